"""Every example's documented training command runs beside the default job: its own experiment_name, and
every documented main_grpo.sh / main_eval.sh command composes (`--cfg job`) as written."""
import re
import shlex
from pathlib import Path

import pytest
import yaml

from rl_factory.cli import main
from rl_factory.config import load_config

REPO = Path(__file__).resolve().parents[2]
READMES = sorted((REPO / "examples").glob("*/README.md"))


def commands(readme: Path) -> list[list[str]]:
    """The bash blocks' main_grpo.sh / main_eval.sh commands as argument lists ($VAR from the block expanded)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", readme.read_text(), re.S):
        text = block.replace("\\\n", " ")
        env = {}
        for line in text.splitlines():
            line = line.split(" #", 1)[0].strip()
            if re.match(r"^[A-Z_]+=", line):
                name, value = line.split("=", 1)
                env[name] = " ".join(shlex.split(value))
            elif line.startswith(("bash main_grpo.sh", "bash main_eval.sh")):
                line = re.sub(r"\$([A-Z_]+)", lambda m: env.get(m.group(1), m.group(0)), line)
                out.append(shlex.split(line)[1:])
    return out


ALL = [(readme.parent.name, args) for readme in READMES for args in commands(readme)]


def test_every_example_documents_a_command():
    documented = {name for name, args in ALL if args[0] == "main_grpo.sh"}
    assert documented == {readme.parent.name for readme in READMES}


@pytest.mark.parametrize("example, args", [a for a in ALL if a[1][0] == "main_grpo.sh"],
                         ids=lambda a: a if isinstance(a, str) else "")
def test_training_commands_have_their_own_run_directory(example, args):
    names = [a.split("=", 1)[1] for a in args if a.startswith("experiment_name=")]
    default = load_config("grpo", []).experiment_name
    assert names and names[-1] != default, f"{example}: {' '.join(args)}"


def test_no_two_training_commands_share_a_run_directory():
    names = [next(a for a in args if a.startswith("experiment_name=")) for _, args in ALL if args[0] == "main_grpo.sh"]
    assert len(names) == len(set(names)), names


@pytest.mark.parametrize("example, args", ALL, ids=lambda a: a if isinstance(a, str) else "")
def test_documented_commands_compose(example, args, capsys):
    command = "train" if args[0] == "main_grpo.sh" else "eval"
    assert main([command, *args[1:], "--cfg", "job"]) == 0, capsys.readouterr().err
    assert yaml.safe_load(capsys.readouterr().out)["experiment_name"]
