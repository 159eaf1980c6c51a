"""A first run and what a new user does right after it, through the real entry points.

One short training run (tiny model, two steps, validation every step) is shared: its report is read
back and driven in a headless Chromium, its checkpoint is evaluated (pass@k, failure taxonomy, a
bootstrap comparison), its rollouts are re-scored, and starting it again with other settings or the
same settings must leave its directory untouched.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.browser import chromium
from tests.e2e.test_main_scripts import (REPO, marked_calculator_manifest, metrics_lines, no_server_left, run_script,
                                         script_env, strict_json, tiny_overrides)
from tests.records import jsonl

pytestmark = pytest.mark.slow  # the launch scripts and training runs, end to end



@pytest.fixture(scope="module")
def first_run(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("first_run")
    manifest, marker = marked_calculator_manifest(tmp)
    run = tmp / "calculator_grpo"
    overrides = [*tiny_overrides(tiny_model_dir, run, manifest), "trainer.eval_every=1"]
    result = run_script("main_grpo.sh", *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    return {"run": run, "overrides": overrides, "manifest": manifest, "marker": marker, "tmp": tmp}


def snapshot(run_dir: Path) -> dict:
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def records(run_dir: Path, name: str) -> list[dict]:
    return jsonl(run_dir / "rollouts" / name)


def page_data(html: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S).group(1))


# ---- the report ----------------------------------------------------------------------------------

def test_report_is_written_at_validation_and_at_the_end(first_run):
    run = first_run["run"]
    data = page_data((run / "report.html").read_text())
    assert data["runs"][0]["run_id"] == json.loads((run / "run.json").read_text())["run_id"]
    assert data["runs"][0]["steps"] == 2
    stored = sum(len(records(run, p.name)) for p in (run / "rollouts").glob("*.jsonl"))
    assert len(data["trajectories"]) == data["total"] == stored
    assert {(t["split"], t["step"]) for t in data["trajectories"]} == {("val", 0), ("val", 1), ("val", 2),
                                                                       ("train", 1), ("train", 2)}
    reward = next(f for f in data["figures"] if f["id"] == "reward")
    assert [t["x"] for t in reward["data"]] == [[1, 2], [0, 1, 2]]


def _open(page, path: Path) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_selector(".chart .main-svg")
    return errors


@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:
        yield browser


def test_report_in_a_headless_browser(first_run, browser):
    run = first_run["run"]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = _open(page, run / "report.html")
    points = page.evaluate("Array.from(document.querySelectorAll('.chart')).map(d => "
                           "[d.id, d.data.reduce((n, t) => n + (t.x || t.z || []).length, 0)])")
    assert len(points) >= 8 and all(n > 0 for _, n in points), points
    assert page.locator(".chart .scatterlayer .point, .chart .barlayer .point").count() > 0  # drawn, not just data

    trajs = [r for p in sorted((run / "rollouts").glob("*.jsonl")) for r in records(run, p.name)]

    def listed() -> int:
        return page.locator("#traj-list tbody tr").count()

    assert listed() == len(trajs)
    page.select_option("#f-split", "val")
    val = sum(len(records(run, f"val_step_{s:06d}.jsonl")) for s in (0, 1, 2))
    assert listed() == val and page.inner_text("#match-count").startswith(f"{val} of {len(trajs)}")
    page.select_option("#f-split", "")
    page.fill("#f-step-min", "2")
    page.fill("#f-step-max", "2")
    assert listed() == len(records(run, "step_000002.jsonl")) + len(records(run, "val_step_000002.jsonl"))
    page.fill("#f-step-min", "")
    page.fill("#f-step-max", "")
    page.fill("#f-text", "calculator")  # free text reaches tool-call names and arguments
    with_calls = sum(any(c["name"] == "calculator" for c in r["tool_calls"]) or
                     any("calculator" in (m.get("content") or "") for m in r["messages"]) for r in trajs)
    assert listed() == with_calls
    page.fill("#f-text", "")
    page.select_option("#f-error", "__some")
    failing = sum(bool([x for x in r["tool_results"] if x["error_kind"]] or [c for c in r["tool_calls"] if c["error"]])
                  for r in trajs)
    assert listed() == failing
    page.select_option("#f-error", "")
    page.fill("#f-reward-min", "1")
    assert listed() == sum((r["reward"] or 0) >= 1 for r in trajs)
    page.fill("#f-reward-min", "")
    stop = sorted({r["stop_reason"] for r in trajs})[0]
    page.select_option("#f-stop", stop)
    assert listed() == sum(r["stop_reason"] == stop for r in trajs)
    page.select_option("#f-stop", "")

    # A trajectory with a tool call shows the call and its result apart from the text.
    page.select_option("#f-split", "train")
    page.select_option("#f-sort", "step")  # oldest first: the order of the rollout files
    rows = page.locator("#traj-list tbody tr")
    shown = []
    for i in range(min(rows.count(), 40)):
        rows.nth(i).click()
        shown.append((page.locator("#traj-detail .call").count(), page.locator("#traj-detail .msg.tool").count()))
    train_rows = [r for r in trajs if r.get("advantage") is not None][:40]
    assert [(len(r["tool_calls"]), len(r["tool_results"])) for r in train_rows] == shown
    assert errors == []


# ---- a second start: other settings, the same settings --------------------------------------------

def test_other_settings_do_not_resume_into_the_finished_run(first_run):
    run = first_run["run"]
    before = snapshot(run)
    result = run_script("main_grpo.sh", *first_run["overrides"], "rollout.n=4", "optim.lr=1e-5")
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    assert len(errors) == 1 and f"holds run {run_id}, checkpoint at step 2" in errors[0], result.stderr
    assert "rollout.n 2 -> 4" in errors[0] and "optim.lr 0.0003 -> 1e-05" in errors[0]
    assert "experiment_name=" in errors[0] and "trainer.resume=never" in errors[0] and "trainer.resume=force" in errors[0]
    assert "Traceback" not in result.stderr and "resuming run" not in result.stderr
    assert snapshot(run) == before  # config.yaml, run.json, metrics, logs: untouched


def test_the_same_command_again_says_the_run_is_finished(first_run):
    run = first_run["run"]
    before = snapshot(run)
    result = run_script("main_grpo.sh", *first_run["overrides"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "nothing to train" in result.stderr and "finished at step 2" in result.stderr
    assert "raise trainer.total_steps above 2" in result.stderr and "done:" not in result.stderr
    assert snapshot(run) == before
    assert no_server_left(first_run["marker"])


def further(overrides: list[str]) -> list[str]:
    """The run's overrides with one more step to train (the run finished at step 2)."""
    return [o for o in overrides if not o.startswith("trainer.total_steps=")] + ["trainer.total_steps=3"]


