"""Our run-directory contract on verl: `metrics.jsonl` with our names, `rollouts/step_NNNNNN.jsonl`.

The embedded trainer writes one metrics line per step (`reward/mean`, `accuracy`, `tool/*`,
`timing/*`, `val/*` at validation steps) and every trajectory to `rollouts/`; the report, eval
comparisons and users' scripts read those. On verl the pieces of a step live in different processes:

- a trajectory is scored in a reward worker (or, for ArenaRL, in its agent-loop worker), which
  appends its rollouts line (`trajectory_record`, reward included) to its own part file
  `rollouts/.parts/<split>_step_NNNNNN/<host>-<pid>.jsonl` (one writer per file: no locks, and on
  several nodes each writes to the shared run directory);
- verl's trainer logs the step's metrics through its `Tracking` object in the TaskRunner process,
  after every reward of the step is in. `RunDirLogger`, added to `Tracking` by our plugin when
  `trainer.logger` names `rl_factory`, then gathers the step's parts into `rollouts/step_N.jsonl`
  (`val_step_N.jsonl` at validation steps), computes our metrics from them with the embedded
  backend's own `summarize_records`, maps verl's timing names onto ours, and appends one line to
  `metrics.jsonl`: our names plus every verl metric under its own name. After a validation step it
  rewrites `report.html` (rl_factory/report), as the embedded trainer does. The run guard checks the step
  there too (rl_factory/guard/lines.py), on the evidence the agent loop put in each rollouts line. The first
  training step's line completes the start-up record, `startup.json` (startup.py).

A resumed run (verl restored checkpoint k) keeps each step one line, as the embedded backend does.
verl saves step k's checkpoint *before* it validates and logs step k, and (with val_before_train)
re-validates the restored weights at step k before training step k+1. So at start the logger drops
everything of steps > k (metrics lines, rollouts parts, the arena/pipeline workers' rows: steps the
killed run did not finish), writes step k's line from its rollouts if the killed run never logged it
(our metrics only: verl's died with it), and merges the re-validation into step k's line, adding only
the keys it lacks. The run guard's state goes with verl's checkpoints (rl_factory/guard/lines.py): written
into `global_step_k/` once step k is checked, restored from there on resume.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
from collections import Counter
from pathlib import Path
from typing import Any

from rl_factory.backends.verl import startup
from rl_factory.base.files import write_atomic
from rl_factory.jsonl import WRITE_ERRORS, Tail, dumps, read_records

PARTS_DIR = Path("rollouts") / ".parts"
LOGGER_NAME = "rl_factory"
INVALID_TOOL = "_invalid"  # calls to names no server serves, pooled as ToolEnv.metrics() does
UNROUTED_KINDS = ("parse", "unknown_tool", "too_many_calls")  # failures decided before a tool is looked up
# verl's timing_s/<phase> -> our timing/<name>_s, where our name differs from verl's phase name
TIMING_NAMES = {"gen": "rollout", "update_actor": "update"}
# verl's async trainers' off-policy metrics -> ours (the embedded backend's async/*, rl_factory/asynchrony.py):
# verl's "worst" staleness is the trained weights' version minus the version of the trajectory's first token
ASYNC_NAMES = {"training/off_policy/trajectory_staleness_worst/mean": "async/staleness/mean",
               "training/off_policy/trajectory_staleness_worst/max": "async/staleness/max",
               "training/off_policy/trajectory_spans/mean": "async/version_spans/mean"}


def write_part(out_dir: str | Path, split: str, step: int, lines: list[dict[str, Any]]) -> None:
    """Append scored rollouts lines of `split` at `step` to this process's part file."""
    part = Path(out_dir) / PARTS_DIR / f"{split}_step_{int(step):06d}" / f"{socket.gethostname()}-{os.getpid()}.jsonl"
    text = "".join(dumps(line) for line in lines)  # secrets scrubbed, as the embedded backend's rollouts
    try:  # the step's directory exists after its first trajectory: no mkdir per trajectory
        f = part.open("a", encoding="utf-8", errors=WRITE_ERRORS)
    except FileNotFoundError:
        part.parent.mkdir(parents=True, exist_ok=True)
        f = part.open("a", encoding="utf-8", errors=WRITE_ERRORS)
    with f:  # one write per call: a reader never sees half a line
        f.write(text)


