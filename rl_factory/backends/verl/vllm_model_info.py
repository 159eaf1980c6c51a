"""vLLM's model-info cache, filled beside the launch instead of inside the rollout servers' start.

Before vLLM builds an engine it inspects the model's class (a text-generation model? LoRA? which pooling?).
It does that in a fresh Python process (vLLM's `registry._run_in_subprocess`, so that the server's own process
never initializes CUDA), which imports vLLM and the model's module, and keeps the answer in
`$VLLM_CACHE_ROOT/modelinfos/` (`~/.cache/vllm`), keyed by the hash of the model's source file. On a machine
where that cache is empty (its first launch, a new vLLM, a new architecture) the inspection runs inside the
rollout servers' start, where nothing else happens: 11.7 s of the 87 s vLLM's server took on the H200's first
0.6B launch (its arguments printed at 74.3 s, its engine's first line at 86.0 s; 0.1 s apart on the launch
after it).

So the launcher starts the same inspection in a background process as soon as the config is checked, about a
minute before verl asks for vLLM's servers (Ray, TransferQueue and the FSDP actor start in between), and the
server finds the cache filled. Where it is already filled the process reads it and exits; where it is still
running when the server starts, the server inspects as it would have (vLLM writes the file atomically). It
warms the launching node's cache only: on several nodes the others inspect at their first launch as before.

    python -m rl_factory.backends.verl.vllm_model_info --out FILE ARCH [ARCH ...]

is that process: one JSON line per architecture appended to FILE (`cached`: the cache had it; `seconds`; `error`;
`ended`: the wall clock, comparable with startup.json's marks).
Nothing here imports verl, Ray, or (outside that process) vLLM.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

from rl_factory import jsonl

FILE = "vllm_model_info.jsonl"  # in the run's output directory


def architectures(model_path: str) -> list[str]:
    """The `architectures` of a model directory's config.json, or of a hub id's cached one ([] where neither)."""
    config = Path(model_path) / "config.json"
    if not config.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model_path, "config.json")
        except Exception:  # noqa: BLE001 - not a hub id, or no huggingface_hub: nothing to warm
            return []
        if not isinstance(cached, str):
            return []
        config = Path(cached)
    try:
        names = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [n for n in names if isinstance(n, str)]


def start(model_path: str, out_dir: Path) -> subprocess.Popen | None:
    """The background inspection of the model's architectures, or None where vLLM or the architectures are
    missing. Its output goes to `out_dir/FILE`; it ends on its own (23-25 s beside Ray's start on the H200, with
    the cache empty)."""
    names = architectures(model_path)
    if not names or importlib.util.find_spec("vllm") is None:
        return None
    return subprocess.Popen([sys.executable, "-m", __name__, "--out", str(Path(out_dir) / FILE), *names],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # a Ctrl-C at the launcher does not interrupt a cache write


def inspect(name: str) -> dict:
    """vLLM's own inspection of one architecture (its cache read, else filled), as one record."""
    record: dict = {"architecture": name}
    began = time.monotonic()
    try:
        from vllm.model_executor.models.registry import ModelRegistry

        model = ModelRegistry.models.get(name)
        if model is None:
            record["error"] = "not one of vLLM's architectures (vLLM falls back to transformers' class)"
            return record
        cache_dir, cache_file = getattr(model, "_get_cache_dir", None), getattr(model, "_get_cache_filename", None)
        if cache_dir and cache_file:
            record["cached"] = (cache_dir() / cache_file()).is_file()
        model.inspect_model_cls()
    except Exception as exc:  # noqa: BLE001 - the server will inspect it itself, and say what is wrong
        record["error"] = f"{type(exc).__name__}: {exc}"[:500]
    record["seconds"] = round(time.monotonic() - began, 3)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON-lines file the records are appended to")
    parser.add_argument("architectures", nargs="+")
    args = parser.parse_args(argv)
    began = time.monotonic()
    records = [inspect(name) for name in args.architectures]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        for record in records:
            f.write(jsonl.dumps({**record, "process_seconds": round(time.monotonic() - began, 3),
                                 "ended": round(time.time(), 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
