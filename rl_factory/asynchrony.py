"""Off-policy asynchronous training on the embedded backend: rollouts of later steps run while a step trains.

`trainer.max_staleness=k` (0 = on-policy: this module is not used at all, the trainer's own path runs).
Policy version v is the weights after v updates; step s trains from version s - 1 and makes version s.

- **Ahead of the trainer.** `Ahead` collects the batches of steps s + 1, s + 2, ... in a background task
  with the run's one `RolloutPipeline` (filters, dynamic sampling and arena tournaments included: a batch
  is collected whole, so a group always meets complete). Step s's batch may start once version
  s - 1 - k exists, so a trajectory is trained at most k versions after the version of its first token;
  with k = 0 that is exactly the on-policy order. Batches overlap: step s + 1's starts as soon as the bound
  allows, while step s's trajectories still wait on their tools, and the engine admits the older step's
  turns first (`SamplingParams.priority`). Each batch draws its prompts when it starts, so the sampler
  stays in step order; with dynamic sampling (later rounds draw mid-batch) batches run one at a time.
  The update runs in a worker thread, on the cores the decode thread leaves (`update_threads`), so that
  the event loop (tool calls, parsing, rewards) keeps serving the rollouts meanwhile.
- **Weights reach the generator.** The engine generates from its own copy of the model (for LoRA the whole
  peft model; only the trainable tensors, the adapters, travel). After each update the trainable tensors
  are cloned (`snapshot`) and handed to the engine, whose decode thread copies them in between two decode
  steps (`HFEngine.swap_weights`). With `trainer.partial_rollouts=true` (the default) a running trajectory
  continues with the new weights from its next token (its cache stays: the tokens before were computed by
  the old weights, as in AReaL's interruptible rollouts); with `false` new weights wait until no trajectory
  is running (`TrajectoryGate`), and trajectories that would start meanwhile wait for them, so each
  trajectory is sampled by one version.
- **Every token span records its version**: `Turn.version_spans`, the rollout line's `policy_versions`.
- **Exactly-once resume.** Batches are drawn from the one `PromptSampler` in step order; the sampler state
  saved with the checkpoint of step s is the one before step s + 1's batch was drawn
  (`sampler_state(s)`), not the sampler's current one, which has run ahead. A resumed run therefore draws
  the batches of the steps after the checkpoint again and regenerates their samples (with the weights of
  the checkpoint): nothing in flight is lost, nothing is trained twice. Episodes in flight are not
  snapshotted; they are reopened from their sample.

Metrics (each step): async/staleness/mean|max (versions between a trained trajectory's first token and
the weights it trains), async/version_spans/mean (versions per trajectory; 1 = one policy sampled it),
async/batches_in_flight (batches being collected when this step's started, itself included),
timing/generator_idle_s (the background collector waited for the staleness bound) and
timing/trainer_idle_s (the trainer waited for its batch).

Not bit-reproducible: where a swap falls in a trajectory depends on timing (k = 0 stays reproducible).
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import Callable

import torch

from rl_factory.guard.fingerprint import weight_fingerprint
from rl_factory.base.types import Trajectory

log = logging.getLogger("rl_factory")


def snapshot(model) -> dict[str, torch.Tensor]:
    """Copies of the trainable tensors of `model` (every weight; under LoRA the adapters)."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def generator_copy(model):
    """The engine's own model: a frozen copy of the policy that updates reach only through `load_into`."""
    twin = copy.deepcopy(model).eval()
    for p in twin.parameters():
        p.requires_grad_(False)
    return twin


def load_into(model, tensors: dict[str, torch.Tensor]) -> None:
    """Copy `tensors` (a `snapshot`) into `model`'s parameters of the same names."""
    params = dict(model.named_parameters())
    missing = sorted(set(tensors) - set(params))
    if missing:
        raise KeyError(f"the generator's model has no parameter {missing[0]!r}")
    with torch.no_grad():
        for name, value in tensors.items():
            params[name].copy_(value)