def gather(out_dir: Path, split: str, step: int) -> list[dict[str, Any]]:
    """The step's lines from every part file, into `rollouts/[val_]step_N.jsonl`; the parts are removed."""
    parts = out_dir / PARTS_DIR / f"{split}_step_{step:06d}"
    if not parts.is_dir():
        return []
    name = f"step_{step:06d}.jsonl" if split == "train" else f"val_step_{step:06d}.jsonl"
    return _merge_parts(parts, out_dir / "rollouts" / name, step)


def gather_late(out_dir: Path, step: int) -> list[dict[str, Any]]:
    """Training lines of steps before `step` that finished after their step was logged (an async trainer: the
    prompts verl queued at step s are rolled out while step s and later steps train, and a session still running
    when step s is logged writes its line later). Each goes into its own step's file, `rollouts/step_S.jsonl`
    (a line's `step` is the step that queued its prompt); returned to be counted and checked at `step`."""
    late = []
    parts_dir = out_dir / PARTS_DIR
    for parts in sorted(parts_dir.glob("train_step_*")) if parts_dir.is_dir() else []:
        number = parts.name.rpartition("_step_")[2]
        if number.isdigit() and int(number) < step:
            late += _merge_parts(parts, out_dir / "rollouts" / f"step_{int(number):06d}.jsonl", int(number))
    return late


def _merge_parts(parts: Path, target: Path, step: int) -> list[dict[str, Any]]:
    """The part files' lines (of `step`) into `target`, beside the lines it holds: a session's line replaces an
    earlier one of the same sample and session, as a prompt re-issued after a resume rolls out again. The parts are
    removed. Returns the parts' lines."""
    # a killed worker can leave half a line: its other lines and the other workers' still count
    lines = [record for part in sorted(parts.glob("*.jsonl")) for record in read_records(part, torn_ok=True)]
    for line in lines:  # the arena's lines are written without it (group.py): the step whose prompt it is
        line.setdefault("step", step)
    new = {_session(r) for r in lines}
    kept = [r for r in read_records(target, torn_ok=True) if _session(r) not in new] if target.exists() else []
    lines.sort(key=_order)
    write_atomic(target, "".join(dumps(r) for r in sorted(kept + lines, key=_order)), errors=WRITE_ERRORS)
    shutil.rmtree(parts, ignore_errors=True)
    return lines


def _session(line: dict[str, Any]) -> tuple[Any, Any]:
    return line.get("sample_index"), line.get("session")


def _order(line: dict[str, Any]) -> tuple[Any, Any]:
    return line.get("sample_index", 0), line.get("session", 0)


ARENA_MEANS = ("arena/reward_spearman",)  # per-group values the step reports as their mean; every other arena/* is a count


class ArenaMetrics:
    """The step's `arena/*` metrics as the embedded trainer logs them, from the per-group lines every worker
    process appends (`<output_dir>/arena/<host>-<pid>/metrics.jsonl`, group.py): counts summed over the groups,
    the Spearman correlation averaged over the groups that have one. Each line is read once: a step's lines wait
    here until that step is logged (an async trainer's workers run ahead), and older steps' are dropped then."""

    def __init__(self, out_dir: Path):
        self.tail = Tail(Path(out_dir) / "arena", "*/metrics.jsonl")
        self.pending: dict[int, list[dict[str, Any]]] = {}

    def step(self, step: int) -> dict[str, float]:
        for line in self.tail.read():
            if isinstance(line, dict) and isinstance(line.get("step"), int):
                self.pending.setdefault(line["step"], []).append(line)
        lines = self.pending.pop(step, [])
        for old in [s for s in self.pending if s < step]:
            del self.pending[old]
        sums: dict[str, float] = {}
        means: dict[str, list[float]] = {}
        for line in lines:
            for key, value in line.items():
                if not key.startswith("arena/") or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                if key in ARENA_MEANS:
                    means.setdefault(key, []).append(float(value))
                else:
                    sums[key] = sums.get(key, 0.0) + float(value)
        return {**sums, **{key: sum(values) / len(values) for key, values in means.items()}}

