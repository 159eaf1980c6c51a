"""startup.json: where a verl launch's time goes before its first step (rl_factory/backends/verl/startup.py).

The stages of verl's trainer are marked from the attributes its `_setup` assigns and the methods it calls; a
verl that renamed or reordered them would leave stages unmarked, so one test reads verl's own source for each.
The launch test (slow: a local Ray and verl's TaskRunner actor) runs our launcher's start through verl's
run_ppo on CPU, where verl stops when it asks Ray for a GPU: the record holds every mark up to there.
"""
from __future__ import annotations

import inspect
import json
import re
import time

import pytest

from rl_factory.backends.verl import startup
from rl_factory.backends.verl.run_dir import RunDirLogger


@pytest.fixture()
def clock(monkeypatch, tmp_path):
    """The TaskRunner's clock of a launch whose launcher marks came before, writing to tmp_path/startup.json."""
    monkeypatch.setattr(startup, "_clock", None)  # the process's clock is put back after the test
    now = time.time()
    marks = {"process_started": now - 9, "launcher_entered": now - 8, "run_ppo_called": now - 2}
    made = startup.task_runner_clock(marks)
    startup.write_to(tmp_path)
    return made


class Handle:
    """A worker group / manager handle: the calls verl makes on it during start-up."""

    def __init__(self, calls):
        self.calls = calls

    def init_model(self):
        self.calls.append("init_model")
        return "built"

    def sleep_replicas(self):
        self.calls.append("sleep_replicas")


class VerlLikeTrainer:
    """verl's PPOTrainer start-up as test_verls_trainer_still_does_what_the_marks_watch checks it: the same
    calls and assignments in the same order (not verl: no Ray, no GPUs)."""

    def __init__(self, config):
        self.config, self.calls = config, []

    def _init_tokenizer(self):
        self.tokenizer = "tok"

    def _init_dataloader(self):
        self.train_dataloader = []

    def _load_checkpoint(self):
        self.global_steps = 0

    def init(self):
        self._init_tokenizer()
        self._init_dataloader()
        self.resource_pool_to_cls = {}
        self.actor_rollout_wg = Handle(self.calls)
        assert self.actor_rollout_wg.init_model() == "built"  # the wrapped call returns what verl's returns
        self.ref_policy_wg = self.actor_rollout_wg  # the reference in the actor's workers: no stage of its own
        self.reward_loop_manager = object()
        self.teacher_model_manager = None  # no distillation: not a stage
        self.llm_server_manager = object()
        self.checkpoint_manager = Handle(self.calls)
        self.checkpoint_manager.sleep_replicas()
        self._load_checkpoint()
        self.on_init_end()

    def on_init_end(self):
        pass

    def on_validate_end(self):
        pass

    def on_train_begin(self):
        pass

    def on_step_end(self):
        self.checkpoint_manager.sleep_replicas()

    def prepare_step(self):
        return {}

    def on_sample_end(self):
        pass

    def _update_actor(self, batch, metrics):
        return batch

    def fit(self, validate_before: bool, steps: int, log):
        self.logger = object()
        if validate_before:
            self.on_validate_end()
        self.on_train_begin()
        for step in range(1, steps + 1):
            self.prepare_step()
            self.on_sample_end()
            assert self._update_actor("batch", {}) == "batch"
            self.on_step_end()
            self.on_validate_end()  # a validation at this step: not the one before training
            log({"timing_s/step": 1.0, "training/global_step": step}, step)


def _logger(run):
    return RunDirLogger({"rl_factory": {"trainer": {"output_dir": str(run), "report": False},
                                        "reward": {"success_threshold": 1.0}},
                         "trainer": {"resume_mode": "disable", "default_local_dir": str(run / "checkpoints")}})


