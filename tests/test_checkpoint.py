"""Re-saving a checkpoint of a step that exists never leaves the run without that checkpoint."""
import os

import pytest

from rl_factory import checkpoint as ckpt


class Saveable:
    """What save_checkpoint needs of a model or tokenizer: `save_pretrained(dir)`."""

    def __init__(self, file: str, text: str):
        self.file, self.text = file, text

    def save_pretrained(self, path) -> None:
        (path / self.file).write_text(self.text)


def save(run_dir, step, text):
    return ckpt.save_checkpoint(run_dir, step, Saveable("weights.txt", text), Saveable("tokenizer.txt", "tok"),
                                {"sampler": {}})


def test_resaving_a_step_replaces_it_whole(tmp_path):
    save(tmp_path, 20, "old")
    final = save(tmp_path, 20, "new")
    assert (final / "weights.txt").read_text() == "new"
    assert sorted(p.name for p in final.parent.iterdir()) == ["step_000020"]  # nothing left over


def test_a_crash_while_replacing_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    save(tmp_path, 20, "old")
    real_replace = os.replace

    def crash_on_install(src, dst):
        if str(src).endswith(".tmp-step_000020"):
            raise KeyboardInterrupt("killed between moving the old checkpoint away and installing the new one")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_install)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 20, "new")
    monkeypatch.setattr(os, "replace", real_replace)
    # The next start (resume=auto) finds the old checkpoint, whole.
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "step_000020"
    assert (latest / "weights.txt").read_text() == "old" and (latest / ckpt.STATE_FILE).exists()
