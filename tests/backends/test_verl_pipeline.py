"""The rollout pipeline on verl, against the real verl package on CPU (scripted LLM server, local Ray).

- Config: filters and dynamic sampling map onto verl (our estimator copies, verl's custom-sampler hook,
  which verl's own loader resolves) and pass verl's validation; what verl cannot do is refused by name.
- Estimators: a row with no trained token (a dropped trajectory) is left out of its group's statistics,
  which then equal verl's own grpo/rloo on the survivors alone.
- The V1 rollout path: our filters run where a prompt's sessions meet; a dropped trajectory's outputs
  train no token, and verl's advantage step gives the survivors the survivors' advantages.
- Dynamic sampling: verl's ReplayBuffer (with real TransferQueue) evicts the groups our filters dropped,
  refills through the trainer's refill function, and stops evicting at max_rounds.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")
ray = pytest.importorskip("ray")

from omegaconf import OmegaConf  # noqa: E402

from rl_factory.backends.verl.pipeline import GROUP_KEY, SAMPLER_NAME, check_verl_pipeline  # noqa: E402
from rl_factory.config import ConfigError, parse  # noqa: E402
from tests.backends.conftest import CALL, transfer_queue  # noqa: E402
from tests.backends.test_verl_v1_ray import rollout_step  # noqa: E402

RIGHT, WRONG = [CALL, "The answer is 10063."], [CALL, "The answer is 5."]


# ---- config -----------------------------------------------------------------------------------------

def test_filters_and_dynamic_sampling_map_onto_verl(verl_setup):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.import_utils import load_extern_object

    cfg, _ = verl_setup("rollout.filters=[truncated,zero_variance]", "rollout.dynamic_sampling.min_groups=16",
                        "rollout.dynamic_sampling.max_rounds=3")
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert cfg.algorithm.adv_estimator == "rl_factory_grpo"  # ours leaves dropped rows out of the group
    sampler = cfg.trainer.v1.sampler
    assert (sampler.custom_sampler.path, sampler.custom_sampler.name) == ("pkg://rl_factory.backends.verl.pipeline",
                                                                          SAMPLER_NAME)
    assert OmegaConf.to_container(sampler.sampler_kwargs.rl_factory) == {
        "train_batch_size": 16, "max_rounds": 3, "max_inflight_gen_batches": 1, "poll_interval_s": 0.05}
    cls = load_extern_object(sampler.custom_sampler.path, sampler.custom_sampler.name)  # as verl's trainer loads it
    assert cls.__name__ == SAMPLER_NAME
    check_verl_pipeline(parse(cfg.rl_factory), cfg)

    plain, _ = verl_setup("rollout.filters=[zero_variance]", "algorithm.advantage=gae")
    assert plain.trainer.v1.sampler.custom_sampler.name == "PollingReplayBuffer"  # no refill: only the polling


@pytest.mark.parametrize(("overrides", "raw", "message"), [
    (["rollout.dynamic_sampling.min_groups=4", "data.train_batch_size=8"], {},
     "verl's batch always holds data.train_batch_size=8 groups"),
    (["rollout.augment=[per_turn]", "rollout.filters=[truncated]"], {},
     "rollout.filters=truncated is not supported on the verl backend with rollout.augment=per_turn: it can drop part "
     "of a group"),
    (["rollout.augment=[tool_prefix]"], {}, "verl has no per-sample weight"),
    (["rollout.augment=[per_turn]", "algorithm.advantage=rloo"], {},
     "rollout.augment=per_turn is not supported on the verl backend with algorithm.advantage=rloo"),
    (["rollout.filters=[zero_variance]"], {"trainer.use_v1": False}, "with trainer.use_v1=false"),
    (["rollout.dynamic_sampling.min_groups=16"], {"trainer.v1.trainer_mode": "colocate_async"},
     "with trainer.v1.trainer_mode=colocate_async: verl's async trainers refill on their own; set "
     "trainer.v1.trainer_mode=sync"),
    (["rollout.filters=[zero_variance]", "algorithm.advantage=gae"], {}, "gae's advantages are not zero"),
])
def test_what_verl_cannot_do_is_refused(verl_setup, overrides, raw, message):
    cfg, _ = verl_setup(*overrides)
    for key, value in raw.items():
        OmegaConf.update(cfg, key, value)
    with pytest.raises(ConfigError) as err:
        check_verl_pipeline(parse(cfg.rl_factory), cfg)
    assert message in str(err.value)


# ---- estimators -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_a_row_without_trained_tokens_leaves_its_group(name):
    from verl.trainer.ppo import core_algos

    rewards = torch.tensor([1.0, 0.0, 1.0, 0.5, 1.0, 0.0])
    mask = torch.ones(6, 4)
    mask[2] = 0  # dropped by a filter: its reward (1.0) must not count
    token_rewards = torch.zeros(6, 4)
    token_rewards[:, -1] = rewards
    index = np.array(["a", "a", "a", "a", "b", "b"], dtype=object)
    ours, _ = core_algos.get_adv_estimator_fn(f"rl_factory_{name}")(
        token_level_rewards=token_rewards, response_mask=mask, index=index, config={"norm_adv_by_std_in_grpo": True})
    survivors = [0, 1, 3, 4, 5]
    theirs, _ = core_algos.get_adv_estimator_fn(name)(
        token_level_rewards=token_rewards[survivors], response_mask=mask[survivors], index=index[survivors],
        config=None)
    assert torch.allclose(ours[survivors], theirs, atol=1e-5)  # verl's own, on the survivors alone
    assert torch.all(ours[2] == 0)
    if name == "rloo":  # by hand: 1 - mean(0, 0.5), 0 - mean(1, 0.5), 0.5 - mean(1, 0)
        assert ours[[0, 1, 3], 0].tolist() == pytest.approx([0.75, -0.75, 0.0])


# ---- the V1 rollout path ----------------------------------------------------------------------------

def _setup_v1(verl_setup, *overrides):
    cfg, files = verl_setup(*overrides)
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.agent.num_workers", 1)
    OmegaConf.update(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    return cfg, files


def _extra(data, i) -> dict:
    value = data["extra_fields"][i]
    return getattr(value, "data", value)


@pytest.mark.parametrize("advantage", ["grpo", "arena"])
def test_v1_sessions_are_filtered_where_they_meet(ray_cluster, verl_setup, advantage):
    cfg, files = _setup_v1(verl_setup, "rollout.filters=[duplicate,zero_variance]", f"algorithm.advantage={advantage}")
    # sessions 0 and 2 follow the same script: the same tokens, so session 2 is a duplicate
    keys, data, adv = rollout_step(cfg, files, [RIGHT, WRONG, RIGHT])
    assert keys == ["prompt-0_0_0", "prompt-0_1_0", "prompt-0_2_0"]
    extras = [_extra(data, i) for i in range(3)]
    assert [e.get("rl_factory_dropped") for e in extras] == [None, None, "duplicate"]
    masks = [data["response_mask"][i].tolist() for i in range(3)]
    assert 1 in masks[0] and 1 in masks[1] and set(masks[2]) == {0}  # the dropped one trains no token
    scores = [float(data["rm_scores"][i].sum()) for i in range(3)]
    assert [e["reward_extra_info"]["score"] for e in extras] == [1.0, 0.0, 1.0]  # our reward, where they met
    assert [e["reward_extra_info"][GROUP_KEY] for e in extras] == [0.0, 1.0, 2.0]  # a kept group
    if advantage == "grpo":
        assert scores == [1.0, 0.0, 1.0]
    else:  # the tournament among the two survivors: the right one beats the wrong one
        assert scores[0] > scores[1]
    # verl's advantage step (our rl_factory_grpo / arena): the survivors alone, the dropped row 0
    assert adv[0] == pytest.approx(0.7071, abs=1e-3) and adv[1] == pytest.approx(-0.7071, abs=1e-3)
    assert adv[2] == 0.0


def test_v1_views_are_outputs_of_their_session(ray_cluster, verl_setup):
    """rollout.augment=[per_turn]: one output per turn, each the engine's tokens after their exact prefix."""
    cfg, files = _setup_v1(verl_setup, "rollout.augment=[per_turn]")
    keys, data, adv = rollout_step(cfg, files, [RIGHT, WRONG, RIGHT])
    assert keys == [f"prompt-0_{s}_{t}" for s in range(3) for t in range(2)]  # 3 sessions x 2 turns
    from verl.utils.tokenizer import hf_tokenizer
    tok = hf_tokenizer(cfg.actor_rollout_ref.model.path)
    eos = tok.eos_token_id
    for s in range(3):
        first, second = 2 * s, 2 * s + 1
        # the second view's prompt is the first view's prompt, its response, and the tool observation
        p1, r1 = data["prompts"][first].tolist(), data["responses"][first].tolist()
        p2 = data["prompts"][second].tolist()
        assert p2[:len(p1) + len(r1)] == p1 + r1 and len(p2) > len(p1) + len(r1)
        assert data["response_mask"][first].tolist() == [1] * len(r1) and r1[-1] == eos
        assert "<tool_call>" in tok.decode(r1, skip_special_tokens=True)
        assert "answer is" in tok.decode(data["responses"][second].tolist(), skip_special_tokens=True)
        assert adv[first] == pytest.approx(adv[second])  # verl's grpo: the session's advantage on each view
    assert [a > 0 for a in adv[::2]] == [True, False, True]