class TrajectoryGate:
    """New weights only between trajectories (`trainer.partial_rollouts=false`).

    Every episode runs inside `trajectory()`. `publish(apply)` marks a swap as waiting: trajectories that
    start from then on wait; once the running ones are done, `apply()` runs and the waiting ones go on.
    """

    def __init__(self):
        self.running = 0
        self._pending: Callable[[], None] | None = None
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def trajectory(self):
        async with self._changed:
            await self._changed.wait_for(lambda: self._pending is None)
            self.running += 1
        try:
            yield
        finally:
            async with self._changed:
                self.running -= 1
                self._flush()
                self._changed.notify_all()

    async def publish(self, apply: Callable[[], None]) -> None:
        async with self._changed:
            self._pending = apply
            self._flush()
            self._changed.notify_all()

    def _flush(self) -> None:
        if self._pending is not None and self.running == 0:
            apply, self._pending = self._pending, None
            apply()


class Ahead:
    """Collects the batches of later steps while a step trains (module docstring).

    Args:
        pipeline: the run's `RolloutPipeline` (`collect(step)`).
        sampler: its `PromptSampler` (its state before each batch is kept for checkpoints).
        agent: the rollout agent; its engine gets its own copy of `policy.model`.
        policy: the trained policy.
        max_staleness: k >= 1.
        partial: swap weights between tokens of running trajectories (True) or between trajectories.
        step: the last step done (0, or the checkpoint's step on resume); its weights are version `step`.
        total_steps: the last step to collect.
    """

    def __init__(self, pipeline, sampler, agent, policy, max_staleness: int, partial: bool, step: int,
                 total_steps: int):
        self.pipeline, self.sampler, self.agent, self.policy = pipeline, sampler, agent, policy
        self.k, self.partial, self.total_steps = max_staleness, partial, total_steps
        self.version = step
        self.engine = agent.engine
        self.engine.model = generator_copy(policy.model)
        self.engine.tracks_versions = True  # from now on each swap stamps the version (and the run guard's receipt)
        self.engine.version, self.engine.weights = step, weight_fingerprint(self.engine.model)
        self.gate = None if partial else TrajectoryGate()
        agent.gate = self.gate
        self._first = step + 1
        self._batches: dict[int, asyncio.Future] = {}
        self._states: dict[int, dict] = {}
        self._in_flight: dict[int, int] = {}  # batches being collected when each step's started (itself included)
        self._versions = asyncio.Condition()
        self._task: asyncio.Task | None = None
        self.generator_idle_s = 0.0
        self.trainer_idle_s = 0.0
        self._threads = update_threads(self.engine)

    async def __aenter__(self) -> Ahead:
        return self

    async def __aexit__(self, *exc) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def batch(self, step: int):
        """Step `step`'s batch, collected ahead (waits for it if it is not done yet)."""
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._batches = {s: loop.create_future() for s in range(self._first, self.total_steps + 1)}
            self._task = asyncio.create_task(self._collect_ahead(), name="rl_factory-ahead")
        start = time.perf_counter()
        batch = await self._batches[step]
        self.trainer_idle_s += time.perf_counter() - start
        return batch

    async def _collect_ahead(self) -> None:
        step = self._first
        running: set[asyncio.Task] = set()
        try:
            for step in range(self._first, self.total_steps + 1):
                start = time.perf_counter()
                async with self._versions:  # the staleness bound: version step - 1 - k must exist
                    await self._versions.wait_for(lambda: self.version >= step - 1 - self.k)
                self.generator_idle_s += time.perf_counter() - start
                if any(f.done() and f.exception() is not None for f in self._batches.values()):
                    return  # an earlier batch failed: the trainer stops at it
                self._states[step] = self.sampler.state_dict()
                self._in_flight[step] = len(running) + 1
                collecting = self._deliver(step, self.pipeline.start(step))  # its prompts are drawn here
                if self.pipeline.one_draw:
                    # Run it beside the batches still collecting: its trajectories decode while theirs wait
                    # on tools. Its prompts are drawn, so the sampler stays in step order.
                    task = asyncio.create_task(collecting, name=f"rl_factory-batch-{step}")
                    running.add(task)
                    task.add_done_callback(running.discard)
                else:  # dynamic sampling draws more rounds mid-batch: one batch at a time keeps step order
                    await collecting
            await asyncio.gather(*running)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the trainer awaiting this step (or a later one) raises it
            for s in range(step, self.total_steps + 1):
                if not self._batches[s].done():
                    self._batches[s].set_exception(exc)
        finally:
            for task in list(running):
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _deliver(self, step: int, collecting) -> None:
        """Step `step`'s batch (or its error) to the trainer waiting for it."""
        try:
            self._batches[step].set_result(await collecting)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._batches[step].set_exception(exc)

    async def update(self, run: Callable[[], dict[str, float]], step: int) -> dict[str, float]:
        """Run the update `run()` in a worker thread (rollouts go on meanwhile), then publish version `step`."""
        def in_thread() -> dict[str, float]:
            torch.set_num_threads(self._threads)  # torch's thread count is per thread
            return run()

        metrics = await asyncio.to_thread(in_thread)
        await self.publish(step)
        return metrics

    async def publish(self, version: int) -> None:
        """Hand the policy's current weights to the generator as `version`."""
        tensors = snapshot(self.policy.model)
        model = self.engine.model

        def swap() -> None:
            self.engine.swap_weights(version, lambda: load_into(model, tensors))

        if self.gate is not None:
            await self.gate.publish(swap)
        else:
            swap()
        async with self._versions:
            self.version = version
            self._versions.notify_all()

    def sampler_state(self, step: int) -> dict:
        """The sampler state a checkpoint of `step` keeps: before step + 1's batch was drawn."""
        state = self._states.get(step + 1)
        return dict(state) if state is not None else self.sampler.state_dict()

    def metrics(self, trajs: list[Trajectory], step: int) -> dict[str, float]:
        """async/* and idle times of the step that trains `trajs` (from version step - 1)."""
        trained = step - 1
        spans = [t.version_spans for t in trajs]
        stale = [trained - s[0][0] for s in spans if s]
        out = {"timing/generator_idle_s": self.generator_idle_s, "timing/trainer_idle_s": self.trainer_idle_s,
               "async/batches_in_flight": float(self._in_flight.pop(step, 1))}
        self.generator_idle_s = self.trainer_idle_s = 0.0
        if stale:
            out.update({"async/staleness/mean": sum(stale) / len(stale), "async/staleness/max": float(max(stale)),
                        "async/version_spans/mean": sum(len(s) for s in spans if s) / len(stale)})
            if max(stale) > self.k:  # the bound is this module's promise: never train past it silently
                raise RuntimeError(f"step {step}: a trajectory is {max(stale)} versions stale, past "
                                   f"trainer.max_staleness={self.k}")
        return out


