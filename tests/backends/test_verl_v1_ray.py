"""verl's V1 rollout path end to end on CPU: Ray, TransferQueue, AgentLoopManagerTQ, RewardLoopWorker.

What the trainer does each step, minus the GPUs: the batch goes to verl's AgentLoopManagerTQ, whose
AgentLoopWorkerTQ actor runs n sessions per prompt with our agent loop (loaded from our YAML by path,
in a Ray worker process that got our plugin through the entry point), our reward runs inside verl's
RewardLoopWorker actor through `reward.custom_reward_function`, and the results land in TransferQueue
where the trainer reads them and computes advantages with the configured estimator (verl's grpo, or our
arena through the plugin). Only the LLM server is scripted (vLLM needs a GPU).
"""
from __future__ import annotations

import os
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")
ray = pytest.importorskip("ray")

from omegaconf import OmegaConf  # noqa: E402

from tests.backends.conftest import CALL, ScriptedServer, load_rows, transfer_queue  # noqa: E402
from tests.records import jsonl

RIGHT, WRONG = [CALL, "The answer is 10063."], [CALL, "The answer is 5."]


def rollout_step(cfg, files, scripts, then=None, manager_out=None):
    """One V1 generation step as verl's trainer runs it; returns the rows read back from TransferQueue
    (and `then(keys)`'s result, run while TransferQueue still holds them). The agent-loop manager is the class
    the config names, as verl's TaskRunner picks it (verl's AgentLoopManagerTQ where none); `manager_out`, a list,
    gets it."""
    import transfer_queue as tq
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ
    from verl.utils import tensordict_utils as tu
    from verl.utils.import_utils import load_class_from_fqn
    from verl.utils.tokenizer import hf_tokenizer

    with transfer_queue(cfg.transfer_queue):
        reward_worker = ray.remote(RewardLoopWorker).remote(cfg)
        server = ScriptedServer(hf_tokenizer(cfg.actor_rollout_ref.model.path), scripts)
        fqn = cfg.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class")
        manager_class = load_class_from_fqn(fqn, "AgentLoopManager") if fqn else AgentLoopManagerTQ
        manager = manager_class.create(config=cfg, llm_client=server, teacher_client=None,
                                       reward_loop_worker_handles=[reward_worker])
        if manager_out is not None:
            manager_out.append(manager)
        batch_dict = load_rows(cfg, files)
        batch_dict["uid"] = np.array(["prompt-0"], dtype=object)
        batch = tu.get_tensordict(batch_dict)
        tu.assign_non_tensor_data(batch, "global_steps", 1)
        tq.kv_batch_put(keys=["prompt-0"], partition_id="train",
                        tags=[{"is_prompt": True, "status": "pending", "global_steps": 1}])
        manager.generate_sequences(batch)
        deadline = time.time() + 240
        while time.time() < deadline:
            status = tq.kv_list(partition_id="train").get("train", {}).get("prompt-0", {}).get("status")
            if status in ("finished", "failure"):
                break
            time.sleep(0.5)
        assert status == "finished", status
        # keys are {uid}_{session}_{output}: one output per trajectory, or one per turn (step context)
        listing = tq.kv_list(partition_id="train").get("train", {})
        keys = sorted(k for k in listing if k.startswith("prompt-0_"))
        if then is not None:
            return then(keys)
        return keys, tq.kv_batch_get(keys=keys, partition_id="train"), advantages(cfg, keys)