def test_v1_group_without_signal_is_marked_for_verls_refill(ray_cluster, verl_setup):
    cfg, files = _setup_v1(verl_setup, "rollout.filters=[zero_variance]")
    keys, data, adv = rollout_step(cfg, files, [WRONG, WRONG, WRONG])
    extras = [_extra(data, i) for i in range(3)]
    assert [e.get("rl_factory_dropped") for e in extras] == ["zero_variance"] * 3
    assert [e["reward_extra_info"][GROUP_KEY] for e in extras] == [0.0] * 3  # constant: verl's DAPO evicts it
    assert adv == [0.0, 0.0, 0.0]


# ---- dynamic sampling: verl's ReplayBuffer with our group key ----------------------------------------

class FakeRollouts:
    """Puts finished groups into TransferQueue as the agent loop would: kept (key = session) or dropped (0)."""

    def __init__(self, tq, plan: list[bool]):
        self.tq, self.plan, self.count, self.refills = tq, list(plan), 0, []

    def put(self, kept: bool, global_steps: int = 1) -> str:
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        uid = f"g{self.count}"
        self.count += 1
        keys = [f"{uid}_{s}_0" for s in range(2)]
        fields = [{"extra_fields": {"reward_extra_info": {GROUP_KEY: float(s) if kept else 0.0}},
                   "rm_scores": torch.zeros(3)} for s in range(2)]
        self.tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields),
                             tags=[{"status": "success", "global_steps": global_steps}] * 2)
        self.tq.kv_batch_put(keys=[uid], partition_id="train",
                             tags=[{"is_prompt": True, "status": "finished", "global_steps": global_steps}])
        return uid

    def refill(self, num_prompts: int) -> int:  # the trainer's refill: draw and roll out more prompts
        self.refills.append(num_prompts)
        for _ in range(num_prompts):
            self.put(self.plan.pop(0))
        return num_prompts


