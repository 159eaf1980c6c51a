"""Where a profiled step's time goes on the GPU: one line from a torch profiler trace (verl's `global_profiler`).

    python benchmarks/trace_summary.py outputs/gpu_suite/trace            # the newest trace under that directory
    python benchmarks/trace_summary.py TRACE.json.gz --window empty_cache   # more windows (python frames, markers)
    bash benchmarks/gpu_suite.sh trace                                    # on the lent GPU: profile step 3, summarize

py-spy says which Python line a process is in; it cannot say whether the GPU was busy meanwhile. verl's torch
profiler (`global_profiler.tool=torch`, the actor's `profiler.enable=true`, contents `[cuda,stack]`) writes a
Chrome trace of the actor process over one step: CPU ops, verl's stage markers (`record_function`, e.g.
`actor_update`), Python frames and the GPU's kernels and copies. For each window (a marker or a Python frame whose
name holds the window's text: by default verl's update and weight-sync methods, the optimizer step and
`empty_cache`) the line gives its wall seconds, the seconds the GPU ran anything inside it (kernels, copies and
sets, overlaps counted once) and that share, the longest kernels there and the CUDA runtime calls that wait
(`cudaMalloc`, `cudaFree`, synchronizations) with their count and seconds. A window the GPU is busy for most of is
compute-bound; one where it idles is bound by the host: Python, launches, allocation or waiting for another process.
`kernel_s_by_launcher` splits a window's kernel seconds by the part of the step whose Python launched them (the
log-probs from the LM head, the loss, the optimizer, the batch's copy to the device, the model's forward, Python
backward functions; `no_python_frame`: autograd's C++ backward, run on its own thread), read from the frames open on
the launching thread at the launch (`FRAME_GROUPS`). `gpu_idle_s` says what the window's own host thread was doing
while the GPU idled inside it: the idle seconds by the same parts, by the innermost Python frame open then, and,
counted inclusively, by each open frame of verl's or rl_factory's code: where a host-bound window's time goes.
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WINDOWS = ("actor_update", "update_weights", "train_mini_batch", "optimizer_step", "empty_cache",
           "get_per_tensor_param")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
WINDOW_CATEGORIES = ("user_annotation", "python_function", "cpu_op")
# runtime calls that block the host or the device: what an idle GPU inside a window may be waiting on
WAITS = ("cudaMalloc", "cudaFree", "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
         "cudaMemcpy", "cuMemMap", "cuMemUnmap", "cuMemCreate", "cuMemRelease", "cudaHostAlloc")


# which part of the step launched a kernel: the first of these whose text is in the name of a Python frame open on
# the launching thread when it was launched (`file.py(line): function`), in this order; verl 0.9.1's FSDP engine
FRAME_GROUPS = (
    ("lm_head_logprobs", ("_fused_linear_for_ppo", "linear_cross_entropy", "logprobs_from_logits",
                          "entropy_from_logits")),
    ("loss", ("ppo_loss", "workers/utils/losses.py", "core_algos.py")),
    ("optimizer", ("optimizer_step", "clip_grad_norm", "torch/optim/")),
    ("batch_to_device", ("tensordict/", "prepare_model_inputs")),
    ("model_forward", ("forward",)),
    ("backward", ("backward",)),
)
# kernels launched where no Python frame was open: autograd's own thread running C++ backward functions, mostly
NO_FRAME = "no_python_frame"
ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def load(path: Path) -> list[dict[str, Any]]:
    """The complete ('X') events of a Chrome trace (.json or .json.gz)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and isinstance(e.get("dur"), (int, float))]


def newest_trace(path: Path) -> Path:
    if path.is_file():
        return path
    found = sorted((p for p in path.rglob("*.json*") if p.name.endswith((".json", ".json.gz"))),
                   key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"trace_summary: no .json or .json.gz trace under {path}")
    return found[-1]


