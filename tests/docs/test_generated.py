"""The generators behind the site's generated pages, on small inputs whose right answer is known."""
import json

import pytest

from docsgen import benchmarks_page, trl_shapes
from docsgen.config_reference import _tables, parse

SAMPLE = """# A config. Override keys on the command line.
#   bash main_grpo.sh a.b=1

# Name of the run
name: demo
a:
  # The b key: auto | cpu | cuda
  b: auto
  # A block list
  items:
    - x
    - y
  nested:
    # Deep, with an interpolation
    deep: ${name}
  bare: 3
"""


def test_each_key_gets_the_comment_block_above_it_and_its_default():
    header, keys = parse(SAMPLE)
    assert header.splitlines()[0] == "A config. Override keys on the command line."
    got = {k.path: (k.default, k.comment, k.is_section) for k in keys}
    assert got == {
        "name": ("demo", "Name of the run", False),
        "a": ("", "", True),
        "a.b": ("auto", "The b key: auto | cpu | cuda", False),
        "a.items": ("[x, y]", "A block list", False),
        "a.nested": ("", "", True),
        "a.nested.deep": ("${name}", "Deep, with an interpolation", False),
        "a.bare": ("3", "", False),
    }


def test_a_comment_becomes_one_table_cell_with_its_pipes_escaped():
    rows = "\n".join(_tables(parse(SAMPLE)[1]))
    assert "| `a.b` | `auto` | The b key: auto \\| cpu \\| cuda |" in rows
    assert "### `a`" in rows and "| `name` | `demo` | Name of the run |" in rows


def record(command, date, value, cpu="Xeon"):
    return {"benchmark": "demo", "date": date, "commit": "abc", "command": command,
            "machine": {"cpu": cpu, "cores": 2}, "value": value}


def test_the_table_keeps_the_newest_record_of_each_command_and_machine():
    rows = [record("a", "2026-01-02T00:00:00", 1), record("b", "2026-01-01T00:00:00", 2),
            record("a", "2026-01-03T00:00:00", 3), record("a", "2026-01-01T00:00:00", 4),
            record("a", "2026-01-01T00:00:00", 5, cpu="EPYC")]
    assert [r["value"] for r in benchmarks_page.current(rows)] == [3, 2, 5]


def test_a_broken_results_line_names_its_file_and_line(tmp_path):
    (tmp_path / "demo.jsonl").write_text(json.dumps(record("a", "2026-01-01", 1)) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"demo\.jsonl:2: not a JSON line"):
        benchmarks_page.load(tmp_path)


def gpu_step_record(date, step_s, shape="qwen3-0.6b", lr=1e-6, overrides=(), commit="aaa", gpu="NVIDIA H200"):
    return {"benchmark": "gpu_step", "date": date, "commit": commit, "command": f"gpu_step.py --shape {shape}",
            "machine": {"cpu": "Xeon", "cores": 16, "gpu": gpu, "gpus": 1}, "shape": shape, "gpus": 1,
            "lora_rank": 0, "agent_loop": "rl_factory", "batch": 16, "n": 8, "step_s": step_s,
            "job": {"max_response_tokens": 256, "max_total_tokens": 512, "max_turns": 3, "lr": lr},
            "overrides": list(overrides), "trajectories_per_step": 128.0,
            "phases": {"generate": {"s": 1.5, "generated_tokens": 25600.0}, "update": {"s": 1.0},
                       "update_weights": {"s": 0.3}, "old_log_prob": {"s": 0.04}},
            "memory_gb": {"max_allocated": 20.5, "max_reserved": 24.0, "device_peak_used": 110.0, "device_total": 140.0},
            # as gpu_step.py writes it: the tuned keys whole, dots and all
            "tuned": {"actor_rollout_ref.rollout.gpu_memory_utilization": 0.5}}