def test_the_trainers_stages_are_marked_in_order_and_the_first_steps_line_completes_the_record(clock, tmp_path, capsys):
    trainer_cls = type("StartupVerlLike", (startup.StartupTrainer, VerlLikeTrainer), {})
    trainer = trainer_cls({"x": 1})
    trainer.init()
    partial = json.loads((tmp_path / startup.FILE).read_text())  # rewritten at each mark: a kill leaves this
    assert not partial["complete"] and partial["launch_to_first_step_s"] is None
    assert list(partial["marks"])[-1] == "weights_synced"
    logger = _logger(tmp_path)
    logger.log({"val-core/rl_factory/reward/mean@1": 0.0}, step=0)  # validation before training: not a step
    assert not json.loads((tmp_path / startup.FILE).read_text())["complete"]
    trainer.fit(validate_before=True, steps=1, log=logger.log)
    done = (tmp_path / startup.FILE).read_text()
    trainer.on_step_end(), trainer.on_validate_end()  # step 2 and a validation at it: the record is final
    logger.log({"timing_s/step": 1.0}, step=2)
    logger.finish()
    assert (tmp_path / startup.FILE).read_text() == done

    out = json.loads(done)
    assert out["complete"]
    assert list(out["marks"]) == [
        "process_started", "launcher_entered", "run_ppo_called", "task_runner_started", "trainer_constructing",
        "trainer_constructed", "tokenizer_loaded", "dataloader_built", "resource_pools_created", "workers_spawned",
        "actor_initialized", "reward_workers_started", "rollout_servers_started", "checkpoint_engine_ready",
        "rollout_asleep", "checkpoint_loaded", "weights_synced", "loggers_ready", "validated", "training_started",
        "first_batch_queued", "first_rollout_done", "first_update_done", "first_step_done", "first_step_logged"]
    # each phase is the time since the mark before it, named by what ran in it; they add up to the total
    assert list(out["phases"])[:3] == ["cli", "environment_checks", "task_runner_start"]
    assert out["phases"]["cli"] == pytest.approx(1.0, abs=0.01)
    assert out["phases"]["environment_checks"] == pytest.approx(6.0, abs=0.01)
    assert sum(out["phases"].values()) == pytest.approx(out["launch_to_first_step_s"], abs=0.01)
    assert out["launch_to_first_step_s"] == pytest.approx(out["before_training_s"] + out["first_step_s"], abs=0.01)
    assert out["launch_to_first_step_s"] >= 9 and out["launcher_s"] == pytest.approx(7.0, abs=0.01)
    assert out["trainer_init_s"] == pytest.approx(out["marks"]["weights_synced"] - out["marks"]["trainer_constructed"],
                                                  abs=0.01)
    assert trainer.calls == ["init_model", "sleep_replicas", "sleep_replicas", "sleep_replicas"]
    printed = [line for line in capsys.readouterr().out.splitlines() if "start-up" in line]
    assert len(printed) == 1 and re.match(r"\[rl_factory\] start-up: \d+ s to the first step's end; longest: ", printed[0])
    assert "environment_checks 6.0 s" in printed[0]


def test_without_validation_before_training_the_loggers_phase_runs_into_training(clock, tmp_path):
    trainer = type("StartupVerlLike", (startup.StartupTrainer, VerlLikeTrainer), {})({})
    trainer.init()
    trainer.fit(validate_before=False, steps=1, log=_logger(tmp_path).log)
    out = json.loads((tmp_path / startup.FILE).read_text())
    assert "validated" not in out["marks"] and "validation" not in out["phases"]  # the validation at step 1 is a step's
    assert list(out["phases"])[-6:] == ["train_begin", "first_prepare", "first_rollout", "first_train", "first_step_end",
                                        "first_step_log"]


def test_what_ran_beside_the_marked_stages_is_recorded_outside_the_phases(clock, tmp_path):
    startup.mark("task_runner_run")
    startup.mark("trainer_constructing")
    phases = dict(clock.record()["phases"])
    startup.beside("transfer_queue", 14.2)  # TransferQueue's start, in a thread (transfer_queue_start.py)
    out = json.loads((tmp_path / startup.FILE).read_text())
    assert out["beside"] == {"transfer_queue": 14.2} and out["phases"] == phases
    startup.beside("nothing", None)  # a start that never finished: nothing recorded
    assert clock.record()["beside"] == {"transfer_queue": 14.2}