def tool_counts(lines: list[dict[str, Any]], tool_names: set[str] | None = None) -> dict[str, float]:
    """ToolEnv.metrics()'s counters (`tool/calls`, `tool/<name>/calls`, `tool/errors/<kind>`, ...) from rollouts lines."""
    counts: Counter[str] = Counter()
    latencies = []
    results = [res for line in lines for res in line["tool_results"]]
    # Without the manifest's names, a name is a tool's if some call of it got past the env's local checks:
    # a garbled call (a parse error, often with an empty or invented name) must not mint its own key.
    known = set(tool_names) if tool_names is not None else {
        res["name"] for res in results if res["error_kind"] not in UNROUTED_KINDS}
    for line in lines:
        for res in line["tool_results"]:
            unknown = res["error_kind"] == "unknown_tool" or res["name"] not in known
            name = INVALID_TOOL if unknown else res["name"]
            counts["tool/calls"] += 1
            counts[f"tool/{name}/calls"] += 1
            if res["error_kind"] is not None:
                counts[f"tool/errors/{res['error_kind']}"] += 1
                counts[f"tool/{name}/errors/{res['error_kind']}"] += 1
            elif res.get("latency_s"):
                latencies.append(res["latency_s"])
    out = {k: float(v) for k, v in counts.items()}
    if latencies:
        out["tool/latency_s/mean"], out["tool/latency_s/max"] = sum(latencies) / len(latencies), max(latencies)
    return out


def trajectory_timing(lines: list[dict[str, Any]]) -> dict[str, float]:
    """The slowest and the mean trajectory's wall time in its agent loop (start to return): beside
    `timing/rollout_s`, what the rollout phase spends beyond its slowest trajectory.

    Where every line says when its trajectory began (`started_unix`, one node's clock): how long after the first
    trajectory the last one began (`timing/trajectory_starts_s`: verl's dispatch to the workers and its router's
    answers, paid before a request reaches vLLM) and from the first start to the last return
    (`timing/trajectories_span_s`: the part of the rollout phase spent in agent loops), and the most of the starts'
    spread inside one agent-loop worker (`timing/trajectory_starts_in_worker_s`: its event loop runs each trajectory
    up to its first wait before the next one begins; the rest of the spread is the dispatch to the workers). Where
    they say when their
    first request left for the server (`first_request_unix`): how long after the first such request the last one
    left (`timing/request_starts_s`: what vLLM sees arrive over several engine steps, each adding requests, where a
    ceiling that submits every request at once sees one) and the longest a trajectory spent in its agent loop before
    it (`timing/before_first_request_s`: its episode opened, its prompt rendered)."""
    timings = [r["timing"] for r in lines if isinstance(r.get("timing"), dict) and "wall_s" in r["timing"]]
    if not timings:
        return {}
    walls = [t["wall_s"] for t in timings]
    out = {"timing/slowest_trajectory_s": max(walls), "timing/trajectory_mean_s": sum(walls) / len(walls)}
    if all("started_unix" in t for t in timings):
        starts = [t["started_unix"] for t in timings]
        out["timing/trajectory_starts_s"] = max(starts) - min(starts)
        out["timing/trajectories_span_s"] = max(s + w for s, w in zip(starts, walls)) - min(starts)
        by_worker: dict[Any, list[float]] = {}
        for t in timings:
            by_worker.setdefault(t.get("worker"), []).append(t["started_unix"])
        if None not in by_worker:  # within one agent-loop worker: its event loop starts its trajectories one by one
            out["timing/trajectory_starts_in_worker_s"] = max(max(v) - min(v) for v in by_worker.values())
    sent = [t for t in timings if "first_request_unix" in t]  # a failed episode sent none
    if sent:
        firsts = [t["first_request_unix"] for t in sent]
        out["timing/request_starts_s"] = max(firsts) - min(firsts)
        if all("started_unix" in t for t in sent):
            out["timing/before_first_request_s"] = max(t["first_request_unix"] - t["started_unix"] for t in sent)
    return out


