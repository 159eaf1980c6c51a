"""`RLFactoryAgentLoop`: our rollout, MCP tools and parsers as a verl agent loop.

verl creates one agent-loop object per trajectory inside its AgentLoopWorker Ray actors and calls
`run(sampling_params, **dataset_fields)`; generation goes through `server_manager.generate` (token ids
in, token ids and log-probs out, vLLM or SGLang behind it). We run the same `Agent.rollout` as the
embedded backend on top of that: prompt ids rendered once with the *full* JSON schemas of the
manifest's tools (verl's own tool schema model drops nested fields), generated ids appended verbatim,
tool observations appended as chat-template deltas with mask 0. The result is verl's
`AgentLoopOutput` with exactly those ids, the mask and the sampling log-probs.

What lives per worker process (`WorkerState`, built on the first trajectory and shared by all): the
tool env (stdio servers are started here, once per AgentLoopWorker; HTTP servers are just URLs),
the chat format, the parser, and for ArenaRL the group rendezvous. The per-trajectory object stays
cheap, as verl requires.

One episode per verl session (envs.episode): the session's trajectory runs in its own episode, opened
here, so `scope: episode` servers start in the worker that runs the session. When episodes hold state
(`scope: episode` servers or `env.environment`), verl's reward worker (another process) could not reach
them, so the loop scores the trajectory itself, through the run's `Scorer` with the episode's tools,
before the episode closes, and hands verl the score as `reward_score` (as the ArenaRL rendezvous does;
verl then skips its reward worker). A session whose episode fails returns one output that trains no
token (`rl_factory_dropped`), left out of its group by our estimators.

Settings come from the `rl_factory` node of verl's config (our whole composed config, `self.config`
in every agent loop), parsed once per worker process (`rl_factory.config.parse`, in `WorkerState`), so
the agent-loop YAML needs no arguments.
"""
from __future__ import annotations

import asyncio
import math
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput
from verl.experimental.agent_loop.tool_agent_loop import SPEC_DECODE_EXTRA_KEYS

from envs import get_parser
from rl_factory.backends.verl import sampling_logprobs
from rl_factory.backends.verl.data import SPLIT_KEY, sample_from_kwargs
from rl_factory.backends.verl.group import ArenaGroups
from rl_factory.backends.verl.pipeline import GROUP_KEY, augmented, finish_outputs, group_stage
from rl_factory.backends.verl.records import RECORD_KEY, to_record
from rl_factory.backends.verl.reward import score_result
from rl_factory.backends.verl.run_dir import write_part
from rl_factory.chat import ChatFormat
from rl_factory.components import loop_config, open_env
from rl_factory.config import parse
from rl_factory.engines.base import Generation, SamplingParams
from rl_factory.evaluate import trajectory_record
from rl_factory.pipeline import build_augmenters
from rl_factory.guard.evidence import receipt, trajectory_evidence
from rl_factory.rollout import Agent, RolloutConfig
from rl_factory.base.types import EPISODE_FAILED, Trajectory
from rewards.scorer import build_scorer

AGENT_NAME = "rl_factory"


