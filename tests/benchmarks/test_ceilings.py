"""benchmarks/ceilings.py's ratios: each phase of a gpu_step record against the ceilings measured in the same run,
the step against the serial limit, and which of the GPU targets hold. The numbers are the H200's 0.6B record of
2026-12-05 (step 3.61 s) beside the ceilings of 2026-12-04 (vLLM 1.92 s with log-probs, 1.53 s without;
forward+backward 0.69 s), on 40,463 tokens a step."""
from __future__ import annotations

import json
import os
import statistics

import pytest

from benchmarks.ceilings import ratios
from benchmarks.pyspy_watch import py_spy
from tests.benchmarks.spinners import spinning_now

TOKENS, GENERATED = 40463, 31591


def phases(update_weights_s: float, mode: str = "update") -> dict:
    return {"generate": {"s": 2.127, "tokens_per_s": GENERATED / 2.127},
            "old_log_prob": {"s": 0.043, "mode": mode, "tokens_per_s": TOKENS / 0.043},
            "update": {"s": 1.084, "tokens_per_s": TOKENS / 1.084}, "update_weights": {"s": update_weights_s}}


VLLM = {"seconds": 1.92, "tokens_per_s": GENERATED / 1.92, "without_logprobs": {"seconds": 1.53}}
TRAIN = {"forward_backward": {"seconds": 0.69, "tokens_per_s": TOKENS / 0.69},
         "forward": {"seconds": 0.25, "tokens_per_s": TOKENS / 0.25}}


def test_each_phase_is_set_beside_its_ceiling_and_the_step_beside_the_serial_limit():
    out = ratios(phases(0.26), 3.611, VLLM, TRAIN)
    assert out["generate_vs_vllm"] == pytest.approx(1.92 / 2.127)
    assert out["generate_vs_vllm_best"] is None  # a ceiling recorded before its best run was kept
    best = ratios(phases(0.26), 3.611, {**VLLM, "best_tokens_per_s": GENERATED / 1.5}, TRAIN)
    assert best["generate_vs_vllm_best"] == pytest.approx(1.5 / 2.127)  # the target stays on the median
    assert best["targets_met"]["generate_vs_vllm"]
    assert out["update_vs_forward_backward"] == pytest.approx(0.69 / 1.084)
    assert out["old_log_prob_vs_forward"] is None  # `update` mode runs no forward: no ceiling
    assert out["serial_limit_s"] == pytest.approx(1.53 + 0.69)
    assert out["step_vs_serial_limit"] == pytest.approx(3.611 / 2.22)
    # 1.63x the limit, generation at 0.90 of vLLM, the update at 0.64, a 0.26-s sync: only generation holds
    assert out["targets_met"] == {"step_vs_serial_limit": False, "generate_vs_vllm": True,
                                  "update_vs_forward_backward": False, "weight_sync_s": False}


def test_a_run_that_meets_every_target_says_so_and_a_missing_ceiling_judges_nothing():
    fast = {**phases(0.12, mode="recompute"), "update": {"s": 0.9, "tokens_per_s": TOKENS / 0.9}}
    assert all(ratios(fast, 3.3, VLLM, TRAIN)["targets_met"].values())
    assert ratios(fast, 3.3, VLLM, TRAIN)["old_log_prob_vs_forward"] == pytest.approx(0.25 / 0.043)
    failed = ratios(phases(0.12), 3.3, {"error": "vLLM did not start"}, TRAIN)  # a ceiling that failed to run
    assert failed["generate_vs_vllm"] is None and failed["serial_limit_s"] is None
    assert set(failed["targets_met"]) == {"update_vs_forward_backward", "weight_sync_s"}


