"""vLLM's own receipts of each weight sync, and the run guard naming a sync that did not land.

The engine's side is `SyncRecorder` on a real torch model, driven as our vLLM worker extension drives it (begin,
one call per bucket of received tensors, end); the model the sync should change is loaded with the received
tensors, or, for the fault, left as it was (a sync whose tensors vLLM's `load_weights` skipped). The guard's side is
our `rl_factory` Tracking backend, as on verl. The extension itself (rl_factory/backends/verl/vllm_receipts.py)
imports vLLM, which needs a GPU: the last test checks, from verl's source, that the two methods it wraps are
still verl's, with the arguments it passes.
"""
from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from rl_factory.backends.verl.run_dir import RunDirLogger, write_part
from rl_factory.guard import GuardStop
from rl_factory.guard.__main__ import main as guard_main
from rl_factory.guard.evidence import digest
from rl_factory.guard.syncs import SYNCS_DIR, SyncRecorder, set_aside_earlier, unlanded
from rl_factory.jsonl import Tail


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(torch.bfloat16)


def _sync(recorder: SyncRecorder, engine: torch.nn.Module, trainer: torch.nn.Module, lands: bool = True) -> dict:
    """One sync in two buckets, as verl's BucketedWeightReceiver hands them over."""
    recorder.begin(engine)
    tensors = list(trainer.state_dict().items())
    for bucket in (tensors[:2], tensors[2:]):
        recorder.received(t for _, t in bucket)
        if lands:
            engine.load_state_dict(dict(bucket), strict=False)
    return recorder.end(engine)


def _line(session: int, version: int) -> dict:
    ids = [[5, 6, 7]]
    evidence = {"sample_index": 0, "session_key": f"uid_{session}", "engine": [digest(t) for t in ids],
                "trained": [digest(t) for t in ids], "versions": [version], "weights": [None],
                "generated_tokens": 3, "trained_tokens": 3, "tool_calls": 0, "parse_errors": 0, "tool_errors": {},
                "neg_logprob_sum": 1.0, "neg_logprob_count": 1}
    return {"sample_index": 0, "session": session, "reward": float(session), "num_turns": 1, "generated_tokens": 3,
            "total_tokens": 9, "prompt_tokens": 6, "stop_reason": "stop", "tool_calls": [], "tool_results": [],
            "guard": evidence}


