"""One episode per verl session, against the real verl package on CPU (scripted LLM server).

The manifest runs tests/fakes/notes_server.py with `scope: episode`: each session puts a note in its own
server, and the reward (a file written here) reads it back through `tools` and reports which process
served it and which process scored. So the test sees that the server was started by the process running
the session (verl's AgentLoopWorker, a Ray actor in the V1 test), that the reward ran there too, inside
the episode (not in verl's RewardLoopWorker, which cannot reach the episode), that no session saw
another's note, and, from /proc, that every per-episode server is gone once the step is done. The same
through verl's V1 path with Ray: test_verl_v1_ray.py::test_v1_step_with_per_episode_servers.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import yaml

pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")

from omegaconf import OmegaConf  # noqa: E402

from tests.backends.conftest import NOTES, RIGHT_NOTE, WRONG_NOTE, ScriptedServer, load_rows  # noqa: E402
from tests.e2e.test_episode_cleanup import marked_processes  # noqa: E402
from tests.e2e.test_main_scripts import wait_until  # noqa: E402

def _extra(data, i) -> dict:
    value = data["extra_fields"][i]
    return getattr(value, "data", value)


def test_each_session_scores_in_its_own_episode_in_the_worker(episodes):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    cfg, files, marker = episodes()
    assert cfg.algorithm.adv_estimator == "rl_factory_grpo"  # a failed episode's row leaves its group
    batch = load_rows(cfg, files)
    kwargs = {k: v[0] for k, v in batch.items() if not hasattr(v, "shape") or v.dtype == object}
    kwargs.pop("agent_name", None)

    async def run():
        worker = AgentLoopWorker(cfg, llm_client=None)
        worker.llm_client = ScriptedServer(worker.tokenizer, [RIGHT_NOTE, WRONG_NOTE])
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
        tasks = []
        for session in range(2):  # the sessions of one prompt, at once, as verl's V1 worker runs them
            trajectory = {"step": 1, "sample_index": 0, "rollout_n": session, "validate": False}
            tasks.append(worker._run_agent_loop(sampling, trajectory, agent_name="rl_factory", trace=False,
                                                uid="prompt-0", session_id=session, global_steps=1, **kwargs))
        return await asyncio.gather(*tasks)

    outputs = asyncio.run(run())
    # scored in the loop (verl skips its reward worker): each session read its own note, whatever the order
    # in which their episodes opened and took the scripts
    assert sorted(o.reward_score for o in outputs) == [0.0, 1.0]
    infos = [o.extra_fields["reward_extra_info"] for o in outputs]
    assert all(i["reward/server_ppid"] == os.getpid() == i["reward/scorer_pid"] for i in infos)
    # every episode's server stopped once its session ended. Its exit is not waited for (envs.episode: the last
    # episode's close starts the teardowns in the background, and asyncio.run cancels what is left of them when
    # run() returns; the server then exits on its stdin's EOF): a deadline, not an instant
    assert wait_until(lambda: not marked_processes(marker), 30), marked_processes(marker)
    rollouts = Path(cfg.rl_factory.trainer.output_dir) / "rollouts" / ".parts"
    assert len(list(rollouts.rglob("*.jsonl"))) >= 1  # the loop wrote the scored lines (no reward worker did)


def test_a_session_whose_episode_fails_trains_nothing(episodes, tmp_path):
    from verl.protocol import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    manifest = tmp_path / "lookup.yaml"
    manifest.write_text(yaml.safe_dump({"mcpServers": {"notes": {
        "command": "python", "args": [NOTES], "hidden_arguments": {"lookup": {"db_id": "${sample.db_id}"}}}}}))
    cfg, files, _ = episodes(f"env.tools={manifest}", "env.environment=tests.test_environment:Guess")
    batch = load_rows(cfg, files)

    async def run():
        worker = AgentLoopWorker(cfg, llm_client=None)
        worker.llm_client = ScriptedServer(worker.tokenizer, [["I guess 75"]])
        return await worker.generate_sequences(DataProto.from_single_dict(batch, meta_info={"global_steps": 1}))

    out = asyncio.run(run())  # the row has no db_id column: its episode cannot open
    assert out.non_tensor_batch["rl_factory_dropped"][0] == "episode_error"
    assert out.batch["response_mask"][0].sum() == 0 and float(out.batch["rm_scores"][0].sum()) == 0.0


def test_an_inline_manifest_naming_the_sample_is_refused_on_verl():
    from rl_factory.backends.verl.supported import check
    from rl_factory.config import ConfigError, load_config

    inline = "env.tools={mcpServers:{db:{command:python,args:['${sample.db_path}'],scope:episode}}}"
    with pytest.raises(ConfigError, match="put it in a file and set env.tools=path/to/tools.yaml"):
        check(load_config("grpo", ["trainer.backend=verl", inline]))
