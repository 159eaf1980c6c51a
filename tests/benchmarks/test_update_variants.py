"""benchmarks/update_variants.py on the CPU: the packing, the chunked log-probs and the JSON line it prints."""
import json

import pytest
import torch

from benchmarks import update_variants
from benchmarks.ceilings import micro_batches


def test_micro_batches_pack_whole_sequences_up_to_the_budget():
    assert micro_batches([300] * 7, 1000) == [[300] * 3, [300] * 3, [300]]
    assert micro_batches([1200, 100], 1000) == [[1200], [100]]  # a longer sequence rides alone


def test_chunked_log_probs_are_the_plain_ones_with_the_same_gradients():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2500, 16, generator=gen, requires_grad=True)  # three 1,024-token chunks, the last short
    weight = torch.randn(50, 16, generator=gen, requires_grad=True)
    labels = torch.randint(0, 50, (2500,), generator=gen)
    ours = update_variants.token_log_probs(weight, hidden, labels)
    ours.sum().backward()
    got = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    plain = torch.log_softmax(hidden @ weight.t(), -1).gather(-1, labels[:, None])[:, 0]
    plain.sum().backward()
    assert torch.allclose(ours, plain, atol=1e-5)
    assert torch.allclose(got[0], hidden.grad, atol=1e-5) and torch.allclose(got[1], weight.grad, atol=1e-4)


def test_every_variant_reports_its_micro_batches_and_seconds(capsys):
    update_variants.main(["--shape", "qwen3-smoke", "--device", "cpu", "--tokens", "1024", "--sequence", "128",
                          "--micro", "256", "512", "--optimizer", "foreach", "fused", "--repeats", "1"])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["tokens"] == 1024 and line["checkpointing"] and line["vocab"] == 635
    assert set(line["variants"]) == {"foreach/256", "foreach/512", "fused/256", "fused/512"}
    for name, variant in line["variants"].items():
        assert variant["micro_batches"] == 1024 // int(name.split("/")[1])
        assert variant["forward_backward_s"] > 0 and variant["optimizer_step_s"] > 0


def test_without_a_gpu_it_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(SystemExit) as exit_:
        update_variants.main(["--shape", "qwen3-smoke"])
    assert exit_.value.code == 2 and "no CUDA GPU" in capsys.readouterr().err


def test_the_plain_wrap_runs_beside_fsdps_under_its_own_names(capsys):
    update_variants.main(["--shape", "qwen3-smoke", "--device", "cpu", "--tokens", "512", "--sequence", "128",
                          "--micro", "256", "--optimizer", "fused", "--wrap", "fsdp", "plain", "--repeats", "1"])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(line["variants"]) == {"fused/256", "plain:fused/256"}
    assert line["params"] > 0 and all(v["micro_batches"] == 2 for v in line["variants"].values())


def test_a_variant_out_of_memory_is_recorded_and_the_others_still_run(capsys, monkeypatch):
    # the 4B shape's foreach AdamW on an 80-GB GPU: its step's temporary did not fit beside the training state
    step = torch.optim.AdamW.step

    def foreach_out_of_memory(self, *args, **kwargs):
        if self.defaults.get("foreach"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 386.00 MiB. GPU 0 has 79.18 GiB")
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", foreach_out_of_memory)
    update_variants.main(["--shape", "qwen3-smoke", "--device", "cpu", "--tokens", "512", "--sequence", "128",
                          "--micro", "256", "--optimizer", "foreach", "fused", "--repeats", "1"])
    out = capsys.readouterr()
    line = json.loads(out.out.strip().split("\n")[-1])
    assert line["variants"]["foreach/256"] == {"failed": "out of memory: CUDA out of memory"}
    assert line["variants"]["fused/256"]["optimizer_step_s"] > 0
    assert "foreach/256 ran out of memory" in out.err
