"""Per-run cgroups for the Python sandbox: a cap on processes (`pids`) and on memory (`memory`).

RLIMIT_AS bounds one process's address space, not what a run holds: memory in memfds, SysV or
POSIX shared memory and tmpfs files is outside it, and a run may start many processes. A memory
cgroup charges all of it (anonymous memory, shmem, tmpfs pages, the page cache the run fills) to
the run and kills the run's largest process when the sum passes the limit. The kernel also
exempts uid 0 from RLIMIT_NPROC, so a pids cgroup is the process cap that holds for every uid.

`RunCgroups.find()` looks for writable hierarchies: cgroup v2 (the unified hierarchy, where the
server's own group delegates the controller in `cgroup.subtree_control`) or cgroup v1 (one
hierarchy per controller, e.g. /sys/fs/cgroup/memory). `create` makes one fresh group per run in
each, `join` (a preexec function) moves the starting process in, so the run and all its
descendants count; `oom_killed` says whether the memory limit killed something; `remove` deletes
the groups once empty. Where a controller cannot be had, `find` leaves it out and the server says
in its tool description which limit is not enforced.
"""
from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

CONTROLLERS = ("pids", "memory")


@dataclass
class RunGroup:
    """One run's groups: a directory per hierarchy (one in v2, one per controller in v1)."""

    dirs: list[Path]
    memory_events: Path | None = None  # where the kernel counts OOM kills of this run


@dataclass
class RunCgroups:
    # controller -> (hierarchy directory the per-run groups go under, "v1" | "v2")
    roots: dict[str, tuple[Path, str]] = field(default_factory=dict)
    _counter: itertools.count = field(default_factory=itertools.count)

    @classmethod
    def find(cls) -> RunCgroups:
        own = _own_groups()
        roots: dict[str, tuple[Path, str]] = {}
        unified = next((Path(p) for p in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
                        if Path(p, "cgroup.controllers").exists()), None)
        if unified is not None and "" in own:
            base = unified / own[""].lstrip("/")
            delegated = _read(base / "cgroup.subtree_control").split()
            for controller in CONTROLLERS:
                if controller in delegated and _writable(base):
                    roots[controller] = (base, "v2")
        for controller in CONTROLLERS:
            if controller in roots or controller not in own:
                continue
            base = Path("/sys/fs/cgroup", controller) / own[controller].lstrip("/")
            if _writable(base):
                roots[controller] = (base, "v1")
        return cls(roots)

    def has(self, controller: str) -> bool:
        return controller in self.roots

    def create(self, max_processes: int, memory_bytes: int) -> RunGroup:
        name = f"rl_factory_sandbox_{os.getpid()}_{next(self._counter)}"
        group = RunGroup(dirs=[])
        try:
            for base, version in dict.fromkeys(self.roots.values()):
                path = base / name
                path.mkdir()
                group.dirs.append(path)
                self._limit(path, version, max_processes, memory_bytes, group)
        except OSError:
            self.remove(group)
            raise
        return group

    def _limit(self, path: Path, version: str, max_processes: int, memory_bytes: int, group: RunGroup) -> None:
        controllers = [c for c, root in self.roots.items() if root[0] == path.parent]
        if "pids" in controllers:
            (path / "pids.max").write_text(str(max_processes))
        if "memory" not in controllers:
            return
        if version == "v2":
            (path / "memory.max").write_text(str(memory_bytes))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
            group.memory_events = path / "memory.events"
        else:
            (path / "memory.limit_in_bytes").write_text(str(memory_bytes))
            if (path / "memory.memsw.limit_in_bytes").exists():  # memory + swap: no swapping past the limit
                (path / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            group.memory_events = path / "memory.oom_control"

    @staticmethod
    def join(group: RunGroup):
        def preexec() -> None:
            for path in group.dirs:
                (path / "cgroup.procs").write_text(str(os.getpid()))
        return preexec

    @staticmethod
    def oom_killed(group: RunGroup) -> bool:
        if group.memory_events is None:
            return False
        for line in _read(group.memory_events).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value) > 0
        return False

    @staticmethod
    def remove(group: RunGroup) -> None:
        # The namespace's processes are reaped a moment after its init exits (longer for a fork bomb
        # on a loaded machine): keep trying for a while, then leave the empty group behind.
        for path in group.dirs:
            for attempt in range(200):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(min(0.01 * (attempt + 1), 0.1))


def _own_groups() -> dict[str, str]:
    """controller -> the server's own group path ("" is the v2 unified hierarchy)."""
    own: dict[str, str] = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            own[controller] = path.strip()
    return own


def _writable(base: Path) -> bool:
    probe = base / f"rl_factory_probe_{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
