"""The report's data and figures from run directories the project's own writers produced."""
import json
import re
import shutil
import subprocess
import sys

import pytest

from rl_factory.evaluate import write_rollouts
from rl_factory.jsonl import read_lines
from rl_factory.report import render_report, write_report
from rl_factory.report.data import load_run
from rl_factory.report.figures import build_figures
from rl_factory.report.trajectories import browser_records
from tests.browser import chromium
from tests.report.conftest import make_traj


def page_data(html: str) -> dict:
    block = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S).group(1)
    return json.loads(block)


def figures_by_id(runs):
    return {f["id"]: f for f in build_figures(runs)}


def test_curves_follow_metrics_jsonl(arena_run):
    figs = figures_by_id([load_run(arena_run)])
    reward = {t["name"]: (t["x"], t["y"]) for t in figs["reward"]["data"]}
    logged = [json.loads(line) for line in (arena_run / "metrics.jsonl").read_text().splitlines()]
    assert reward["train reward"] == ([1, 2, 3], [m["reward/mean"] for m in logged])
    assert reward["val reward"] == ([1, 3], [0.25, 0.75])
    assert {"reward", "accuracy", "tool_use", "tool_errors", "tool_by_tool", "turns", "lengths", "stop", "timing",
            "update", "arena_matrix_0", "arena_stability"} <= set(figs)
    update = {t["name"] for t in figs["update"]["data"]}
    assert update == {"actor/kl", "actor/clip_fraction"}
    timing = {t["name"]: t["y"] for t in figs["timing"]["data"]}
    assert timing["rollout"] == [2.0, 3.0, 4.0] and timing["other"] == [0.5, 0.5, 0.5]
    by_tool = {t["name"]: t["y"] for t in figs["tool_by_tool"]["data"]}
    assert by_tool == {"succeeded": [6.0], "timeout": [6.0]}  # 3 steps x (4 calls, 2 timeouts)


def test_validation_timed_apart_is_its_own_bar_not_part_of_other(tmp_path):
    """The embedded trainer logs validation as timing/val_s beside timing/step_s, not inside it."""
    from rl_factory.tracking import Tracker

    run = tmp_path / "run"
    run.mkdir()
    with Tracker(run, ["jsonl"]) as tracker:
        tracker.log({"val/accuracy": 0.0, "timing/val_s": 0.4}, step=0)
        tracker.log({"reward/mean": 0.5, "timing/rollout_s": 1.0, "timing/update_s": 0.5, "timing/step_s": 1.6}, step=1)
        tracker.log({"reward/mean": 0.6, "timing/rollout_s": 1.0, "timing/update_s": 0.5, "timing/step_s": 1.6,
                     "timing/val_s": 0.7, "val/accuracy": 0.5}, step=2)
    (run / "config.yaml").write_text("rollout:\n  n: 4\n")
    timing = {t["name"]: t["y"] for t in figures_by_id([load_run(run)])["timing"]["data"]}
    assert timing["validation"] == [0.0, 0.7]
    assert timing["other"] == pytest.approx([0.1, 0.1])  # step_s - rollout - update


def test_arena_win_matrix_and_rank_stability(arena_run):
    figs = figures_by_id([load_run(arena_run)])
    heat = figs["arena_matrix_0"]["data"][0]
    z = heat["z"]
    # Reward judge: every rollout ranked 1 beat every lower-ranked one, and the reverse never happened.
    assert z[0][-1] == 1.0 and z[-1][0] == 0.0
    assert z[0][0] == 0.5  # tied rollouts (same reward) draw
    stability = {t["name"]: t["y"] for t in figs["arena_stability"]["data"]}
    assert stability["Spearman(tournament score, reward)"] == pytest.approx([1.0, 1.0, 1.0])
    # step 1: [1, 0, 0, 0] per group -> one rollout at rank 1, three tied below: not fully ordered
    assert stability["groups fully ordered (no tied ranks)"] == [0.0, 0.0, 0.0]
    assert stability["share of rollouts tied at rank 1"] == [0.25, 0.5, 0.75]


def test_tournament_tables_say_who_beat_whom_per_group(arena_run):
    tables = page_data(render_report([arena_run]))["tournaments"]
    assert [(t["step"], t["group"]) for t in tables] == [(s, g) for s in (1, 2, 3) for g in (0, 1)]
    last = tables[4]  # step 3, group 0: rollouts 0-2 answer right (reward 1), rollout 3 wrong; judged by reward
    assert last["prompt"] == 30
    assert [(p["rollout"], p["rank"], p["record"], p["reward"]) for p in last["players"]] == [
        (0, 1, "1-0-2", 1.0), (1, 1, "1-0-2", 1.0), (2, 1, "1-0-2", 1.0), (3, 4, "0-3-0", 0.0)]
    assert [p["vs"] for p in last["players"]] == [
        [None, 0.5, 0.5, 1.0], [0.5, None, 0.5, 1.0], [0.5, 0.5, None, 1.0], [0.0, 0.0, 0.0, None]]
    assert last["players"][3]["answer"] == "The answer is 0."
    assert last["players"][0]["answer"] == "The answer is 31."


