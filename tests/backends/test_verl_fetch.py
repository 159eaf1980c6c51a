"""Our verl trainer's worker calls fetch what the workers read (rl_factory/backends/verl/fetch.py).

On the trajectories of a real V1 rollout step in TransferQueue (our loop, verl's reward worker), through
verl's own `tqbridge`, the path by which an actor worker receives the trainer's batch. The workers' compute
needs GPUs; a worker group that records what it was handed stands in for them.
"""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow  # verl's FSDP engine and the local Ray on the built model

pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")
ray = pytest.importorskip("ray")

from omegaconf import OmegaConf  # noqa: E402

from rl_factory.backends.verl import fetch  # noqa: E402
from rl_factory.config import ConfigError  # noqa: E402
from tests.backends.test_verl_v1_ray import RIGHT, WRONG, rollout_step  # noqa: E402

READ_BY_WORKERS = {"input_ids", "position_ids", "responses", "response_mask", "prompts", "rollout_log_probs"}


@pytest.fixture()
def registry():
    """verl's trainer registry, as it was before the test."""
    from verl.trainer.ppo.v1 import trainer_base

    before = dict(trainer_base.TRAINER_REGISTRY)
    yield trainer_base.TRAINER_REGISTRY
    trainer_base.TRAINER_REGISTRY.clear()
    trainer_base.TRAINER_REGISTRY.update(before)


def entropy_lengths(keys: list[str]) -> dict[str, list[int]]:
    """The row lengths of the stored entropy, whole sequences and responses: which form the entropy was left in."""
    import transfer_queue as tq

    got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["entropy", "input_ids", "responses"])
    return {name: got[name].offsets().diff().tolist() for name in ("entropy", "input_ids", "responses")}


class RecordingWorkers:
    """An actor worker group: each call receives the batch as a worker does (verl's tqbridge) and records it."""

    def __init__(self):
        from verl.utils.transferqueue_utils import tqbridge

        self.received: dict[str, list[str]] = {}

        @tqbridge()
        def update_actor(data):
            self.received["update_actor"] = sorted(data.keys())
            return {"metrics": {"mfu": [0.5], "pg_loss": [0.1, 0.3]}}  # per micro-batch, as the worker's metrics

        @tqbridge()
        def compute_log_prob(data):
            self.received["compute_log_prob"] = sorted(data.keys())
            from tensordict import TensorDict
            lengths = data["input_ids"].offsets().diff().tolist()
            nested = torch.nested.as_nested_tensor([torch.full((n,), -0.5) for n in lengths], layout=torch.jagged)
            return TensorDict({"log_probs": nested, "entropy": nested.clone()}, batch_size=[len(lengths)])

        self.update_actor, self.compute_log_prob = update_actor, compute_log_prob


def test_worker_calls_get_every_field_but_the_rollouts_bookkeeping(ray_cluster, verl_setup, registry):
    import transfer_queue as tq
    from transfer_queue.metadata import KVBatchMeta
    from verl.trainer.ppo.v1 import PPOTrainerSync

    cfg, files = verl_setup("algorithm.old_log_probs=recompute")
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.agent.num_workers", 1)
    OmegaConf.update(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    trainer_cls = fetch.use_narrow_fetch("sync")

    def then(keys):
        every = sorted(tq.kv_batch_get(keys=keys, partition_id="train").keys())
        trainer = trainer_cls.__new__(trainer_cls)  # the methods under test read only config and worker group
        trainer.config, trainer.actor_rollout_wg = cfg, RecordingWorkers()
        batch = KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id="train")
        metrics: dict = {}
        trainer._compute_old_log_prob(batch, metrics)
        trainer._update_actor(batch, metrics)
        after = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["old_log_probs"])
        stored = entropy_lengths(keys)
        # what each worker got: fields from TransferQueue, and the batch's extra_info (calculate_entropy, ...)
        received = {call: set(names) - set(batch.extra_info) for call, names in trainer.actor_rollout_wg.received.items()}
        return every, received, batch.fields, metrics, after, stored

    every, received, fields_after, metrics, after, stored = rollout_step(cfg, files, [RIGHT, WRONG, RIGHT], then=then)
    assert issubclass(trainer_cls, PPOTrainerSync)
    # what the rollout left: the workers' inputs and the bookkeeping, ours (trajectory records) among it
    assert READ_BY_WORKERS | {"extra_fields", "raw_prompt", "rm_scores", "reward_model", "uid"} <= set(every)
    expected = set(every) - fetch.UNREAD
    assert READ_BY_WORKERS <= set(expected) and len(expected) < len(every) - 10
    # the forward-only pass also goes without the responses' own tensors and vLLM's log-probs
    assert received["compute_log_prob"] == expected - fetch.FORWARD_UNREAD
    assert fetch.FORWARD_UNREAD <= expected and {"input_ids", "position_ids", "loss_mask"} <= received["compute_log_prob"]
    # the update's batch also holds the old log-probs the pass wrote back (its entropy is the trainer's metric)
    assert received["update_actor"] == expected | {"old_log_probs"}
    assert fields_after is None  # the trainer's meta is left as verl made it
    # the pass's old log-probs went back to TransferQueue sliced to the responses, as verl's do; its entropy, which
    # nothing fetches, did not (only the metric reads it)
    assert all(float(row.max()) == -0.5 for row in after["old_log_probs"].unbind(0))
    assert stored["entropy"] == stored["input_ids"] != stored["responses"]  # the worker's, full-sequence
    assert metrics["actor/entropy"] == pytest.approx(-0.5) and metrics["actor/pg_loss"] == pytest.approx(0.2)


