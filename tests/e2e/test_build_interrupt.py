"""The builtin model's first build: a stop signal ends the run at once, and concurrent first runs build once.

`bash main_grpo.sh` with an empty model cache builds the embedded default (minutes on two cores); SIGTERM
and Ctrl-C during that build must end the run within seconds, with no model directory or temp build
directory left behind. Several processes needing the same model build it once: the others wait on its lock.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_main_scripts import REPO, SCRIPT_TIMEOUT_S, script_env, wait_until

pytestmark = pytest.mark.slow  # the launch scripts and training runs, end to end

CHEAP_BUILD = """
import os, sys, time
from pathlib import Path
from rl_factory.models.tiny import cached_build

def build(tmp):
    with open(sys.argv[2], "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(2)
    (tmp / "config.json").write_text("{}")

print(cached_build(Path(sys.argv[1]), build, log=lambda m: print(m, flush=True)), flush=True)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_the_builtin_model_build_at_once(tmp_path, signum):
    cache = tmp_path / "cache"
    args = ["bash", "main_grpo.sh", f"trainer.output_dir={tmp_path / 'run'}", "trainer.total_steps=1",
            "trainer.progress=false"]
    with (tmp_path / "run.log").open("w") as log:
        proc = subprocess.Popen(args, cwd=REPO, env={**script_env(), "RL_FACTORY_CACHE": str(cache)}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            building = wait_until(lambda: "building the embedded default model" in (tmp_path / "run.log").read_text()
                                  or proc.poll() is not None, SCRIPT_TIMEOUT_S)
            assert building and proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            time.sleep(3)  # well into the build (tokenizer, then the warm start's first steps)
            start = time.monotonic()
            os.killpg(proc.pid, signum) if signum == signal.SIGINT else proc.send_signal(signum)
            proc.wait(timeout=120)
            took = time.monotonic() - start
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    output = (tmp_path / "run.log").read_text()
    assert proc.returncode == (143 if signum == signal.SIGTERM else 130), output[-3000:]
    assert took < 15, f"{took:.1f} s to stop"  # the build itself takes minutes
    assert "interrupted" in output and "Traceback" not in output
    models = cache / "models"
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == []  # nothing half-written


def test_concurrent_first_builds_build_once(tmp_path):
    out, builds = tmp_path / "models" / "m", tmp_path / "builds.txt"
    procs = [subprocess.Popen([sys.executable, "-c", CHEAP_BUILD, str(out), str(builds)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(3)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    assert len(builds.read_text().split()) == 1  # one process built; the others waited and reused it
    assert all(o.strip().endswith(str(out)) for o in outputs)
    assert sum("waiting for another process building" in o for o in outputs) >= 1
    assert (out / "config.json").exists() and not list(out.parent.glob(".building-*"))


def test_sigterm_stops_a_run_started_with_sigint_ignored(tiny_model_dir, tmp_path):
    """A job started in the background of a script (`cmd &` in bash) starts with SIGINT ignored: SIGTERM must
    still stop it, not be turned into a SIGINT that nothing hears."""
    from tests.conftest import CALCULATOR_MANIFEST
    from tests.e2e.test_main_scripts import tiny_overrides

    run = tmp_path / "run"
    args = ["bash", "main_grpo.sh", *tiny_overrides(tiny_model_dir, run, CALCULATOR_MANIFEST),
            "trainer.total_steps=5000", "trainer.save_every=0", "trainer.progress=false"]
    with (tmp_path / "run.log").open("w") as log:
        proc = subprocess.Popen(args, cwd=REPO, env=script_env(), stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        try:
            stepping = wait_until(lambda: "step 1:" in (tmp_path / "run.log").read_text() or proc.poll() is not None,
                                  SCRIPT_TIMEOUT_S)
            assert stepping and proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
            took = time.monotonic() - start
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    output = (tmp_path / "run.log").read_text()
    assert proc.returncode == 143, output[-3000:]
    assert took < 15, f"{took:.1f} s to stop"  # 5000 steps take many minutes
    assert "interrupted" in output and "Traceback" not in output