def _tools(manifest) -> list[dict]:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from envs import ToolEnv

    async def listed():
        async with ToolEnv.from_manifest(manifest) as env:
            return await env.list_tools()
    with ThreadPoolExecutor(1) as pool:  # a thread of its own: Playwright's sync API keeps a loop running here
        return pool.submit(asyncio.run, listed()).result()


def test_a_checkpoint_that_does_not_fit_the_model_is_one_line_and_changes_nothing(first_run):
    """Another tool schema, the model built for it (another vocabulary), and trainer.resume=force: the
    checkpoint cannot load into it. One line, exit 2, and the run directory as it was."""
    from rl_factory.models.tiny import TinyModelConfig, build_tiny_model
    from rl_factory.models.warmstart import WarmStartConfig

    run, tmp = first_run["run"], first_run["tmp"]
    manifest = tmp / "functions.yaml"
    manifest.write_text("functions: [envs.servers.calculator:evaluate]\n")  # the same tool, as a function
    model = tmp / "model_for_functions"
    build_tiny_model(model, _tools(manifest), log=lambda *_: None, cfg=TinyModelConfig(
        warmstart=WarmStartConfig(num_transcripts=300, mechanics_steps=1, decision_steps=1)))
    before = snapshot(run)
    overrides = [o for o in first_run["overrides"] if not o.startswith(("model.path=", "env.tools="))]
    result = run_script("main_grpo.sh", *further(overrides), f"model.path={model}", f"env.tools={manifest}",
                        "trainer.resume=force")
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert re.search(r"checkpoint .*step_000002 does not fit the model of this config \(.*size mismatch.*\); "
                     r"did the tools or model.path change\? Start a new run: trainer.resume=never", errors[0]), errors[0]
    assert snapshot(run) == before