def update_threads(engine) -> int:
    """torch threads for the update, which now runs while the engine decodes: the cores the decode thread
    leaves (`HFEngine.threads`: all but one by default), at least one. On two cores the update on two threads
    beside a one-thread decode put three busy threads on two cores, and each of torch's parallel regions
    waited at its barrier for a thread the OS had put aside: the update took 2.5-4x its on-policy time
    (0.42-0.69 s against 0.15-0.17 s, the default job on 2 cores, benchmarks/async_training.py)."""
    total = torch.get_num_threads()
    decode = getattr(engine, "threads", 0)
    if decode and getattr(engine, "threads_auto", False) and not getattr(engine, "started", True) and total > 2:
        engine.threads = decode = max(1, total // 2)  # not started yet: split the cores between the two
    return max(1, total - decode) if decode else total


def build_ahead(max_staleness: int, partial: bool, pipeline, sampler, agent, policy, step: int,
                total_steps: int) -> Ahead | None:
    """The collector for `trainer.max_staleness` > 0, else None (the trainer's on-policy path)."""
    if max_staleness <= 0:
        return None
    log.info("async training: rollouts run up to %d policy version(s) ahead of the update (%s)", max_staleness,
             "weights swapped between tokens" if partial else "weights swapped between trajectories")
    return Ahead(pipeline, sampler, agent, policy, max_staleness, partial, step, total_steps)