def trl_shape_record(date, median_s, shape="qwen3-0.6b", device="cuda", gpu="NVIDIA H200"):
    return {"benchmark": "vs_trl", "date": date, "commit": "bbb", "command": f"vs_trl.py --shape {shape}",
            "machine": {"cpu": "Xeon", "cores": 16, "gpu": gpu, "gpus": 1}, "shape": shape, "device": device,
            "job": {"prompts": 16, "n": 8, "max_response_tokens": 256, "max_total_tokens": 512, "max_turns": 3,
                    "lr": 1e-6, "seed": 0},
            "trl": {"median_s": median_s, "mean_completion_tokens": 190.0,
                    "phases": {"rollout": 1.25, "update": 0.75, "update_weights": 0.2, "old_log_prob": 0.0},
                    "memory_gb": {"device_peak_used": 90.0, "max_allocated_gb": 70.0, "max_reserved_gb": 80.0,
                                  "vllm_budget_gb": 42.0}}}


def cells_of(lines, shape):
    line = next(x for x in lines if x.startswith(f"| {shape} |"))
    return [c.strip() for c in line.strip("|").split(" | ")]


def test_the_trl_table_says_not_measured_yet_without_gpu_records():
    lines = trl_shapes.table({"vs_trl": [trl_shape_record("2026-12-05", 2.0, device="cpu")]})
    for shape in ("qwen3-0.6b", "qwen3-4b"):
        assert cells_of(lines, shape)[1] == "not measured yet"


def test_the_trl_table_puts_ours_on_the_same_job_beside_trls_newest_record():
    records = {"gpu_step": [gpu_step_record("2026-12-05T10:00", 4.0),
                            gpu_step_record("2026-12-05T11:00", 9.0, lr=3e-4),  # another job: not beside TRL's
                            gpu_step_record("2026-12-05T12:00", 9.5, overrides=["algorithm.old_log_probs=recompute"])],
               "vs_trl": [trl_shape_record("2026-12-05T09:00", 8.0), trl_shape_record("2026-12-05T10:30", 5.0)]}
    head, cells = trl_shapes.HEAD, cells_of(trl_shapes.table(records), "qwen3-0.6b")
    got = dict(zip(head, cells))
    assert got["step s ours / TRL"] == "4 / 5" and got["ours / TRL (target <= 1)"] == "0.80 (met)"
    assert got["rollout s"] == "1.5 / 1.25" and got["weight sync s"] == "0.3 / 0.2"
    assert got["peak GPU used GiB"] == "110 / 90" and got["torch peak allocated, reserved GiB"] == "20.5, 24 / 70, 80"
    assert got["vLLM budget GiB"] == "70 / 42" and got["tokens a trajectory (ours generated / TRL completion)"] == "200 / 190"
    assert got["commit"] == "`aaa` / `bbb`" and got["date"] == "2026-12-05 10:00 / 2026-12-05 10:30"
    assert cells_of(trl_shapes.table(records), "qwen3-4b")[1] == "not measured yet"


def test_the_trl_table_takes_a_launch_joined_with_the_one_before_it_over_the_launch_alone():
    """`python -m benchmarks.launches` appends the join of the newest launch with the earlier one under the newest's
    date: the medians over both launches go beside TRL's, in either order in the file."""
    trl = [trl_shape_record("2026-12-06T17:41", 3.47)]
    alone = gpu_step_record("2026-12-06T17:43", 4.45)
    joined = {**gpu_step_record("2026-12-06T17:43", 3.62), "launches": 2}
    for ours in ([alone, joined], [joined, alone]):
        got = dict(zip(trl_shapes.HEAD, cells_of(trl_shapes.table({"gpu_step": ours, "vs_trl": trl}), "qwen3-0.6b")))
        assert got["step s ours / TRL"] == "3.62 / 3.47"


