"""Session-wide fixtures: the repo root on sys.path, a private model cache, and one tiny model.

`tiny_model_dir` builds a quick (few-step warm start) embedded model once per session, with the
calculator's real tool schemas, obtained by starting the real calculator MCP server. Tests that
need a real tokenizer / model (rollout token faithfulness, the HF engine, the update, the
end-to-end scripts) share it.
"""
import asyncio
import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

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


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, calculator_tools) -> Path:
    """A quick tiny Qwen3 model + tokenizer (Hugging Face directory), built once per session."""
    from rl_factory.models.tiny import TinyModelConfig, build_tiny_model
    from rl_factory.models.warmstart import WarmStartConfig

    out = tmp_path_factory.mktemp("tiny_model")
    cfg = TinyModelConfig(warmstart=WarmStartConfig(num_transcripts=300, mechanics_steps=10, decision_steps=5))
    build_tiny_model(out, calculator_tools, cfg, log=lambda *_: None)
    return out
