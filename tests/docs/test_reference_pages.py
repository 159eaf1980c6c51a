"""The reference pages written by hand keep up with what a run writes: one tiny training run (2 steps, with
validation) and every metric it logs is named on the metrics page, every file of its run directory and every
field of its rollout records on the run-directory page."""
import json
import re

import pytest

from tests.docs.markdown import INLINE_CODE, REPO
from tests.e2e.test_main_scripts import run_script, tiny_overrides
from tests.records import jsonl

pytestmark = pytest.mark.slow  # a training run through main_grpo.sh (a module fixture)

MANIFEST = REPO / "configs" / "tools" / "calculator.yaml"


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("reference") / "run"
    done = run_script("main_grpo.sh", *tiny_overrides(tiny_model_dir, run, MANIFEST), "trainer.eval_every=1")
    assert done.returncode == 0, done.stderr[-3000:]
    return run


def documented(page: str) -> list[re.Pattern]:
    """Every name in the page's inline code, `<...>` families as one path segment, as patterns."""
    names = []
    for span in INLINE_CODE.finditer((REPO / "docs" / "reference" / page).read_text()):
        for name in span.group(0).strip("`").split(", "):
            parts = re.split(r"<[^>]+>", name.strip())
            names.append(re.compile("[^/]+".join(re.escape(p) for p in parts)))
    return names


def undocumented(keys, patterns) -> list[str]:
    return sorted(k for k in keys if not any(p.fullmatch(k) for p in patterns))


def test_every_metric_of_a_run_is_on_the_metrics_page(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = {k.removeprefix("val/") for line in lines for k in line if k != "step"}
    assert any(k.startswith("val/") for line in lines for k in line) and len(keys) > 20
    assert undocumented(keys, documented("metrics.md")) == []


def test_every_file_of_a_run_directory_is_on_the_run_directory_page(run_dir):
    patterns = documented("run-directory.md")
    # a directory is documented by what it holds: rollouts/step_NNNNNN.jsonl, tool_logs/<server>.log
    entries = {p.name for p in run_dir.iterdir() if p.is_file()}
    entries |= {f"{d.name}/{p.name}" + ("/" if p.is_dir() else "") for d in run_dir.iterdir() if d.is_dir()
                for p in d.iterdir()}
    generic = [re.compile(p.pattern.replace("NNNNNN", r"\d{6}")) for p in patterns]
    assert undocumented(entries, generic) == []


def test_every_field_of_a_rollout_record_is_on_the_run_directory_page(run_dir):
    record = jsonl(next((run_dir / "rollouts").glob("step_*.jsonl")))[0]
    assert undocumented(set(record), documented("run-directory.md")) == []