class ServerEngine:
    """Our `Engine` interface over verl's LLM server client (one request id per trajectory).

    The same request id on every turn lets verl route a trajectory's turns to the same server
    (prefix-cache reuse). verl's sampling params (train or validation, greedy overrides) are the
    base; the per-turn token budget is ours.
    """

    def __init__(self, server_manager: Any, sampling_params: dict[str, Any], stop_ids: set[int],
                 max_prompt_tokens: int, sample: Any = None, logprobs: bool = True):
        self.server_manager, self.base, self.stop_ids = server_manager, dict(sampling_params), stop_ids
        self.logprobs = logprobs  # vLLM's log-prob of each sampled token (sampling_logprobs.py)
        self.max_prompt_tokens, self.sample, self.turns = max_prompt_tokens, sample, 0
        self.request_id = uuid.uuid4().hex
        # What the server reports besides tokens, kept as verl's ToolAgentLoop keeps it: the first turn's
        # fields (weight versions, for the async trainers' staleness control), then the latest
        # max_global_steps and summed speculative-decoding counters.
        self.extra: dict[str, Any] = {}
        self.num_preempted = -1
        self.first_request_unix: float | None = None  # when the first turn's request left for the server

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if self.turns == 0 and len(prompt_ids) > self.max_prompt_tokens:  # verl pads prompts to this length
            raise ValueError(f"sample {self.sample}: prompt of {len(prompt_ids)} tokens (tools included) exceeds "
                             f"data.max_prompt_length={self.max_prompt_tokens}")
        self.turns += 1
        sampling = {**self.base, "max_tokens": params.max_new_tokens, "logprobs": self.logprobs}
        if not sampling.get("stop"):
            # verl's server returns token ids only and we decode them ourselves: vLLM's incremental
            # detokenizer (and the text of each sampled log-prob) would be per-token Python work in the
            # server's event loop for text nobody reads. Stop strings are the one thing that needs it.
            sampling.setdefault("detokenize", False)
        if self.first_request_unix is None:
            self.first_request_unix = time.time()
        out = await self.server_manager.generate(request_id=self.request_id, prompt_ids=list(prompt_ids),
                                                 sampling_params=sampling)
        self._record(out)
        ids = list(out.token_ids)
        # none asked for: NaN, which the guard skips and to_outputs hands verl as sampling_logprobs.ABSENT
        logprobs = list(out.log_probs) if out.log_probs is not None else [math.nan] * len(ids)
        # vLLM reports "completed" for both eos and length stops; the last token tells them apart.
        finish = "stop" if ids and ids[-1] in self.stop_ids and out.stop_reason != "aborted" else "length"
        # the run guard's receipt: the ids as the server returned them, and the weight version it generated
        # with (verl's server sets global_steps when an update_weights lands; no weight fingerprint from vLLM)
        fields = out.extra_fields or {}
        version = fields.get("max_global_steps", fields.get("global_steps"))
        return Generation(ids, logprobs, finish, receipt(ids, None if version is None else int(version), None))

    def _record(self, out: Any) -> None:
        if out.num_preempted is not None:
            self.num_preempted = max(self.num_preempted, 0) + out.num_preempted
        if not self.extra:
            self.extra.update(out.extra_fields)
            return
        if out.extra_fields.get("max_global_steps"):
            self.extra["max_global_steps"] = out.extra_fields["max_global_steps"]
        for key in SPEC_DECODE_EXTRA_KEYS:
            if key in out.extra_fields and key in self.extra:
                self.extra[key] = int(self.extra[key]) + int(out.extra_fields[key])

    async def close(self) -> None:
        return None


class WorkerState:
    """What all trajectories of one AgentLoopWorker process share (see the module docstring)."""

    # Keyed by (event loop, config): the tool env's connections belong to the loop that opened them.
    # The entry holds both objects, so neither id can be reused by another object while it is cached.
    _instances: dict[tuple[int, int], tuple[Any, DictConfig, WorkerState]] = {}
    _locks: dict[int, tuple[Any, asyncio.Lock]] = {}

    def __init__(self, loop_cfg: RolloutConfig, env: Any, fmt: ChatFormat, parser: Any, stop_ids: set[int],
                 arena: ArenaGroups | None, output_dir: Path, scorer: Any = None, augmenters: list | None = None):
        self.loop_cfg, self.env, self.fmt, self.parser, self.stop_ids = loop_cfg, env, fmt, parser, stop_ids
        self.arena, self.output_dir = arena, output_dir
        self.scorer = scorer  # scores inside the episode (episodes with state), else None: verl's reward worker
        self.augmenters = augmenters or []  # rollout.augment, built once

    @classmethod
    async def get(cls, config: DictConfig, tokenizer: Any, sample: dict | None = None) -> WorkerState:
        loop = asyncio.get_running_loop()
        key = (id(loop), id(config))
        if key not in cls._instances:
            if cls._locks.get(id(loop), (None,))[0] is not loop:
                cls._locks[id(loop)] = (loop, asyncio.Lock())
            lock = cls._locks[id(loop)][1]
            async with lock:  # the first trajectories of a worker arrive together: build once
                if key not in cls._instances:
                    cls._instances[key] = (loop, config, await cls._build(config, tokenizer, sample))
        return cls._instances[key][2]

    @classmethod
    async def _build(cls, config: DictConfig, tokenizer: Any, sample: dict | None) -> WorkerState:
        ours = parse(config.rl_factory)  # our config, as the launcher handed it on: parsed once per worker
        env_cfg = ours.env
        loop_cfg = loop_config(env_cfg, ours.rollout)
        # verl pads every response to response_length: the whole multi-turn tail must fit in it.
        loop_cfg.max_tail_tokens = config.actor_rollout_ref.rollout.response_length
        output_dir, worker = Path(ours.trainer.output_dir), f"{socket.gethostname()}-{os.getpid()}"
        # The worker's first sample lists the tools of per-episode servers whose launch line names the sample.
        env = await open_env(env_cfg, log_dir=output_dir / "tool_logs" / worker, probe_sample=sample).__aenter__()
        tools = await env.list_tools()  # stdio servers start here, once per worker process
        stop_ids = {tokenizer.eos_token_id, *_generation_eos_ids(config)}
        arena = group_stage(ours, env, output_dir, worker)  # ArenaRL and rollout filters meet here (pipeline.py)
        scorer = build_scorer(ours.reward).use_tools(env) if env.episodic else None
        return cls(loop_cfg, env, ChatFormat(tokenizer, tools), get_parser(env_cfg.parser, tools=tools),
                   {i for i in stop_ids if i is not None}, arena, output_dir, scorer,
                   build_augmenters(ours.rollout.augment))