def test_vllm_alone_is_the_faster_of_its_defaults_and_the_rollouts_configuration():
    """The H100 launch at 58270373a9cd: vLLM's defaults ran the step's requests in a median 2.21 s, the rollout's
    engine arguments in 1.27 s. Against the defaults the 2.17-s rollout looked at vLLM's speed; it is at 0.58 of
    vLLM at its fastest, and the target is judged there."""
    rollout = {**phases(0.279), "generate": {"s": 2.171, "tokens_per_s": 31597 / 2.171}}
    defaults = {"seconds": 2.209, "tokens_per_s": 31502 / 2.209, "best_tokens_per_s": 31502 / 1.365,
                "without_logprobs": {"seconds": 2.569}}
    configured = {"seconds": 1.267, "tokens_per_s": 31502 / 1.267, "best_tokens_per_s": 31502 / 1.204,
                  "without_logprobs": {"seconds": 0.98}}
    out = ratios(rollout, 3.584, defaults, TRAIN, configured)
    assert out["vllm_ceiling"] == "configured"
    assert out["generate_vs_vllm"] == pytest.approx((31597 / 2.171) / (31502 / 1.267))
    assert out["generate_vs_vllm"] == out["generate_vs_vllm_configured"]
    assert out["generate_vs_vllm_best"] == pytest.approx((31597 / 2.171) / (31502 / 1.204))  # the same ceiling's best
    assert out["generate_vs_vllm_defaults"] > 1 and not out["targets_met"]["generate_vs_vllm"]
    assert out["serial_limit_s"] == pytest.approx(0.98 + 0.69)  # the faster run without log-probs
    # a configured ceiling measured with log-probs only (as at 58270373a9cd): vLLM ran these requests in 1.267 s with
    # log-probs, so without them it takes no longer; the defaults' 2.569 s without would inflate the limit
    only_with = {k: v for k, v in configured.items() if k != "without_logprobs"}
    assert ratios(rollout, 3.584, defaults, TRAIN, only_with)["serial_limit_s"] == pytest.approx(1.267 + 0.69)
    # where the defaults are the faster, or the configured ceiling failed, the defaults are the ceiling
    assert ratios(rollout, 3.584, configured, TRAIN, defaults)["vllm_ceiling"] == "defaults"
    failed = ratios(rollout, 3.584, defaults, TRAIN, {"error": "vLLM did not start"})
    assert failed["vllm_ceiling"] == "defaults" and failed["generate_vs_vllm_configured"] is None
    assert failed["generate_vs_vllm"] == pytest.approx((31597 / 2.171) / (31502 / 2.209))


def test_rollouts_without_log_probs_are_set_beside_vllm_without_them():
    """Steps whose rollouts asked vLLM for no log-probs (sampling_logprobs_every) did less work than a ceiling with
    them: generation is set beside each ceiling's run without, the faster of those, and beside the one with too."""
    rollout = {**phases(0.1), "generate": {"s": 1.7, "tokens_per_s": 31502 / 1.7, "sampling_logprobs": False}}
    def ceiling(with_s: float, without_s: float) -> dict:
        return {"seconds": with_s, "tokens_per_s": 31502 / with_s,
                "without_logprobs": {"seconds": without_s, "tokens_per_s": 31502 / without_s}}
    defaults, configured = ceiling(2.2, 1.6), ceiling(2.0, 1.5)
    out = ratios(rollout, 2.9, defaults, TRAIN, configured)
    assert out["vllm_ceiling"] == "configured" and out["generate_vs_vllm"] == pytest.approx(1.5 / 1.7)
    assert out["generate_vs_vllm_defaults"] == pytest.approx(1.6 / 1.7)
    assert out["generate_vs_vllm_with_logprobs"] == pytest.approx(2.0 / 1.7)
    assert out["serial_limit_s"] == pytest.approx(1.5 + 0.69)
    asked = ratios({**rollout, "generate": {**rollout["generate"], "sampling_logprobs": True}}, 2.9, defaults, TRAIN,
                   configured)
    assert asked["generate_vs_vllm"] == pytest.approx(2.0 / 1.7) and "generate_vs_vllm_with_logprobs" not in asked


# ---- one record over two launches (benchmarks/launches.py) -------------------------------------------------------

