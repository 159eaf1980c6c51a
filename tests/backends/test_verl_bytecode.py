"""rl_factory/backends/verl/bytecode.py: modules without compiled bytecode are counted without importing them,
warned about only where no process will write them, and `--compile` writes them."""
import json
import shutil
import subprocess
import sys

from rl_factory.backends.verl import bytecode


def probe_package(root):
    pkg = root / "rlf_bytecode_probe"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "mod.py").write_text("raise SystemExit('a survey must not import the package')\n")
    return pkg


def test_a_package_without_bytecode_is_warned_about_until_it_is_compiled(tmp_path, monkeypatch):
    pkg = probe_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # PYTHONDONTWRITEBYTECODE: nothing will write them

    found = bytecode.survey(("rlf_bytecode_probe", "rlf_not_installed"))
    assert found["writes_bytecode"] is False
    assert list(found["packages"]) == ["rlf_bytecode_probe"]  # what is not installed is left out
    assert found["packages"]["rlf_bytecode_probe"]["modules"] == 3
    assert found["packages"]["rlf_bytecode_probe"]["without_bytecode"] == 3
    line = bytecode.finding(found)
    assert "3 of 3 modules" in line and "PYTHONDONTWRITEBYTECODE" in line and "rlf_bytecode_probe 3/3" in line
    assert "python -m rl_factory.backends.verl.bytecode --compile" in line

    compiled = bytecode.compile_packages(("rlf_bytecode_probe",), workers=1)
    assert compiled["packages"]["rlf_bytecode_probe"]["without_bytecode"] == 0
    assert bytecode.finding(compiled) is None

    # a Python that writes bytecode into a writable directory: the first launch leaves it for the next
    shutil.rmtree(pkg / "__pycache__")
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    found = bytecode.survey(("rlf_bytecode_probe",))
    assert found["packages"]["rlf_bytecode_probe"]["without_bytecode"] == 1
    assert bytecode.finding(found) is None


def test_the_command_prints_the_survey_and_the_warning(tmp_path):
    probe_package(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-m", "rl_factory.backends.verl.bytecode", "--packages", "rlf_bytecode_probe"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["packages"]["rlf_bytecode_probe"]["without_bytecode"] == 3
    assert "3 of 3 modules" in done.stderr