def our_metrics(data: dict[str, Any]) -> dict[str, Any]:
    """Our names for verl's step metrics that have one: timing_s/<phase> -> timing/<phase>_s, async/*."""
    out = {}
    for key, value in data.items():
        if key in ASYNC_NAMES:
            out[ASYNC_NAMES[key]] = value
        elif key.startswith("timing_s/"):
            phase = key.split("/", 1)[1]
            out[f"timing/{TIMING_NAMES.get(phase, phase)}_s"] = value
    return out


class RunDirLogger:
    """A verl `Tracking` backend that writes our metrics.jsonl and rollouts (module docstring)."""

    def __init__(self, config: dict[str, Any]):
        from rl_factory.tracking import JsonlLogger

        from rl_factory.config import parse

        ours = parse(config["rl_factory"])  # our config as the launcher handed it on (once: one logger a run)
        self.out_dir = Path(ours.trainer.output_dir)
        self.threshold = float(ours.reward.success_threshold)
        self.report = bool(ours.trainer.report)
        self.checkpoints = Path(config["trainer"].get("default_local_dir") or self.out_dir / "checkpoints")
        self.resume = None if config["trainer"].get("resume_mode") == "disable" else _resume_step(config)
        if self.resume is not None:
            drop_unfinished(self.out_dir, self.resume)
        self.jsonl = JsonlLogger(self.out_dir, None, self.resume)
        self.arena = ArenaMetrics(self.out_dir)
        from rl_factory.guard.lines import LineGuard

        self.guard = LineGuard(ours, self.out_dir)  # the run guard, on the step's rollouts lines
        self._train: list[dict[str, Any]] = []
        if self.resume is not None:
            self.guard.resume(self.checkpoints, self.resume - 1)  # the checks' state saved with that checkpoint
            self._recover(self.resume - 1)

    def log(self, data: dict[str, Any], step: int) -> None:
        startup.step_logged(data)  # the first training step's line ends the start-up record (startup.json)
        self._train = []
        line = {**self._ours(data, step)}
        line.update({k: v for k, v in data.items() if k not in line})
        if self._train:
            line.update(self.guard.after_step(step, line, self._train))
            self.guard.save(step, self.checkpoints)  # before the line: a logged step always left its state
        if self.resume is not None and step < self.resume:
            self._merge(line, step)  # the resumed run's validation of the checkpoint it restored
        else:
            self.jsonl.log(line, step=step)
        self.guard.enforce()  # a `stop` check fired: GuardStop ends verl's trainer (exit code 3)
        if any(key.startswith("val/") for key in line):  # as the embedded trainer: at every validation
            from rl_factory.run import RunDir

            RunDir(self.out_dir).write_report(self.report)

    def _ours(self, data: dict[str, Any], step: int, train: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        from rl_factory.evaluate import summarize_records

        metrics: dict[str, Any] = {}
        if train is None:
            train = gather(self.out_dir, "train", step) + gather_late(self.out_dir, step)
        self._train = train
        if train:
            metrics.update(summarize_records(train, self.threshold))
            metrics.update(tool_counts(train))
            metrics.update(trajectory_timing(train))
            metrics.update(self.arena.step(step))  # the group stage's per-worker lines (group.py)
        if any(key.startswith("val-") for key in data):
            val = gather(self.out_dir, "val", step)
            metrics.update({f"val/{k}": v for k, v in summarize_records(val, self.threshold).items()})
        metrics.update(our_metrics(data))
        return metrics

    def _recover(self, step: int) -> None:
        """The restored checkpoint's step, if the killed run saved it but never logged it: our metrics
        from its rollouts (verl's own metrics of that step are lost with the process). The guard checks it
        again when its state after that step was not saved (`LineGuard.pending`)."""
        path = self.jsonl.path
        logged = next((r for r in read_records(path, torn_ok=True) if r.get("step") == step), None)
        recheck = self.guard.pending == step
        if logged is not None and not recheck:
            return
        train = gather(self.out_dir, "train", step)  # killed between its checkpoint and its log
        done = self.out_dir / "rollouts" / f"step_{step:06d}.jsonl"
        if not train and done.exists():  # killed between gathering and writing the line
            train = read_records(done)
        if not train:
            return
        line = logged if logged is not None else self._ours({}, step, train)
        if recheck:  # a stop it finds ends the run at the next log, as it would have at this step's
            line = {**line, **self.guard.after_step(step, line, train)}
            self.guard.save(step, self.checkpoints)
        if logged is None:
            self.jsonl.log(line, step=step)

    def _merge(self, line: dict[str, Any], step: int) -> None:
        """Step `step`'s line gets the keys it lacks (or is written, if nothing of that step is left)."""
        from rl_factory.tracking import JsonlLogger, _json_value

        self.jsonl.close()
        path = self.jsonl.path
        records = read_records(path)
        old = next((r for r in records if r.get("step") == step), None)
        line = {k: _json_value(v) for k, v in line.items() if k != "step"}
        if old is None:
            records.append({"step": step, **line})
            records.sort(key=lambda r: r.get("step", 0))
        else:
            old.update({k: v for k, v in line.items() if k not in old})
        write_atomic(path, "".join(json.dumps(r, default=str) + "\n" for r in records))
        self.jsonl = JsonlLogger(self.out_dir, None, None)

    def finish(self) -> None:
        self.jsonl.close()


def _resume_step(config: dict[str, Any]) -> int | None:
    """The step a resumed verl run continues after (its last checkpoint), so metrics.jsonl keeps each step once."""
    ckpt_dir = Path(config["trainer"]["default_local_dir"])
    marker = ckpt_dir / "latest_checkpointed_iteration.txt"
    try:
        return int(marker.read_text().strip()) + 1
    except (OSError, ValueError):
        return None


def drop_unfinished(out_dir: Path, resume: int) -> None:
    """What a killed run left of the steps a resumed run does again (>= `resume`): parts and arena rows.

    Run when the resumed run's logger starts, before any of its workers writes (verl builds the logger
    before it validates or rolls out). Step `resume - 1`'s train parts stay: that step finished (its
    checkpoint is what was restored) but may not have been logged. Its validation parts go: verl
    validates that step again.
    """
    parts = out_dir / PARTS_DIR
    for part in parts.glob("*_step_*") if parts.is_dir() else []:
        split, _, number = part.name.rpartition("_step_")
        if number.isdigit() and (int(number) >= resume or (split == "val" and int(number) == resume - 1)):
            shutil.rmtree(part, ignore_errors=True)
    for where in ("arena", "pipeline"):  # the group stage's per-worker files (group.py, pipeline.py)
        for path in (out_dir / where).glob("*/*"):
            if path.suffix == ".csv":
                _keep_rows(path, resume, csv_rows=True)
            elif path.suffix == ".jsonl":
                _keep_rows(path, resume, csv_rows=False)


def _keep_rows(path: Path, resume: int, csv_rows: bool) -> None:
    lines = path.read_text(encoding="utf-8").split("\n")  # rl_factory.jsonl: "\n" is the only separator
    if csv_rows:  # header, then rows whose first column is the step
        kept = lines[:1] + [x for x in lines[1:] if not x.split(",", 1)[0].isdigit() or int(x.split(",", 1)[0]) < resume]
    else:
        kept = [x for x in lines if _step_of(x) is None or _step_of(x) < resume]
    if len(kept) != len(lines):
        write_atomic(path, "\n".join(kept))


def _step_of(line: str) -> int | None:
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def install(tracking_cls: Any) -> None:
    """Teach verl's `Tracking` the `rl_factory` backend (called by our plugin in every verl process)."""
    if LOGGER_NAME in tracking_cls.supported_backend:
        return
    tracking_cls.supported_backend = [*tracking_cls.supported_backend, LOGGER_NAME]
    original_init = tracking_cls.__init__

    def __init__(self, project_name, experiment_name, default_backend="console", config=None):
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        original_init(self, project_name, experiment_name, [b for b in backends if b != LOGGER_NAME], config)
        if LOGGER_NAME in backends and config is not None and "rl_factory" in config:
            self.logger[LOGGER_NAME] = RunDirLogger(config)

    tracking_cls.__init__ = __init__