def test_a_failed_launch_records_where_it_stopped_and_why(clock, tmp_path):
    startup.mark("trainer_constructing")
    try:
        raise ValueError("Total available GPUs 0 is less than total desired GPUs 1\nmore")
    except ValueError as exc:
        startup.failed(exc)
    out = json.loads((tmp_path / startup.FILE).read_text())
    assert out["error"] == "ValueError: Total available GPUs 0 is less than total desired GPUs 1"
    assert not out["complete"] and list(out["marks"])[-1] == "trainer_constructing"
    with pytest.raises(KeyError, match="unknown start-up event 'nope'"):
        startup.mark("nope")


def test_without_a_clock_the_logger_and_marks_do_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(startup, "_clock", None)
    startup.mark("tokenizer_loaded")
    _logger(tmp_path).log({"timing_s/step": 1.0}, step=1)
    assert not (tmp_path / startup.FILE).exists() and (tmp_path / "metrics.jsonl").exists()


def test_the_process_start_is_before_now_and_after_the_interpreter_could_have_started():
    started = startup.process_start_time()
    if started is None:
        pytest.skip("no /proc here")
    import psutil

    assert started <= time.time() and abs(started - psutil.Process().create_time()) < 1.5


def test_verls_trainer_still_does_what_the_marks_watch():
    """verl 0.9.1's PPOTrainer._setup assigns WATCHED's attributes in WATCHED's order, fit assigns `logger`,
    its `init` runs `_setup` then `on_init_end`, and TaskRunnerV1.run builds the trainer, then the agent-loop
    manager: a renamed or reordered stage fails here instead of going unmarked."""
    pytest.importorskip("verl")
    from verl.trainer.main_ppo import TaskRunnerV1
    from verl.trainer.ppo.v1 import trainer_base

    trainer = trainer_base.PPOTrainer
    setup = inspect.getsource(trainer._setup)
    where = [re.search(rf"self\.{name}(\s*:[^=\n]+)?\s*=[^=]", setup) for name in startup.WATCHED if name != "logger"]
    assert all(where) and [m.start() for m in where] == sorted(m.start() for m in where)
    for name, (_, call) in startup.WATCHED.items():
        if call is not None:
            assert f"self.{name}.{call[0]}()" in setup, (name, call)
    assert re.search(r"self\.logger\s*=\s*Tracking\(", inspect.getsource(trainer.fit))
    assert re.findall(r"self\.(_setup|on_init_end)\(\)", inspect.getsource(trainer.init)) == ["_setup", "on_init_end"]
    order = re.findall(r"self\.(_init_tokenizer|_init_dataloader|_load_checkpoint)\(\)", setup)
    assert order == ["_init_tokenizer", "_init_dataloader", "_load_checkpoint"]
    fit = inspect.getsource(trainer.fit)
    assert fit.index("self.on_validate_end()") < fit.index("self.on_train_begin()") < fit.index("self.on_step_end()")
    # step 1's marks: the batch queued, its rollouts sampled, the update, in this order inside a step
    step, once = inspect.getsource(trainer.step), inspect.getsource(trainer._step_once)
    assert step.index("self.prepare_step()") < step.index("self._step_once(")
    assert once.index("self.on_sample_end()") < once.index("self._update_actor(")
    assert fit.index("self.step(") < fit.index("self.on_step_end()")
    run = inspect.getsource(TaskRunnerV1.__ray_metadata__.modified_class.__ray_actor_class__.run)
    assert run.index("trainer_cls(config=config)") < run.index("self.init_agent_loop_manager()")


