"""vLLM's model-info cache filled in the background (rl_factory/backends/verl/vllm_model_info.py).

vLLM is not installed where these tests run, so the process under test imports a stand-in `vllm` package with
vLLM's registry interface (`ModelRegistry.models[arch].inspect_model_cls()`, the cache path methods) from a
temporary directory; on a GPU machine the launcher runs it against vLLM itself (docs/guides/verl.md).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rl_factory.backends.verl import launcher, vllm_model_info

REGISTRY = textwrap.dedent('''
    import os, time
    from pathlib import Path

    class Registered:
        def __init__(self, name):
            self.name = name
        def _get_cache_dir(self):
            return Path(os.environ["FAKE_VLLM_CACHE"])
        def _get_cache_filename(self):
            return self.name + ".json"
        def inspect_model_cls(self):
            if self.name == "Broken":
                raise RuntimeError("the model module failed to import")
            if not (self._get_cache_dir() / self._get_cache_filename()).is_file():
                time.sleep(0.2)  # vLLM's subprocess
                (self._get_cache_dir() / self._get_cache_filename()).write_text("{}")

    class _Registry:
        models = {"Qwen3ForCausalLM": Registered("Qwen3ForCausalLM"), "Broken": Registered("Broken")}

    ModelRegistry = _Registry()
''')


@pytest.fixture()
def fake_vllm(tmp_path, monkeypatch):
    """A `vllm` package with the registry interface on sys.path and PYTHONPATH; its cache directory."""
    package = tmp_path / "site" / "vllm" / "model_executor" / "models"
    package.mkdir(parents=True)
    for folder in (package.parent.parent, package.parent, package):
        (folder / "__init__.py").write_text("")
    (package / "registry.py").write_text(REGISTRY)
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'site'}:{Path.cwd()}")
    monkeypatch.setenv("FAKE_VLLM_CACHE", str(cache))
    return cache


def model_dir(tmp_path: Path, architectures) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": architectures}))
    return path


def test_architectures_come_from_the_model_directory_and_are_empty_where_there_is_none(tmp_path):
    assert vllm_model_info.architectures(str(model_dir(tmp_path, ["Qwen3ForCausalLM"]))) == ["Qwen3ForCausalLM"]
    assert vllm_model_info.architectures(str(tmp_path / "missing")) == []
    assert vllm_model_info.architectures("nobody/not-in-the-hub-cache") == []
    (tmp_path / "model" / "config.json").write_text("{not json")
    assert vllm_model_info.architectures(str(tmp_path / "model")) == []


def test_nothing_starts_without_vllm_or_without_architectures(tmp_path):
    if importlib.util.find_spec("vllm") is None:
        assert vllm_model_info.start(str(model_dir(tmp_path, ["Qwen3ForCausalLM"])), tmp_path) is None
    assert vllm_model_info.start(str(tmp_path / "missing"), tmp_path) is None


def test_the_process_fills_the_cache_once_and_records_each_architecture(fake_vllm, tmp_path):
    out = tmp_path / "out" / vllm_model_info.FILE
    command = [sys.executable, "-m", "rl_factory.backends.verl.vllm_model_info", "--out", str(out),
               "Qwen3ForCausalLM", "Broken", "NotVllms"]
    for _ in range(2):
        subprocess.run(command, check=True, timeout=60)
    first, broken, unknown, again, *_ = [json.loads(line) for line in out.read_text().splitlines()]
    assert first["architecture"] == "Qwen3ForCausalLM" and first["cached"] is False and "error" not in first
    assert (fake_vllm / "Qwen3ForCausalLM.json").is_file()
    assert again["cached"] is True and again["seconds"] < first["seconds"]
    assert "failed to import" in broken["error"]
    assert "not one of vLLM's architectures" in unknown["error"]
    assert all(isinstance(r["ended"], float) for r in (first, broken, unknown, again))


def test_the_launcher_starts_it_for_a_vllm_rollout_only(fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "_WARMING", [])
    path = model_dir(tmp_path, ["Qwen3ForCausalLM"])
    cfg = OmegaConf.create({"actor_rollout_ref": {"model": {"path": str(path)}, "rollout": {"name": "sglang"}}})
    launcher.warm_vllm(cfg, tmp_path / "run")
    assert launcher._WARMING == []
    cfg.actor_rollout_ref.rollout.name = "vllm"
    launcher.warm_vllm(cfg, tmp_path / "run")
    (process,) = launcher._WARMING
    assert process.wait(timeout=60) == 0
    (record,) = [json.loads(line) for line in (tmp_path / "run" / vllm_model_info.FILE).read_text().splitlines()]
    assert record["architecture"] == "Qwen3ForCausalLM" and record["cached"] is False
    assert (fake_vllm / "Qwen3ForCausalLM.json").is_file()
