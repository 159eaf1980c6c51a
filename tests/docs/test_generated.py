"""The generators behind the site's generated pages, on small inputs whose right answer is known."""
import json

import pytest

from docsgen import benchmarks_page
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