def launch_record(step_s: list[float], update_s: list[float], gpu: str = "NVIDIA H200", **job) -> dict:
    per_step = {"step": step_s, "generate": [2.1] * len(step_s), "old_log_prob": [0.04] * len(step_s),
                "update": update_s, "update_weights": [0.26] * len(step_s), "total_tokens": [TOKENS] * len(step_s)}
    return {"benchmark": "gpu_step", "date": "2026-12-05T13:08:01+00:00", "commit": "06179fed523c",
            "command": "gpu_step.py --shape qwen3-0.6b", "machine": {"gpu": gpu}, "shape": "qwen3-0.6b", "batch": 16,
            "n": 8, "steps": 5, "measured_steps": [2, 3, 4, 5], "overrides": [], **job, "per_step": per_step,
            "step_s": statistics.median(step_s), "phases": phases(0.26)}


def test_two_launches_of_one_job_are_reported_over_both_and_only_the_same_job_is_joined(tmp_path):
    from benchmarks.launches import earlier_launch, join

    first = launch_record([3.5, 3.6, 3.7, 3.6], [1.0, 1.1, 1.0, 1.1])
    other_gpu = launch_record([9.0] * 4, [9.0] * 4, gpu="NVIDIA H100 80GB HBM3")
    other_job = launch_record([9.0] * 4, [9.0] * 4, batch=32)
    unjoinable = {**launch_record([9.0] * 4, [9.0] * 4), "per_step": None}  # a record from before per-step numbers
    results = tmp_path / "gpu_step.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in (first, other_gpu, other_job, unjoinable)))
    this = {key: value for key, value in launch_record([3.8, 3.9, 3.8, 4.0], [1.2, 1.2, 1.3, 1.2]).items()
            if key not in ("benchmark", "date", "commit", "command", "machine")}
    this["ceilings"] = {"vllm_generate": VLLM, **TRAIN}
    assert earlier_launch(this, "NVIDIA H200", results) == first
    assert earlier_launch(this, "NVIDIA A100", results) is None
    generate = {**this["phases"]["generate"], "sampling_logprobs": False}
    without = {**this, "phases": {**this["phases"], "generate": generate}}
    assert earlier_launch(without, "NVIDIA H200", results) is None  # rollouts without vLLM's log-probs: other work
    joined = join(this, first)
    assert joined["launches"] == 2 and joined["earlier_invocation"]["commit"] == "06179fed523c"
    assert joined["step_s"] == pytest.approx(statistics.median([3.5, 3.6, 3.7, 3.6, 3.8, 3.9, 3.8, 4.0]))
    assert joined["phases"]["update"]["s"] == pytest.approx(1.15)  # the median of both launches' eight steps
    assert joined["this_launch"]["step_s"] == pytest.approx(3.85)
    assert joined["ratio_to_ceiling"]["update_vs_forward_backward"] == pytest.approx(0.69 / 1.15)
    assert joined["ratio_to_ceiling"]["step_vs_serial_limit"] == pytest.approx(joined["step_s"] / 2.22)


def test_a_launch_on_another_machine_of_the_same_gpu_model_is_not_joined(tmp_path):
    from benchmarks.launches import earlier_launch
    from benchmarks.record import boot_id

    here, there = {"gpu": "NVIDIA H200", "boot_id": "b-here"}, {"gpu": "NVIDIA H200", "boot_id": "b-there"}
    this = {**launch_record([3.8] * 4, [1.2] * 4), "date": "2026-12-05T14:00:00+00:00", "machine": here}
    results = tmp_path / "gpu_step.jsonl"
    for earlier, joined in (({**launch_record([3.5] * 4, [1.0] * 4), "machine": there}, False),
                            ({**launch_record([3.5] * 4, [1.0] * 4), "machine": here}, True),
                            (launch_record([3.5] * 4, [1.0] * 4), True)):  # from before records kept the boot id
        results.write_text(json.dumps(earlier) + "\n")
        assert (earlier_launch(this, "NVIDIA H200", results) == earlier) is joined
    # a launch's own result has no machine yet: this machine's boot id stands for it
    results.write_text(json.dumps({**launch_record([3.5] * 4, [1.0] * 4), "machine": there}) + "\n")
    assert earlier_launch({k: v for k, v in this.items() if k != "machine"}, "NVIDIA H200", results) is None
    assert boot_id()  # Linux: every record made here carries one