class Union:
    """Sorted disjoint intervals (µs): the union of the given ones, and how much of a span they cover."""

    def __init__(self, intervals: list[tuple[float, float]]):
        self.spans: list[tuple[float, float]] = []
        for start, end in sorted(intervals):
            if self.spans and start <= self.spans[-1][1]:
                self.spans[-1] = (self.spans[-1][0], max(self.spans[-1][1], end))
            else:
                self.spans.append((start, end))
        self.starts = [a for a, _ in self.spans]

    def cover(self, start: float, end: float) -> float:
        total, i = 0.0, max(0, bisect.bisect_right(self.starts, start) - 1)
        while i < len(self.spans) and self.spans[i][0] < end:
            a, b = self.spans[i]
            total += max(0.0, min(end, b) - max(start, a))
            i += 1
        return total

    def total(self) -> float:
        return sum(b - a for a, b in self.spans)


def launchers(events: list[dict[str, Any]]) -> dict[Any, str]:
    """Each launch's FRAME_GROUPS label by its correlation id: the Python frames open on the host thread that made
    the runtime call (cudaLaunchKernel, cudaMemcpyAsync, ...) when it made it, as a stack swept in time order."""
    frames: dict[tuple, list[tuple[float, float, str]]] = {}
    calls: dict[tuple, list[tuple[float, Any]]] = {}
    for e in events:
        thread = (e.get("pid"), e.get("tid"))
        if e.get("cat") == "python_function":
            frames.setdefault(thread, []).append((e["ts"], e["ts"] + e["dur"], e.get("name", "")))
        elif e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in (e.get("args") or {}):
            calls.setdefault(thread, []).append((e["ts"], e["args"]["correlation"]))
    labels: dict[Any, str] = {}
    for thread, launched in calls.items():
        opened = sorted(frames.get(thread, []), key=lambda f: (f[0], -f[1]))  # outer frames first at a tie
        stack: list[tuple[float, float, str]] = []
        i = 0
        for ts, correlation in sorted(launched, key=lambda c: c[0]):
            while i < len(opened) and opened[i][0] <= ts:
                while stack and stack[-1][1] < opened[i][0]:
                    stack.pop()
                stack.append(opened[i])
                i += 1
            while stack and stack[-1][1] < ts:
                stack.pop()
            labels[correlation] = group_of([name for _, end, name in stack if end >= ts])
    return labels


def group_of(names: list[str]) -> str:
    """The FRAME_GROUPS label of a stack of open Python frames (`other` where none matches, NO_FRAME where empty)."""
    return next((label for label, texts in FRAME_GROUPS if any(t in name for t in texts for name in names)),
                "other" if names else NO_FRAME)


def idle_by_frames(events: list[dict[str, Any]], where: Union, gpu: Union, thread: tuple,
                   top: int = 12) -> dict[str, Any]:
    """While the GPU idles inside `where`, what `thread`'s Python was doing: the idle seconds by FRAME_GROUPS label of
    the frames open then, by the innermost open frame, and, inclusive, by each open frame of verl's or our code (the
    code a change could move)."""
    frames = sorted(((e["ts"], e["ts"] + e["dur"], e.get("name", "")) for e in events
                     if e.get("cat") == "python_function" and (e.get("pid"), e.get("tid")) == thread),
                    key=lambda f: (f[0], -f[1]))
    by_part: Counter[str] = Counter()
    innermost: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    groups: dict[tuple[str, ...], str] = {}  # a stack's label, worked out once
    # one sweep over every frame boundary and window edge: between two such points the open frames stay the same,
    # and the stretch lies wholly inside the window or wholly outside it
    edges = {t for span in where.spans for t in span}
    points = sorted(edges | {t for a, b, _ in frames for t in (a, b)})
    stack: list[tuple[float, float, str]] = []
    i = 0
    for a, b in zip(points, points[1:]):
        while i < len(frames) and frames[i][0] <= a:
            while stack and stack[-1][1] <= frames[i][0]:
                stack.pop()
            stack.append(frames[i])
            i += 1
        while stack and stack[-1][1] <= a:  # frames nest on a thread: the innermost ends first
            stack.pop()
        idle = (b - a) - gpu.cover(a, b) if where.cover(a, b) > 0 else 0.0
        if idle <= 0:
            continue
        names = tuple(name for _, end, name in stack if end > a)
        if names not in groups:
            groups[names] = group_of(list(names))
        by_part[groups[names]] += idle
        # a built-in's name carries its object's address ("... of Tensor object at 0x7f..."): one name for all
        innermost[ADDRESS.sub("", names[-1]) if names else NO_FRAME] += idle
        for name in dict.fromkeys(n for n in names if "/verl/" in n or "/rl_factory/" in n):
            ours[name] += idle

    def seconds(counter: Counter[str], n: int | None = None) -> dict[str, float]:
        return {k[-120:]: round(v / 1e6, 6) for k, v in counter.most_common(n)}

    return {"by_part": seconds(by_part), "by_innermost_frame": seconds(innermost, top),
            "inclusive_verl_and_ours": seconds(ours, top)}