@pytest.mark.slow
def test_a_launch_marks_ours_then_ray_then_verls_stages_until_it_stops(ray_cluster, verl_setup, tmp_path):
    """Our launcher's start through verl's run_ppo (Ray already up here) into our TaskRunner and verl's trainer,
    which on CPU stops asking Ray for a GPU: startup.json holds each mark to there and the error."""
    import ray

    from rl_factory.backends.verl.launcher import start

    from omegaconf import OmegaConf

    from tests.backends.conftest import close_transfer_queue

    close_transfer_queue()  # the TaskRunner starts its own TransferQueue, as in a run: none left by an earlier test
    cfg, _ = verl_setup()
    # one storage unit (verl's 8 would each hold one of the test cluster's CPUs, and the TaskRunner waits for one)
    OmegaConf.update(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    run = tmp_path / "run"
    run.mkdir()
    clock = startup.launcher_clock()
    for event in ("verl_imported", "config_checked", "data_written"):
        clock.mark(event)
    with pytest.raises(ray.exceptions.RayTaskError, match="Total available GPUs 0"):
        start(cfg, clock)
    out = json.loads((run / startup.FILE).read_text())
    marks = list(out["marks"])
    assert marks[marks.index("run_ppo_called"):] == [
        "run_ppo_called", "ray_initialized", "task_runner_started", "task_runner_run", "agent_loops_prestarted",
        "trainer_constructing",
        "trainer_constructed", "tokenizer_loaded", "dataloader_built"]
    assert out["error"].startswith("ValueError: Total available GPUs 0") and not out["complete"]
    assert all(b >= a for a, b in zip(out["marks"].values(), list(out["marks"].values())[1:]))
    assert out["phases"]["task_runner_start"] > 0.1  # a Ray actor's process and its imports


def _statements(source: str) -> list[str]:
    """A function's lines of code: no docstring, comments or blank lines, indentation dropped."""
    body = re.sub(r'"""[\s\S]*?"""', "", source)
    return [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_our_taskrunner_run_is_verls_with_transfer_queue_started_in_the_background():
    """transfer_queue_start.run is verl 0.9.1's TaskRunnerV1.run but for where TransferQueue starts and is waited
    for: a verl whose run changed fails here instead of running a stale copy."""
    pytest.importorskip("verl")
    from verl.trainer.main_ppo import TaskRunnerV1

    from rl_factory.backends.verl import transfer_queue_start

    verls = _statements(inspect.getsource(TaskRunnerV1.__ray_metadata__.modified_class.__ray_actor_class__.run))
    ours = _statements(inspect.getsource(transfer_queue_start.run))
    assert verls[0] == "def run(self, config: DictConfig):" and verls[-1] == "tq.close()"
    expected = [s.replace("self.", "runner.") for s in verls[1:]
                if s not in ("import transfer_queue as tq", "from verl.trainer.ppo.v1 import get_trainer_cls")]
    expected[expected.index("tq.init(config.transfer_queue)")] = "_pending = Background(config.transfer_queue)"
    expected.insert(expected.index("runner.init_agent_loop_manager()"), "ready()")
    close = expected.index("tq.close()")
    expected[close:close + 1] = ["try:", "_pending.thread.join()  # close what it started, whether or not it failed",
                                 "finally:", "tq.close()"]
    imports = ("global _pending", "import transfer_queue as tq", "from verl.trainer.ppo.v1 import get_trainer_cls",
               "from verl.utils.logging_utils import configure_verl_logging")
    assert [s for s in ours[1:] if s not in imports] == [s for s in expected if s not in imports]


@pytest.mark.slow
def test_transfer_queue_started_in_the_background_is_waited_for_and_its_failure_raised(ray_cluster, verl_setup):
    import transfer_queue as tq
    from omegaconf import OmegaConf

    from rl_factory.backends.verl import transfer_queue_start
    from tests.backends.conftest import close_transfer_queue

    close_transfer_queue()  # a start of its own: not one an earlier test of this process left running
    cfg, _ = verl_setup()
    OmegaConf.update(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    started = transfer_queue_start.Background(cfg.transfer_queue)
    started.wait()
    try:
        assert tq.kv_list(partition_id="train") == {} and started.seconds > 0
    finally:
        tq.close()
    OmegaConf.update(cfg, "transfer_queue.controller.sampler", "NoSuchSampler", force_add=True)
    failing = transfer_queue_start.Background(cfg.transfer_queue)
    with pytest.raises(ValueError, match="Could not find sampler NoSuchSampler"):
        failing.wait()
    tq.close()