def test_a_launch_without_its_job_earlier_says_what_made_the_newest_there_another_job(tmp_path, capsys):
    """An override given to one launch only (vLLM's iteration log, say) makes two jobs: the launch stays one launch,
    and the record and stderr name what differed from the newest launch on that GPU."""
    from benchmarks.launches import with_earlier

    logged = {**launch_record([3.5, 3.6, 3.7, 3.6], [1.0, 1.1, 1.0, 1.1]), "overrides": ["+iterations=true"]}
    results = tmp_path / "gpu_step.jsonl"
    results.write_text(json.dumps(logged) + "\n")
    this = {key: value for key, value in launch_record([3.8, 3.9, 3.8, 4.0], [1.2, 1.2, 1.3, 1.2]).items()
            if key not in ("benchmark", "date", "commit", "command", "machine")}
    alone = with_earlier(this, "NVIDIA H200", results)
    assert alone["launches"] == 1 and alone["earlier_missing"] == str(results)
    assert alone["earlier_differs"] == {"overrides": [["+iterations=true"], []]}
    assert "differs in" in capsys.readouterr().err
    joined = with_earlier({**this, "overrides": ["+iterations=true"]}, "NVIDIA H200", results)
    assert joined["launches"] == 2 and "earlier_differs" not in joined


def test_a_launch_without_ceilings_is_rated_against_the_earlier_launchs():
    """gpu_suite.sh ours_shape measures no ceilings: joined with a launch of the same job that did, the medians over
    both are set beside those, and the record says whose they are."""
    from benchmarks.launches import join

    measured = {**launch_record([3.5, 3.6, 3.7, 3.6], [1.0, 1.1, 1.0, 1.1]),
                "ceilings": {"vllm_generate": VLLM, **TRAIN}}
    bare = {**launch_record([3.8, 3.9, 3.8, 4.0], [1.2, 1.2, 1.3, 1.2]), "date": "2026-12-06T17:43:54+00:00"}
    joined = join(bare, measured)
    assert joined["ceilings_from"] == "earlier_invocation" and joined["ceilings"]["vllm_generate"] == VLLM
    assert joined["ratio_to_ceiling"]["step_vs_serial_limit"] == pytest.approx(joined["step_s"] / 2.22)
    assert "ceilings_from" not in join(measured, bare)  # a launch's own ceilings stay its own
    assert "ratio_to_ceiling" not in join(bare, bare)


