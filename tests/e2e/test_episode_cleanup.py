"""A run interrupted while its episodes are open leaves no episode process and no episode directory.

`bash main_grpo.sh` runs the memory example (npm's server-memory, one process and one `${episode.dir}` per
trajectory) with a reward that is still running when the signal comes, so episodes are open: their
processes are found in /proc by a marker in their environment, their directories in the run's TMPDIR.
SIGTERM (what a scheduler or `kill` sends) and SIGINT (Ctrl-C) both end the run through its cleanup.
"""
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_main_scripts import MARKER_VAR, REPO, SCRIPT_TIMEOUT_S, script_env, tiny_overrides, wait_until

pytestmark = pytest.mark.slow  # the launch scripts and training runs, end to end

HANGING_REWARD = """\
import asyncio


async def reward(**_):
    await asyncio.sleep(120)  # the episode stays open while its reward runs
    return 0.0
"""


def marked_processes(marker: str) -> set[int]:
    pids = set()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"{MARKER_VAR}={marker}".encode() in (proc / "environ").read_bytes():
                pids.add(int(proc.name))
        except OSError:
            continue
    return pids


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_run_closes_its_episodes(tiny_model_dir, tmp_path, signum):
    marker = uuid.uuid4().hex
    spec = yaml.safe_load((REPO / "examples" / "memory" / "tools.yaml").read_text())
    spec["mcpServers"]["memory"]["env"][MARKER_VAR] = marker
    manifest = tmp_path / "tools.yaml"
    manifest.write_text(yaml.safe_dump(spec))
    (tmp_path / "reward.py").write_text(HANGING_REWARD)
    temp = tmp_path / "tmp"
    temp.mkdir()
    data = REPO / "examples" / "memory" / "data"
    args = ["bash", "main_grpo.sh", *tiny_overrides(tiny_model_dir, tmp_path / "run", manifest),
            f"data.train_files={data / 'train.jsonl'}", f"data.val_files={data / 'val.jsonl'}",
            f"reward.function={tmp_path / 'reward.py'}:reward", "data.val_limit=2"]
    episode_dirs = lambda: [p for p in temp.iterdir() if p.name.startswith("rlf-episode-")]  # noqa: E731
    with (tmp_path / "run.log").open("w") as log:
        proc = subprocess.Popen(args, cwd=REPO, env={**script_env(), "TMPDIR": str(temp)}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # validation at step 0: both episodes open (one server each), their rewards running
            opened = wait_until(lambda: len(marked_processes(marker)) >= 2 and len(episode_dirs()) >= 2
                                or proc.poll() is not None, SCRIPT_TIMEOUT_S)
            assert opened and proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            os.killpg(proc.pid, signum) if signum == signal.SIGINT else proc.send_signal(signum)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    output = (tmp_path / "run.log").read_text()
    assert proc.returncode == (143 if signum == signal.SIGTERM else 130), output[-3000:]
    assert "interrupted" in output and "Traceback" not in output
    assert wait_until(lambda: not marked_processes(marker), timeout_s=10), marked_processes(marker)
    assert episode_dirs() == []
