"""The arena-vs-pointwise experiment: the hidden quality, the stand-in judge behind the real judge path, and a
tiny invocation of benchmarks/arena_vs_pointwise.py end to end (real server, real trainer, real judge clients)."""
import asyncio
import json
import statistics

import pytest

from benchmarks.arena_vs_pointwise import bootstrap, expected_matches, main
from examples.arena_vs_pointwise.judge_server import JudgeServer, StandInConfig, StandInJudge
from examples.arena_vs_pointwise.task import optimum, quality
from rewards.judge import Candidate, JudgeConfig, LLMJudge
from rewards.llm_reward import LLMReward

HERE = "examples/arena_vs_pointwise"
Q = "What is 120 * 50?"  # 6000


def test_quality_is_exact_one_else_graded_by_relative_error():
    assert optimum(Q) == 6000 and optimum("What is 9 + 3?") == 12 and optimum("hello") is None
    assert quality(Q, "The answer is 6000.") == 1.0
    assert quality(Q, "The answer is 6,000.") == 1.0
    assert quality(Q, "The answer is 5400.") == pytest.approx(0.45)  # 10% off
    assert quality(Q, "The answer is 90000.") == 0.0 and quality(Q, "no idea") == 0.0


def noiseless(**kw):
    return StandInConfig(**{"noise": 0.0, "drift": 0.0, **kw})


def pointwise_prompt(answer):
    return f"<question>{Q}</question>\n<answer>{answer}</answer>"


def pairwise_prompt(a, b):
    return f"<question>{Q}</question>\n<answer_a>{a}</answer_a>\n<answer_b>{b}</answer_b>"


def test_pointwise_scores_are_squashed_into_the_band_and_rounded():
    judge = StandInJudge(noiseless())
    assert json.loads(judge.reply(pointwise_prompt("6000"))) == {"score": 8}
    assert json.loads(judge.reply(pointwise_prompt("5400"))) == {"score": 7}  # 6 + 2 * 0.45 = 6.9
    assert json.loads(judge.reply(pointwise_prompt("none"))) == {"score": 6}
    unrounded = StandInJudge(noiseless(score_step=0.0))
    assert json.loads(unrounded.reply(pointwise_prompt("5400"))) == {"score": "6.900/10"}
    assert judge.stats() == {"calls": 3, "pointwise": 3, "pairwise": 0}


def test_pairwise_verdicts_follow_quality_and_cancel_the_shared_drift():
    # A drift of 5 points shifts both impressions of one call alike: the verdict stays right.
    judge = StandInJudge(noiseless(drift=5.0, drift_period=7))
    assert [json.loads(judge.reply(pairwise_prompt("5400", "6000")))["winner"] for _ in range(7)] == ["B"] * 7
    assert json.loads(judge.reply(pairwise_prompt("6000", "6000")))["winner"] == "tie"
    margin = StandInJudge(noiseless(tie_margin=1.2))
    assert json.loads(margin.reply(pairwise_prompt("5400", "6000")))["winner"] == "tie"  # 6.9 vs 8.0: 1.1 apart
    assert [c["kind"] for c in judge.calls] == ["pairwise"] * 8


def test_noise_is_per_call_and_seeded_by_prompt_not_by_arrival_order():
    cfg = StandInConfig(noise=2.0, drift=0.0)
    first, second = StandInJudge(cfg), StandInJudge(cfg)
    prompts = [pointwise_prompt(a) for a in ("5400", "6000", "5000")]
    a = [first.reply(p) for p in prompts + prompts]
    b = [second.reply(p) for p in list(reversed(prompts)) + list(reversed(prompts))]
    assert sorted(a) == sorted(b)  # the same draws whatever the order
    scores = [json.loads(StandInJudge(cfg).reply(pointwise_prompt("6000")))["score"] for _ in range(3)]
    repeats = StandInJudge(cfg)
    asked_again = [json.loads(repeats.reply(pointwise_prompt("6000")))["score"] for _ in range(40)]
    assert len(set(scores)) == 1 and len(set(asked_again)) > 1  # a repeated question gets fresh noise
    assert statistics.fmean(asked_again) == pytest.approx(8.0, abs=0.8)


def test_the_real_judge_clients_reach_the_stand_in():
    async def ask(base_url):
        pairwise = LLMJudge(JudgeConfig(type="llm", base_url=base_url, model="standin", api_key_env=None,
                                        prompt=f"{HERE}/pairwise_prompt.txt", backoff_s=0.01))
        pointwise = LLMReward(model="standin", base_url=base_url, api_key_env=None,
                              prompt=f"{HERE}/pointwise_rubric.txt", backoff_s=0.01)
        try:
            verdict = await pairwise.compare(Q, Candidate("The answer is 6000."), Candidate("The answer is 5400."))
            score = await pointwise(prompt=Q, completion="The answer is 5400.")
        finally:
            await pairwise.aclose()
            await pointwise.aclose()
        return verdict, score, pairwise.stats["requests"]

    with JudgeServer(noiseless()) as server:
        verdict, score, requests = asyncio.run(ask(server.base_url))
        calls = server.judge.calls
    assert verdict == 1.0 and score == pytest.approx(0.7) and requests == 2  # both orders of the match
    assert [c["kind"] for c in calls] == ["pairwise", "pairwise", "pointwise"]
    assert sorted(c["verdict"] for c in calls[:2]) == ["A", "B"]  # 6000 won as A and as B


