"""The run guard's tokens check on verl compares the engine's receipts with the batch the actor is handed.

On CPU: a real V1 rollout step (our loop in verl's AgentLoopWorkerTQ, our reward in its RewardLoopWorker, the rows
in TransferQueue; only the LLM server is scripted), then our trainer's `_update_actor` (TrainedBatch in front of
verl's sync trainer) with an actor worker group that receives the batch through verl's own `tqbridge`, as a worker
does, and the step logged by our `rl_factory` Tracking backend. Faults are injected after the agent loop, into
TransferQueue: a response_mask that drops the last generated token, an id changed in input_ids. The pure tests at
the end play verl's async order (a rollout trained a step after it was logged) and a dropped trajectory.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_factory.backends.verl.run_dir import RunDirLogger, write_part
from rl_factory.guard import GuardStop
from rl_factory.guard.__main__ import main as guard_main
from rl_factory.guard.evidence import digest
from tests.records import jsonl


def _guard(lines_run: Path, **guard) -> RunDirLogger:
    lines_run.mkdir(parents=True, exist_ok=True)  # the launcher's config.yaml is its first file
    ours = {"trainer": {"output_dir": str(lines_run), "report": False, "guard": {"receipts": {"action": "off"}, **guard}},
            "reward": {"success_threshold": 1.0}}
    return RunDirLogger({"rl_factory": ours, "trainer": {"resume_mode": "disable"}})


def _line(session: int, ids: list[list[int]], dropped: str | None = None, uid: str = "uid-a") -> dict:
    evidence = {"sample_index": 0, "session_key": f"{uid}_{session}", "engine": [digest(t) for t in ids],
                "trained": [digest(t) for t in ids], "versions": [0] * len(ids), "weights": [None] * len(ids),
                "generated_tokens": sum(map(len, ids)), "trained_tokens": sum(map(len, ids)), "tool_calls": 0,
                "parse_errors": 0, "tool_errors": {}, "neg_logprob_sum": 1.0, "neg_logprob_count": 1}
    return {"sample_index": 0, "session": session, "reward": float(session), "num_turns": len(ids),
            "generated_tokens": 3, "total_tokens": 9, "prompt_tokens": 6, "stop_reason": "stop", "tool_calls": [],
            "tool_results": [], "dropped_by": dropped, "guard": evidence}


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_rollout_trained_a_step_later_is_judged_at_that_step(tmp_path):
    """verl's async trainers: step 1's rollouts are in no batch of step 1 (counted untrained), step 2's batch trains
    them (judged then, as late evidence); a wrong one there names its sample, session and rollout step."""
    run = tmp_path / "run"
    logger = _guard(run)
    turns = [[5, 6, 7], [8, 9]]
    write_part(run, "train", 1, [_line(0, turns), _line(1, turns)])
    logger.guard.trained(1, {})  # the step's update trained older rollouts only
    logger.log({"training/global_step": 1}, step=1)
    line = _metrics(run)[-1]
    assert line["guard/tokens/untrained"] == 2.0 and line["guard/tokens/from_batch"] == 0.0
    write_part(run, "train", 2, [_line(0, turns, uid="uid-b")])  # another prompt, trained at step 3
    logger.guard.trained(2, {"uid-a_0": {"trained": [digest(t) for t in turns], "trained_tokens": 5},
                             "uid-a_1": {"trained": [digest([5, 6, 7]), digest([8])], "trained_tokens": 4}})
    with pytest.raises(GuardStop, match="tokens at step 2") as stopped:
        logger.log({"training/global_step": 2}, step=2)
    assert ("sample 0 session 1 (rolled out at step 1) trains ids the engine did not sample (4 tokens under the loss "
            "mask in the actor's batch, 5 generated)") in str(stopped.value)
    line = _metrics(run)[-1]
    # step 2's own line waits (untrained); the late pair is judged: session 0 right, session 1 wrong
    assert line["guard/tokens/from_batch"] == 2.0 and line["guard/tokens/mismatched"] == 1.0
    assert line["guard/tokens/untrained"] == 1.0
    bundle = run / "guard" / "step_000002_tokens"
    assert len(json.loads((bundle / "step.json").read_text())["late"]) == 2
    assert guard_main(["replay", str(bundle)]) == 3


def test_a_dropped_trajectory_must_train_nothing(tmp_path):
    run = tmp_path / "run"
    logger = _guard(run)
    turns = [[5, 6, 7]]
    write_part(run, "train", 1, [_line(0, turns), _line(1, turns, dropped="zero_variance")])
    logger.guard.trained(1, {"uid-a_0": {"trained": [digest([5, 6, 7])], "trained_tokens": 3},
                             "uid-a_1": {"trained": [], "trained_tokens": 0}})
    logger.log({"training/global_step": 1}, step=1)  # verl zeroed its mask, as finish_outputs asks
    assert _metrics(run)[-1]["guard/tokens/from_batch"] == 2.0 and _metrics(run)[-1]["guard/violations"] == 0.0
    write_part(run, "train", 2, [_line(0, turns), _line(1, turns, dropped="zero_variance")])
    logger.guard.trained(2, {"uid-a_0": {"trained": [digest([5, 6, 7])], "trained_tokens": 3},
                             "uid-a_1": {"trained": [digest([5, 6, 7])], "trained_tokens": 3}})
    with pytest.raises(GuardStop, match=r"session 1 was dropped \(zero_variance\) but trains tokens"):
        logger.log({"training/global_step": 2}, step=2)


# ---- the real batch: V1 rollout on Ray, TransferQueue, tqbridge -------------------------------------------------

@pytest.fixture()
def registry():
    """verl's trainer registry, as it was before the test."""
    pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")
    from verl.trainer.ppo.v1 import trainer_base

    before = dict(trainer_base.TRAINER_REGISTRY)
    yield trainer_base.TRAINER_REGISTRY
    trainer_base.TRAINER_REGISTRY.clear()
    trainer_base.TRAINER_REGISTRY.update(before)


