"""Where a verl launch spends its time before the first step: `<output_dir>/startup.json`, on every run.

A verl launch starts in three processes before any step: the launcher (our checks, the data), the driver's
Ray, and verl's TaskRunner actor, which builds the trainer (worker groups, FSDP, vLLM servers, reward and
agent-loop workers). Each records marks, wall-clock times (`time.time()`: comparable across processes, and
across nodes as far as their clocks agree): the launcher's (`Clock`, handed to the TaskRunner with its
constructor, `StampedRunner`); the TaskRunner's, from our TaskRunner (runner.py) and `StartupTrainer` in front
of verl's trainer class, which marks verl's stages where verl exposes them as separate calls or as the
attribute each stage assigns (`WATCHED`, in `PPOTrainer._setup`'s order; a test reads verl's source for each);
and the end of the first training step, when our metrics logger sees its line (run_dir.RunDirLogger).

Each mark is an event; the phase named in EVENTS is the time since the mark before it (marks that did not
happen are absent, and the next phase takes their time). startup.json is rewritten at each TaskRunner mark,
so a launch killed or failed before its first step still shows where it was; `complete` is true once the
first step's line is logged. Nothing here imports verl or Ray.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from rl_factory.base.files import write_atomic

log = logging.getLogger("rl_factory.verl")

FILE = "startup.json"
# event -> the phase that ends with it (what ran since the previous mark), in the order they happen
EVENTS = {
    # the launcher's process
    "process_started": None,  # the first mark: the process's own start time (`main_grpo.sh` execs python)
    "launcher_entered": "cli",  # interpreter start, imports, our Hydra config composed, logging set up
    "verl_imported": "import_verl",  # verl (and torch) imported, our plugin registered
    "config_checked": "config",  # plugin and capability checks, run-directory claim, verl config composed
    # (tuning, a builtin model built) and checked as verl's workers would
    "data_written": "data",  # our data in verl's Parquet layout, each row's reward columns checked
    "run_ppo_called": "environment_checks",  # GPU count, rollout engine, trl; config.yaml and run.json
    "ray_initialized": "ray_init",  # verl's run_ppo: ray.init (a local cluster, or joining RAY_ADDRESS's)
    # verl's TaskRunner actor
    "task_runner_started": "task_runner_start",  # the actor's process started, verl imported there
    "task_runner_run": "task_runner_call",
    "agent_loops_prestarted": "agent_loop_prestart",  # agent-loop workers and router asked of Ray (prestart.py)
    # verl prints and resolves the config (TransferQueue starts in the background: `beside`, transfer_queue_start.py)
    "trainer_constructing": "trainer_config",
    "trainer_constructed": "trainer_construct",
    "tokenizer_loaded": "tokenizer",
    "dataloader_built": "dataloader",  # verl's RLHFDataset over our Parquet files
    "resource_pools_created": "resource_pools",  # Ray placement groups for the GPUs
    "workers_spawned": "worker_spawn",  # the FSDP worker group's actors started
    "critic_initialized": "critic_init",
    "actor_initialized": "actor_init",  # the actor's (and a LoRA run's reference) model built under FSDP
    "ref_initialized": "ref_init",
    "reward_workers_started": "reward_workers",
    "teachers_started": "teachers",
    "rollout_servers_started": "rollout_servers",  # vLLM servers: engine, weights, torch.compile, CUDA graphs
    "router_adopted": "router_adopt",  # the request router started early takes the servers (prestart.py)
    "checkpoint_engine_ready": "checkpoint_engine",
    "rollout_asleep": "rollout_sleep",  # verl puts the replicas to sleep before loading a checkpoint
    "checkpoint_loaded": "checkpoint_load",  # a resumed run's checkpoint (else ~0)
    "weights_synced": "weight_sync",  # the trainer's `on_init_end`: actor weights into vLLM
    "agent_loops_started": "agent_loop_manager",  # agent-loop workers (ours: their MCP servers) started
    "loggers_ready": "loggers",  # verl's Tracking, our metrics logger among its backends
    "validated": "validation",  # `trainer.val_before_train`
    "training_started": "train_begin",  # re-issued prompts, async warm-up batches
    # step 1, split where verl's trainer calls out: what its own timers (`timing_s/*`) leave out shows as the
    # difference between a phase here and the step's timers
    "first_batch_queued": "first_prepare",  # the first batch read from the data and queued for the rollout
    "first_rollout_done": "first_rollout",  # its rollouts sampled from the replay buffer (vLLM put to sleep)
    "first_update_done": "first_train",  # balance, old log-probs, advantages, the actor's update
    "first_step_done": "first_step_end",  # the first weight sync (and a checkpoint, where one is due)
    "first_step_logged": "first_step_log",  # step 1's metrics (and any validation at it) computed
}

_clock: Clock | None = None  # this process's, where one is started (the launcher's, the TaskRunner's)


def process_start_time() -> float | None:
    """This process's start as wall-clock time (Linux /proc; None elsewhere), ~10 ms resolution."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of proc(5)
        since = time.clock_gettime(time.CLOCK_BOOTTIME) - started_after_boot
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - since