def test_a_forced_resume_whose_server_cannot_start_changes_nothing(first_run):
    run = first_run["run"]
    before = snapshot(run)
    result = run_script("main_grpo.sh", *further(first_run["overrides"]), "trainer.resume=force",
                        "env.tools={mcpServers: {ghost: {command: rlf-no-such-command-xyz}}}")
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "'ghost'" in errors[0] and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert snapshot(run) == before


# ---- evaluation and re-scoring of this run --------------------------------------------------------

def test_eval_reports_pass_at_k_failures_and_a_comparison(first_run):
    run, tmp = first_run["run"], first_run["tmp"]
    ckpt = run / "checkpoints" / "step_000002"
    common = [f"model.path={ckpt}", "eval.limit=6", "eval.n=2", "eval.temperature=1.0", f"env.tools={first_run['manifest']}",
              "rollout.max_response_tokens=32", "model.device=cpu"]
    first = run_script("main_eval.sh", *common, f"eval.output_dir={tmp / 'eval_a'}")
    assert first.returncode == 0, first.stderr[-3000:]
    a = strict_json((tmp / "eval_a" / "results.json").read_text())
    assert set(a["pass_at_k"]) == {"1", "2"} and a["pass_at_k"]["2"] >= a["pass_at_k"]["1"]
    assert a["pass_at_k"]["1"] == pytest.approx(a["metrics"]["accuracy"])
    assert len(a["per_row"]) == 6 and set(a["by_data_source"]) == {"(none)"}
    wrong = sum(1 - r["correct"] for r in a["per_row"]) * 2
    assert sum(f["count"] for f in a["failures"].values()) == pytest.approx(wrong)
    assert all(f["examples"] for f in a["failures"].values())
    assert "pass@k" in first.stderr and ("failures" in first.stderr) == bool(a["failures"])

    second = run_script("main_eval.sh", *common, "seed=1", f"eval.output_dir={tmp / 'eval_b'}",
                        f"eval.compare={tmp / 'eval_a' / 'results.json'}", "eval.bootstrap=300")
    assert second.returncode == 0, second.stderr[-3000:]
    b = strict_json((tmp / "eval_b" / "results.json").read_text())
    acc = b["compare"]["metrics"]["accuracy"]
    assert b["compare"]["paired"] and acc["ci_low"] <= acc["difference"] <= acc["ci_high"]
    assert acc["difference"] == pytest.approx(b["metrics"]["accuracy"] - a["metrics"]["accuracy"])
    assert "compared with" in second.stderr

    bad = run_script("main_eval.sh", *common, f"eval.compare={tmp / 'nope.json'}")
    assert bad.returncode == 2 and "eval.compare: cannot read" in bad.stderr

    # The report reads an evaluation directory too, next to the run.
    done = subprocess.run([sys.executable, "-m", "rl_factory.report", str(run), str(tmp / "eval_b"), "-o",
                           str(tmp / "both.html")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    evals = page_data((tmp / "both.html").read_text())["evals"]
    assert len(evals) == 1 and evals[0]["compare"][0][0] == "accuracy"


def test_a_long_eval_shows_a_progress_bar_on_a_terminal(first_run):
    from tests.fakes.terminal import run_in_terminal

    ckpt = first_run["run"] / "checkpoints" / "step_000002"
    code, screen = run_in_terminal(["bash", "main_eval.sh", f"model.path={ckpt}", "eval.limit=3", "eval.n=2",
                                    "eval.temperature=1.0", f"env.tools={first_run['manifest']}", "model.device=cpu",
                                    f"eval.output_dir={first_run['tmp'] / 'eval_tty'}"], cwd=REPO, env=script_env())
    assert code == 0, screen[-3000:]
    assert re.search(r"eval: 100%\|.*\| 6/6 \[", screen), screen[-3000:]


def test_rescore_with_the_runs_own_reward_reproduces_it_and_a_new_one_differs(first_run):
    run = first_run["run"]
    stored = [r for p in sorted((run / "rollouts").glob("*.jsonl")) for r in records(run, p.name)]
    same = subprocess.run([sys.executable, "-m", "rl_factory.rescore", str(run), "--out", str(run.parent / "rs_same")],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=script_env())
    assert same.returncode == 0, same.stderr
    summary = json.loads((run.parent / "rs_same" / "summary.json").read_text())
    assert summary["trajectories"] == len(stored) and summary["changed"] == 0

    new = subprocess.run([sys.executable, "-m", "rl_factory.rescore", str(run),
                          "reward.function=rewards.rules:tool_calls_valid", "--split", "train",
                          "--out", str(run.parent / "rs_new")], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env=script_env())
    assert new.returncode == 0, new.stderr
    rows = (run.parent / "rs_new" / "rescore.csv").read_text().splitlines()
    train = [r for r in stored if r.get("advantage") is not None]
    assert len(rows) == 1 + len(train) and rows[0].startswith("split,step,sample,id,old_reward,new_reward")
    want = [0.0 if any(c["error"] for c in r["tool_calls"]) else 1.0 for r in train]
    got = [float(line.split(",")[5]) for line in rows[1:]]
    assert sorted(got) == sorted(want)
    assert "side-by-side table" in new.stdout

    bad = subprocess.run([sys.executable, "-m", "rl_factory.rescore", str(run), "reward.functon=x"], cwd=REPO,
                         capture_output=True, text=True, timeout=120, env=script_env())
    assert bad.returncode == 2 and "functon" in bad.stderr and "Traceback" not in bad.stderr

    # An error line that would hold a secret from the environment shows its reference instead.
    secret = "sk-rescore-0123456789abcdef"
    leak = subprocess.run([sys.executable, "-m", "rl_factory.rescore", str(run),
                           "reward.function=/nonexistent/${oc.env:RLF_RESCORE_API_KEY}.py:reward"], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**script_env(), "RLF_RESCORE_API_KEY": secret})
    assert leak.returncode == 2 and "reward file not found" in leak.stderr, leak.stderr
    assert secret not in leak.stderr + leak.stdout and "${oc.env:RLF_RESCORE_API_KEY}" in leak.stderr


def test_rescore_of_an_eval_directory_reads_its_config_and_rows(first_run):
    run, tmp = first_run["run"], first_run["tmp"]
    ckpt = run / "checkpoints" / "step_000002"
    out = tmp / "eval_to_rescore"
    done = run_script("main_eval.sh", f"model.path={ckpt}", "eval.limit=3", f"env.tools={first_run['manifest']}",
                      "rollout.max_response_tokens=32", "model.device=cpu", f"eval.output_dir={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    config = yaml.safe_load((out / "config.yaml").read_text())  # resolved and redacted, as a run's
    assert config["model"]["path"] == str(ckpt) and config["eval"]["limit"] == 3
    assert config["eval"]["files"] == config["data"]["val_files"] and "${" not in config["eval"]["files"]
    # `kind` is a column of the eval rows only (not of the stored records): 1 where the rows were reloaded
    reward = tmp / "has_kind.py"
    reward.write_text("def reward(kind, **_):\n    return 1.0 if kind else 0.0\n")
    for split in ("all", "eval"):
        rescored = subprocess.run([sys.executable, "-m", "rl_factory.rescore", str(out), f"reward.function={reward}:reward",
                                   "--split", split, "--out", str(out / f"rs_{split}")], cwd=REPO, capture_output=True,
                                  text=True, timeout=120, env=script_env())
        assert rescored.returncode == 0, rescored.stderr
        summary = json.loads((out / f"rs_{split}" / "summary.json").read_text())
        assert summary["trajectories"] == 3 and summary["new_mean"] == 1.0
        assert [s["split"] for s in summary["per_step"]] == ["eval"]
