"""README.md, the docs pages and benchmarks/README.md describe the project as it is: no dates or "sessions" telling
how it got there.

Dates belong in benchmark records (benchmarks/results/), which the generated benchmarks page shows; the
checker reads only pages on disk, so generated pages are exempt, and skips fenced and inline code.
"""
from pathlib import Path

import pytest

from tests.docs.markdown import REPO, doc_files, narrative_problems

SAMPLE = """# Page

A paragraph about rollouts.
On the H200 (2026-12-04), the step took 4.07 s.
The thirteenth session measured it again.
In this session's run the loss fell.
Each trajectory opens an MCP session; `Mcp-Session-Id` is a header.
This stop's first version shared the prompt only.

```bash
.venv/bin/python benchmarks/soak.py   # 2026-12-04: fenced code is not prose
```
"""


def test_the_checker_finds_each_kind_of_history_and_nothing_else():
    problems = narrative_problems(SAMPLE, Path("sample.md"))
    assert [p.split(":")[1] for p in problems] == ["4", "5", "6", "8"], problems
    assert "2026-12-04" in problems[0] and "thirteenth session" in problems[1] and "session" in problems[2]
    assert "this stop" in problems[3].lower()


@pytest.mark.parametrize("line", ["Until 2026-12-01 a prefill summed its attention at once.",
                                  "Across this session's changes, seed 0 went 0.87 -> 0.67 s.",
                                  "**On the H200, twelfth session**: the fetch narrowed."])
def test_a_planted_line_fails(line):
    assert narrative_problems(f"# Page\n\n{line}\n") != []


# benchmarks/README.md documents the scripts; their numbers are records (benchmarks/results/), not its prose
NARRATIVE_FILES = [*doc_files(), REPO / "benchmarks" / "README.md"]


@pytest.mark.parametrize("path", NARRATIVE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_docs_prose_tells_no_history(path):
    assert narrative_problems(path.read_text(), path) == []
