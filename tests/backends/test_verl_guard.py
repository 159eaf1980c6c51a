"""The run guard on the verl backend, on CPU: receipts from our agent loop inside verl's own AgentLoopWorker,
checked where verl logs the step (our `rl_factory` Tracking backend).

The only fake is verl's LLM server client (vLLM needs a GPU), as in test_verl_agent_loop.py. The injected
fault is a server that keeps its initial weights: every turn reports the weight version verl set at start
(`global_steps` 0), as a server whose `update_weights` never lands does. What needs vLLM itself (a weight
fingerprint from inside the server, a full run) is not run here.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")

from omegaconf import OmegaConf  # noqa: E402

from rl_factory.backends.verl.records import RECORD_KEY  # noqa: E402
from rl_factory.backends.verl.reward import compute_score  # noqa: E402
from rl_factory.backends.verl.run_dir import RunDirLogger  # noqa: E402
from rl_factory.guard import GuardStop  # noqa: E402
from rl_factory.guard.__main__ import main as guard_main  # noqa: E402
from rl_factory.guard.evidence import digest  # noqa: E402
from tests.backends.conftest import CALL, ScriptedServer, load_rows  # noqa: E402

ANSWER = "The answer is 10063."


class StuckServer(ScriptedServer):
    """The fault: the weights never change, so every turn reports version 0."""

    async def generate(self, request_id, **kwargs):
        out = await super().generate(request_id, **kwargs)
        out.extra_fields = {"global_steps": 0, "min_global_steps": 0, "max_global_steps": 0}
        return out


def rollout_step(cfg, batch, step: int):
    """One trajectory through verl's AgentLoopWorker at global step `step` (as V1's `_run_prompt` runs a
    session), scored by our reward, which writes its rollouts line; returns verl's output and our record."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    kwargs = {k: v[0] for k, v in batch.items() if not hasattr(v, "shape") or v.dtype == object}
    kwargs.pop("agent_name", None)

    async def run():
        worker = AgentLoopWorker(cfg, llm_client=None)
        worker.llm_client = StuckServer(worker.tokenizer, [[CALL, ANSWER]])
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
        trajectory = {"step": step, "sample_index": 0, "rollout_n": 0, "validate": False}
        out = await worker._run_agent_loop(sampling, trajectory, agent_name="rl_factory", trace=False,
                                           uid="prompt-0", session_id=0, global_steps=step, **kwargs)
        extra = {k: out.extra_fields[k] for k in (RECORD_KEY, "tool_calls", "tool_errors", "stop_reason")}
        reward_kwargs = OmegaConf.to_container(cfg.reward.custom_reward_function.reward_kwargs)
        await compute_score("rl_factory", "ignored", "10063", extra_info={**extra, "index": 0}, **reward_kwargs)
        return out, json.loads(extra[RECORD_KEY])

    return asyncio.run(run())


def test_a_server_that_keeps_its_initial_weights_stops_the_run(verl_setup):
    cfg, files = verl_setup()
    batch = load_rows(cfg, files)
    run = Path(cfg.rl_factory.trainer.output_dir)
    run.mkdir(parents=True)  # the launcher's config.yaml is its first file
    logger = RunDirLogger(OmegaConf.to_container(cfg, resolve=True))

    out, record = rollout_step(cfg, batch, 1)
    evidence = record["guard"]
    # the receipts: the server's ids per turn, and what verl is handed to train (the response under its mask)
    response, mask = out.response_ids[0].tolist(), out.response_mask[0].tolist()
    runs = [[]]
    for token, m in zip(response, mask):
        runs[-1:] = [runs[-1] + [token]] if m else ([runs[-1], []] if runs[-1] else runs[-1:])
    assert evidence["engine"] == evidence["trained"] == [digest(r) for r in runs if r]
    assert evidence["versions"] == [0, 0] and evidence["tool_calls"] == 1
    logger.log({"training/global_step": 1}, step=1)  # step 1 expects the start's version 0: no violation

    rollout_step(cfg, batch, 2)
    with pytest.raises(GuardStop) as stopped:
        logger.log({"training/global_step": 2}, step=2)
    assert "receipts at step 2" in str(stopped.value) and "version(s) [0]" in str(stopped.value)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["guard/receipts/stale"] for m in lines] == [0.0, 1.0]  # the step's line is logged before the stop
    bundle = next((run / "guard").glob("step_000002_receipts"))
    assert json.loads((bundle / "trajectories.jsonl").read_text().splitlines()[0])["guard"]["versions"] == [0, 0]
    assert guard_main(["replay", str(bundle)]) == 3


def test_a_guard_stop_raised_in_verls_task_runner_is_found_for_exit_code_3():
    from ray.exceptions import RayTaskError

    from rl_factory.backends.verl.launcher import guard_stop

    cause = GuardStop("guard: receipts at step 2: 1 of 1 trajectories were generated by policy version(s) [0]")
    wrapped = RayTaskError("TaskRunner.run", "Traceback (most recent call last): ...", cause).as_instanceof_cause()
    found = guard_stop(wrapped)
    assert isinstance(found, GuardStop) and str(found).startswith("guard: receipts at step 2")
    assert guard_stop(RuntimeError("something else")) is None