@pytest.mark.parametrize("max_rounds", [3, 1])
def test_replay_buffer_evicts_dropped_groups_and_stops_at_max_rounds(ray_cluster, verl_setup,
                                                                     max_rounds):
    from rl_factory.backends.verl.pipeline import RolloutReplayBuffer

    cfg, _ = verl_setup()
    OmegaConf.update(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    with transfer_queue(cfg.transfer_queue) as tq:
        rollouts = FakeRollouts(tq, plan=[False, True, False, True])
        for kept in (True, False, False):  # the step's first round: one group with signal (g0), two without
            rollouts.put(kept, global_steps=0 if kept else 1)
        buffer = RolloutReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
                                     max_off_policy_strategy="drop", refill_fn=rollouts.refill,
                                     sampler_kwargs={"rl_factory": {"train_batch_size": 2, "max_rounds": max_rounds,
                                                                    "max_inflight_gen_batches": 1}})
        buffer.poll_interval = 0.05
        batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=2)
        uids = sorted({k.split("_")[0] for k in batch.keys})
        if max_rounds == 3:
            # verl evicts g1 and g2 and refills 2 prompts (its in-flight limit: one batch): g3 without
            # signal (evicted too) and g4 with; g0 and g4 train
            assert uids == ["g0", "g4"] and rollouts.refills == [2]
            assert metrics["training/filter_groups/evicted_samples"] == 3
            assert metrics["rollout/refilled_prompts"] == 2.0 and metrics["rollout/max_rounds_hit"] == 0.0
        else:  # one round: nothing evicted or refilled; the step trains on what finished
            assert rollouts.refills == [] and "g0" in uids and len(uids) == 2
            assert metrics["rollout/max_rounds_hit"] == 1.0 and metrics["rollout/refilled_prompts"] == 0.0


