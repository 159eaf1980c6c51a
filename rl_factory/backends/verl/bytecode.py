"""Whether the packages verl's processes import have compiled bytecode, and compiling it once.

A verl launch starts a dozen Python processes one after another (the TaskRunner, TransferQueue's actors, the
FSDP workers, vLLM's server, engine core and workers, the reward and agent-loop workers), and each imports
torch, transformers, Ray, verl and most of vLLM before it does anything. Where those packages have no `.pyc`
files and Python does not write them (`PYTHONDONTWRITEBYTECODE`, set by many container images; a read-only
site-packages; `pip install --no-compile`), every one of those processes compiles every module from source.
On the H200 machine (2026-12-05) py-spy found the processes compiling torch, vLLM, Ray and sympy from source at
every launch, and each Ray actor took about 20 s from its request to its constructor; on a 2-core VM, importing
verl's trainer and our TaskRunner took 5.5 s with bytecode and 12.6-13.6 s without (docs/guides/verl.md).

`survey()` counts, per package, the modules without a bytecode file where this interpreter would look for one
(`importlib.util.cache_from_source`, which follows `PYTHONPYCACHEPREFIX`), without importing anything;
`finding()` turns that into the launcher's and `--doctor`'s one-line warning; and

    python -m rl_factory.backends.verl.bytecode             # the survey, one JSON line
    python -m rl_factory.backends.verl.bytecode --compile   # compile the packages' bytecode once (all cores)

writes the files (compileall writes them whatever PYTHONDONTWRITEBYTECODE says, and every later process reads
them). Nothing here imports verl or Ray.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

# what verl's processes import at start-up (py-spy on the H200: each of these compiled from source there)
PACKAGES = ("torch", "vllm", "verl", "transformers", "ray", "triton", "sympy", "tensordict", "transfer_queue",
            "rl_factory")
WORTH_A_WARNING = 0.2  # the share of modules without bytecode above which a launch warns


def package_dirs(name: str) -> list[Path]:
    """Where a top-level package's modules are, found without importing it ([] when it is not installed)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def survey(packages: tuple[str, ...] = PACKAGES) -> dict[str, Any]:
    """Per installed package: its modules, those without a bytecode file, and whether Python will write one."""
    out: dict[str, Any] = {"writes_bytecode": not sys.dont_write_bytecode, "packages": {}}
    for name in packages:
        modules = missing = 0
        dirs = package_dirs(name)
        for root in dirs:
            for folder, subdirs, files in os.walk(root):
                subdirs[:] = [d for d in subdirs if d != "__pycache__"]
                for file in files:
                    if not file.endswith(".py"):
                        continue
                    modules += 1
                    if not os.path.exists(importlib.util.cache_from_source(os.path.join(folder, file))):
                        missing += 1
        if dirs:
            writable = all(os.access(d, os.W_OK) for d in dirs)
            out["packages"][name] = {"modules": modules, "without_bytecode": missing, "writable": writable,
                                     "dirs": [str(d) for d in dirs]}
    return out


def finding(found: dict[str, Any]) -> str | None:
    """One line when processes will compile modules from source at every launch; None when they will not
    (bytecode present, or Python writes what is missing and the first launch leaves it for the next)."""
    stuck = {name: p for name, p in found["packages"].items() if p["without_bytecode"]
             and not (found["writes_bytecode"] and p["writable"])}
    missing = sum(p["without_bytecode"] for p in stuck.values())
    total = sum(p["modules"] for p in found["packages"].values())
    if not total or missing / total < WORTH_A_WARNING:
        return None
    why = ("this Python does not write bytecode (PYTHONDONTWRITEBYTECODE)" if not found["writes_bytecode"]
           else "their directories are not writable")
    names = ", ".join(f"{name} {p['without_bytecode']}/{p['modules']}" for name, p in stuck.items())
    return (f"start-up: {missing} of {total} modules that verl's processes import have no compiled bytecode and "
            f"{why} ({names}): every Ray worker and vLLM process compiles them again at each launch (verl's "
            f"trainer imports 2.3x slower, docs/guides/verl.md); compile them once with "
            f"`python -m rl_factory.backends.verl.bytecode --compile`")


def compile_packages(packages: tuple[str, ...] = PACKAGES, workers: int = 0) -> dict[str, Any]:
    """compileall over each installed package (workers=0: every core); the survey after it."""
    import compileall

    installed = {name: dirs for name in packages if (dirs := package_dirs(name))}
    failed = []
    for name, dirs in installed.items():
        for root in dirs:
            # quiet=2: a module that does not compile (a template, a py2 leftover) is skipped, not fatal;
            # compileall writes bytecode even where PYTHONDONTWRITEBYTECODE is set
            if not compileall.compile_dir(str(root), quiet=2, workers=workers):
                failed.append(name)
    return {"compiled": list(installed), "some_modules_did_not_compile": sorted(set(failed)), **survey(packages)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile", action="store_true", help="write the missing bytecode (compileall, all cores)")
    parser.add_argument("--packages", nargs="+", default=list(PACKAGES))
    args = parser.parse_args(argv)
    packages = tuple(args.packages)
    result = compile_packages(packages) if args.compile else survey(packages)
    print(json.dumps(result))
    line = finding(result)
    if line:
        print(line, file=sys.stderr)


if __name__ == "__main__":
    main()
