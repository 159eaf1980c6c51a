"""End to end through the real entry points: `bash main_grpo.sh ...` and `bash main_eval.sh ...`.

Every run uses the session's quick tiny model, tiny budgets, and a copy of the calculator manifest
that gives the server process a unique marker in its environment, so the tests can find the very
servers their runs started (and only those) in /proc and check that none outlives its run.
"""
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.records import jsonl

pytestmark = pytest.mark.slow  # the launch scripts and training runs, end to end

REPO = Path(__file__).resolve().parents[2]
MARKER_VAR = "RL_FACTORY_TEST_RUN"
SCRIPT_TIMEOUT_S = 180


def script_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("RL_FACTORY_DEBUG", None)  # it turns the one-line errors into tracebacks
    return env


def run_script(script: str, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", script, *overrides], cwd=REPO, env=script_env(), capture_output=True,
                          text=True, timeout=SCRIPT_TIMEOUT_S)


def calculator_pids(marker: str) -> set[int]:
    """Live calculator servers whose environment carries `marker`."""
    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"envs.servers.calculator" in (proc / "cmdline").read_bytes() and \
                    f"{MARKER_VAR}={marker}".encode() in (proc / "environ").read_bytes():
                pids.add(int(proc.name))
        except OSError:  # exited meanwhile, or not ours to read
            continue
    return pids


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def write_manifest(directory: Path, servers: dict) -> Path:
    path = directory / f"tools-{uuid.uuid4().hex[:8]}.yaml"
    path.write_text(yaml.safe_dump({"mcpServers": servers}))
    return path


def marked_calculator_manifest(directory: Path) -> tuple[Path, str]:
    """A copy of the calculator manifest whose server carries a fresh marker in its environment."""
    marker = uuid.uuid4().hex
    manifest = yaml.safe_load((REPO / "configs" / "tools" / "calculator.yaml").read_text())
    manifest["mcpServers"]["calculator"]["env"] = {MARKER_VAR: marker}
    path = write_manifest(directory, manifest["mcpServers"])
    assert calculator_pids(marker) == set()  # the "before" of the orphan check
    return path, marker


def no_server_left(marker: str) -> bool:
    # A server may take a moment to exit after its run; an orphan never does.
    return wait_until(lambda: not calculator_pids(marker), timeout_s=10)


@pytest.fixture
def marked_manifest(tmp_path):
    return marked_calculator_manifest(tmp_path)


def tiny_overrides(model_dir, output_dir, manifest) -> list[str]:
    return [f"model.path={model_dir}", "model.device=cpu", f"env.tools={manifest}",
            "trainer.total_steps=2", "data.train_batch_size=2", "rollout.n=2", "data.val_limit=4",
            "rollout.max_response_tokens=32", f"trainer.output_dir={output_dir}", "trainer.eval_every=0",
            "trainer.save_every=1"]


def metrics_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


# ---- a short run, then evaluating its checkpoint ------------------------------------------------

@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    manifest_path, marker = marked_calculator_manifest(tmp)
    run_dir = tmp / "run"
    result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, run_dir, manifest_path))
    return {"result": result, "run_dir": run_dir, "manifest": manifest_path, "marker": marker, "tmp": tmp,
            "model_dir": tiny_model_dir}