def test_the_trl_table_puts_beside_trl_only_ours_from_the_same_sitting():
    """Another host of the same GPU model is another machine: ours from hours later is not set beside TRL's."""
    trl = [trl_shape_record("2026-12-07T00:55:00+00:00", 4.53, gpu="NVIDIA H100 80GB HBM3")]
    beside = gpu_step_record("2026-12-07T01:01:00+00:00", 4.5, gpu="NVIDIA H100 80GB HBM3")
    later = gpu_step_record("2026-12-07T04:19:00+00:00", 3.2, gpu="NVIDIA H100 80GB HBM3")
    got = dict(zip(trl_shapes.HEAD, cells_of(trl_shapes.table({"gpu_step": [beside, later], "vs_trl": trl}),
                                             "qwen3-0.6b")))
    assert got["step s ours / TRL"] == "4.5 / 4.53" and got["ours / TRL (target <= 1)"] == "0.99 (met)"
    alone = cells_of(trl_shapes.table({"gpu_step": [later], "vs_trl": trl}), "qwen3-0.6b")
    assert alone[1] == "not measured yet / 4.53" and alone[2] == ""


def test_the_trl_table_puts_beside_trl_only_ours_from_the_same_boot_where_the_records_keep_one():
    h100 = "NVIDIA H100 80GB HBM3"
    trl = [{**trl_shape_record("2026-12-07T14:00:00+00:00", 9.0, gpu=h100),
            "machine": {"gpu": h100, "gpus": 1, "boot_id": "b1"}}]
    same = {**gpu_step_record("2026-12-07T13:26:00+00:00", 8.8, gpu=h100), "machine": {"gpu": h100, "boot_id": "b1"}}
    other = {**gpu_step_record("2026-12-07T13:59:00+00:00", 8.7, gpu=h100), "machine": {"gpu": h100, "boot_id": "b2"}}
    unknown = gpu_step_record("2026-12-07T13:58:00+00:00", 8.6, gpu=h100)  # within the hour, no boot id: unknown
    for ours, want in (([same, other, unknown], "8.8 / 9"), ([other, unknown], "not measured yet / 9")):
        got = dict(zip(trl_shapes.HEAD, cells_of(trl_shapes.table({"gpu_step": ours, "vs_trl": trl}), "qwen3-0.6b")))
        assert got["step s ours / TRL"] == want