@pytest.fixture()
def verl_actor(tiny_model_dir, monkeypatch):
    """verl's own actor worker (TrainingWorker, FSDP engine) on the tiny model, on CPU: the engine's module is the
    plain Hugging Face model (FSDP wrapping needs a GPU) and verl's platform says "cpu" instead of "cuda"."""
    import socket

    from transformers import AutoModelForCausalLM
    from verl.plugin.platform import get_platform
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.engine_workers import TrainingWorker

    monkeypatch.setattr(type(get_platform()), "device_name", "cpu")
    monkeypatch.setattr(type(get_platform()), "current_device", lambda self: "cpu")
    assert not torch.distributed.is_initialized()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    model = HFModelConfig(path=str(tiny_model_dir), use_remove_padding=True)
    engine_cfg = FSDPEngineConfig(use_torch_compile=False, use_dynamic_bsz=True, max_token_len_per_gpu=4096,
                                  infer_max_token_len_per_gpu=8192)
    engine = FSDPEngineWithLMHead(model, engine_cfg, FSDPOptimizerConfig(lr=1e-6), CheckpointConfig())
    engine.module = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    engine._autocast_dtype = torch.float32
    worker = TrainingWorker.__new__(TrainingWorker)  # what its constructor sets that infer_batch reads
    worker.engine, worker.model_config, worker.engine_config = engine, model, engine_cfg
    worker.device_name, worker.flops_counter, worker.loss_fn = "cpu", None, None
    worker._Worker__dispatch_dp_rank, worker._Worker__collect_dp_rank = {}, {}
    worker._register_dispatch_collect_info("train", dp_rank=0, is_collect=True)  # one rank: it puts the output
    yield worker
    torch.distributed.destroy_process_group()  # the next test in this process may start its own


def test_verls_forward_gives_the_same_old_log_probs_on_the_narrowed_fetch(ray_cluster, verl_setup, registry,
                                                                          verl_actor):
    """verl's own old-log-prob pass, worker side included (TrainingWorker.infer_batch: tqbridge's fetch, verl's
    micro-batching and forward, the put back), with and without NarrowFetch: the same numbers."""
    import transfer_queue as tq
    from transfer_queue.metadata import KVBatchMeta
    from verl.workers.engine_workers import TrainingWorker

    cfg, files = verl_setup("algorithm.old_log_probs=recompute")
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.agent.num_workers", 1)
    OmegaConf.update(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    received = []
    forward = verl_actor.engine.infer_batch

    def recording(data, **kwargs):
        received.append(set(data.keys()))
        return forward(data, **kwargs)

    verl_actor.engine.infer_batch = recording
    workers = type("ActorWorkers", (), {"compute_log_prob": staticmethod(
        lambda batch: TrainingWorker.infer_batch(verl_actor, batch))})()

    def then(keys):
        out = {}
        # ours first: what it leaves in TransferQueue is looked at before verl's pass writes there too
        for name, trainer_cls in (("needed", fetch.use_narrow_fetch("sync")),
                                  ("all", fetch.use_narrow_fetch("sync").__mro__[2])):
            trainer = trainer_cls.__new__(trainer_cls)
            trainer.config, trainer.actor_rollout_wg = cfg, workers
            metrics: dict = {}
            trainer._compute_old_log_prob(KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id="train"), metrics)
            got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["old_log_probs", "response_mask"])
            stored = entropy_lengths(keys)
            out[name] = got["old_log_probs"].unbind(0), got["response_mask"].unbind(0), metrics, stored
        return out

    out = rollout_step(cfg, files, [RIGHT, WRONG, RIGHT], then=then)
    assert len(received) == 2 and not fetch.FORWARD_UNREAD & received[0] and fetch.FORWARD_UNREAD <= received[1]
    (lp_all, mask, m_all, _), (lp_needed, _, m_needed, stored) = out["all"], out["needed"]
    # ours puts back the old log-probs alone: the entropy stays as the worker put it, verl's is sliced
    assert stored["entropy"] == stored["input_ids"] and out["all"][3]["entropy"] == stored["responses"]
    assert len(lp_all) == 3 and all(int(m.sum()) > 0 for m in mask)
    for a, b, m in zip(lp_all, lp_needed, mask):
        assert torch.equal(a, b) and bool((a[m.bool()] < 0).all())  # real log-probs of the sampled tokens
    # the same metrics: actor/entropy from the same forward, and vLLM-vs-actor ones where the rollout kept log-probs
    assert m_all == m_needed and m_needed["actor/entropy"] > 0