def test_the_engines_receipts_tell_a_landed_sync_from_one_that_left_the_weights(tmp_path):
    engine, recorder = _model(0), SyncRecorder(tmp_path, engine="host-1")
    first = _sync(recorder, engine, _model(1))
    assert first["sent_changed"] and first["held_after"] != first["held_before"] and not unlanded(first)
    assert first["tensors"] == 4 and first["sync"] == 1
    same = _sync(recorder, engine, _model(1))  # the trainer's weights did not move (an update too small for bf16)
    assert not same["sent_changed"] and same["held_after"] == same["held_before"] and not unlanded(same)
    stuck = _sync(recorder, engine, _model(2), lands=False)  # new weights sent, none loaded
    assert stuck["sent_changed"] and unlanded(stuck)
    adapter = {**stuck, "adapter": True}  # a LoRA adapter sync leaves the base weights by design
    assert not unlanded(adapter)
    lines = [json.loads(x) for x in (tmp_path / "host-1.jsonl").read_text().splitlines()]
    assert [x["sync"] for x in lines] == [1, 2, 3] and lines[2]["received"] != lines[1]["received"]
    assert all(0 < x["receipts_seconds"] <= x["seconds"] for x in lines)  # the receipts' part of the whole sync


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_device_sum_reads_half_precision_in_float32_partials_and_still_sees_one_ulp(dtype):
    from rl_factory.guard.fingerprint import device_sum

    torch.manual_seed(0)
    for numel in (64 * 16, 64 * 1000 + 37, 151 * 1024):  # whole partials, a tail, an embedding-like row count
        t = (torch.randn(numel) * 0.02).to(dtype)
        exact = t.double().sum().item()
        total = device_sum(t)
        assert total.dtype == torch.float64 and abs(total.item() - exact) <= 1e-9 * t.double().abs().sum().item()
        assert device_sum(t.clone()).item() == total.item()  # the same values, the same bits
        for index in (0, numel // 2, numel - 1):  # one ulp up, in a partial and in the tail
            moved = t.clone()
            moved[index] = torch.nextafter(t[index].float(), torch.tensor(1.0)).to(dtype)
            if moved[index] == t[index]:  # the float32 neighbour rounds back: step by the dtype's own ulp
                moved[index] = (t[index].float() + t[index].float().abs() * torch.finfo(dtype).eps).to(dtype)
            assert moved[index] != t[index] and device_sum(moved).item() != total.item()


def test_a_sync_that_does_not_land_stops_the_run_and_its_bundle_replays(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    ours = {"trainer": {"output_dir": str(run), "report": False, "guard": {"tokens": {"action": "off"}}},
            "reward": {"success_threshold": 1.0}}
    logger = RunDirLogger({"rl_factory": ours, "trainer": {"resume_mode": "disable"}})
    engine, recorder = _model(0), SyncRecorder(run / SYNCS_DIR, engine="node-7")
    _sync(recorder, engine, _model(1))  # the sync before step 1 (version 0)
    write_part(run, "train", 1, [_line(0, 0), _line(1, 0)])
    logger.log({"training/global_step": 1}, step=1)
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["guard/receipts/engine_syncs"] == 1.0 and metrics[-1]["guard/receipts/engine_unlanded"] == 0.0
    _sync(recorder, engine, _model(2), lands=False)  # after step 1's update: verl still reports version 1
    write_part(run, "train", 2, [_line(0, 1), _line(1, 1)])
    with pytest.raises(GuardStop, match="receipts at step 2") as stopped:
        logger.log({"training/global_step": 2}, step=2)
    assert ("1 of 1 weight syncs left the engine's weights as they were: sync 2 of engine node-7 was sent 4 new "
            "tensors") in str(stopped.value)
    bundle = run / "guard" / "step_000002_receipts"
    assert json.loads((bundle / "step.json").read_text())["syncs"][0]["sync"] == 2
    assert guard_main(["replay", str(bundle)]) == 3


def test_the_reader_takes_whole_lines_once_and_a_new_launch_starts_afresh(tmp_path):
    directory = tmp_path / SYNCS_DIR
    directory.mkdir()
    (directory / "a.jsonl").write_text('{"sync": 1}\n{"sync": 2')  # the second line is still being written
    reader = Tail(directory)
    assert reader.read() == [{"sync": 1}]
    with (directory / "a.jsonl").open("a") as f:
        f.write("}\n")
    assert reader.read() == [{"sync": 2}] and reader.read() == []
    set_aside_earlier(tmp_path)
    set_aside_earlier(tmp_path)  # nothing left to move
    assert not list(directory.glob("*.jsonl")) and [p.name for p in (directory / "earlier").iterdir()] == ["a.jsonl"]
    (directory / "a.jsonl").write_text("")
    set_aside_earlier(tmp_path)  # a name taken in earlier/ is kept apart, not overwritten
    assert sorted(p.name for p in (directory / "earlier").iterdir()) == ["a.1.jsonl", "a.jsonl"]


def test_the_methods_the_extension_wraps_are_verls():
    """vllm_receipts.ReceiptsWorkerExtension overrides two methods of verl's vLLMColocateWorkerExtension; read from
    verl's source (importing it needs vLLM) that they exist with the arguments ours passes on."""
    spec = importlib.util.find_spec("verl")
    if spec is None:
        pytest.skip("verl is an extra: bash setup.sh --dev (verl-cpu)")
    source = Path(spec.origin).parent / "workers" / "rollout" / "vllm_rollout" / "utils.py"
    cls = next(n for n in ast.parse(source.read_text()).body
               if isinstance(n, ast.ClassDef) and n.name == "vLLMColocateWorkerExtension")
    methods = {f.name: [a.arg for a in f.args.args] for f in cls.body if isinstance(f, ast.FunctionDef)}
    assert methods["update_weights_from_ipc"] == ["self", "peft_config", "base_sync_done", "use_shm"]
    assert methods["_update_weights"] == ["self", "weights", "peft_config", "base_sync_done"]
    calls = {c.func.attr for c in ast.walk(cls) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)}
    assert "_update_weights" in calls  # each bucket still goes through the method we wrap


def test_a_receipt_that_cannot_be_taken_never_fails_the_sync(tmp_path):
    """A tensor whose sum the recorder cannot take (here: not a tensor at all) turns the receipts off, quietly for
    the sync: the engine's weights still load and nothing half-written is left."""
    engine, recorder = _model(0), SyncRecorder(tmp_path, engine="host-2")
    recorder.begin(engine)
    recorder.received(["not a tensor"])
    assert recorder.end(engine) is None and recorder.path is None
    assert _sync(recorder, engine, _model(1)) is None  # off for the rest of the run
    assert not list(tmp_path.iterdir())
