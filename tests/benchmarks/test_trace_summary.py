"""benchmarks/trace_summary.py: windows found in a real torch profiler trace (CPU here), and the GPU's busy time
inside a window counted once where kernels overlap."""
import gzip
import json
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks import trace_summary

ROOT = Path(__file__).resolve().parents[2]


def cpu_trace(path: Path) -> Path:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:
        with torch.profiler.record_function("actor_update"):  # verl's marker of the update stage
            for _ in range(3):
                model(torch.randn(32, 64)).sum().backward()
            optimizer.step()
    prof.export_chrome_trace(str(path))
    return path


def test_a_real_traces_update_window_is_found_and_has_no_gpu_time(tmp_path):
    events = trace_summary.load(cpu_trace(tmp_path / "actor.json"))
    out = trace_summary.summarize(events)
    update = out["actor_update"]
    assert update["occurrences"] == 1 and 0 < update["wall_s"] <= out["trace"]["wall_s"]
    assert update["gpu_busy_s"] == 0 and update["gpu_busy_share"] == 0 and update["top_kernels_s"] == {}
    assert out["empty_cache"] is None  # not called: no window, not an empty one


def test_overlapping_kernels_count_once_and_only_inside_the_window():
    events = [{"ph": "X", "cat": "user_annotation", "name": "actor_update", "ts": 0, "dur": 30},
              {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 10},
              {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 5, "dur": 10},      # overlaps the first
              {"ph": "X", "cat": "gpu_memcpy", "name": "copy", "ts": 20, "dur": 5},
              {"ph": "X", "cat": "kernel", "name": "later", "ts": 40, "dur": 10},    # after the window
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaFree", "ts": 26, "dur": 3},
              {"ph": "X", "cat": "cpu_op", "name": "aten::empty_cache", "ts": 45, "dur": 5}]
    out = trace_summary.summarize(events)
    assert out["actor_update"]["gpu_busy_s"] == 20e-6 and out["actor_update"]["gpu_busy_share"] == 0.667
    assert out["actor_update"]["top_kernels_s"] == {"gemm": 20e-6}
    assert out["actor_update"]["waits"] == {"cudaFree": {"calls": 1, "s": 3e-6}}
    assert out["empty_cache"]["gpu_busy_s"] == 5e-6  # "later" runs half of its 10 µs under it


def test_kernels_are_put_to_the_part_of_the_step_whose_python_launched_them():
    """A kernel links to its launch by correlation id, the launch to the Python frames open on its thread then: the
    first FRAME_GROUPS entry found among them names it; autograd's thread, with no frame open, is told apart."""
    def frame(name, ts, dur, tid=1):
        return {"ph": "X", "cat": "python_function", "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}

    def launch(ts, correlation, tid=1):
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": tid, "ts": ts,
                "dur": 1, "args": {"correlation": correlation}}

    def kernel(ts, dur, correlation):
        return {"ph": "X", "cat": "kernel", "name": f"k{correlation}", "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                "args": {"correlation": correlation}}

    events = [{"ph": "X", "cat": "user_annotation", "name": "actor_update", "pid": 7, "tid": 1, "ts": 0, "dur": 100},
              frame("verl/workers/engine/fsdp/transformer_impl.py(1549): forward_step", 0, 60),
              frame("torch/nn/modules/module.py(1750): forward", 2, 20),
              launch(5, 1), kernel(6, 10, 1),                                       # the model's forward
              frame("verl/utils/experimental/torch_functional.py(36): _fused_linear_for_ppo_fwd", 25, 10),
              frame("torch/nn/functional.py(2000): softmax", 26, 5),
              launch(27, 2), kernel(28, 7, 2),                                      # the fused head, one frame down
              frame("verl/workers/utils/losses.py(57): ppo_loss", 40, 10),
              launch(45, 3), kernel(46, 2, 3),
              launch(55, 4), kernel(56, 1, 4),                                      # forward_step alone: its name
              launch(70, 5, tid=2), kernel(71, 20, 5),                              # autograd's thread, no frame
              frame("verl/workers/engine/fsdp/transformer_impl.py(788): optimizer_step", 90, 9),
              frame("torch/optim/adamw.py(300): _multi_tensor_adamw", 91, 5),
              launch(92, 6), kernel(93, 4, 6),
              kernel(97, 1, 99)]                                                    # its launch not in the trace
    by = trace_summary.summarize(events)["actor_update"]["kernel_s_by_launcher"]
    assert by == {"no_python_frame": 20e-6, "model_forward": 11e-6, "lm_head_logprobs": 7e-6, "optimizer": 4e-6,
                  "loss": 2e-6, "unlinked": 1e-6}


def test_the_command_reads_the_newest_gzipped_trace_of_a_directory(tmp_path):
    old = cpu_trace(tmp_path / "old.json")
    new = tmp_path / "new.json.gz"
    with gzip.open(new, "wt") as f:
        f.write(old.read_text())
    done = subprocess.run([sys.executable, "benchmarks/trace_summary.py", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    line = json.loads(done.stdout.splitlines()[-1])
    assert line["file"] == str(new) and line["windows"]["actor_update"]["occurrences"] == 1


def test_the_gpus_idle_time_is_put_to_what_the_windows_host_thread_was_doing_then():
    """Idle: the window less the GPU's busy time; each idle stretch goes to the frames open on the window's thread
    then (another thread's frames do not count): the innermost one, its FRAME_GROUPS part, and every open frame of
    verl's or our code inclusively."""
    def frame(name, ts, dur, tid=1):
        return {"ph": "X", "cat": "python_function", "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}

    update = "/site-packages/verl/workers/actor/dp_actor.py(400): update_policy"
    micro = "/site-packages/verl/workers/actor/dp_actor.py(90): _forward_micro_batch"
    call = "torch/nn/modules/module.py(1750): _call_impl"
    events = [{"ph": "X", "cat": "user_annotation", "name": "actor_update", "pid": 7, "tid": 1, "ts": 0, "dur": 100},
              frame(update, 0, 100), frame(micro, 10, 30), frame(call, 15, 15),
              frame("elsewhere.py(1): busy", 0, 100, tid=2),            # another thread: not the window's
              {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 20, "dur": 15}]
    idle = trace_summary.summarize(events)["actor_update"]["gpu_idle_s"]
    assert idle["total"] == 85e-6
    # innermost: update_policy alone [0,10] and [40,100]; the micro-batch alone [10,15] and [35,40]; _call_impl [15,20]
    assert idle["by_innermost_frame"] == {update[-120:]: 70e-6, micro: 10e-6, call: 5e-6}
    assert idle["inclusive_verl_and_ours"] == {update[-120:]: 85e-6, micro: 15e-6}
    assert idle["by_part"] == {"model_forward": 15e-6, "other": 70e-6}  # "_forward_micro_batch" holds "forward"
    assert abs(sum(idle["by_part"].values()) - idle["total"]) < 1e-12


def test_a_real_traces_idle_time_adds_up_to_its_window(tmp_path):
    out = trace_summary.summarize(trace_summary.load(cpu_trace(tmp_path / "actor.json")))
    idle = out["actor_update"]["gpu_idle_s"]
    assert idle["total"] == out["actor_update"]["wall_s"]  # a CPU trace: the GPU never ran
    assert abs(sum(idle["by_part"].values()) - idle["total"]) < 1e-5 and idle["by_innermost_frame"]