class ActorWorkers:
    """The actor worker group's update: it receives the batch as a worker does (verl's tqbridge) and records the
    digests of what its loss would train (the last len(responses) ids of input_ids, under response_mask)."""

    def __init__(self):
        from verl.utils.transferqueue_utils import tqbridge

        from rl_factory.guard.evidence import run_digests

        self.trained: list[list[str]] = []

        @tqbridge()
        def update_actor(data):
            for seq, resp, mask in zip(data["input_ids"].unbind(0), data["responses"].unbind(0),
                                       data["response_mask"].unbind(0)):
                self.trained.append(run_digests(seq[len(seq) - len(resp):], mask))
            return {"metrics": {"mfu": [0.5], "pg_loss": [0.1]}}

        self.update_actor = update_actor


def test_the_tokens_check_reads_the_batch_the_actor_is_handed(ray_cluster, verl_setup, registry, tmp_path):
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from transfer_queue.metadata import KVBatchMeta
    from verl.utils.tracking import Tracking

    from rl_factory.backends.verl.run_dir import PARTS_DIR
    from rl_factory.backends.verl.trained import TIMING_KEY, use_trained_batch
    from tests.backends.test_verl_v1_ray import RIGHT, WRONG, rollout_step

    # the scripted server's weight versions are not a trainer's (test_verl_guard.py tests the receipts)
    cfg, files = verl_setup("trainer.guard.receipts.action=off")
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.agent.num_workers", 1)
    OmegaConf.update(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    trainer_cls = use_trained_batch("sync")
    parts = Path(cfg.rl_factory.trainer.output_dir) / PARTS_DIR / "train_step_000001"

    def step(keys, name, fault=None):
        """Our trainer's update of the rollout's batch (`fault` applied to TransferQueue first, undone after), logged
        by our Tracking backend into a run directory of its own; returns (its metrics line or the stop, digests)."""
        run = tmp_path / name
        run.mkdir()
        write_part(run, "train", 1, [json.loads(x) for p in parts.glob("*.jsonl") for x in p.read_text().splitlines()])
        config = OmegaConf.to_container(cfg, resolve=True)
        config["rl_factory"]["trainer"]["output_dir"] = str(run)
        before = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["input_ids", "response_mask"])
        if fault is not None:
            fault(keys)
        trainer = trainer_cls.__new__(trainer_cls)  # what _update_actor reads: config, worker group, step, logger
        trainer.config, trainer.actor_rollout_wg, trainer.global_steps = cfg, ActorWorkers(), 1
        trainer.logger = Tracking("p", "e", default_backend=["rl_factory"], config=config)
        metrics: dict = {}
        try:
            trainer._update_actor(KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id="train"), metrics)
            trainer.logger.log(metrics, step=1)
            result = _metrics(run)[-1]
        except GuardStop as stop:
            result = stop
        finally:
            tq.kv_batch_put(keys=keys, partition_id="train", fields=before)
        sessions = [r["guard"] for r in jsonl(run / "rollouts" / "step_000001.jsonl")]
        return result, trainer.actor_rollout_wg.trained, sessions, run

    def drop_last_generated(keys):  # session 1's mask loses its last generated token
        data = tq.kv_batch_get(keys=keys[1:2], partition_id="train", select_fields=["response_mask"])
        mask = data["response_mask"].unbind(0)[0].clone()
        mask[int(mask.nonzero().max())] = 0
        data["response_mask"] = _nested([mask])
        tq.kv_batch_put(keys=keys[1:2], partition_id="train", fields=data)

    def change_an_id(keys):  # session 2's first generated id, in the sequence the actor's forward runs on
        data = tq.kv_batch_get(keys=keys[2:3], partition_id="train", select_fields=["input_ids", "responses"])
        ids = data["input_ids"].unbind(0)[0].clone()
        ids[len(ids) - len(data["responses"].unbind(0)[0])] += 1
        data["input_ids"] = _nested([ids])
        tq.kv_batch_put(keys=keys[2:3], partition_id="train", fields=data.select("input_ids"))

    def then(keys):
        return {name: step(keys, name, fault) for name, fault in
                (("normal", None), ("mask", drop_last_generated), ("ids", change_an_id))}

    out = rollout_step(cfg, files, [RIGHT, WRONG, RIGHT], then=then)
    line, worker, sessions, _ = out["normal"]
    # what the actor worker received trains exactly the engine's receipts (the rollouts lines keep the agent loop's
    # evidence), and the guard judged all three on the batch
    assert sorted(map(sorted, worker)) == sorted(sorted(s["engine"]) for s in sessions)
    assert line["guard/tokens/from_batch"] == 3.0 and line["guard/violations"] == 0.0 and line[TIMING_KEY] > 0
    for name, what in (("mask", "session 1 trains ids the engine did not sample"),
                       ("ids", "session 2 trains ids the engine did not sample")):
        stop, worker, sessions, run = out[name]
        assert isinstance(stop, GuardStop) and "tokens at step 1: 1 of 3 trajectories differ" in str(stop), stop
        assert f"sample 0 {what}" in str(stop) and "in the actor's batch" in str(stop)
        bundle = run / "guard" / "step_000001_tokens"
        judged = json.loads((bundle / "step.json").read_text())["trajectories"]
        assert [e["trained_in"] for e in judged] == ["actor batch"] * 3  # the worker got what the guard judged:
        assert sorted(map(sorted, worker)) == sorted(sorted(e["trained"]) for e in judged)
        assert guard_main(["replay", str(bundle)]) == 3