def test_narrow_fetch_takes_the_modes_place_once(registry):
    import inspect

    from verl.trainer.ppo.v1 import PPOTrainer, PPOTrainerColocateAsync, PPOTrainerSync, get_trainer_cls

    for name in fetch.WORKER_CALLS:  # a verl that renamed one would leave its call unnarrowed: fail here instead
        assert list(inspect.signature(getattr(PPOTrainer, name)).parameters) == ["self", "batch", "metrics"], name

    sync = fetch.use_narrow_fetch("sync")
    assert get_trainer_cls("sync") is sync and issubclass(sync, PPOTrainerSync) and sync.__mro__[1] is fetch.NarrowFetch
    assert fetch.use_narrow_fetch("sync") is sync  # a second install does not wrap it twice
    assert get_trainer_cls("colocate_async") is PPOTrainerColocateAsync  # other modes keep verl's class
    # verl's own old-log-prob pass gives way to ours; a mode that overrides it keeps its override, narrowed
    assert sync._compute_old_log_prob is fetch.old_log_prob_pass
    separate = fetch.use_narrow_fetch("separate_async")
    assert separate._compute_old_log_prob is fetch.NarrowFetch._compute_old_log_prob
    assert separate.__mro__[2]._compute_old_log_prob is not PPOTrainer._compute_old_log_prob
    with pytest.raises(ValueError, match="Unknown trainer"):
        fetch.use_narrow_fetch("no_such_mode")


def test_launcher_picks_the_task_runner_from_worker_fetch(ray_cluster, verl_setup, registry):
    from verl.trainer.main_ppo import TaskRunnerV1
    from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls

    from rl_factory.backends.verl import runner, startup, trained
    from rl_factory.backends.verl.launcher import task_runner_class

    cfg, _ = verl_setup()
    assert cfg.worker_fetch == "needed"
    ours = task_runner_class(cfg, TaskRunnerV1)
    base = TaskRunnerV1.__ray_metadata__.modified_class.__ray_actor_class__
    assert issubclass(ours.__ray_metadata__.modified_class.__ray_actor_class__, base)
    # as a Ray actor (as run_ppo starts it): its run installs our trainer classes for the mode, then runs verl's run
    actor = ours.remote()
    with pytest.raises(ray.exceptions.RayTaskError, match="Unknown trainer 'nope'"):
        ray.get(actor.run.remote(OmegaConf.create({"trainer": {"v1": {"trainer_mode": "nope"}}})))
    with pytest.raises(ray.exceptions.RayTaskError, match="Missing key transfer_queue"):  # verl's run, past ours
        ray.get(actor.run.remote(OmegaConf.create({"trainer": {"v1": {"trainer_mode": "sync"}}})))
    ray.kill(actor)
    # in this process: `worker_fetch: all` keeps verl's fetch, and start-up is marked either way
    narrow = runner.use_trainer("sync", narrow_fetch=True)
    assert get_trainer_cls("sync") is narrow and issubclass(narrow, fetch.NarrowFetch)
    assert narrow.__mro__[1] is startup.StartupTrainer and runner.use_trainer("sync", True) is narrow
    registry["sync"] = PPOTrainerSync
    plain = runner.use_trainer("sync", narrow_fetch=False)
    assert issubclass(plain, startup.StartupTrainer) and not issubclass(plain, fetch.NarrowFetch)
    OmegaConf.update(cfg, "worker_fetch", "all")
    assert issubclass(task_runner_class(cfg, TaskRunnerV1).__ray_metadata__.modified_class.__ray_actor_class__, base)
    # the run guard reads the update's batch (trained.py) unless its tokens check is off
    guarded = runner.use_trainer("sync", narrow_fetch=False, guard_batch=True)
    assert issubclass(guarded, trained.TrainedBatch) and issubclass(guarded, startup.StartupTrainer)
    registry["sync"] = PPOTrainerSync
    OmegaConf.update(cfg, "worker_fetch", "some")
    with pytest.raises(ConfigError, match="worker_fetch='some'"):
        task_runner_class(cfg, TaskRunnerV1)