def test_training_run_writes_the_run_directory(trained):
    result, run = trained["result"], trained["run_dir"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr

    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["trainer"]["total_steps"] == 2 and config["model"]["path"] == str(trained["model_dir"])

    lines = metrics_lines(run)
    assert [m["step"] for m in lines] == [0, 1, 2]
    for m in (lines[0], lines[2]):
        assert {"val/accuracy", "val/reward/mean"} <= set(m)
        assert 0.0 <= m["val/accuracy"] <= 1.0
    for m in lines[1:]:
        assert {"reward/mean", "accuracy", "tool/call_rate", "timing/rollout_s", "actor/trained_fraction"} <= set(m)
    assert "val/accuracy" not in lines[1]  # eval_every=0: validation only at the start and the end

    for step in (1, 2):
        records = jsonl(run / "rollouts" / f"step_{step:06d}.jsonl")
        assert len(records) == 2 * 2  # train_batch_size * rollout.n
        for r in records:
            assert r["messages"][0]["role"] == "user" and r["messages"][-1]["role"] == "assistant"
            assert isinstance(r["reward"], float) and isinstance(r["advantage"], float)
            assert 0 < r["generated_tokens"] and r["prompt_tokens"] + r["generated_tokens"] <= r["total_tokens"]
        # Per-step tool metrics count exactly this step's tool calls (not a running total).
        calls = sum(len(r["tool_results"]) for r in records)
        assert lines[step].get("tool/calls", 0.0) == calls

    assert (run / "train.log").read_text().count("starting run") == 1

    from transformers import AutoModelForCausalLM, AutoTokenizer
    ckpt = run / "checkpoints" / "step_000002"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    assert model.config.vocab_size == len(tokenizer)
    assert (ckpt / "trainer_state.pt").exists()


def test_no_calculator_server_outlives_the_run(trained):
    assert trained["result"].returncode == 0
    assert no_server_left(trained["marker"]), calculator_pids(trained["marker"])


def test_eval_script_scores_the_checkpoint(trained):
    assert trained["result"].returncode == 0
    out = trained["tmp"] / "eval"
    ckpt = trained["run_dir"] / "checkpoints" / "step_000002"
    result = run_script("main_eval.sh", f"model.path={ckpt}", "eval.limit=4", f"eval.output_dir={out}",
                        f"env.tools={trained['manifest']}", "rollout.max_response_tokens=32", "model.device=cpu")
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout + result.stderr
    for key in ("accuracy", "reward/mean", "num_turns/mean", "tool/success_rate"):
        assert key in printed, key
    report = strict_json((out / "results.json").read_text())  # NaN would make it unreadable to JSON tools
    assert report["rows"] == 4 and report["model"] == str(ckpt)
    metrics = report["metrics"]
    assert {"accuracy", "reward/mean", "num_turns/mean", "tool/success_rate"} <= set(metrics)
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["num_turns/mean"] >= 1.0
    assert len(jsonl(out / "rollouts.jsonl")) == 4
    assert no_server_left(trained["marker"]), calculator_pids(trained["marker"])


def test_eval_with_no_model_scores_the_last_checkpoint_of_the_run_the_config_trains(trained):
    assert trained["result"].returncode == 0
    out, run = trained["tmp"] / "eval_default", trained["run_dir"]
    result = run_script("main_eval.sh", f"trainer.output_dir={run}", "eval.limit=2", f"eval.output_dir={out}",
                        f"env.tools={trained['manifest']}", "rollout.max_response_tokens=32", "model.device=cpu")
    assert result.returncode == 0, result.stderr[-3000:]
    ckpt = run / "checkpoints" / "step_000002"
    said = [line for line in result.stderr.splitlines() if line.startswith("evaluating ")]
    assert said[0] == (f"evaluating {ckpt}: the last checkpoint of the run in {run} "
                       "(model.path=... evaluates another model)")
    assert strict_json((out / "results.json").read_text())["model"] == str(ckpt)
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["path"] == str(ckpt)


# ---- bad input: exit 2, one line naming the problem, no traceback --------------------------------

def _missing_manifest(tmp):
    return ["env.tools=nope.yaml"], ["nope.yaml", "not found"]


def _server_without_command_or_url(tmp):
    path = write_manifest(tmp, {"calc": {"timeout_s": 5}})
    return [f"env.tools={path}"], [path.name, "calc", "command", "url"]


def _unknown_manifest_key(tmp):
    path = write_manifest(tmp, {"calc": {"command": "python", "args": ["-m", "envs.servers.calculator"],
                                         "timeout": 5}})
    return [f"env.tools={path}"], [path.name, "calc", "'timeout'"]


def _missing_reward_file(tmp):
    return ["reward.function=no_such_reward.py:reward"], ["no_such_reward.py", "not found"]


def _row_without_prompt(tmp):
    data = tmp / "train.jsonl"
    data.write_text('{"prompt": "What is 1 + 2?", "answer": "3"}\n{"question": "What is 2 + 2?", "answer": "4"}\n')
    return [f"data.train_files={data}"], [str(data), "line 2", "'prompt'"]


def _misspelled_config_key(tmp):
    return ["trainer.totl_steps=3"], ["totl_steps"]


def _reward_that_raises(tmp):
    reward = tmp / "raising_reward.py"
    reward.write_text("def reward(completion, answer, **_):\n    raise ValueError('boom: no score today')\n")
    first_val = json.loads((REPO / "examples" / "calculator" / "data" / "val.jsonl").read_text().splitlines()[0])
    return ([f"reward.function={reward}:reward", "data.val_limit=2", "rollout.max_response_tokens=4"],
            ["raising_reward.py", "sample 0", first_val["prompt"], "boom: no score today"])


BAD_INPUTS = [_missing_manifest, _server_without_command_or_url, _unknown_manifest_key, _missing_reward_file,
              _row_without_prompt, _misspelled_config_key, _reward_that_raises]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=lambda f: f.__name__.strip("_"))
def test_bad_input_fails_with_a_clear_message(case, tiny_model_dir, tmp_path, marked_manifest):
    manifest, marker = marked_manifest
    overrides, expected = case(tmp_path)
    result = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, tmp_path / "run", manifest), *overrides)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert len(errors[0]) < 400, errors[0]
    for text in expected:
        assert text in errors[0], (text, errors[0])
    assert no_server_left(marker), calculator_pids(marker)


# ---- kill -9 and resume ------------------------------------------------------------------------

SLOW_REWARD = """\
import time
from rewards.exact_match import numeric_exact_match


def reward(completion, answer, **_):
    time.sleep(0.2)  # makes a step last long enough to be killed in the middle of one
    return numeric_exact_match(completion, answer)
"""


