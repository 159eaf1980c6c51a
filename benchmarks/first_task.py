"""A new user's first task of their own, timed from an empty model cache (docs/quickstart.md's path).

    .venv/bin/python benchmarks/first_task.py                 # a fresh RL_FACTORY_CACHE in a temp dir
    .venv/bin/python benchmarks/first_task.py --cache DIR     # reuse DIR (the model built once already)

In a temporary working directory: `python -m envs new-server word_count`, then the `--doctor` and the
3-step training commands it prints, exactly as printed (the run directory is put in the temp dir).
Prints one JSON line: seconds for the scaffold, the doctor, the model preparation (the builtin
model's build, when the cache lacks it, and its load), the time from launch to the first training
step's line, the 3 steps, and the whole; plus the load average at start and end and the CPU count.
The target is a first step within 3 minutes of launch on 2 idle cores.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402


def timed_lines(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[int, list[tuple[float, str]]]:
    """Run `command`; every line of its stdout and stderr with the seconds since launch (also into `log`)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    with log.open("w", encoding="utf-8") as out:
        for raw in iter(proc.stdout.readline, b""):
            # tqdm redraws with \r: each redraw is a line of its own
            for text in raw.decode("utf-8", "replace").replace("\r", "\n").splitlines():
                lines.append((time.perf_counter() - t0, text))
                out.write(f"+{lines[-1][0]:7.1f}s {text}\n")
                out.flush()
    return proc.wait(), lines


def first(lines: list[tuple[float, str]], pattern: str) -> float | None:
    return next((t for t, text in lines if re.search(pattern, text)), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=None, help="RL_FACTORY_CACHE to use (default: a new, empty one)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, task, run) and print it")
    args = parser.parse_args()
    load_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="rlf-first-task-"))
    cache = Path(args.cache) if args.cache else work / "cache"
    fresh = not any(cache.glob("models/*/config.json"))
    env = {**os.environ, "RL_FACTORY_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    python = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
    out: dict = {"benchmark": "first_task", "fresh_cache": fresh, "cpus": os.cpu_count(),
                 "loadavg_1m_start": round(load_start[0], 2)}

    t0 = time.perf_counter()
    scaffold = subprocess.run([python, "-m", "envs", "new-server", "word_count"], cwd=work, env=env,
                              capture_output=True, text=True, check=True)
    out["scaffold_s"] = round(time.perf_counter() - t0, 2)
    printed = [line.strip() for line in scaffold.stdout.splitlines() if line.startswith("  ")]
    commands = dict(zip(["list", "call", "doctor", "train", "eval"], printed, strict=True))

    t0 = time.perf_counter()
    rc, _ = timed_lines(shlex.split(commands["doctor"]), work, env, work / "doctor.log")
    out["doctor_s"] = round(time.perf_counter() - t0, 2)
    out["doctor_ok"] = rc == 0

    train = [*shlex.split(commands["train"]), f"trainer.output_dir={work / 'run'}"]
    rc, lines = timed_lines(train, work, env, work / "train.log")
    build, started = first(lines, r"^building the embedded default model"), first(lines, r"^starting run in")
    step1, step3 = first(lines, r"^step 1: "), first(lines, r"^step 3: ")
    out.update(train_ok=rc == 0, built_model=build is not None,
               model_prep_s=round(started - (build if build is not None else 0.0), 2) if started else None,
               time_to_first_step_s=round(step1, 2) if step1 else None,
               three_steps_s=round(step3 - started, 2) if step3 and started else None,
               train_wall_s=round(lines[-1][0], 2) if lines else None)
    out["first_step_since_scaffold_s"] = round(out["scaffold_s"] + out["doctor_s"] + step1, 2) if step1 else None
    out["total_s"] = round(out["scaffold_s"] + out["doctor_s"] + (out["train_wall_s"] or 0.0), 2)
    out["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    out["train_command"] = commands["train"]
    if args.keep or rc != 0:
        out["work_dir"] = str(work)
    else:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    emit("first_task", out)
    return 0 if out["train_ok"] and out["doctor_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