class Clock:
    """Marks of one launch: event -> time.time(), the first of each kept, in the order they happened."""

    def __init__(self, marks: dict[str, float] | None = None, path: str | Path | None = None):
        self.marks = dict(marks or {})
        self.path = Path(path) if path is not None else None
        self.done = False
        self.beside: dict[str, float] = {}  # what ran beside the marked stages, not between two marks: seconds

    def mark(self, event: str, write: bool = True) -> None:
        if event not in EVENTS:
            raise KeyError(f"unknown start-up event {event!r} (known: {', '.join(EVENTS)})")
        if self.done or event in self.marks:
            return
        self.marks[event] = time.time()
        if write and self.path is not None:
            self.write()

    def record(self, error: str | None = None) -> dict[str, Any]:
        out = record(self.marks, complete=self.done, error=error)
        if self.beside:
            out["beside"] = dict(self.beside)
        return out

    def write(self, error: str | None = None) -> dict[str, Any]:
        out = self.record(error)
        try:  # the launcher and the TaskRunner both write it: write_atomic's temp name carries the pid
            write_atomic(self.path, json.dumps(out, indent=1) + "\n")
        except OSError as exc:  # a record is no reason to stop the run
            log.warning("start-up record %s not written: %s", self.path, exc)
        return out

    def finish(self, event: str) -> dict[str, Any]:
        """The last mark: the record is complete, written, and logged as one line."""
        self.mark(event, write=False)
        self.done = True
        out = self.write() if self.path is not None else self.record()
        print(f"[rl_factory] start-up: {summary(out)}", flush=True)  # the TaskRunner's stdout reaches the driver's
        return out


def record(marks: dict[str, float], complete: bool = False, error: str | None = None) -> dict[str, Any]:
    """startup.json's content: phase -> seconds (each since the mark before it), totals and the raw marks."""
    events = list(marks)
    phases = {EVENTS[b] or b: round(marks[b] - marks[a], 3) for a, b in zip(events, events[1:])}
    first = marks[events[0]] if events else None

    def between(start: str | None, end: str) -> float | None:
        begun = first if start is None else marks.get(start)
        return round(marks[end] - begun, 3) if end in marks and begun is not None else None

    out = {"complete": complete, "host": socket.gethostname(),
           "launch_to_first_step_s": between(None, "first_step_logged"),
           "before_training_s": between(None, "training_started"),
           "first_step_s": between("training_started", "first_step_logged"),
           # the launcher's own part, and verl's trainer.init() as a whole (worker groups to the first weight sync)
           "launcher_s": between(None, "run_ppo_called"), "trainer_init_s": between("trainer_constructed", "weights_synced"),
           "phases": phases, "marks": {k: round(v, 3) for k, v in marks.items()}}
    if error:
        out["error"] = error
    return out


def summary(out: dict[str, Any], top: int = 6) -> str:
    """One line: the total to the first step and the longest phases."""
    total = out.get("launch_to_first_step_s")
    head = f"{total:.0f} s to the first step's end" if total is not None else "incomplete"
    longest = sorted(out["phases"].items(), key=lambda kv: -kv[1])[:top]
    return f"{head}; longest: " + ", ".join(f"{k} {v:.1f} s" for k, v in longest)


# ---- the launcher's process ---------------------------------------------------------------------

_launched = False


def launcher_clock() -> Clock:
    """A launch's clock, from the process's start for the first launch of this process (from now for a later
    one, as in a test): the launcher's first call."""
    global _launched
    started = None if _launched else process_start_time()
    _launched = True
    clock = Clock({"process_started": started} if started is not None else None)
    clock.mark("launcher_entered", write=False)
    return clock


class StampedRunner:
    """The TaskRunner actor class as verl's run_ppo receives it: when run_ppo creates the actor (Ray is up by
    then), the clock marks `ray_initialized` and the actor gets the launcher's marks with its constructor."""

    def __init__(self, actor_class: Any, clock: Clock, options: dict[str, Any] | None = None):
        self.actor_class, self.clock, self._options = actor_class, clock, options

    def options(self, **kwargs: Any) -> StampedRunner:  # run_ppo's nsys profiling path
        return StampedRunner(self.actor_class, self.clock, kwargs)

    def remote(self) -> Any:
        self.clock.mark("ray_initialized")
        cls = self.actor_class.options(**self._options) if self._options else self.actor_class
        return cls.remote(self.clock.marks)


# ---- verl's TaskRunner process -------------------------------------------------------------------