def advantages(cfg, keys):
    """The trainer's advantage step on what the rollout left in TransferQueue (as V1's _compute_advantage)."""
    import transfer_queue as tq
    from verl.protocol import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    fields = ["uid", "response_mask", "rm_scores", "rollout_log_probs"]
    data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=fields)
    data = DataProto(batch=data.to_padded_tensor())
    data.batch["token_level_scores"] = data.batch["token_level_rewards"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    data = compute_advantage_for_multi_trajectories(
        data, batch_keys=keys, adv_estimator=cfg.algorithm.adv_estimator, gamma=cfg.algorithm.gamma,
        lam=cfg.algorithm.lam, num_repeat=cfg.actor_rollout_ref.rollout.n,
        norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo, config=cfg.algorithm)
    mask = data.batch["response_mask"]
    # a row without trained tokens (a trajectory a rollout filter dropped) has no advantage: 0
    return [float(data.batch["advantages"][i][mask[i].bool()][0]) if mask[i].any() else 0.0 for i in range(len(keys))]


def _decoded_answers(cfg, data):
    from verl.utils.tokenizer import hf_tokenizer

    tok = hf_tokenizer(cfg.actor_rollout_ref.model.path)
    out = []
    for i in range(len(data)):
        ids, mask = data["responses"][i].tolist(), data["response_mask"][i].tolist()
        out.append(tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=True))
    return out