def test_a_launch_recorded_without_its_earlier_one_is_joined_afterwards(tmp_path):
    """ab.py names the model by an absolute path, a hand-run gpu_step.py by a relative one: the same weights, so
    the same job; `python -m benchmarks.launches RESULTS` joins the newest record with it after the fact."""
    import subprocess
    import sys
    from pathlib import Path

    from benchmarks.launches import same_job

    root = Path(__file__).resolve().parents[2]
    earlier = {**launch_record([2.3, 2.3, 2.3, 2.4], [0.84, 0.85, 0.83, 0.86]),
               "model": str(root / "outputs/gpu_suite/model-qwen3-0.6b"), "date": "2026-12-06T02:42:56+00:00"}
    newest = {**launch_record([2.8, 2.8, 2.9, 2.8], [0.91, 0.90, 0.90, 0.94]), "model": "outputs/gpu_suite/model-qwen3-0.6b",
              "date": "2026-12-06T02:47:28+00:00", "launches": 1, "earlier_missing": "/root/outputs/bench/gpu_step.jsonl",
              "ceilings": {"vllm_generate": VLLM, **TRAIN}}
    assert same_job(earlier, newest) and not same_job(earlier, {**newest, "model": "outputs/gpu_suite/model-qwen3-4b"})
    results = tmp_path / "gpu_step.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in (earlier, newest)))
    done = subprocess.run([sys.executable, "-m", "benchmarks.launches", str(results)], cwd=root, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    joined = json.loads(done.stdout)
    assert json.loads(results.read_text().splitlines()[-1]) == joined  # recorded in the same file
    assert joined["launches"] == 2 and "earlier_missing" not in joined and joined["date"] == newest["date"]
    assert joined["earlier_invocation"]["date"] == earlier["date"]
    assert joined["step_s"] == pytest.approx(statistics.median([2.3, 2.3, 2.3, 2.4, 2.8, 2.8, 2.9, 2.8]))
    # a file whose newest record has no earlier launch of its job says so instead of joining another
    results.write_text(json.dumps(newest) + "\n")
    alone = subprocess.run([sys.executable, "-m", "benchmarks.launches", str(results)], cwd=root, capture_output=True,
                           text=True, timeout=120)
    assert alone.returncode != 0 and "no earlier launch" in alone.stderr


# ---- vLLM alone as the rollout's server was configured (ceilings.py, configured_engine_args) --------------------

@pytest.mark.slow  # composes verl's config
def test_the_configured_ceiling_gets_the_engine_arguments_verls_server_would(tmp_path, tiny_model_dir):
    pytest.importorskip("verl", reason="verl is an extra")
    import importlib.util
    from pathlib import Path

    from omegaconf import OmegaConf

    from benchmarks.ceilings import SERVER_ARGS, configured_engine_args
    from rl_factory.backends.verl.config import compose_verl
    from rl_factory.backends.verl.launcher import absolute
    from rl_factory.config import load_config, parse, split_overrides

    ours, raw = split_overrides(["trainer.backend=verl", "trainer.n_gpus_per_node=1",
                                 "+actor_rollout_ref.rollout.engine_kwargs.vllm.stream_interval=7",
                                 "actor_rollout_ref.rollout.max_model_len=900"])
    cfg = compose_verl(absolute(parse(load_config("grpo", ours))), raw,
                       {"train": "/d/train.parquet", "val": "/d/val.parquet"}, str(tiny_model_dir))
    rollout = OmegaConf.to_container(cfg.actor_rollout_ref.rollout, resolve=True)
    args = configured_engine_args(rollout)
    # verl's server module imports vLLM, which a CPU install lacks: its source is read instead
    verl_dir = Path(importlib.util.find_spec("verl").origin).parent
    server = (verl_dir / "workers" / "rollout" / "vllm_rollout" / "vllm_async_server.py").read_text()
    for key in SERVER_ARGS:  # each is an engine argument verl's server takes from the rollout config of that name
        assert f'"{key}": self.config.{key}' in server, key
    assert "enable_sleep_mode" not in rollout and args["enable_sleep_mode"] is True  # verl's dataclass default
    assert args["max_num_batched_tokens"] == rollout["max_num_batched_tokens"]
    assert args["logprobs_mode"] == rollout["logprobs_mode"]
    assert args["max_model_len"] == 900  # the server's context, as given (verl's None: the model's, as there)
    # the compilation config as verl merges it: our tuning's (a JSON string), verl's default mode where it has none,
    # the tuned capture sizes
    assert args["compilation_config"]["cudagraph_capture_sizes"] == rollout["cudagraph_capture_sizes"]
    assert args["compilation_config"]["cudagraph_mode"]
    assert args["stream_interval"] == 7  # the command line's engine_kwargs over the server's own arguments
    assert "worker_extension_cls" not in args and "load_format" not in args
    json.dumps(args)  # travels to the ceiling's process as JSON


def test_each_variant_puts_one_configured_argument_back_at_vllms_default():
    from benchmarks.ceiling_variants import variants

    configured = {"logprobs_mode": "processed_logprobs", "enable_sleep_mode": True, "stream_interval": 512,
                  "dtype": "bfloat16"}
    runs = variants(configured)
    assert runs["configured"] == configured
    assert set(runs) == {"configured", "without_logprobs_mode", "without_enable_sleep_mode", "without_stream_interval"}
    assert runs["without_enable_sleep_mode"] == {"logprobs_mode": "processed_logprobs", "stream_interval": 512,
                                                 "dtype": "bfloat16"}
    assert set(variants(configured, ["stream_interval", "kv_cache_memory_bytes"])) == {"configured",
                                                                                       "without_stream_interval"}


def test_a_set_variant_puts_its_own_arguments_over_the_configured_ones():
    import argparse

    from benchmarks.ceiling_variants import parse_set, variants

    configured = {"logprobs_mode": "processed_logprobs", "enable_sleep_mode": True,
                  "compilation_config": {"mode": "NONE", "cudagraph_mode": "FULL", "cudagraph_capture_sizes": [1, 2]}}
    name, changes = parse_set('compiled={"compilation_config": {"mode": "VLLM_COMPILE"}, "logprobs_mode": null}')
    runs = variants(configured, [], {name: changes})
    assert set(runs) == {"configured", "compiled"}  # an empty --only: no without_ variant
    # a key inside the compilation config replaces that key only: the capture sizes stay as configured
    assert runs["compiled"] == {"enable_sleep_mode": True, "compilation_config": {
        "mode": "VLLM_COMPILE", "cudagraph_mode": "FULL", "cudagraph_capture_sizes": [1, 2]}}
    assert runs["configured"] == configured and configured["compilation_config"]["mode"] == "NONE"
    for bad, says in (("compiled", "expected NAME="), ("x={mode: 1}", "not JSON"), ("=[1]", "expected NAME=")):
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            parse_set(bad)


def test_each_variant_runs_the_configured_ceiling_with_its_own_arguments(tmp_path):
    """The script end to end on a CPU machine: each variant reaches vLLM in a ceiling process of its own (which
    this machine lacks: the error is vLLM's import), with its spec kept in a directory of its own."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = {"model": "m", "gpu_memory_utilization": 0.5, "n": 2, "prompt_len": 4, "gen_lens": [3, 5], "vocab": 100,
            "engine_args": {"logprobs_mode": "processed_logprobs", "enable_sleep_mode": True}}
    (tmp_path / "ceiling-vllm_configured.spec.json").write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, "benchmarks/ceiling_variants.py", str(tmp_path), "--only", "logprobs_mode"],
                          cwd=root, capture_output=True, text=True, timeout=300, env={**os.environ, "BENCH_RESULTS_DIR": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(line["runs"]) == {"configured", "without_logprobs_mode"}
    assert all("No module named 'vllm'" in run["error"] for run in line["runs"].values()), line["runs"]
    kept = json.loads((tmp_path / "without_logprobs_mode" / "ceiling-vllm_configured.spec.json").read_text())
    assert kept["engine_args"] == {"enable_sleep_mode": True} and kept["gen_lens"] == [3, 5]
    assert kept["without_logprobs"] is False  # the rollout's work alone: the serial limit is gpu_step.py's


# vLLM's engine clients as the ceilings use them, for a CPU machine without vLLM: each request generates exactly
# its max_tokens, and AsyncLLM refuses a request on another event loop than the one it was built in (vLLM's output
# handler is a task of that loop)
_VLLM_STAND_IN = {
    "vllm/__init__.py": '''
class SamplingParams:
    def __init__(self, max_tokens, logprobs=None, **kw):
        self.max_tokens, self.logprobs = max_tokens, logprobs
class _Out:
    def __init__(self, n):
        self.outputs = [type("C", (), {"token_ids": list(range(n))})()]
def _collection(scanned):
    return (f"(EngineCore_DP0 pid=7) INFO 12-07 11:01:02 [gc_utils.py:86] GC took 500.0ms to complete. "
            f"Collected 3 objects (out of {scanned}) in GC generation 2.")
class LLM:
    def __init__(self, model, **engine):
        import os
        self.engine = engine
        if os.environ.get("STAND_IN_BUSY"):
            with open(os.environ["STAND_IN_BUSY"], "a") as f:
                from tests.benchmarks.spinners import spinning_now
                f.write(f"{spinning_now()} ")
        if os.environ.get("STAND_IN_ENV_SEEN"):
            with open(os.environ["STAND_IN_ENV_SEEN"], "a") as f:
                f.write(os.environ.get("STAND_IN_MARK", "-") + " ")
        if os.environ.get("STAND_IN_ENGINE"):  # a child titled as vLLM titles its engine core, gone at exit
            import atexit, subprocess, sys
            core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "VLLM::EngineCore"])
            atexit.register(core.kill)
        if os.environ.get("STAND_IN_GC"):  # as VLLM_GC_DEBUG=1 has the engine core log a collection at start-up
            print(_collection(900000), flush=True)
    def generate(self, requests, params, use_tqdm=False):
        import os, time
        time.sleep(float(os.environ.get("STAND_IN_PASS_S", "0")))
        if os.environ.get("STAND_IN_GC") and params[0].logprobs is not None:  # and in every pass with log-probs
            print(_collection(800000), flush=True)
        assert len(requests) == len(params)
        return [_Out(p.max_tokens) for p in params]
''',
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": '''
class AsyncEngineArgs:
    def __init__(self, model, **engine):
        self.model, self.engine = model, engine
''',
    "vllm/v1/__init__.py": "",
    "vllm/v1/engine/__init__.py": "",
    "vllm/v1/engine/async_llm.py": '''
import asyncio, os
from vllm import _Out
class AsyncLLM:
    def __init__(self, args):
        self.loop, self.ids = asyncio.get_running_loop(), set()
    @classmethod
    def from_engine_args(cls, args):
        return cls(args)
    async def generate(self, prompt, params, request_id):
        assert asyncio.get_running_loop() is self.loop, "a request on another event loop"
        assert request_id not in self.ids
        self.ids.add(request_id)
        for n in range(1, params.max_tokens + 1):  # cumulative outputs, the final one last
            await asyncio.sleep(0)
            yield _Out(n)
    def shutdown(self):
        open(os.environ["STAND_IN_SHUTDOWN"], "w").close()
''',
}


@pytest.mark.parametrize("frontend", ["llm", "async"])
def test_the_vllm_ceiling_times_each_pass_through_either_engine_client(tmp_path, frontend):
    """The ceiling's own plumbing, vLLM stood in for (a CPU machine has none): the async frontend builds AsyncLLM in
    the event loop its requests run on, reads every request to its final output, and shuts the engine down."""
    import subprocess
    import sys
    from pathlib import Path

    for name, text in _VLLM_STAND_IN.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    root = Path(__file__).resolve().parents[2]
    spec = {"model": "m", "gpu_memory_utilization": 0.5, "n": 2, "prompt_len": 4, "gen_lens": [3, 5, 2, 7],
            "vocab": 100, "engine_args": {"enable_sleep_mode": True}, "frontend": frontend, "without_logprobs": True}
    result = tmp_path / "ceiling.json"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}", "STAND_IN_SHUTDOWN": str(tmp_path / "down")}
    done = subprocess.run([sys.executable, "benchmarks/ceilings.py", "vllm_configured", "--spec", json.dumps(spec),
                           "--result", str(result)], cwd=root, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(result.read_text())
    assert out["tokens"] == out["without_logprobs"]["tokens"] == 17  # every request read to its final output
    assert len(out["all_seconds"]) == len(out["without_logprobs"]["all_seconds"]) == 5
    assert out["frontend"] == frontend and out["engine_args"] == {"enable_sleep_mode": True}
    assert (tmp_path / "down").exists() == (frontend == "async")


def test_an_unknown_frontend_is_refused_by_name():
    from benchmarks.ceilings import ceiling_vllm

    with pytest.raises(ValueError, match="spec frontend 'http'"):
        ceiling_vllm({"gen_lens": [1], "gpu_memory_utilization": 0.5, "prompt_len": 2, "n": 1, "vocab": 20,
                      "frontend": "http"})


def _variants_with_stand_in(tmp_path, *args: str, **env: str) -> dict:
    """benchmarks/ceiling_variants.py end to end, vLLM stood in for, on a spec of two requests: its JSON line."""
    import subprocess
    import sys
    from pathlib import Path

    for name, text in _VLLM_STAND_IN.items():
        (tmp_path / "site" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "site" / name).write_text(text)
    root = Path(__file__).resolve().parents[2]
    spec = {"model": "m", "gpu_memory_utilization": 0.5, "n": 2, "prompt_len": 4, "gen_lens": [3, 5], "vocab": 100,
            "engine_args": {"enable_sleep_mode": True}}
    (tmp_path / "ceiling-vllm_configured.spec.json").write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, "benchmarks/ceiling_variants.py", str(tmp_path), *args], cwd=root,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{root}",
                               "BENCH_RESULTS_DIR": "", **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _kept_spec(tmp_path, variant: str) -> dict:
    return json.loads((tmp_path / variant / "ceiling-vllm_configured.spec.json").read_text())


def test_each_variant_runs_through_each_engine_client_asked_for(tmp_path):
    line = _variants_with_stand_in(tmp_path, "--only", "--without-logprobs", "--frontends", "llm", "async",
                                   STAND_IN_SHUTDOWN=str(tmp_path / "down"))
    assert list(line["runs"]) == ["configured", "configured@async"]
    assert set(line["over_configured"]) == set(line["over_configured_without_logprobs"]) == set(line["runs"])
    kept = _kept_spec(tmp_path, "configured@async")
    assert kept["frontend"] == "async" and kept["without_logprobs"] is True


def test_each_variant_also_runs_beside_busy_cores_that_are_gone_after(tmp_path):
    """`--busy-cores 2`: each variant once on an idle host and once with two spinning processes beside it, which are
    running while vLLM is built and gone once the variant ends."""
    seen = tmp_path / "spinners.txt"
    before = spinning_now()
    line = _variants_with_stand_in(tmp_path, "--only", "--busy-cores", "2", STAND_IN_BUSY=str(seen))
    assert list(line["runs"]) == ["configured", "configured+busy2"]
    assert [int(n) - before for n in seen.read_text().split()] == [0, 2]  # as each variant's vLLM was built
    assert spinning_now() == before
    assert _kept_spec(tmp_path, "configured+busy2")["busy_cores"] == 2


@pytest.mark.skipif(py_spy() is None, reason="py-spy is not installed (pip install py-spy)")
def test_py_spy_records_the_engine_core_over_the_passes_without_log_probs(tmp_path):
    """`--pyspy`: real py-spy on the ceiling's child titled VLLM::EngineCore (a sleeping stand-in) over the timed
    passes without log-probs, its stacks kept in the variant's directory and summed up in the line."""
    line = _variants_with_stand_in(tmp_path, "--only", "--without-logprobs", "--pyspy", STAND_IN_ENGINE="1",
                                   STAND_IN_PASS_S="0.3")
    (pid, profile), = line["runs"]["configured"]["pyspy"].items()
    assert profile["samples"] > 10, profile
    assert any("sleep" in frame or "<module>" in frame for frame, _ in profile["top"]), profile["top"]
    assert (tmp_path / "configured" / "pyspy" / f"EngineCore-{pid}.txt").exists()


def test_the_engines_collections_inside_the_timed_passes_are_told_apart_from_start_ups(tmp_path):
    """VLLM_GC_DEBUG=1 before a ceiling: the engine's collections are summed, and those inside its timed passes are
    counted by kind of pass, read from one stream in the order written whichever one vLLM logs to."""
    gc = _variants_with_stand_in(tmp_path, "--only", "--without-logprobs", STAND_IN_GC="1")["runs"]["configured"]
    gc = gc["engine_gc"]
    assert gc["gen2"]["collections"] == 1 + 1 + 5  # start-up, the warm-up, five timed passes with log-probs
    assert gc["in_timed_passes"] == {
        "with_logprobs": {"passes": 5, "collections": 5, "total_s": 2.5, "max_ms": 500.0},
        "without_logprobs": {"passes": 5, "collections": 0, "total_s": 0.0, "max_ms": 0.0}}


def test_a_set_variant_may_set_its_processs_environment(tmp_path):
    """`--set 'NAME={"env": {...}}'`: environment variables of that variant's ceiling process, not engine arguments."""
    seen = tmp_path / "seen.txt"
    marked = 'marked={"env": {"STAND_IN_MARK": "x"}, "max_num_seqs": 64}'
    line = _variants_with_stand_in(tmp_path, "--only", "--set", marked, STAND_IN_ENV_SEEN=str(seen))
    assert list(line["runs"]) == ["configured", "marked"]
    assert seen.read_text().split() == ["-", "x"]
    kept = _kept_spec(tmp_path, "marked")
    assert kept["env"] == {"STAND_IN_MARK": "x"}
    assert kept["engine_args"] == {"enable_sleep_mode": True, "max_num_seqs": 64}
