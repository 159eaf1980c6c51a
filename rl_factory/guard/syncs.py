"""Weight-sync receipts from the engine's side: what a sync sent, and whether the weights the engine holds changed.

verl's vLLM server says which version it last synced to (`global_steps`), which it sets when `update_weights`
returns, whether or not the weights landed: a sync whose tensors were skipped (names vLLM's `load_weights` does
not know, a transfer to the wrong socket, an adapter loaded but not applied) still advances the version, and
the rollouts of every later step carry the right version and the initial weights. So the engine itself, in the
process that holds the weights, fingerprints them around each sync (`SyncRecorder`, driven by our vLLM worker
extension, rl_factory/backends/verl/vllm_receipts.py):

  held_before  the weights it generates with, before the sync (`sums_fingerprint`, as for the trainer's model)
  received     what the sync sent, tensor by tensor in arrival order
  held_after   the weights after the sync

and appends one JSON line per sync to `<run>/engine_syncs/<host>-<pid>.jsonl`, with the worker's whole sync
(`seconds`: receiving, loading and the receipts) and the receipts' own part of it (`receipts_seconds`). The
receipts check (rl_factory/guard/checks/receipts.py) names a sync that sent new weights (`received` differs from the engine's
previous sync, or it is its first) and left the held weights as they were (`held_after == held_before`). A sync
that sent the same tensors as the last one (an update too small to move a bf16 weight) is not judged: holding
the same weights is right then. The fingerprints are sums, compared only with the same engine's own, so vLLM's
fused and padded layouts (qkv, gate_up, the vocabulary padded to a multiple of 64) never meet the trainer's.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Iterable

from rl_factory.guard.fingerprint import device_sum, sums_fingerprint

log = logging.getLogger("rl_factory")

SYNCS_ENV = "RL_FACTORY_ENGINE_SYNCS"  # the directory the engine's processes write their sync lines into
SYNCS_DIR = "engine_syncs"  # <run>/engine_syncs; a launch moves its predecessors' lines to earlier/


class SyncRecorder:
    """One engine process's sync lines: `begin(model)`, `received(tensors)` per bucket, `end(model, adapter)`.

    Args:
        directory: where the lines go (None: record nothing; every method is then a no-op).
        engine: the engine's name in its lines (default `<host>-<pid>`).
    """

    def __init__(self, directory: str | os.PathLike | None, engine: str | None = None):
        self.path = None if not directory else Path(directory) / f"{engine or _engine_name()}.jsonl"
        self.engine = engine or _engine_name()
        self.count = 0
        self.last_received: str | None = None
        self._before: str | None = None
        self._sums: list = []
        self._started = 0.0
        self._own = 0.0  # seconds the receipts themselves took in this sync (in `seconds`, the whole sync's)

    def begin(self, model: Any) -> None:
        if self.path is None:
            return
        self._started = time.perf_counter()
        self._before, self._sums = self._fingerprint(model), []
        self._own = time.perf_counter() - self._started

    def received(self, tensors: Iterable[Any]) -> None:
        """One bucket's tensors, while they are still valid (the receiver reuses its buffer for the next bucket)."""
        if self.path is None or self._before is None:
            return
        import torch

        started = time.perf_counter()
        try:
            with torch.no_grad():
                sums = [device_sum(t.detach()).reshape(1) for t in tensors]
                if sums and sums[0].is_cuda:  # the receiver synchronizes next anyway: the wait counts as ours
                    torch.cuda.synchronize(sums[0].device)
        except Exception as exc:  # noqa: BLE001 - a dtype sum() refuses: no receipts, the sync itself goes on
            self._give_up(exc)
            return
        if sums:
            self._sums.append(torch.cat(sums))  # kept on the device: one transfer at the end
        self._own += time.perf_counter() - started

    def end(self, model: Any, adapter: bool = False, **extra: Any) -> dict[str, Any] | None:
        """The sync's line (also returned); `adapter`: the sync loaded a LoRA adapter, not the base weights."""
        if self.path is None or self._before is None:
            return None
        import torch

        started = time.perf_counter()
        try:
            sums = torch.cat([s.cpu() for s in self._sums]) if self._sums else torch.zeros(0, dtype=torch.float64)
        except Exception as exc:  # noqa: BLE001
            self._give_up(exc)
            return None
        received = hashlib.blake2b(sums.numpy().tobytes(), digest_size=8).hexdigest()
        after = self._fingerprint(model)
        ended = time.perf_counter()
        self.count += 1
        line = {"engine": self.engine, "sync": self.count, "time": time.time(), "tensors": int(sums.numel()),
                "held_before": self._before, "received": received, "held_after": after, "adapter": bool(adapter),
                "sent_changed": self.last_received is None or received != self.last_received,
                "seconds": round(ended - self._started, 4), "receipts_seconds": round(self._own + ended - started, 4),
                **extra}
        self.last_received, self._before, self._sums = received, None, []
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
        except OSError as exc:  # a receipt is no reason to stop generating
            log.warning("engine sync receipt not written to %s: %s", self.path, exc)
        return line

    def _fingerprint(self, model: Any) -> str | None:
        try:
            return sums_fingerprint(model)
        except Exception as exc:  # noqa: BLE001 - the engine must keep generating; the check sees None
            log.warning("engine weights not fingerprinted: %s", exc)
            return None

    def _give_up(self, exc: BaseException) -> None:
        """Receipts are a check, never a reason for a sync to fail: this engine records nothing from now on."""
        log.warning("engine sync receipts off for %s: %s", self.engine, exc)
        self.path, self._before, self._sums = None, None, []


def unlanded(line: dict[str, Any]) -> bool:
    """A sync that sent new base weights and left the engine's weights as they were."""
    before, after = line.get("held_before"), line.get("held_after")
    return (not line.get("adapter") and bool(line.get("sent_changed")) and int(line.get("tensors") or 0) > 0
            and before is not None and before == after)


def set_aside_earlier(run_dir: str | os.PathLike) -> None:
    """A new launch's engines start their counts afresh: the lines of earlier launches move to earlier/."""
    directory = Path(run_dir) / SYNCS_DIR
    files = sorted(directory.glob("*.jsonl")) if directory.is_dir() else []
    if not files:
        return
    earlier = directory / "earlier"
    earlier.mkdir(exist_ok=True)
    for path in files:
        target = earlier / path.name
        n = 1
        while target.exists():
            target, n = earlier / f"{path.stem}.{n}.jsonl", n + 1
        path.replace(target)


def _engine_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"
