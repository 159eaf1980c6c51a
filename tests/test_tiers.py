"""The tiers' guard (tests/tiers.py), as this test run installed it: it sees a launch script or a finished
training run in a test that is not marked slow, and leaves the rest alone."""
import asyncio
import subprocess
import sys

import pytest

from tests import tiers


@pytest.mark.parametrize("args", [
    ["bash", "main_grpo.sh", "trainer.total_steps=2"],
    ["bash", "/repo/main_eval.sh"],
    [sys.executable, "-m", "rl_factory.cli", "train", "trainer.total_steps=2"],
    "bash -c '.venv/bin/python -m rl_factory.cli eval model.path=x'",
    b"bash main_grpo.sh",
])
def test_a_launch_in_a_command_line_is_seen(args):
    assert tiers.launches(args)


@pytest.mark.parametrize("args", [
    ["bash", "-n"],
    [sys.executable, "-m", "envs", "list", "configs/tools/calculator.yaml"],
    [sys.executable, "-m", "rl_factory.cli", "--help"],
    [sys.executable, "-m", "rl_factory.report", "runs/x"],
])
def test_other_commands_are_not_launches(args):
    assert not tiers.launches(args)


def test_a_test_not_marked_slow_that_starts_a_launch_script_is_caught():
    """`true` ignores its arguments: nothing is launched, but the command line names main_grpo.sh. Both ways a
    test starts a process count: subprocess, and asyncio's (an MCP server's way)."""
    subprocess.run(["true", "main_grpo.sh"], check=True)

    async def start():
        proc = await asyncio.create_subprocess_exec("true", "main_eval.sh")
        await proc.wait()
    asyncio.run(start())
    caught = list(tiers._violations)
    tiers._violations.clear()  # else the guard fails this test, as it should fail any other
    assert caught == ["starts 'true main_grpo.sh'", "starts 'true main_eval.sh'"]


@pytest.mark.slow
def test_a_slow_test_may_start_one():
    subprocess.run(["true", "main_grpo.sh"], check=True)
    assert tiers._violations == []


def test_a_training_run_counts_when_it_returns_and_a_refusal_does_not():
    def refuse():
        raise ValueError("algorithm.advantage=x is not supported")

    with pytest.raises(ValueError):
        tiers._watched(refuse, "refuse")()
    assert tiers._violations == []
    tiers._watched(lambda: {}, "train")()
    caught = list(tiers._violations)
    tiers._violations.clear()
    assert caught == ["ran train() to its end"]


def test_the_trainer_is_watched_even_where_a_test_module_imported_it_at_collection():
    import rl_factory.trainer
    from tests import test_trainer_timing  # `from rl_factory.trainer import train` at its top

    assert getattr(rl_factory.trainer.train, "__tiers_watched__", False)
    assert test_trainer_timing.train is rl_factory.trainer.train


def test_the_fixture_rule_marks_what_uses_a_slow_fixture_and_the_model(request):
    """Over the tests this run collected: a test that uses a SLOW_FIXTURES fixture is slow, one that uses the
    built model is `model`; under `-m "not slow"` no slow test is left (the marks come before `-m` deselects)."""
    fast_tier = request.config.option.markexpr == "not slow"
    for item in request.session.items:
        assert not (fast_tier and item.get_closest_marker("slow")), f"{item.nodeid} is slow yet left in"
        names = set(item.fixturenames)
        if names.intersection(tiers.SLOW_FIXTURES):
            assert item.get_closest_marker("slow"), item.nodeid
        assert bool(item.get_closest_marker("model")) == (tiers.MODEL_FIXTURE in names), item.nodeid