@pytest.mark.parametrize("advantage", ["grpo", "arena"])
def test_v1_step_with_our_loop_and_reward(ray_cluster, verl_setup, advantage):
    # the scripted server reports weight versions 7 + turn (for the counters' test), not a trainer's: the run
    # guard's receipts would rightly stop the step (tests/backends/test_verl_guard.py tests them)
    cfg, files = verl_setup(f"algorithm.advantage={advantage}", "trainer.guard.receipts.action=off")
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.agent.num_workers", 1)
    OmegaConf.update(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    keys, data, adv = rollout_step(cfg, files, [RIGHT, WRONG, RIGHT])
    assert keys == ["prompt-0_0_0", "prompt-0_1_0", "prompt-0_2_0"]
    answers = _decoded_answers(cfg, data)
    scores = [float(data["rm_scores"][i].sum()) for i in range(len(data))]
    right = ["10063." in a.rsplit("answer is", 1)[-1] for a in answers]
    assert sorted(right) == [False, True, True]  # each session followed one script
    for i in range(len(data)):
        mask = data["response_mask"][i].tolist()
        assert mask[0] == 1 and 0 in mask and mask[-1] == 1  # generated, tool observation, generated
        assert len(data["rollout_log_probs"][i]) == len(mask)
    if advantage == "grpo":  # pointwise: our reward, run by verl's RewardLoopWorker
        assert scores == [1.0 if r else 0.0 for r in right]
    else:  # the tournament's scores: both right answers beat the wrong one
        wrong = right.index(False)
        assert all(scores[i] > scores[wrong] for i in range(len(data)) if right[i])
    # verl's advantage step with the estimator the config names (verl's grpo, or our arena via the plugin)
    assert all((a > 0) == r for a, r in zip(adv, right)) and abs(sum(adv)) < 1e-5
    assert_run_dir_contract(cfg, right)


def test_the_loop_the_workers_build_directly_is_the_one_our_registry_entry_names():
    from rl_factory.backends.verl import prestart
    from rl_factory.backends.verl.agent_loop import AGENT_NAME, agent_loop_config_path

    entries = OmegaConf.load(agent_loop_config_path())
    assert [e["_target_"] for e in entries if e["name"] == AGENT_NAME] == [prestart.OUR_LOOP]


def _count_instantiate(worker) -> None:
    """In an agent-loop worker's process: count hydra.utils.instantiate's calls (verl builds each trajectory's loop
    with it), still calling it."""
    import hydra.utils

    original = hydra.utils.instantiate
    _count_instantiate.calls = 0

    def counted(*args, **kwargs):
        _count_instantiate.calls += 1
        return original(*args, **kwargs)

    hydra.utils.instantiate = counted


def test_v1_step_on_agent_loop_workers_started_before_the_trainer(ray_cluster, verl_setup):
    """Our TaskRunner starts the agent-loop workers before TransferQueue and the trainer (prestart.py); the
    manager verl builds from the config's class hands them the clients instead of starting its own, and the step
    runs on them."""
    from rl_factory.backends.verl import prestart

    cfg, files = verl_setup("trainer.guard.receipts.action=off")
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.agent.num_workers", 2)
    OmegaConf.update(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    assert prestart.start(cfg) == 2  # as the TaskRunner calls it: before tq.init
    prestart._started.join()
    started, router = list(prestart._started.workers), prestart._started.router
    assert cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class == prestart.MANAGER
    # each trajectory's loop is built without hydra's instantiate (prestart.py's _run_agent_loop): counted in the workers
    ray.get([w.__ray_call__.remote(_count_instantiate) for w in started])
    managers = []
    keys, data, adv = rollout_step(cfg, files, [RIGHT, WRONG, RIGHT], manager_out=managers)
    assert keys == ["prompt-0_0_0", "prompt-0_1_0", "prompt-0_2_0"]
    assert [float(data["rm_scores"][i].sum()) for i in range(len(data))] == [1.0, 0.0, 1.0]
    assert ray.get([w.__ray_call__.remote(lambda self: _count_instantiate.calls) for w in started]) == [0, 0]
    assert isinstance(managers[0], prestart.PrestartedAgentLoopManager)
    assert [w._actor_id for w in managers[0].agent_loop_workers] == [w._actor_id for w in started]
    assert prestart.take() == []  # taken once
    # the request router started with them takes the place of the one verl's server manager creates, with its servers
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    stand_in = ray.remote(GlobalRequestLoadBalancer)  # any actors: the router only hands their handles out
    servers = [stand_in.remote(servers={}) for _ in range(2)]
    manager = SimpleNamespace(server_addresses=["10.0.0.1:8000", "10.0.0.2:8000"], server_handles=servers,
                              global_load_balancer=stand_in.remote(servers={}))
    verls = manager.global_load_balancer

    class Trainer(prestart.PrestartedRouter):
        pass

    from rl_factory.backends.verl import startup

    # the thread waited for the router's first answer, which came after its constructor's end in its own process
    assert 0 < prestart._started.router_built_s <= prestart._started.router_ready_s
    # then for its import of vLLM's server class, which this machine lacks: reported, not timed, the router kept
    assert prestart._started.router_preload_s is None
    clock = startup.task_runner_clock({})
    try:
        Trainer().llm_server_manager = manager  # as verl's trainer assigns it in _setup
    finally:
        startup._clock = None
    assert manager.global_load_balancer is router
    # the start-up record: the servers' end, then the hand-over as a phase of its own, the router's start beside
    assert clock.marks["task_runner_started"] <= clock.marks["rollout_servers_started"] <= clock.marks["router_adopted"]
    hand_over = clock.marks["router_adopted"] - clock.marks["rollout_servers_started"]
    assert clock.beside.pop("router_add_servers") + clock.beside.pop("router_kill_verls") <= hand_over + 0.002
    assert clock.beside == {"request_router": prestart._started.router_ready_s,
                            "request_router_built": prestart._started.router_built_s}
    assert "router_adopt" in clock.record()["phases"]
    picked = {ray.get(router.acquire_server.remote(f"request-{i}"))[0] for i in range(8)}
    assert picked == set(manager.server_addresses)  # least-loaded over both
    with pytest.raises(ray.exceptions.RayActorError):  # verl's own router is stopped
        ray.get(verls.get_all_servers.remote())
    assert prestart.adopt_router(manager) is False  # once
    # a run that names its own manager, or distills from a teacher, starts its workers verl's way
    own, _ = verl_setup("trainer.guard.receipts.action=off")
    OmegaConf.update(own, prestart.MANAGER_KEY, "my.Manager", force_add=True)
    assert not prestart.wanted(own) and prestart.start(own) == 0
    OmegaConf.update(own, prestart.MANAGER_KEY, None, force_add=True)
    assert prestart.wanted(own)
    OmegaConf.update(own, "distillation.enabled", True, force_add=True)
    assert not prestart.wanted(own)


def assert_run_dir_contract(cfg, right):
    """verl's trainer logs the step through its Tracking; ours writes metrics.jsonl and rollouts from the parts."""
    import json
    from pathlib import Path

    from verl.utils.tracking import Tracking

    tracking = Tracking("p", "e", default_backend=["rl_factory"], config=OmegaConf.to_container(cfg, resolve=True))
    tracking.log({"timing_s/gen": 2.5, "timing_s/update_actor": 1.5, "critic/score/mean": 0.5}, step=1)
    run = Path(cfg.rl_factory.trainer.output_dir)
    line = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert line["step"] == 1 and line["accuracy"] == pytest.approx(sum(right) / len(right))
    assert line["reward/mean"] == pytest.approx(sum(right) / len(right))
    assert line["tool/calls"] == 3 and line["tool/calculator/calls"] == 3 and line["tool/call_rate"] == 1.0
    assert line["timing/rollout_s"] == 2.5 and line["timing/update_s"] == 1.5 and line["critic/score/mean"] == 0.5
    rollouts = jsonl(run / "rollouts" / "step_000001.jsonl")
    assert sorted(r["reward"] for r in rollouts) == sorted(float(r) for r in right)
    assert all(r["num_turns"] == 2 and r["total_tokens"] > r["prompt_tokens"] > 0 for r in rollouts)
    # each trajectory's time in its agent loop; the step's slowest beside verl's rollout phase
    assert all(r["timing"]["wall_s"] >= r["timing"]["generate_s"] + r["timing"]["tools_s"] > 0 for r in rollouts)
    assert line["timing/slowest_trajectory_s"] == max(r["timing"]["wall_s"] for r in rollouts)
    starts = [r["timing"]["started_unix"] for r in rollouts]
    assert line["timing/trajectory_starts_s"] == pytest.approx(max(starts) - min(starts))
    assert line["timing/slowest_trajectory_s"] <= line["timing/trajectories_span_s"] + 1e-3
    firsts = [r["timing"]["first_request_unix"] for r in rollouts]  # each sent its first request after it began
    assert all(r["timing"]["started_unix"] <= r["timing"]["first_request_unix"] for r in rollouts)
    assert line["timing/request_starts_s"] == pytest.approx(max(firsts) - min(firsts))
    assert 0 <= line["timing/before_first_request_s"] <= line["timing/slowest_trajectory_s"]
    assert not (run / "rollouts" / ".parts" / "train_step_000001").exists()  # gathered once
    # a validation step: val/* from the val parts, and the run report (as the embedded trainer writes them)
    from rl_factory.backends.verl.run_dir import write_part

    write_part(run, "val", 2, [{**rollouts[0], "reward": 1.0}])
    tracking.log({"val-core/rl_factory/reward/mean@1": 1.0}, step=2)
    line = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert line["step"] == 2 and line["val/accuracy"] == 1.0 and (run / "report.html").exists()


def test_v1_step_context_gives_one_sample_per_turn(ray_cluster, verl_setup):
    """rollout.context=step: each turn is its own sample; verl scores the last and spreads grpo's advantage."""
    cfg, files = verl_setup("rollout.context=step")
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.agent.num_workers", 1)
    OmegaConf.update(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    keys, data, adv = rollout_step(cfg, files, [RIGHT, WRONG, RIGHT])
    assert keys == [f"prompt-0_{s}_{t}" for s in range(3) for t in range(2)]  # 3 sessions x 2 turns
    from verl.utils.tokenizer import hf_tokenizer
    tok = hf_tokenizer(cfg.actor_rollout_ref.model.path)
    for i, key in enumerate(keys):
        mask = data["response_mask"][i].tolist()
        assert mask == [1] * len(mask)  # a step's response is that turn's generated tokens only
        text = tok.decode(data["responses"][i].tolist(), skip_special_tokens=True)
        assert ("<tool_call>" in text) == key.endswith("_0")
    scores = [float(data["rm_scores"][i].sum()) for i in range(len(keys))]
    right = [scores[i] == 1.0 for i in range(len(keys))]
    assert sorted(right) == [False] * 2 + [True] * 4
    for s in range(3):  # both samples of a session share its reward and its advantage
        assert scores[2 * s] == scores[2 * s + 1] and adv[2 * s] == pytest.approx(adv[2 * s + 1])
        assert (adv[2 * s] > 0) == right[2 * s]


def test_v1_step_with_per_episode_servers(ray_cluster, episodes):
    """One episode per session (test_verl_episodes.py): servers started and rewards scored in the worker."""
    from tests.backends.conftest import RIGHT_NOTE, WRONG_NOTE
    from tests.e2e.test_episode_cleanup import marked_processes
    from tests.e2e.test_main_scripts import wait_until

    cfg, files, marker = episodes()
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.agent.num_workers", 1)
    OmegaConf.update(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    keys, data, adv = rollout_step(cfg, files, [RIGHT_NOTE, WRONG_NOTE, RIGHT_NOTE])
    assert keys == ["prompt-0_0_0", "prompt-0_1_0", "prompt-0_2_0"]
    scores = [float(data["rm_scores"][i].sum()) for i in range(3)]
    # each session's own note, read by the reward in its own episode (sessions take scripts as they come)
    assert sorted(scores) == [0.0, 1.0, 1.0]
    infos = [_extra_fields(data, i)["reward_extra_info"] for i in range(3)]
    worker_pids = {i["reward/scorer_pid"] for i in infos}
    # one AgentLoopWorker actor ran the sessions, started their servers and scored them: not this driver
    assert len(worker_pids) == 1 and os.getpid() not in worker_pids
    assert all(i["reward/server_ppid"] == i["reward/scorer_pid"] for i in infos)
    assert all((a > 0) == (r == 1.0) for a, r in zip(adv, scores)) and np.isclose(sum(adv), 0.0, atol=1e-5)
    # the episodes closed: no server of theirs is left. Their exits are not waited for (the last close starts the
    # teardowns in the background; each server exits on its stdin's EOF): a deadline, as in test_verl_episodes.py
    assert wait_until(lambda: not marked_processes(marker), 30), marked_processes(marker)


def _extra_fields(data, i) -> dict:
    value = data["extra_fields"][i]
    return getattr(value, "data", value)


# ---- two agent-loop workers, four prompts: ArenaRL groups and stdio servers per worker ------------
# Self-contained (its own data, manifest, server and step helper) so that it does not depend on how
# the module's rollout_step or the ray fixture are organised.

PRODUCTS = [(347, 29), (58, 71), (123, 45), (19, 88)]


def _calculator_script(a: int, b: int, right: bool) -> list[str]:
    call = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{a} * {b}"}}}}\n</tool_call>'
    return [call, f"The answer is {a * b if right else 5}."]


class PerPromptServer(ScriptedServer):
    """Scripts chosen by the question in the prompt: a prompt's 2nd session answers wrong, the others right.

    Each agent-loop worker gets its own copy (verl pickles the client into every worker); the counter
    counts the sessions of a question that reached this worker.
    """

    def __init__(self, tokenizer):
        super().__init__(tokenizer, [])
        self.seen: dict[tuple[int, int], int] = {}

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        if request_id not in self.order:
            text = self.tokenizer.decode(prompt_ids)
            a, b = next((a, b) for a, b in PRODUCTS if f"What is {a} * {b}?" in text)
            k = self.seen.get((a, b), 0)
            self.seen[(a, b)] = k + 1
            self.scripts.append(_calculator_script(a, b, right=k != 1))
        return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)


def _marked_servers(marker: str) -> dict[int, int]:
    """pid -> parent pid of the live calculator servers started with RLF_TEST_MARK=<marker>."""
    import os

    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
            if b"envs.servers.calculator" in cmdline and \
                    f"RLF_TEST_MARK={marker}".encode() in open(f"/proc/{pid}/environ", "rb").read():
                stat = open(f"/proc/{pid}/stat").read()
                found[int(pid)] = int(stat.rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
    return found


def test_v1_two_workers_arena_groups_meet_and_stdio_servers_stop(ray_cluster, verl_setup, tmp_path):
    """4 prompts over 2 AgentLoopWorkerTQ actors with algorithm.advantage=arena.

    verl chunks the batch of prompts (one row per uid) over its workers and each worker's `_run_prompt`
    starts all n sessions of a uid itself (verl/trainer/ppo/v1/agent_loop_tq.py), so a group meets in
    one worker. Checked from the outside: every uid finishes (a group split over workers would wait in
    each for sessions that never come), every group's tournament is complete and in exactly one
    worker's rankings.csv, both workers played, and each worker started its own calculator server,
    which is gone once the workers are killed. `ray.kill` is what the end of a job does to them too
    (Ray fate-shares its processes with the driver; no atexit handler runs): a stdio server ends when
    its stdin closes with the worker (envs/servers/stdio.py), not through our env's close.
    """
    import csv
    import json
    import os
    import sys
    from pathlib import Path

    import ray.cloudpickle
    import transfer_queue as tq
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ
    from verl.utils import tensordict_utils as tu
    from verl.utils.tokenizer import hf_tokenizer

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # PerPromptServer travels by value
    marker = f"v1-two-workers-{os.getpid()}-{time.monotonic_ns()}"
    manifest = tmp_path / "tools.yaml"
    manifest.write_text(json.dumps({"mcpServers": {"calculator": {
        "command": "python", "args": ["-m", "envs.servers.calculator"], "env": {"RLF_TEST_MARK": marker}}}}))
    data = tmp_path / "four.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {a} * {b}?", "answer": str(a * b)}) + "\n"
                            for a, b in PRODUCTS))
    cfg, files = verl_setup("algorithm.advantage=arena", f"data.train_files={data}", f"env.tools={manifest}")
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.agent.num_workers", 2)
    OmegaConf.update(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    uids = [f"prompt-{i}" for i in range(len(PRODUCTS))]
    n = cfg.actor_rollout_ref.rollout.n

    manager = reward_worker = None
    with transfer_queue(cfg.transfer_queue):
        try:
            reward_worker = ray.remote(RewardLoopWorker).remote(cfg)
            server = PerPromptServer(hf_tokenizer(cfg.actor_rollout_ref.model.path))
            manager = AgentLoopManagerTQ.create(config=cfg, llm_client=server, teacher_client=None,
                                                reward_loop_worker_handles=[reward_worker])
            workers = manager.agent_loop_workers
            assert len(workers) == 2
            worker_pids = set(ray.get([w.__ray_call__.remote(lambda self: os.getpid()) for w in workers]))
            batch_dict = load_rows(cfg, files)
            assert len(batch_dict["index"]) == len(uids)
            batch_dict["uid"] = np.array(uids, dtype=object)
            batch = tu.get_tensordict(batch_dict)
            tu.assign_non_tensor_data(batch, "global_steps", 1)
            tq.kv_batch_put(keys=uids, partition_id="train",
                            tags=[{"is_prompt": True, "status": "pending", "global_steps": 1}] * len(uids))
            manager.generate_sequences(batch)
            deadline, status = time.time() + 240, {}
            while time.time() < deadline:
                listing = tq.kv_list(partition_id="train").get("train", {})
                status = {u: listing.get(u, {}).get("status") for u in uids}
                if all(s in ("finished", "failure") for s in status.values()):
                    break
                time.sleep(0.5)
            assert status == dict.fromkeys(uids, "finished")
            listing = tq.kv_list(partition_id="train").get("train", {})
            keys = sorted(k for k in listing if k not in uids and k.rsplit("_", 2)[0] in uids)
            assert keys == [f"{u}_{s}_0" for u in uids for s in range(n)]
            data_out = tq.kv_batch_get(keys=keys, partition_id="train")
            scores = [float(data_out["rm_scores"][i].sum()) for i in range(len(keys))]
            adv = advantages(cfg, keys)

            # each worker runs its own calculator server (started by its WorkerState), one per worker
            servers = _marked_servers(marker)
            assert sorted(servers.values()) == sorted(worker_pids), (servers, worker_pids)
        finally:
            started = ([*manager.agent_loop_workers] if manager else []) + ([reward_worker] if reward_worker else [])
            for handle in started:
                ray.kill(handle)

    # the tournaments: each uid's n sessions met (the wrong one is the 2nd to reach its worker)
    answers = _decoded_answers(cfg, data_out)
    for g, (u, (a, b)) in enumerate(zip(uids, PRODUCTS)):
        rows = range(g * n, (g + 1) * n)
        right = [str(a * b) in answers[i].rsplit("answer is", 1)[-1] for i in rows]
        assert sorted(right) == [False] + [True] * (n - 1), (u, [answers[i] for i in rows])
        wrong = [i for i, r in zip(rows, right) if not r][0]
        assert all(scores[i] > scores[wrong] for i in rows if i != wrong)
        assert all((adv[i] > 0) == r for i, r in zip(rows, right)) and abs(sum(adv[i] for i in rows)) < 1e-5

    # rankings.csv: one file per worker process, both workers played, every group exactly once and complete
    run = Path(cfg.rl_factory.trainer.output_dir)
    files_by_worker = sorted((run / "arena").glob("*/rankings.csv"))
    assert {int(p.parent.name.rsplit("-", 1)[1]) for p in files_by_worker} == worker_pids
    groups: dict[str, list[tuple[str, dict]]] = {}
    for path in files_by_worker:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                groups.setdefault(row["group"], []).append((path.parent.name, row))
    assert sorted(groups) == uids  # verl's uid names the group
    for u, rows in groups.items():
        assert len({w for w, _ in rows}) == 1, f"{u} played in several workers"
        assert sorted(int(r["rollout"]) for _, r in rows) == list(range(n))
        assert {r["step"] for _, r in rows} == {"1"}
        assert all(int(r["matches"]) == n - 1 for _, r in rows)  # round robin: everyone met everyone
    assert len({w for rows in groups.values() for w, _ in rows}) == 2  # and both workers played

    # and no calculator server outlives its worker
    deadline = time.time() + 15
    while _marked_servers(marker) and time.time() < deadline:
        time.sleep(0.2)
    assert _marked_servers(marker) == {}


@pytest.mark.parametrize("mode", ["auto", "recompute"])
def test_v1_trainer_skips_its_log_prob_pass_when_the_update_gives_the_old_log_probs(ray_cluster, verl_setup, mode):
    """algorithm.old_log_probs: auto resolves to `update` for one optimizer step per batch. verl's own V1
    `_compute_old_log_prob`, under the config we compose, then never calls the actor's forward and leaves
    vLLM's sampling log-probs in old_log_probs (which our loss replaces by the update's own, detached:
    tests/backends/test_verl_plugin_config.py); with `recompute` it calls the actor as verl always did."""
    import transfer_queue as tq
    from transfer_queue.metadata import KVBatchMeta
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    cfg, files = verl_setup(f"algorithm.old_log_probs={mode}")
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.agent.num_workers", 1)
    OmegaConf.update(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    assert cfg.algorithm.rollout_correction.bypass_mode is (mode == "auto")
    assert (cfg.ray_kwargs.ray_init.runtime_env.env_vars.get("RL_FACTORY_OLD_LOG_PROBS") == "update") is (mode == "auto")
    calls = []

    class Actor:  # the actor worker group: what verl's trainer would ask of it
        def compute_log_prob(self, batch):
            calls.append(len(batch))
            raise RuntimeError("the actor's forward pass was asked for")

    def old_log_probs(keys):
        trainer = SimpleNamespace(config=cfg, actor_rollout_wg=Actor())
        try:
            tags = tq.kv_list(partition_id="train")["train"]
            batch = KVBatchMeta(keys=keys, tags=[tags[k] for k in keys], partition_id="train")
            PPOTrainer._compute_old_log_prob(trainer, batch, metrics={})
        except RuntimeError:
            return None
        return tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["old_log_probs", "rollout_log_probs"])

    data = rollout_step(cfg, files, [RIGHT, WRONG, RIGHT], then=old_log_probs)
    if mode == "recompute":
        assert calls == [3] and data is None
        return
    assert calls == []
    for i in range(3):
        assert torch.equal(data["old_log_probs"][i], data["rollout_log_probs"][i])
        assert len(data["old_log_probs"][i]) > 0