def _nested(rows):
    import torch

    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def test_an_async_step_with_a_handful_of_lines_neither_breaks_a_streak_nor_fires(tmp_path):
    """verl's async trainers log a step with the lines that finished since the last log, a handful at times: the
    batch-rate checks hold their state there (a constant reward's streak goes on; a tool-call rate of one line
    is no fall), and a whole batch after it is judged as before."""
    run = tmp_path / "run"
    run.mkdir()
    ours = {"trainer": {"output_dir": str(run), "report": False, "max_staleness": 1,
                        "guard": {"receipts": {"action": "off"}, "reward_constant": {"steps": 3}}},
            "reward": {"success_threshold": 1.0}, "data": {"train_batch_size": 2}, "rollout": {"n": 2}}
    logger = RunDirLogger({"rl_factory": ours, "trainer": {"resume_mode": "disable"}})

    def lines(step, count, calls):
        out = [_line(i, [[5, 6, 7]], uid=f"uid-{step}") for i in range(count)]
        for line in out:
            line["reward"], line["guard"]["tool_calls"] = 0.0, calls
        return out

    for step, (count, calls) in enumerate([(4, 1), (4, 1), (1, 0)], start=1):  # step 3: one line, no call
        write_part(run, "train", step, lines(step, count, calls))
        logger.log({"training/global_step": step}, step=step)
    line = _metrics(run)[-1]
    assert line["guard/reward_constant/streak"] == 2.0 and line["guard/violations"] == 0.0
    write_part(run, "train", 4, lines(4, 4, 1))
    with pytest.raises(GuardStop, match="reward_constant at step 4"):
        logger.log({"training/global_step": 4}, step=4)
    assert _metrics(run)[-1]["guard/reward_constant/streak"] == 3.0