def window(events: list[dict[str, Any]], spans: list[tuple[float, float]], gpu: Union, labels: dict[Any, str],
           thread: tuple | None = None, top: int = 8) -> dict[str, Any]:
    """Wall, GPU-busy seconds and share, longest kernels and waiting runtime calls inside `spans` (µs), the kernels'
    seconds by the part of the step that launched them (`labels`: `launchers`), and where `thread` (the host thread
    the window ran on) was while the GPU idled (`gpu_idle_s`: `idle_by_frames`)."""
    where = Union(spans)
    wall = where.total()
    busy = sum(gpu.cover(a, b) for a, b in where.spans)
    kernels: Counter[str] = Counter()
    by_frame: Counter[str] = Counter()
    waits: Counter[str] = Counter()
    wait_counts: Counter[str] = Counter()
    for e in events:
        cat = e.get("cat", "")
        if cat == "kernel" and where.cover(e["ts"], e["ts"] + e["dur"]) > 0:
            kernels[e["name"][:80]] += e["dur"]
            by_frame[labels.get((e.get("args") or {}).get("correlation"), "unlinked")] += e["dur"]
        elif (cat in ("cuda_runtime", "cuda_driver") and e["name"].startswith(WAITS)
              and where.cover(e["ts"], e["ts"] + e["dur"]) > 0):
            waits[e["name"]] += e["dur"]
            wait_counts[e["name"]] += 1
    out = {"occurrences": len(where.spans), "wall_s": round(wall / 1e6, 6), "gpu_busy_s": round(busy / 1e6, 6),
           "gpu_busy_share": round(busy / wall, 3) if wall else None,
           "top_kernels_s": {k: round(v / 1e6, 6) for k, v in kernels.most_common(top)},
           "kernel_s_by_launcher": {k: round(v / 1e6, 6) for k, v in by_frame.most_common()},
           "waits": {k: {"calls": wait_counts[k], "s": round(v / 1e6, 6)} for k, v in waits.most_common(top)}}
    if thread is not None:
        out["gpu_idle_s"] = {"total": round((wall - busy) / 1e6, 6), **idle_by_frames(events, where, gpu, thread)}
    return out


def summarize(events: list[dict[str, Any]], names: tuple[str, ...] = WINDOWS) -> dict[str, Any]:
    gpu = Union([(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in GPU_CATEGORIES])
    host = [e for e in events if e.get("cat") not in GPU_CATEGORIES]
    whole = (min(e["ts"] for e in host), max(e["ts"] + e["dur"] for e in host)) if host else (0.0, 0.0)
    labels = launchers(events)
    python = Counter((e.get("pid"), e.get("tid")) for e in events if e.get("cat") == "python_function")
    out = {"trace": window(events, [whole], gpu, labels, python.most_common(1)[0][0] if python else None)}
    for name in names:
        found = [e for e in events if e.get("cat") in WINDOW_CATEGORIES and name in e.get("name", "")]
        threads = Counter((e.get("pid"), e.get("tid")) for e in found)
        out[name] = window(events, [(e["ts"], e["ts"] + e["dur"]) for e in found], gpu, labels,
                           threads.most_common(1)[0][0]) if found else None
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="a .json / .json.gz trace, or a directory: its newest")
    ap.add_argument("--window", action="append", default=[], help="more window names (markers or Python frames)")
    args = ap.parse_args(argv)
    path = newest_trace(Path(args.trace))
    from benchmarks.record import emit

    emit("trace", {"bench": "trace", "file": str(path), "windows": summarize(load(path), (*WINDOWS, *args.window))})


if __name__ == "__main__":
    main()
