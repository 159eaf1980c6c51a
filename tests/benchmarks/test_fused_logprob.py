"""benchmarks/fused_logprob.py on the CPU: verl's chunked log-prob kernel against the plain log-softmax."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")
import torch  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fused_logprob.py"


def test_torch_kernel_matches_plain_log_softmax_and_triton_failure_is_reported(capsys):
    sys.path.insert(0, str(SCRIPT.parent))
    import fused_logprob

    # 1,100 tokens: two full 512-row chunks and a partial one
    fused_logprob.main(["--device", "cpu", "--tokens", "1100", "--hidden", "32", "--vocab", "50", "--repeats", "1"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["device"] == "cpu" and result["tokens"] == 1100
    assert result["torch"]["max_abs_diff_vs_plain"] < 1e-2
    assert result["torch"]["forward_s"] > 0 and result["torch"]["forward_backward_s"] > 0
    # Triton cannot run on a CPU: the line says why instead of the script failing
    assert "error" in result["triton"] and result["triton"]["at"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
@pytest.mark.slow  # the benchmark in a subprocess (imports torch and triton)
def test_no_gpu_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tokens", "8"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "fused_logprob: no CUDA GPU here (--device cpu times the torch kernels on the CPU)"