def test_tournament_tables_leave_out_answers_of_a_group_with_missing_rollouts(arena_run):
    rollouts = arena_run / "rollouts" / "step_000003.jsonl"
    lines = read_lines(rollouts)
    rollouts.write_text("\n".join(lines[1:]) + "\n")  # group 0 lost its first rollout's line
    tables = {(t["step"], t["group"]): t for t in page_data(render_report([arena_run]))["tournaments"]}
    assert [p["reward"] for p in tables[(3, 0)]["players"]] == [None] * 4  # no guessing which line is which
    assert [p["reward"] for p in tables[(3, 1)]["players"]] == [1.0, 1.0, 1.0, 0.0]


def test_browser_records_keep_tool_calls_results_and_errors(arena_run):
    records, total = browser_records([load_run(arena_run)])
    assert total == len(records) == 3 * 8 + 2 * 2
    failed = [r for r in records if r["errors"]]
    assert failed and all(r["errors"] == ["timeout"] for r in failed)
    tool_msgs = [m for m in failed[0]["messages"] if m["role"] == "tool"]
    assert tool_msgs == [{"role": "tool", "content": "Error: boom", "name": "calculator", "error_kind": "timeout",
                          "latency_s": 0.01}]
    call_msg = next(m for m in failed[0]["messages"] if m.get("tool_calls"))
    assert call_msg["tool_calls"][0]["name"] == "calculator"
    assert {r["split"] for r in records} == {"train", "val"}
    assert records[0]["reward_info"] == {"correct": records[0]["reward"]} and records[0]["id"].startswith("q")


def test_trajectory_cap_keeps_validation_and_spreads_training(arena_run):
    records, total = browser_records([load_run(arena_run)], max_trajectories=10)
    assert total == 28
    assert sum(r["split"] == "val" for r in records) == 4  # every validation trajectory
    per_step = [sum(r["split"] == "train" and r["step"] == s for r in records) for s in (1, 2, 3)]
    assert per_step == [2, 2, 2]


def test_page_is_self_contained_and_survives_hostile_text(arena_run, tmp_path):
    hostile = make_traj(99, "</script><script>alert(1)</script> <!-- x", float("nan"))
    write_rollouts(arena_run / "rollouts" / "step_000004.jsonl", [hostile])
    html = render_report([arena_run])
    assert "<script src=" not in html and "https://" not in html.split("<script>", 2)[-1][:200]
    assert html.count("</script>") == 3  # plotly.js, the data block, our script: nothing from the data
    data = page_data(html)
    texts = [m["content"] for t in data["trajectories"] for m in t["messages"]]
    assert any("</script><script>alert(1)</script>" in t for t in texts)
    assert next(t for t in data["trajectories"] if t["step"] == 4)["reward"] is None  # NaN -> null


def test_text_that_is_not_unicode_or_breaks_lines_keeps_the_report_written(arena_run):
    # a lone surrogate (a Python tool's undecodable bytes) and the characters str.splitlines() breaks at:
    # the report used to stop being written for the rest of the run (UnicodeEncodeError, a warning)
    odd = "caf\udce9 \u2028 x\x85y"
    write_rollouts(arena_run / "rollouts" / "step_000004.jsonl", [make_traj(98, odd, 1.0)])
    data = page_data(write_report(arena_run).read_text(encoding="utf-8"))
    texts = [m["content"] for t in data["trajectories"] for m in t["messages"]]
    assert any(odd in t for t in texts)


