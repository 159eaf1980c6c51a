"""Session-wide fixtures: the repo root on sys.path, a private model cache, one tiny model and its tokenizer,
anyio's backend; the test tiers' hooks (tests/tiers.py: the `slow` and `model` marks and their guard).

`tiny_model_dir` builds a quick (few-step warm start) embedded model once per session, with the
calculator's real tool schemas, obtained by starting the real calculator MCP server. Tests that
need a real tokenizer / model (rollout token faithfulness, the HF engine, the update, the
end-to-end scripts) share it; under pytest-xdist the workers share one build too.

The suite runs on three pytest-xdist workers (`-n 3` in pyproject.toml; `-n 0` runs it in one
process). Work is handed out by test file, so a module-scoped fixture (a shared training run, a
started server) runs once, and the files that use the local Ray go together, so one cluster serves them.
"""
import asyncio
import fcntl
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests import tiers  # noqa: E402

CALCULATOR_MANIFEST = REPO_ROOT / "configs" / "tools" / "calculator.yaml"

# One torch thread (here and in the scripts the e2e tests start): on a small shared CPU box torch's
# intra-op threads spin against other processes and make a tiny model ~10x slower, not faster.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def _private_model_cache(tmp_path_factory):
    """Nothing a test runs (builtin models, subprocesses) reads or writes ~/.cache/rl_factory."""
    old = os.environ.get("RL_FACTORY_CACHE")
    os.environ["RL_FACTORY_CACHE"] = str(tmp_path_factory.mktemp("rl_factory_cache"))
    yield
    if old is None:
        os.environ.pop("RL_FACTORY_CACHE", None)
    else:
        os.environ["RL_FACTORY_CACHE"] = old


async def _calculator_tools() -> list[dict]:
    from envs import ToolEnv

    async with ToolEnv.from_manifest(CALCULATOR_MANIFEST) as env:
        return await env.list_tools()


@pytest.fixture(scope="session")
def calculator_tools(_private_model_cache) -> list[dict]:
    """The calculator's tool schemas as the real MCP server reports them."""
    return asyncio.run(_calculator_tools())


def _session_root(tmp_path_factory) -> Path:
    """This session's base temp dir; under xdist, the one the workers' own dirs share."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, calculator_tools) -> Path:
    """A quick tiny Qwen3 model + tokenizer (Hugging Face directory), built once per session."""
    from rl_factory.models.tiny import TinyModelConfig, build_tiny_model
    from rl_factory.models.warmstart import WarmStartConfig

    root = _session_root(tmp_path_factory)
    out = root / "tiny_model"
    # The first worker to get here builds it; the other waits on the lock and reuses it.
    with open(root / "tiny_model.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "config.json").exists():
            building = root / "tiny_model.building"
            shutil.rmtree(building, ignore_errors=True)
            building.mkdir()
            cfg = TinyModelConfig(warmstart=WarmStartConfig(num_transcripts=300, mechanics_steps=10,
                                                            decision_steps=5))
            build_tiny_model(building, calculator_tools, cfg, log=lambda *_: None)
            building.rename(out)
    return out


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    """The tiny model's tokenizer (loaded once per worker; no test changes it)."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def anyio_backend():
    # anyio's pytest plugin runs `@pytest.mark.anyio` tests (on asyncio only, not also on trio); module
    # scope lets a module-scoped async fixture (one started ToolEnv) serve every test of a module.
    return "asyncio"


# ---- pytest-xdist: which tests go together to one worker, and in what order ---------------------

# The files that use tests/backends' local Ray (its package-scoped `ray_cluster`): one unit of work,
# so that one worker starts one cluster for them.
RAY_FILES = ("tests/backends/test_verl_pipeline.py", "tests/backends/test_verl_v1_ray.py")
RAY_UNIT = "tests/backends (Ray)"
# Run first, longest first: units of minutes on 2 cores, so that the workers finish together
# rather than one of them picking up a long file last. Only the order depends on this list.
SLOW_FIRST = [RAY_UNIT, "tests/e2e/test_main_scripts.py", "tests/backends/test_verl_plugin_config.py",
              "tests/e2e/test_first_custom_run.py", "tests/backends/test_verl_checkpoint.py",
              "tests/e2e/test_arena_e2e.py", "tests/test_doctor.py", "tests/test_lora.py", "tests/e2e/test_gae_e2e.py",
              "tests/e2e/test_first_run_messages.py", "tests/e2e/test_reproducible.py", "tests/e2e/test_reward_e2e.py",
              "tests/e2e/test_pipeline_e2e.py", "tests/test_secrets_everywhere.py", "tests/backends/test_verl_agent_loop.py"]


def _work_unit(nodeid: str) -> str:
    """A test's unit of work: its file, or RAY_UNIT for the files that share the local Ray."""
    path = nodeid.split("::", 1)[0]
    return RAY_UNIT if path in RAY_FILES else path


def pytest_configure(config):
    tiers.install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    tiers.enter(item)
    try:
        return (yield)
    finally:
        tiers.enter(None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    tiers.check(item)
    return result


@pytest.hookimpl(tryfirst=True)  # the markers first, so that `-m` deselects by them
def pytest_collection_modifyitems(config, items):
    tiers.mark_tiers(items)
    # A stable sort: each unit stays contiguous and in its own order.
    rank = {scope: i for i, scope in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(_work_unit(item.nodeid), len(rank)))


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        """xdist's loadscope with _work_unit's units, handed out in collection order (above)."""

        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    config.option.loadscopereorder = False  # its reorder is by test count, not by time
    return ByFile(config, log)