def _generation_eos_ids(config: DictConfig) -> list[int]:
    """Extra end-of-turn ids from the model's generation_config.json (Qwen3 stops on two ids)."""
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(config.actor_rollout_ref.model.path).eos_token_id
    except (OSError, ValueError):
        return []
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]


class RLFactoryAgentLoop(AgentLoopBase):
    """One trajectory per instance (verl's contract); the heavy state is the process's `WorkerState`."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        sample = sample_from_kwargs(kwargs)
        state = await WorkerState.get(self.config, self.tokenizer, sample)
        validate = kwargs.get(SPLIT_KEY) == "val"
        group = state.arena if state.arena is not None and not validate else None
        uid, session = kwargs.get("uid"), kwargs.get("session_id", 0)
        start, started = time.perf_counter(), time.time()
        try:
            traj, timing = await self._rollout(state, sample, kwargs, sampling_params)
        except BaseException:
            if group is not None:  # the siblings must not wait for this one forever
                await group.submit(uid, session, None, self.rollout_config.n, kwargs.get("global_steps", 0))
            raise
        step, split = int(kwargs.get("global_steps", 0) or 0), "val" if validate else "train"
        failed = traj.dropped_by == EPISODE_FAILED
        # Scored in the episode (episodes with state), else by the group stage or verl's reward worker.
        score = float(traj.reward_info.get("score", 0.0)) if state.scorer is not None else None
        if group is not None:  # ArenaRL / rollout filters: the group stage's score replaces the reward worker
            played = await group.submit(uid, session, None if failed else traj, self.rollout_config.n, step)
            score = 0.0 if failed else played
            if failed:
                traj.reward_info[GROUP_KEY] = float(session)  # never a group of equal keys because of it
        # how long the trajectory took, beside the rollout phase it was part of (the slowest one bounds it), and when
        # it began: the step's trajectories began together only if verl's dispatch and router let them
        spent = {"wall_s": round(time.perf_counter() - start, 4), "generate_s": round(timing["timing/generate_s"], 4),
                 "tools_s": round(timing["timing/tools_s"], 4), "started_unix": round(started, 4),
                 "worker": os.getpid(),
                 **({"first_request_unix": round(timing["first_request_unix"], 4)}
                    if timing.get("first_request_unix") is not None else {})}
        # the run guard's (rl_factory/guard), checked where verl logs the step; `session_key` is the prefix of this
        # session's keys in verl's batch ({uid}_{session}_{output}), where the guard reads what the actor trains
        evidence = {**trajectory_evidence(traj), "session_key": f"{uid}_{session}"}
        if score is not None:  # verl skips its reward worker for this trajectory: its rollouts line is written here
            write_part(state.output_dir, split, step, [{**trajectory_record(traj), "session": session, "score": score,
                                                        "timing": spent, "guard": evidence}])
        traj = await augmented(traj, state.augmenters, validate or failed)  # rollout.augment: one output per view
        outputs = to_outputs(traj, timing, score, self.rollout_config.response_length,
                             record=to_record(traj, step, split, session, spent, guard=evidence))
        # rollout filters, failed episodes: a dropped trajectory trains no token
        return finish_outputs(outputs, traj, scored=score is not None)

    async def _rollout(self, state: WorkerState, sample: dict, kwargs: dict, sampling_params: dict
                       ) -> tuple[Trajectory, dict[str, Any]]:
        cfg = state.loop_cfg
        step = int(kwargs.get("global_steps", 0) or 0)
        engine = ServerEngine(self.server_manager, sampling_params, state.stop_ids,
                              self.rollout_config.prompt_length, kwargs.get("index"),
                              logprobs=sampling_logprobs.wanted(self.config, step, kwargs.get(SPLIT_KEY) == "val"))
        agent = Agent(engine, state.env, state.fmt, state.parser, cfg)
        params = SamplingParams(float(sampling_params.get("temperature", 1.0)),
                                float(sampling_params.get("top_p", 1.0)), cfg.max_response_tokens)
        index = int(kwargs.get("index", 0) or 0)
        # One episode per session, opened in this worker; scored inside it when it holds state.
        traj = await agent.run_episode(sample, index, params, scorer=state.scorer)
        failed = traj.dropped_by == EPISODE_FAILED
        if state.scorer is not None:
            await state.scorer.wait([traj])  # a reward's failure is raised here, naming the sample
            # what verl's reward worker would return (a failed episode keeps its error for the rollouts line)
            traj.reward_info = {**score_result(state.scorer, traj), **(traj.reward_info if failed else {})}
        if failed:  # nothing was generated: one token, trained by no one
            traj.prompt_ids = state.fmt.prompt_ids(sample["messages"])
            traj.token_ids = [*traj.prompt_ids, self.tokenizer.eos_token_id]
            traj.loss_mask, traj.logprobs = [0] * len(traj.token_ids), [0.0] * len(traj.token_ids)
        return traj, {**agent.timing(), "server_extra": engine.extra, "num_preempted": engine.num_preempted,
                      "first_request_unix": engine.first_request_unix}


def to_outputs(traj: Trajectory, timing: dict[str, Any], score: float | None, response_length: int,
               record: str | None = None) -> AgentLoopOutput | list[AgentLoopOutput]:
    """verl's output(s) for one trajectory: one sequence (append policy) or one per turn (step policy).

    The reward travels in `extra_fields` as our trajectory record (for `reward.compute_score`);
    `score` (ArenaRL) is set as `reward_score`, which makes verl skip its reward worker.
    """
    calls = traj.tool_calls
    extra = {**timing.get("server_extra", {}), RECORD_KEY: record or to_record(traj), "tool_calls": len(calls),
             "tool_errors": sum(not r.ok for r in traj.tool_results), "stop_reason": traj.stop_reason}
    metrics = AgentLoopMetrics(generate_sequences=timing.get("timing/generate_s", 0.0),
                               tool_calls=timing.get("timing/tools_s", 0.0),
                               num_preempted=timing.get("num_preempted", -1))
    num_turns = 1 + len(traj.turns) + sum(bool(t.tool_results) for t in traj.turns)
    pieces = [(s.token_ids, s.loss_mask, s.logprobs) for s in traj.steps] or \
        [(traj.token_ids, traj.loss_mask, traj.logprobs)]
    outputs = []
    for k, (ids, mask, logprobs) in enumerate(pieces):
        start = len(traj.prompt_ids) if not traj.steps else mask.index(1) if 1 in mask else len(ids)
        response = ids[start:]
        if len(response) > response_length:
            raise ValueError(f"sample {traj.sample_index}: response of {len(response)} tokens exceeds "
                             f"response_length={response_length}")
        last = k == len(pieces) - 1
        outputs.append(AgentLoopOutput(
            prompt_ids=ids[:start], response_ids=response, response_mask=mask[start:],
            response_logprobs=sampling_logprobs.for_verl(logprobs[start:]), num_turns=num_turns, metrics=metrics,
            reward_score=score if last else None, extra_fields=dict(extra) if last else {}))
    return outputs if traj.steps else outputs[0]


def agent_loop_config_path() -> str:
    """The agent-loop YAML verl loads in each worker (shipped with the package: same path on every node)."""
    return str(Path(__file__).with_name("agent_loop.yaml"))