def test_a_trl_run_that_failed_before_its_first_step_is_shown_with_its_error():
    h100 = "NVIDIA H100 80GB HBM3"
    failed = {**trl_shape_record("2026-12-07T13:27:48+00:00", None, shape="qwen3-4b", gpu=h100),
              "trl": {"failed": "ended with 1 before its first step's end", "memory_gb": {"device_peak_used": 79.1},
                      "error": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 ..."}}
    ours = gpu_step_record("2026-12-07T13:26:12+00:00", 8.79, shape="qwen3-4b", gpu=h100)
    got = dict(zip(trl_shapes.HEAD, cells_of(trl_shapes.table({"gpu_step": [ours], "vs_trl": [failed]}), "qwen3-4b")))
    assert got["step s ours / TRL"] == "8.79 / failed" and got["peak GPU used GiB"] == "110 / 79.1"
    assert got["ours / TRL (target <= 1)"] == "TRL did not finish a step (OutOfMemoryError: CUDA out of memory)"


def test_a_run_guard_override_leaves_ours_beside_trl_and_a_job_override_does_not():
    trl = [trl_shape_record("2026-12-05T09:30", 5.0)]
    guarded = gpu_step_record("2026-12-05T10:00", 4.0, overrides=["trainer.guard.reward_constant.action=warn"])
    tuned = gpu_step_record("2026-12-05T11:00", 3.0, overrides=["trainer.guard.enabled=false", "optim.lr=1e-5"])
    got = dict(zip(trl_shapes.HEAD, cells_of(trl_shapes.table({"gpu_step": [guarded, tuned], "vs_trl": trl}),
                                             "qwen3-0.6b")))
    assert got["step s ours / TRL"] == "4 / 5"
    # the actor's cache at the sync changes no work either: a launch that kept it is still ours beside TRL
    kept = gpu_step_record("2026-12-05T10:20", 2.5, overrides=["actor_cache_at_sync=keep"])
    got = dict(zip(trl_shapes.HEAD, cells_of(trl_shapes.table({"gpu_step": [guarded, tuned, kept], "vs_trl": trl}),
                                             "qwen3-0.6b")))
    assert got["step s ours / TRL"] == "2.5 / 5"


def test_the_tunings_own_graph_settings_given_on_the_command_line_leave_ours_beside_trl_and_others_do_not():
    trl = [trl_shape_record("2026-12-05T09:00", 5.0)]
    vllm = "actor_rollout_ref.rollout.engine_kwargs.vllm"
    as_tuned = gpu_step_record("2026-12-05T10:00", 4.0, overrides=[
        f"+{vllm}.compilation_config.mode=NONE", f"+{vllm}.compilation_config.cudagraph_mode=FULL",
        "actor_rollout_ref.rollout.cudagraph_capture_sizes=[1,2,4,8,16,32,64,128,256,512,1024]",
        f"+{vllm}.enable_logging_iteration_details=true"])
    compiled = gpu_step_record("2026-12-05T11:00", 3.0, overrides=[f"+{vllm}.compilation_config.mode=VLLM_COMPILE"])
    got = dict(zip(trl_shapes.HEAD, cells_of(trl_shapes.table({"gpu_step": [as_tuned, compiled], "vs_trl": trl}),
                                             "qwen3-0.6b")))
    assert got["step s ours / TRL"] == "4 / 5"


def test_the_trl_table_has_a_row_per_gpu_and_puts_ours_beside_trl_from_the_same_gpu_only():
    h100 = "NVIDIA H100 80GB HBM3"
    records = {"gpu_step": [gpu_step_record("2026-12-05T10:00", 3.0),
                            gpu_step_record("2026-12-06T10:00", 4.4, gpu=h100)],
               "vs_trl": [trl_shape_record("2026-12-05T09:00", 5.0),
                          trl_shape_record("2026-12-06T11:00", 4.6, gpu=h100)]}
    rows = [line for line in trl_shapes.table(records) if line.startswith("| qwen3-0.6b |")]
    assert len(rows) == 2  # TRL's newest GPU first
    first, second = ([c.strip() for c in r.strip("|").split(" | ")] for r in rows)
    assert first[1] == "4.4 / 4.6" and "H100" in first[HEAD_MACHINE]
    assert second[1] == "3 / 5" and "H200" in second[HEAD_MACHINE]
    # ours only on another GPU than TRL's: not put beside it
    alone = {"gpu_step": [gpu_step_record("2026-12-06T10:00", 4.4, gpu=h100)],
             "vs_trl": [trl_shape_record("2026-12-05", 5.0)]}
    assert cells_of(trl_shapes.table(alone), "qwen3-0.6b")[1] == "not measured yet / 5"


HEAD_MACHINE = trl_shapes.HEAD.index("machine")


def test_the_trl_table_shows_one_side_with_the_other_not_measured_yet():
    got = dict(zip(trl_shapes.HEAD, cells_of(trl_shapes.table({"vs_trl": [trl_shape_record("2026-12-05", 5.0)]}),
                                             "qwen3-0.6b")))
    assert got["step s ours / TRL"] == "not measured yet / 5" and got["ours / TRL (target <= 1)"] == ""


def judged_record(date, step_s, gpu="NVIDIA H200", shape="qwen3-0.6b", launches=1, logprobs=True, **ratios):
    ratio = {"serial_limit_s": 1.8, "step_vs_serial_limit": step_s / 1.8, "generate_vs_vllm": 0.8,
             "update_vs_forward_backward": 0.72, **ratios}
    record = {**gpu_step_record(date, step_s, shape=shape, gpu=gpu), "launches": launches, "ratio_to_ceiling": ratio,
              "startup": {"launch_to_first_step_s": 160.0}}
    record["phases"]["generate"]["sampling_logprobs"] = logprobs
    return record


def test_the_targets_table_judges_each_phase_of_the_newest_judged_launch_per_gpu_and_shape():
    from docsgen import gpu_targets

    h100 = "NVIDIA H100 80GB HBM3"
    records = {"gpu_step": [judged_record("2026-12-07T13:16", 2.6, gpu=h100, logprobs=False,
                                          generate_vs_vllm_with_logprobs=1.26),
                            judged_record("2026-12-07T13:18", 2.9, gpu=h100, launches=2, logprobs=False,
                                          generate_vs_vllm_with_logprobs=1.1),
                            {**gpu_step_record("2026-12-07T14:00", 2.0, gpu=h100)},  # no ceilings: not judged
                            {**gpu_step_record("2026-12-07T12:00", 1.5, gpu=h100)},  # older than the judged
                            # a launch, then its join with the launch before it (`benchmarks.launches`): one date
                            judged_record("2026-12-06T22:36", 2.5, logprobs=True),
                            judged_record("2026-12-06T22:36", 3.06, logprobs=True, launches=2)],
               "vs_trl": [trl_shape_record("2026-12-07T13:20", 3.0, gpu=h100)]}
    rows = [line for line in gpu_targets.table(records) if line.startswith("| qwen3-0.6b |")]
    assert len(rows) == 3
    got = [dict(zip(gpu_targets.HEAD, cells_of([line], "qwen3-0.6b"))) for line in rows]
    now_row, h100_row, h200_row = got
    # the newer launch without ceilings: its step and TRL's beside it, no ratio judged
    assert now_row["step s"] == "2" and now_row["date"] == "2026-12-07 14:00" and now_row["serial limit s"] == ""
    assert now_row["step / serial limit (<= 1.6)"] == "" and now_row["vs forward+backward (>= 0.7)"] == ""
    assert now_row["TRL step s (ours / TRL)"] == "3 (0.67)"
    assert h100_row["launches"] == "2" and h100_row["step s"] == "2.9" and h100_row["date"] == "2026-12-07 13:18"
    assert h100_row["step / serial limit (<= 1.6)"] == "1.61 (not met)"
    assert h100_row["vs vLLM with log-probs (>= 0.85)"] == "1.1 (met)" and h100_row["vs vLLM, same work"] == "0.8"
    assert h100_row["vs forward+backward (>= 0.7)"] == "0.72 (met)" and h100_row["weight sync s"] == "0.3 (not met)"
    assert h100_row["launch to step 1 end s"] == "160 (not met)" and h100_row["TRL step s (ours / TRL)"] == "3 (0.97)"
    # rollouts that asked log-probs did vLLM's work with them: the same-work ratio is the one with log-probs
    assert h200_row["vs vLLM with log-probs (>= 0.85)"] == "0.8 (not met)" and h200_row["TRL step s (ours / TRL)"] == "-"
    assert h200_row["launches"] == "2" and h200_row["step s"] == "3.06"  # the join, not the launch of its date
    assert gpu_targets.table({})[-2].startswith("| not measured yet |")


def test_the_targets_table_holds_the_4b_shape_to_the_ratios_only_and_says_when_trl_failed_there():
    from docsgen import gpu_targets

    h100 = "NVIDIA H100 80GB HBM3"
    failed = {**trl_shape_record("2026-12-07T13:27", None, shape="qwen3-4b", gpu=h100),
              "trl": {"failed": "ended with 1 before its first step's end",
                      "error": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 96.00 MiB."}}
    records = {"gpu_step": [judged_record("2026-12-07T13:26", 8.79, gpu=h100, shape="qwen3-4b")], "vs_trl": [failed]}
    got = dict(zip(gpu_targets.HEAD, cells_of(gpu_targets.table(records), "qwen3-4b")))
    assert got["weight sync s"] == "0.3" and got["launch to step 1 end s"] == "160"  # 0.6B's targets only
    assert got["TRL step s (ours / TRL)"] == "failed (OutOfMemoryError: CUDA out of memory)"
    # its rerun with vLLM asleep through the update: a different setting from ours, said beside the ratio
    asleep = {**trl_shape_record("2026-12-07T13:40", 7.46, shape="qwen3-4b", gpu=h100),
              "trl_settings": {"vllm_enable_sleep_mode": True}}
    records["vs_trl"].append(asleep)
    got = dict(zip(gpu_targets.HEAD, cells_of(gpu_targets.table(records), "qwen3-4b")))
    assert got["TRL step s (ours / TRL)"] == "7.46 (1.18, its vLLM asleep)"
