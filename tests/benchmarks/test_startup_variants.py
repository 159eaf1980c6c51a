"""benchmarks/startup_variants.py and gpu_step.py's start-up record: what the GPU run of `gpu_suite.sh startup`
launches and reports, checked on CPU (composing each variant through `--cfg job` is `gpu_suite.sh check`'s)."""
import json
import os
from pathlib import Path

import pytest

from benchmarks import gpu_step, startup_variants
from benchmarks.startup_variants import VARIANTS


def test_a_variants_keys_come_last_and_win():
    args = gpu_step.parse_args(["--shape", "qwen3-0.6b", "--startup-variant", "validate_first", "optim.lr=2e-6"])
    out = gpu_step.verl_overrides(args, Path("/m"), Path("/run"))
    assert out.index("trainer.val_before_train=false") < out.index("trainer.val_before_train=true")
    assert out[-1] == "optim.lr=2e-6"  # the command line's own overrides after the variant's
    # vLLM's own start-up seconds are INFO lines: the workers log them (verl's default for them is WARN)
    assert "+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_LOGGING_LEVEL=INFO" in out
    assert gpu_step.verl_overrides(gpu_step.parse_args(["--shape", "qwen3-0.6b"]), Path("/m"), Path("/run")) == [
        o for o in out if o not in ("trainer.val_before_train=true", "optim.lr=2e-6")]
    with pytest.raises(SystemExit):
        gpu_step.parse_args(["--startup-variant", "nope"])


def test_the_combined_variants_are_their_parts():
    assert set(VARIANTS["fast"].overrides) == {*VARIANTS["awake"].overrides, *VARIANTS["no_dashboard"].overrides,
                                               *VARIANTS["few_workers"].overrides}
    assert set(VARIANTS["fast_eager"].overrides) == {*VARIANTS["fast"].overrides, *VARIANTS["eager"].overrides}
    phases = {p.strip().removesuffix(" (added)") for v in VARIANTS.values() for p in v.phases.split(",")} - {"-"}
    from rl_factory.backends.verl.startup import EVENTS

    assert phases <= set(EVENTS.values())  # each names phases startup.json has


