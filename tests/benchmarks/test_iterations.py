"""benchmarks/iterations.py: vLLM's per-iteration log lines, counted by kind."""
import json
import subprocess
import sys
from pathlib import Path

from benchmarks import iterations

ROOT = Path(__file__).resolve().parents[2]


def line(i, ctx_reqs, ctx_tokens, gen_reqs, gen_tokens, ms):
    return (f"(EngineCore pid=12) INFO 12-06 17:42:49 [core.py:452] Iteration({i}): {ctx_reqs} context requests, "
            f"{ctx_tokens} context tokens, {gen_reqs} generation requests, {gen_tokens} generation tokens, "
            f"iteration elapsed time: {ms} ms\n")


def test_steps_are_counted_by_kind_with_their_waits(tmp_path):
    log = tmp_path / "bench_stdout.log"
    log.write_text("+ 71.6s unrelated line\n" + line(0, 8, 480, 0, 0, "5.10") + line(1, 4, 96, 8, 8, "0.40")
                   + line(2, 0, 0, 12, 12, "0.20") + line(3, 0, 0, 12, 12, "0.30") + line(4, 0, 0, 11, 11, "0.50"))
    out = subprocess.run([sys.executable, "benchmarks/iterations.py", str(log), "--rollouts", "1"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert got["steps"] == 5 and got["steps_per_rollout"] == 5.0
    assert got["prefill"]["steps"] == 1 and got["mixed"]["steps"] == 1 and got["decode"]["steps"] == 3
    assert got["decode"]["median_wait_ms"] == 0.3 and got["decode"]["total_wait_s"] == 0.001
    assert got["max_batch"] == 12 and got["context_tokens"] == 576


def test_a_log_without_iteration_lines_says_so():
    got = iterations.summary(iterations.parse("no vLLM lines here"))
    assert got["steps"] == 0 and got["decode"]["median_wait_ms"] is None and got["max_batch"] == 0


def test_a_ceilings_logged_steps_are_counted_over_its_generate_calls():
    from benchmarks.ceilings import RUNS, engine_steps

    log = "".join(line(i, 0, 0, 4, 4, "0.1") for i in range(6 * (RUNS + 1)))
    with_and_without = engine_steps(log, {"seconds": 1.0, "without_logprobs": {"seconds": 0.9}})
    assert with_and_without["steps"] == 6 * (RUNS + 1) and with_and_without["steps_per_rollout"] == 3.0
    assert engine_steps(log, {"seconds": 1.0})["steps_per_rollout"] == 6.0  # one run: a warm-up and RUNS passes
    assert engine_steps("vLLM logged no iterations", {"seconds": 1.0}) is None


def gc_line(pid, ms, collected, scanned, generation, process="EngineCore"):
    return (f"({process} pid={pid}) INFO 12-07 08:40:01 [gc_utils.py:86] GC took {ms}ms to complete. "
            f"Collected {collected} objects (out of {scanned}) in GC generation {generation}.\n")


def test_the_engine_cores_collections_are_summed_by_generation_each_counted_once(tmp_path):
    """VLLM_GC_DEBUG=1: vLLM logs each collection of the engine core once from the engine and once from its GPU worker
    in the same process; each collection counts once, and other processes' collections are not the engine's."""
    log = tmp_path / "bench_stdout.log"
    log.write_text(line(0, 0, 0, 12, 12, "0.20")
                   + gc_line(9, "0.300", 10, 700, 0) + gc_line(9, "0.310", 10, 700, 0)  # one collection, two loggers
                   + gc_line(9, "0.500", 4, 900, 0) + gc_line(9, "0.510", 4, 900, 0)
                   + "(vLLMHttpServer pid=4) " + gc_line(9, "9.000", 1, 5, 1, process="APIServer")
                   + gc_line(9, "12.000", 300, 250000, 2) + gc_line(9, "12.100", 300, 250000, 2))
    out = subprocess.run([sys.executable, "benchmarks/iterations.py", str(log)], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    gc = json.loads(out.stdout)["gc"]
    assert gc["gen0"] == {"collections": 2, "total_s": 0.0008, "max_ms": 0.5, "median_objects": 800}
    assert gc["gen2"]["collections"] == 1 and gc["gen2"]["max_ms"] == 12.0 and "gen1" not in gc
    assert gc["total_s"] == 0.0128
    assert iterations.gc_pauses(line(0, 0, 0, 1, 1, "0.1")) is None


def test_a_ceilings_collections_are_placed_inside_or_outside_its_timed_passes():
    """A ceiling marks each timed pass on the stream vLLM logs to: a collection between a pass's marks slowed that pass
    (by kind of pass), one at start-up or in the warm-up did not; the same numbers lines apart are two collections."""
    mark = iterations.PASS_MARK
    text = (gc_line(9, "600.0", 5, 820000, 2)  # start-up
            + f"{mark} begins: with_logprobs\n" + gc_line(9, "550.0", 7, 810000, 2) + gc_line(9, "551.0", 7, 810000, 2)
            + line(0, 0, 0, 4, 4, "0.1") + f"{mark} ends: with_logprobs\n"
            + gc_line(9, "0.2", 1, 700, 0)  # between passes
            + f"{mark} begins: with_logprobs\n" + gc_line(9, "550.0", 7, 810000, 2) + f"{mark} ends: with_logprobs\n"
            + f"{mark} begins: without_logprobs\n" + f"{mark} ends: without_logprobs\n")
    gc = iterations.gc_pauses(text)
    assert gc["gen2"]["collections"] == 3  # start-up, and one in each pass with log-probs (the first logged twice)
    assert gc["in_timed_passes"] == {
        "with_logprobs": {"passes": 2, "collections": 2, "total_s": 1.1, "max_ms": 550.0},
        "without_logprobs": {"passes": 1, "collections": 0, "total_s": 0.0, "max_ms": 0.0}}
    assert "in_timed_passes" not in iterations.gc_pauses(gc_line(9, "1.0", 1, 10, 0))  # a job's log: no passes
