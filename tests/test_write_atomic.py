"""`write_atomic`: a rewritten file holds the old content or the new, never part of either, and no temporary
file is left behind either way."""
import os

import pytest

from rl_factory.base.files import write_atomic


def test_replaces_whole_and_leaves_nothing_beside(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("old\n")
    write_atomic(path, "new line é\n")
    assert path.read_text(encoding="utf-8") == "new line é\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text("{\"old\": 1}")
    with pytest.raises(UnicodeEncodeError):  # a lone surrogate cannot be encoded strictly
        write_atomic(path, "\ud800")
    assert path.read_text() == "{\"old\": 1}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
    write_atomic(path, "\ud800", errors="surrogatepass")  # the caller's error handler reaches the encoder
    assert path.read_bytes() == "\ud800".encode("utf-8", "surrogatepass")


def test_the_temporary_name_is_per_process(tmp_path, monkeypatch):
    """Two processes writing the same record (verl's launcher and its TaskRunner) never share a temp file."""
    seen = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (seen.append(os.path.basename(src)), real(src, dst)))
    write_atomic(tmp_path / "startup.json", "{}")
    assert seen == [f".startup.json.{os.getpid()}.tmp"]
