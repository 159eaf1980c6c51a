"""The config reference page, read from configs/*.yaml and the comments above each key.

The YAML files are the documentation of their keys: every key has the comment block right above it.
This module turns that into one table per slice, so the page cannot say anything the files do not.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w\-]*):(?:\s+(?P<value>.*?))?\s*$")
COMMENT_LINE = re.compile(r"^ *#( ?)(?P<text>.*)$")


@dataclass
class Key:
    """One key of a config file: its dotted path, the default as written, and its comment."""
    path: str
    default: str
    comment: str
    is_section: bool


def parse(text: str) -> tuple[str, list[Key]]:
    """The file's leading comment block and its keys in file order.

    A key's comment is the block of comment lines directly above it. Sequence items (`- x`) belong to
    the key above them; their text is taken from the loaded YAML, not from these lines.
    """
    lines = text.splitlines()
    header: list[str] = []
    i = 0
    while i < len(lines) and COMMENT_LINE.match(lines[i]):
        header.append(COMMENT_LINE.match(lines[i])["text"])
        i += 1
    loaded = yaml.safe_load(text) or {}
    keys: list[Key] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the open mappings
    comment: list[str] = []
    for line in lines[i:]:
        if not line.strip():
            comment = []
            continue
        m = COMMENT_LINE.match(line)
        if m:
            comment.append(m["text"])
            continue
        m = KEY_LINE.match(line)
        if not m:  # a sequence item or a continuation line of a value
            comment = []
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [m["key"]])
        value = (m["value"] or "").split(" #")[0].strip()
        node = _lookup(loaded, path)
        is_section = not value and isinstance(node, dict)
        if not value and not is_section:
            value = _flow(node)
        keys.append(Key(path, value, " ".join(c.strip() for c in comment), is_section))
        if is_section:
            stack.append((indent, m["key"]))
        comment = []
    return "\n".join(header), keys


def _lookup(tree: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _flow(value: Any) -> str:
    """A value that spans lines in the file (a block sequence), written on one line."""
    if value is None:
        return "null"
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def leaf_paths(tree: Any, prefix: str = "") -> list[str]:
    """Every key path of a loaded YAML mapping, sections included."""
    out: list[str] = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            out.append(path)
            out.extend(leaf_paths(v, path))
    return out


def _cell(text: str) -> str:
    """Comment text in a table cell: pipes, angle brackets and stars are the text's, not Markdown's."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")


def _code(value: str) -> str:
    if value == "":
        return ""
    return "`" + value.replace("|", "\\|").replace("`", "'") + "`"


FILES = {
    "configs/grpo.yaml": "Training: `bash main_grpo.sh key=value ...`. The evaluation and verl configs build on it.",
    "configs/eval.yaml": "Evaluation: `bash main_eval.sh key=value ...`. It composes `grpo.yaml` (its `model`, `data`, "
                         "`env`, `reward` and `rollout` slices apply as above) and adds `eval`.",
    "configs/verl.yaml": "The verl backend (`trainer.backend=verl`): verl's own `ppo_trainer` config with these "
                         "defaults on top; our config goes under `rl_factory:` and is mapped onto verl's keys.",
}


def render(root: Path) -> str:
    """The whole page: one section per config file, one table per top-level slice."""
    out = ["# Configuration keys", "",
           "Generated from the config files and the comment above each key when the site is built; "
           "edit the YAML, not this page. Every key can be overridden on the command line "
           "(`bash main_grpo.sh rollout.n=16`); a misspelled key is an error.", ""]
    for name, intro in FILES.items():
        header, keys = parse((root / name).read_text())
        out += [f"## `{name}`", "", intro, ""]
        if header:
            out += ["```yaml", *("# " + h if h else "#" for h in header.splitlines()), "```", ""]
        out += _tables(keys)
    return "\n".join(out).rstrip() + "\n"


def _tables(keys: list[Key]) -> list[str]:
    out: list[str] = []
    loose = [k for k in keys if "." not in k.path and not k.is_section]
    if loose:
        out += ["| key | default | meaning |", "|---|---|---|"]
        out += [f"| `{k.path}` | {_code(k.default)} | {_cell(k.comment)} |" for k in loose]
        out.append("")
    for top in (k for k in keys if "." not in k.path and k.is_section):
        out += [f"### `{top.path}`", ""]
        if top.comment:
            out += [top.comment, ""]
        rows = [k for k in keys if k.path.startswith(top.path + ".")]
        if rows:
            out += ["| key | default | meaning |", "|---|---|---|"]
            for k in rows:
                default = "*(section)*" if k.is_section else _code(k.default)
                out.append(f"| `{k.path}` | {default} | {_cell(k.comment)} |")
            out.append("")
    return out
