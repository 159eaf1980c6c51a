"""Seconds to load (or refuse) a tool manifest of up to 1 MiB: the target is under 1 s for any of them.

Three files written to a temporary directory, each loaded with `envs.manifest.load_manifest`:

  * `aliases`: nine YAML aliases of nine aliases of ... (about 400 bytes that expand to 4.8 million values),
    refused;
  * `nesting`: 500,000 nested flow lists (1 MB), refused;
  * `servers`: 9,000 stdio servers written out in full (about 950 KB), loaded.

Prints one JSON line: per file its size, the best of `--repeats` load times and what came back (the
number of servers, or the error's first 120 characters), plus the load average.

    .venv/bin/python benchmarks/manifest_load.py
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402
from envs.manifest import ManifestError, load_manifest  # noqa: E402


def write_files(out: Path, servers: int) -> dict[str, Path]:
    lines = ["x:", '  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        previous, name = chr(96 + i), chr(97 + i)
        lines.append(f"  {name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    lines += ["mcpServers:", "  s:", "    command: python", "    args: *i"]
    files = {"aliases": "\n".join(lines) + "\n",
             "nesting": "mcpServers: " + "[" * 500_000 + "]" * 500_000 + "\n",
             "servers": "mcpServers:\n" + "".join(
                 f'  s{i}:\n    command: python\n    args: ["-m", "envs.servers.calculator", "--x", "{i}"]\n'
                 "    timeout_s: 10\n" for i in range(servers))}
    paths = {}
    for name, text in files.items():
        paths[name] = out / f"{name}.yaml"
        paths[name].write_text(text)
    return paths


def load(path: Path) -> str:
    try:
        return f"{len(load_manifest(path).servers)} servers"
    except ManifestError as err:
        return f"refused: {str(err).split(': ', 1)[-1][:120]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", type=int, default=9000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in write_files(Path(tmp), args.servers).items():
            times, outcome = [], ""
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                outcome = load(path)
                times.append(time.perf_counter() - t0)
            results[name] = {"bytes": path.stat().st_size, "best_s": round(min(times), 3), "outcome": outcome}
    emit("manifest_load", {"files": results, "worst_s": max(r["best_s"] for r in results.values()),
                           "loadavg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)]})


if __name__ == "__main__":
    main()