def test_several_runs_overlay_and_show_their_config_differences(arena_run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(arena_run, other)
    (other / "config.yaml").write_text("rollout:\n  n: 8\nalgorithm:\n  advantage: arena\n")
    data = page_data(render_report([arena_run, other]))
    assert [r["name"] for r in data["runs"]] == ["arena_run", "other"]
    assert data["config_diff"] == [{"key": "rollout.n", "values": ["4", "8"]}]
    reward = next(f for f in data["figures"] if f["id"] == "reward")
    assert {t["name"] for t in reward["data"]} == {"arena_run: train reward", "arena_run: val reward",
                                                   "other: train reward", "other: val reward"}


def test_cli_writes_the_file_and_refuses_a_directory_without_a_run(arena_run, tmp_path):
    out = tmp_path / "r.html"
    done = subprocess.run([sys.executable, "-m", "rl_factory.report", str(arena_run), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 1_000_000 and "abc123" in out.read_text()  # plotly.js inlined; the run id
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = subprocess.run([sys.executable, "-m", "rl_factory.report", str(empty)], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error:") and "not a run directory" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_write_report_defaults_into_the_run_directory(arena_run):
    path = write_report(arena_run)
    assert path == arena_run / "report.html" and not list(arena_run.glob(".report.html*.tmp"))


def test_report_build_shows_a_progress_bar_on_a_terminal(arena_run, tmp_path):
    from tests.fakes.terminal import run_in_terminal

    code, screen = run_in_terminal([sys.executable, "-m", "rl_factory.report", str(arena_run), "-o",
                                    str(tmp_path / "r.html")], cwd=tmp_path)
    assert code == 0, screen
    assert re.search(r"report: 100%\|.*\| 5/5 \[", screen), screen  # 3 training + 2 validation files


def test_each_trajectory_knows_its_group_and_its_place_in_it(arena_run):
    records, _ = browser_records([load_run(arena_run)])
    step3 = [(r["group"], r["rollout"]) for r in records if r["split"] == "train" and r["step"] == 3]
    assert step3 == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]  # two prompts x 4 rollouts
    val = [(r["group"], r["rollout"]) for r in records if r["split"] == "val" and r["step"] == 3]
    assert val == [(0, 0), (0, 1)]  # the fixture's validation file holds one prompt's first two rollouts


# ---- in a browser (Debian's chromium, driven by playwright) ---------------------------------------

@pytest.fixture
def page(arena_run):  # after arena_run, whose asyncio.run cannot run inside playwright's event loop
    with chromium() as browser:
        yield browser.new_page(viewport={"width": 1400, "height": 1000})


def _boxes_overlap(a: dict, b: dict) -> bool:
    return a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"] and \
        a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]


def test_the_browser_opens_on_the_last_training_step_with_groups_and_readable_titles(arena_run, page):
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(write_report(arena_run).as_uri())
    page.wait_for_selector(".chart .main-svg")

    # opens on the last training step (step 3), not on a validation trajectory of it or on the first step
    assert page.inner_text("#traj-detail .meta div >> nth=0").startswith("run arena_run · train step 3 · group 0, rollout 0")
    header = page.eval_on_selector_all("#traj-list thead th", "ths => ths.map(t => t.textContent)")
    first = page.eval_on_selector_all("#traj-list tbody tr:nth-child(-n+5)", "rows => rows.map(r => "
                                      "Array.from(r.cells).map(c => c.textContent))")
    col = {name: header.index(name) for name in ("split", "step", "group", "rollout")}
    assert [(r[col["split"]], r[col["step"]], r[col["group"]], r[col["rollout"]]) for r in first] == [
        ("train", "3", "0", "0"), ("train", "3", "0", "1"), ("train", "3", "0", "2"), ("train", "3", "0", "3"),
        ("train", "3", "1", "0")]

    # each chart's title stays clear of plotly's toolbar, which shows while the pointer is over the chart
    charts = page.locator(".chart")
    assert charts.count() >= 8
    for i in range(charts.count()):
        chart = charts.nth(i)
        chart.scroll_into_view_if_needed()
        chart.hover()
        title, bar = chart.locator(".gtitle").bounding_box(), chart.locator(".modebar").bounding_box()
        assert title and bar and not _boxes_overlap(title, bar), (chart.get_attribute("id"), title, bar)
    assert errors == []


def test_the_tournament_section_shows_the_last_step_and_switches_steps(arena_run, page):
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(write_report(arena_run).as_uri())
    page.wait_for_selector("#tournaments table")
    assert page.is_visible("#tournament-section") and page.input_value("#t-step") == "3"
    rows = page.eval_on_selector_all("#tournaments table >> nth=0 >> tbody tr",
                                     "rows => rows.map(r => Array.from(r.cells).map(c => c.textContent))")
    assert [r[:4] for r in rows] == [["0", "1", "0.667", "1-0-2"], ["1", "1", "0.667", "1-0-2"],
                                     ["2", "1", "0.667", "1-0-2"], ["3", "4", "0", "0-3-0"]]
    assert rows[0][6:] == ["·", "½", "½", "1"] and rows[3][6:] == ["0", "0", "0", "·"]
    page.select_option("#t-step", "1")
    assert page.locator("#tournaments table").count() == 2
    assert page.inner_text("#tournaments p >> nth=0") == "step 1 · group 0 · prompt 10"
    assert errors == []