def test_expected_matches_and_bootstrap():
    assert [expected_matches(t, 8) for t in ("anchor", "swiss", "single_elimination", "double_elimination",
                                             "round_robin")] == [7, 12, 14, 14, 28]
    assert expected_matches("swiss", 4) == 4
    mean, low, high = bootstrap([0.2, 0.4, 0.9])
    assert mean == pytest.approx(0.5) and 0.2 <= low < mean < high <= 0.9
    assert bootstrap([0.3, 0.3]) == [0.3, 0.3, 0.3]


@pytest.mark.slow  # real training runs, every arm
def test_tiny_invocation_end_to_end(tiny_model_dir, tmp_path):
    """Two arms, one seed, one step on the session's tiny model: a real stand-in server for each run."""
    result = main(["--arms", "pointwise,swiss", "--seeds", "0", "--noise", "1.0", "--steps", "1", "--batch", "2",
                   "--n", "4", "--eval-every", "1", "--val-limit", "2", "--parallel", "1",
                   "--model", str(tiny_model_dir), "--out", str(tmp_path)])
    swiss, pointwise = result["arms"]["swiss"]["1"], result["arms"]["pointwise"]["1"]
    # 2 groups of 4: swiss plays 2 rounds of 2 matches per group; each match is 2 requests unless cached
    assert swiss["matches_per_group"] == swiss["expected_matches_per_group"] == 4
    assert swiss["server_requests_match_metrics"]  # the server's log, per step, agrees with arena/judge_requests
    assert 0 < swiss["judge_requests_per_step"] <= 2 * 4 * 2
    assert 0 < pointwise["judge_requests_per_step"] <= 2 * 4  # one request per distinct completion
    assert [c[0] for c in swiss["curve"]] == [0, 1] and [c[0] for c in pointwise["curve"]] == [0, 1]
    runs = json.loads((tmp_path / "runs.json").read_text())["runs"]
    by_arm = {r["arm"]: r for r in runs}
    assert by_arm["pointwise"]["val_judge_requests"] > 0  # validation is scored by the judge too, and set apart
    assert by_arm["swiss"]["val_judge_requests"] == 0  # the arena arm validates on the true quality
    assert result["full_sweep"] is False and result["runs"] == 2
    # a second invocation with the same settings reuses the finished runs instead of training again
    again = main(["--arms", "swiss", "--seeds", "0", "--noise", "1.0", "--steps", "1", "--batch", "2", "--n", "4",
                  "--eval-every", "1", "--val-limit", "2", "--model", str(tiny_model_dir), "--out", str(tmp_path)])
    assert again["arms"]["swiss"] == result["arms"]["swiss"]
    # --finished-only trains nothing: a noise level never run is reported missing, not trained
    only = main(["--arms", "swiss", "--seeds", "0", "--noise", "2.0", "--steps", "1", "--batch", "2", "--n", "4",
                 "--eval-every", "1", "--val-limit", "2", "--model", str(tiny_model_dir), "--out", str(tmp_path),
                 "--finished-only"])
    assert only["runs"] == 0 and only["runs_missing"] == ["swiss-noise2.0-s0"] and only["full_sweep"] is False


def test_the_verl_vllm_judge_script_parses():
    import subprocess

    done = subprocess.run(["bash", "-n", f"{HERE}/verl_vllm_judge.sh"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_verl_judge_runs_line_reads_the_steps_arena_metrics_and_the_guards(tmp_path):
    """summary.py's line from a run directory as the verl backend leaves it: the step lines carry the arena/* sums
    (run_dir.ArenaMetrics), validation lines carry val/accuracy, the guard's bundles are its folders."""
    from examples.arena_vs_pointwise.summary import summarize

    steps = [{"step": s, "arena/judge_calls": 10.0, "arena/ties": t, "arena/judge_requests": 20.0,
              "timing/step_s": 4.0, "guard/violations": v} for s, t, v in ((1, 10.0, 0.0), (2, 0.0, 1.0))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in
                                                    steps + [{"step": 2, "val/accuracy": 0.5}]))
    (tmp_path / "guard" / "step_000002_receipts").mkdir(parents=True)
    line = summarize(tmp_path, "judge-dir", 40.0)
    assert line["steps"] == 2 and line["judge_calls"] == 20.0 and line["tie_share"] == 0.5
    assert line["per_step"]["arena/judge_requests"] == [20.0, 20.0] and line["val_accuracy"] == {2: 0.5}
    assert line["guard_violations"] == 1.0 and line["guard_bundles"] == ["step_000002_receipts"]
    assert line["launch_to_first_step_s"] is None and line["judge_served_requests"] == 40.0