def test_a_fresh_launchs_caches_join_the_machines_without_replacing_its_files(tmp_path, monkeypatch):
    monkeypatch.setattr(startup_variants.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    run = tmp_path / "run-x"
    fresh = {var: Path(d) for var, d in startup_variants.fresh_cache_env(run).items()}
    (fresh["TRITON_CACHE_DIR"] / "k1").mkdir(parents=True)
    (fresh["TRITON_CACHE_DIR"] / "k1" / "kernel.so").write_text("new")
    (fresh["TRITON_CACHE_DIR"] / "k2.json").write_text("new")
    (fresh["VLLM_CACHE_ROOT"] / "modelinfos").mkdir(parents=True)
    (fresh["VLLM_CACHE_ROOT"] / "modelinfos" / "qwen3.json").write_text("{}")
    machine = {"TRITON_CACHE_DIR": str(tmp_path / "triton"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "k2.json").write_text("the machine's")
    # no Inductor cache was written by the launch: nothing kept for it
    assert startup_variants.keep_fresh_caches(run, machine) == ["VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"]
    assert (tmp_path / "triton" / "k1" / "kernel.so").read_text() == "new"
    assert (tmp_path / "triton" / "k2.json").read_text() == "the machine's"  # a file already there stays
    assert (tmp_path / "xdg" / "vllm" / "modelinfos" / "qwen3.json").exists()  # vLLM's default under XDG_CACHE_HOME
    inductor = startup_variants.machine_cache_dirs(machine)["TORCHINDUCTOR_CACHE_DIR"]
    assert inductor.parent == tmp_path / "tmp" and inductor.name.startswith("torchinductor_")


def test_fresh_caches_are_the_launchs_own_and_the_cache_state_is_read(tmp_path):
    args = gpu_step.parse_args(["--fresh-caches"])
    run = tmp_path / f"run-{tmp_path.name}"
    env = gpu_step.launch_env(args, run)
    caches = {Path(env[v]) for v in startup_variants.CACHE_VARS}
    assert len(caches) == 3 and all(c.parent.name == run.name and tmp_path not in c.parents for c in caches)
    assert not any(c.exists() for c in caches)  # empty: the launch compiles everything
    assert env["PYTHONPATH"].startswith(str(gpu_step.ROOT))
    assert startup_variants.compile_cache(env) == "cold"
    own = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm"), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    assert startup_variants.compile_cache(own) == "cold"
    (tmp_path / "vllm" / "torch_compile_cache" / "abc").mkdir(parents=True)
    assert startup_variants.compile_cache(own) == "warm"
    # vLLM uncompiled (the tuning): Triton's kernels are what a launch leaves
    (tmp_path / "triton" / "k1").mkdir(parents=True)
    assert startup_variants.compile_cache({**own, "VLLM_CACHE_ROOT": str(tmp_path / "empty")}) == "warm"
    shared = gpu_step.launch_env(gpu_step.parse_args([]), tmp_path / "run")  # the machine's caches
    assert shared.get("VLLM_CACHE_ROOT") == os.environ.get("VLLM_CACHE_ROOT")


def test_the_record_is_the_runs_startup_json(tmp_path):
    assert startup_variants.startup_record(tmp_path) is None  # a launch that never reached the TaskRunner
    record = {"complete": True, "launch_to_first_step_s": 150.0, "phases": {"cli": 5.0}, "marks": {}}
    (tmp_path / "startup.json").write_text(json.dumps(record))
    read = startup_variants.startup_record(tmp_path)
    # with how much of what the launch's processes import had bytecode (rl_factory/backends/verl/bytecode.py)
    bytecode = read.pop("bytecode")
    assert read == record
    assert isinstance(bytecode["writes_bytecode"], bool) and "verl" in bytecode["without"]
    # and the launcher's background inspection of the model for vLLM, where it ran (vllm_model_info.py)
    inspected = {"architecture": "Qwen3ForCausalLM", "cached": False, "seconds": 11.2, "ended": 1.0}
    (tmp_path / "vllm_model_info.jsonl").write_text(json.dumps(inspected) + "\n")
    assert startup_variants.startup_record(tmp_path)["vllm_model_info"] == [inspected]
    # and what vLLM's server said of its own start, from the job's log (the lines as vLLM 0.24 formats them, behind
    # Ray's prefix for a worker's output)
    lines = ["(vLLMHttpServer pid=81) INFO 12-06 05:20:01 [default_loader.py:431] Loading weights took 0.35 seconds",
             "(vLLMHttpServer pid=81) INFO 12-06 05:20:02 [gpu_model_runner.py:5256] Model loading took 1.12 GiB "
             "memory and 1.904211 seconds",
             "(vLLMHttpServer pid=81) INFO 12-06 05:20:09 [backends.py:1149] Dynamo bytecode transform time: 6.41 s",
             "(vLLMHttpServer pid=81) INFO 12-06 05:20:30 [monitor.py:20] torch.compile took 27.50 s in total",
             "(vLLMHttpServer pid=81) INFO 12-06 05:20:36 [gpu_model_runner.py:6657] Graph capturing finished in 5 "
             "secs, took 0.31 GiB",
             "(vLLMHttpServer pid=81) INFO 12-06 05:20:37 [core.py:345] init engine (profile, create kv cache, warmup "
             "model) took 34.07 s"]
    (tmp_path / "bench_stdout.log").write_text("\n".join(lines) + "\n")
    assert startup_variants.startup_record(tmp_path)["vllm_engine"] == {
        "weights_s": [0.35], "model_load_s": [1.904211], "dynamo_s": [6.41], "compile_total_s": [27.5],
        "graph_capture_s": [5.0], "init_engine_s": [34.07]}


def test_the_listing_names_each_variant_with_what_it_cuts_and_costs(capsys):
    assert startup_variants.main([]) == 0
    out = capsys.readouterr().out
    for name, variant in VARIANTS.items():
        assert f"{name}: {' '.join(variant.overrides) or '(as it is)'}" in out and variant.cost in out