def task_runner_clock(marks: dict[str, float] | None) -> Clock:
    """The TaskRunner's clock: the launcher's marks, then its own (`task_runner_started` first)."""
    global _clock
    _clock = Clock(marks)
    _clock.mark("task_runner_started")
    return _clock


def write_to(output_dir: str | Path | None) -> None:
    """From now on this process's clock rewrites `<output_dir>/startup.json` at each mark."""
    if _clock is not None and output_dir:
        _clock.path = Path(output_dir) / FILE


def mark(event: str) -> None:
    """Mark `event` on this process's clock (nothing where none was started)."""
    if _clock is not None:
        _clock.mark(event)


def beside(name: str, seconds: float | None) -> None:
    """`name` ran for `seconds` beside the marked stages (TransferQueue's start, in the background): recorded under
    `beside`, outside the phases, which add up to the launch."""
    if _clock is not None and seconds is not None and not _clock.done:
        _clock.beside[name] = seconds
        if _clock.path is not None:
            _clock.write()


def failed(exc: BaseException) -> None:
    """The launch stopped before its first step: the record says where, and why."""
    if _clock is not None and not _clock.done and _clock.path is not None:
        _clock.write(error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500])


def step_logged(data: dict[str, Any]) -> None:
    """Our metrics logger got a line: the first training step's (verl times every step: `timing_s/step`)
    completes the record; validation before training logs without it."""
    if _clock is not None and not _clock.done and "timing_s/step" in data:
        _clock.finish("first_step_logged")


def _wrapped(obj: Any, name: str, before: str | None, after: str | None) -> None:
    """`obj.name(...)` marks `before` on entry and `after` on return (on this instance only)."""
    call = getattr(obj, name, None)
    if not callable(call):
        return

    def timed(*args, **kwargs):
        if before:
            mark(before)
        result = call(*args, **kwargs)
        if after:
            mark(after)
        return result

    try:
        setattr(obj, name, timed)
    except (AttributeError, TypeError):  # a handle that takes no attributes: its stage goes unmarked
        pass


# verl's PPOTrainer._setup assigns these in this order, each right after the stage that built it: attribute ->
# (event marked on assignment, or None; the handle's method to time, its entry and return events)
WATCHED: dict[str, tuple[str | None, tuple[str, str | None, str] | None]] = {
    "resource_pool_to_cls": ("resource_pools_created", None),
    "critic_wg": ("workers_spawned", ("reset", None, "critic_initialized")),
    "actor_rollout_wg": (None, ("init_model", "workers_spawned", "actor_initialized")),
    "ref_policy_wg": (None, ("init_model", None, "ref_initialized")),
    "reward_loop_manager": ("reward_workers_started", None),
    "teacher_model_manager": ("teachers_started", None),
    "llm_server_manager": ("rollout_servers_started", None),
    "checkpoint_manager": ("checkpoint_engine_ready", ("sleep_replicas", None, "rollout_asleep")),
    "logger": ("loggers_ready", None),  # fit's Tracking
}


class StartupTrainer:
    """In front of a verl V1 trainer class: marks its start-up stages (EVENTS) on this process's clock."""

    def __init__(self, config):
        mark("trainer_constructing")
        super().__init__(config)
        mark("trainer_constructed")

    def __setattr__(self, name: str, value: Any) -> None:
        watched = WATCHED.get(name)
        if watched is not None and value is not None and not (name == "ref_policy_wg" and value is getattr(
                self, "actor_rollout_wg", None)):  # a reference inside the actor starts with it
            event, call = watched
            if call is not None:
                _wrapped(value, *call)
            if event is not None:
                mark(event)
        super().__setattr__(name, value)

    def _init_tokenizer(self):
        super()._init_tokenizer()
        mark("tokenizer_loaded")

    def _init_dataloader(self):
        super()._init_dataloader()
        mark("dataloader_built")

    def _load_checkpoint(self):
        from rl_factory.backends.verl import transfer_queue_start

        transfer_queue_start.ready()  # a resumed run restores TransferQueue's state here
        super()._load_checkpoint()
        mark("checkpoint_loaded")

    def init(self):
        super().init()
        mark("weights_synced")  # on_init_end (sync and colocated async: the first weight sync) has run

    def on_validate_end(self):
        super().on_validate_end()
        if not getattr(self, "_startup_training", False):  # the validation before training, not a later one
            mark("validated")

    def on_train_begin(self):
        super().on_train_begin()
        self._startup_training = True
        mark("training_started")

    def prepare_step(self):
        out = super().prepare_step()
        mark("first_batch_queued")  # the first one only: a clock keeps each event's first time
        return out

    def on_sample_end(self):
        super().on_sample_end()
        mark("first_rollout_done")

    def _update_actor(self, *args, **kwargs):
        out = super()._update_actor(*args, **kwargs)
        mark("first_update_done")
        return out

    def on_step_end(self):
        super().on_step_end()
        mark("first_step_done")