def _verls_replay_buffer(cfg):
    """The replay buffer verl's V1 trainer builds from `cfg` (its own PPOTrainer._build_replay_buffer)."""
    from types import SimpleNamespace

    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    trainer = SimpleNamespace(config=cfg, trainer_mode=cfg.trainer.v1.trainer_mode,
                              _add_prompts_to_generate=lambda n: n)
    trainer._resolve_filter_groups_metric = lambda: PPOTrainer._resolve_filter_groups_metric(trainer)
    return PPOTrainer._build_replay_buffer(trainer)


def _ours_and_verls(cfg):
    """The replay buffer verl builds from `cfg` (ours), the one it builds without our sampler, and that config."""
    builtin = OmegaConf.create(OmegaConf.to_container(cfg))
    builtin.trainer.v1.sampler.custom_sampler.path = builtin.trainer.v1.sampler.custom_sampler.name = None
    return _verls_replay_buffer(cfg), _verls_replay_buffer(builtin), builtin


def test_verl_builds_our_polling_sampler_with_its_own_arguments(ray_cluster, verl_setup):
    """verl's sync sampler polls TransferQueue every 2 s, so a rollout phase lasted a whole number of polls
    (4.07 s on the H200 for 0.44B and 4B models alike). verl's own builder makes ours from the composed
    config, with every argument its built-in sampler gets; it returns a group that finishes mid-wait."""
    import threading

    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from rl_factory.backends.verl.sampler import POLL_INTERVAL_S, PollingReplayBuffer

    cfg, _ = verl_setup()
    ours, theirs, builtin = _ours_and_verls(cfg)
    assert type(ours) is PollingReplayBuffer and type(theirs) is ReplayBuffer
    assert (ours.poll_interval, theirs.poll_interval) == (POLL_INTERVAL_S, 2.0)
    same = ("trainer_mode", "max_off_policy_threshold", "max_off_policy_strategy", "filter_groups_metric",
            "train_batch_size", "gen_batch_size", "max_inflight_gen_batches", "sync_refill_failed_groups")
    assert {k: getattr(ours, k) for k in same} == {k: getattr(theirs, k) for k in same}

    # a sampler named on the command line, and verl's own DAPO filter, keep verl's choice
    from rl_factory.backends.verl.sampler import sampler_values

    filtered = OmegaConf.create(OmegaConf.to_container(builtin))
    filtered.algorithm.filter_groups = {"enable": True, "metric": "acc"}
    assert sampler_values(filtered, set()) == {}
    assert sampler_values(builtin, {"trainer.v1.sampler.custom_sampler.path"}) == {}
    assert sampler_values(builtin, set())["trainer.v1.sampler.custom_sampler.name"] == "PollingReplayBuffer"
    slower = OmegaConf.create(OmegaConf.to_container(builtin))
    slower.trainer.v1.sampler.sampler_kwargs = {"rl_factory": {"poll_interval_s": 0.5}}  # +...poll_interval_s=0.5
    assert sampler_values(slower, set())["trainer.v1.sampler.sampler_kwargs.rl_factory"]["poll_interval_s"] == 0.5

    # verl's async trainers (trainer.max_staleness > 0): its staleness-bounded sampler, with the same poll
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    from rl_factory.backends.verl.sampler import PollingReplayBufferAsync

    ours_async, theirs_async, _ = _ours_and_verls(verl_setup("trainer.max_staleness=1")[0])
    assert type(ours_async) is PollingReplayBufferAsync and type(theirs_async) is ReplayBufferAsync
    assert (ours_async.poll_interval, theirs_async.poll_interval) == (POLL_INTERVAL_S, 2.0)
    assert ours_async.max_off_policy_threshold == 2 and ours_async.max_off_policy_strategy == "wait"
    assert {k: getattr(ours_async, k) for k in same} == {k: getattr(theirs_async, k) for k in same}

    OmegaConf.update(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    with transfer_queue(cfg.transfer_queue) as tq:
        rollouts = FakeRollouts(tq, plan=[])
        first = rollouts.put(True)
        late = threading.Timer(0.5, rollouts.put, args=(True,))  # the step's last group, while sample() waits
        late.start()
        batch, _ = ours.sample(global_steps=1, partition_id="train", batch_size=2)
        late.join()
        assert sorted({k.split("_")[0] for k in batch.keys}) == sorted([first, "g1"])