def test_killed_run_resumes_without_losing_or_repeating_steps(tiny_model_dir, tmp_path, marked_manifest):
    manifest, marker = marked_manifest
    reward = tmp_path / "slow_reward.py"
    reward.write_text(SLOW_REWARD)
    run = tmp_path / "run"
    args = ["bash", "main_grpo.sh", *tiny_overrides(tiny_model_dir, run, manifest), "trainer.total_steps=4",
            "trainer.save_every=1", f"reward.function={reward}:reward"]
    first_state = run / "checkpoints" / "step_000001" / "trainer_state.pt"
    with (tmp_path / "first.log").open("w") as log:
        proc = subprocess.Popen(args, cwd=REPO, env=script_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            assert wait_until(lambda: first_state.exists() or proc.poll() is not None, SCRIPT_TIMEOUT_S)
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert calculator_pids(marker)  # the server is found while the run is alive
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (run / "checkpoints" / "step_000004").exists()  # it really died mid-run
    # The server is a session leader of its own (the MCP SDK starts it so): it must still exit
    # once its client is gone, not linger as an orphan.
    assert no_server_left(marker), calculator_pids(marker)

    result = subprocess.run(args, cwd=REPO, env=script_env(), capture_output=True, text=True,
                            timeout=SCRIPT_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [m["step"] for m in metrics_lines(run)] == [0, 1, 2, 3, 4]
    for step in range(1, 5):
        path = run / "rollouts" / f"step_{step:06d}.jsonl"
        assert len(path.read_text().splitlines()) == 2 * 2, path
    log_text = (run / "train.log").read_text()
    assert "resuming run in" in log_text and "resumed from" in log_text
    assert (run / "checkpoints" / "step_000004" / "trainer_state.pt").exists()
    assert not list((run / "checkpoints").glob(".tmp-*"))
    assert no_server_left(marker), calculator_pids(marker)


# ---- Ctrl-C, and a server that cannot start ---------------------------------------------------

def test_ctrl_c_ends_the_run_and_its_servers(tiny_model_dir, tmp_path, marked_manifest):
    manifest, marker = marked_manifest
    reward = tmp_path / "slow_reward.py"
    reward.write_text(SLOW_REWARD)
    run = tmp_path / "run"
    args = ["bash", "main_grpo.sh", *tiny_overrides(tiny_model_dir, run, manifest), "trainer.total_steps=50",
            f"reward.function={reward}:reward"]
    first_step = run / "rollouts" / "step_000001.jsonl"
    with (tmp_path / "run.log").open("w") as log:
        proc = subprocess.Popen(args, cwd=REPO, env=script_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            assert wait_until(lambda: first_step.exists() or proc.poll() is not None, SCRIPT_TIMEOUT_S)
            assert proc.poll() is None and calculator_pids(marker), (tmp_path / "run.log").read_text()[-3000:]
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: SIGINT to the foreground group
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    output = (tmp_path / "run.log").read_text()
    assert proc.returncode == 130, output[-3000:]
    assert "interrupted" in output and "Traceback" not in output
    assert no_server_left(marker), calculator_pids(marker)


def test_server_command_not_found_names_the_server_and_keeps_secrets(tmp_path):
    secret = "sk-e2e-" + uuid.uuid4().hex
    inline = "{mcpServers:{ghost:{command:rlf-no-such-command-xyz,env:{SERVICE_KEY:'${oc.env:RLF_E2E_SECRET}'}}}}"
    run = tmp_path / "run"
    result = subprocess.run(["bash", "main_grpo.sh", f"env.tools={inline}", f"trainer.output_dir={run}",
                             "model.device=cpu"], cwd=REPO, env={**script_env(), "RLF_E2E_SECRET": secret},
                            capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "MCP server 'ghost' (rlf-no-such-command-xyz) failed to start" in errors[0]
    assert "Traceback" not in result.stderr
    assert secret not in result.stdout + result.stderr
    # A run that fails its start-up checks writes nothing (config.yaml keeps the reference, never the
    # value: tests/test_secrets_everywhere.py).
    assert not run.exists()


def test_cfg_job_prints_the_composed_config_and_runs_nothing(tmp_path):
    """Hydra's `--cfg job`: the composed config (overrides applied) on stdout, no run directory, exit 0."""
    import yaml

    train = run_script("main_grpo.sh", "rollout.n=4", f"trainer.output_dir={tmp_path / 'run'}", "--cfg", "job")
    assert train.returncode == 0, train.stderr[-2000:]
    cfg = yaml.safe_load(train.stdout)
    assert cfg["rollout"]["n"] == 4 and cfg["trainer"]["backend"] == "embedded"
    assert not (tmp_path / "run").exists()
    evaluate = run_script("main_eval.sh", "eval.n=2", "--cfg", "job")
    assert evaluate.returncode == 0 and yaml.safe_load(evaluate.stdout)["eval"]["n"] == 2
    bad = run_script("main_grpo.sh", "--cfg", "hydra")
    assert bad.returncode == 2 and "only --cfg job is supported" in bad.stderr
