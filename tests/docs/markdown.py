"""What the docs checks read out of Markdown: prose lines, fenced bash blocks, the commands in them, links.

README.md and every page under docs/ on disk. Pages generated at build time (docsgen/) are not on disk,
so the prose checks never see their tables: dates belong there.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")


def doc_files() -> list[Path]:
    """README.md and the Markdown pages of the site that are written by hand."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


@dataclass
class Block:
    """One fenced code block: its language, first line number (1-based) and text."""
    path: Path
    lang: str
    line: int
    text: str


def split_markdown(text: str, path: Path = Path("<text>")) -> tuple[list[tuple[int, str]], list[Block]]:
    """(prose lines with their numbers, fenced code blocks). An unclosed fence runs to the end."""
    prose: list[tuple[int, str]] = []
    blocks: list[Block] = []
    open_fence: tuple[str, str, int, list[str]] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if open_fence is None:
            if m:
                open_fence = (m["fence"], m["lang"].lower(), number, [])
            else:
                prose.append((number, line))
        elif m and m["fence"].startswith(open_fence[0]) and not m["lang"] and line.strip() == m["fence"]:
            blocks.append(Block(path, open_fence[1], open_fence[2] + 1, "\n".join(open_fence[3])))
            open_fence = None
        else:
            open_fence[3].append(line)
    if open_fence is not None:
        blocks.append(Block(path, open_fence[1], open_fence[2] + 1, "\n".join(open_fence[3])))
    return prose, blocks


INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
DATE = re.compile(r"\b(?:19|20)\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b")
# "session" is how the project's history was told; an MCP session (the protocol's) is a thing users meet.
SESSION = re.compile(r"\bsessions?\b", re.I)
SESSION_OK = re.compile(r"\b(?:MCP|client|HTTP|Mcp-Session-Id|ClientSession)\s+sessions?\b", re.I)
# "round" is not here: dynamic sampling draws prompts in rounds
HISTORY = re.compile(r"\b(?:this stop|(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|"
                     r"twelfth|thirteenth|\d+(?:st|nd|rd|th)) (?:session|stop))\b", re.I)


def narrative_problems(text: str, path: Path = Path("<text>")) -> list[str]:
    """Prose that tells the project's history: a date, the word "session", "this stop", "the Nth stop".

    Fenced code and inline code are left out (a log line may carry a date; `Mcp-Session-Id` is a header).
    """
    problems = []
    prose, _ = split_markdown(text, path)
    for number, line in prose:
        plain = INLINE_CODE.sub("", line)
        found = DATE.findall(plain) + HISTORY.findall(plain)
        sessions = len(SESSION.findall(plain)) - len(SESSION_OK.findall(plain))
        if sessions > 0:
            found.append("session")
        if found:
            problems.append(f"{path.name}:{number}: {', '.join(dict.fromkeys(found))}: {line.strip()[:160]}")
    return problems


def bash_blocks(paths: list[Path] | None = None) -> list[Block]:
    blocks = []
    for path in paths or doc_files():
        blocks += [b for b in split_markdown(path.read_text(), path)[1] if b.lang in ("bash", "sh", "shell")]
    return blocks


@dataclass
class Command:
    """One command line of a bash block: continuation lines joined, the comment cut off, split into words."""
    block: Block
    line: int
    text: str
    words: list[str]
    # the error the page shows for it: the comment right after it, `# error: ...` or a `# config  FAIL  ...`
    # row of --doctor (continued on `#   ` lines; a trailing "..." cuts it short)
    shown_error: str | None = None

    @property
    def where(self) -> str:
        return f"{self.block.path.relative_to(REPO)}:{self.line}: {self.text[:140]}"


SHOWN_ERROR = re.compile(r"^#\s*(?:error:|config\s+FAIL)\s+(?P<text>.*)")
SHOWN_MORE = re.compile(r"^#\s{2,}(?P<text>\S.*)")


def commands(block: Block) -> list[Command]:
    out: list[Command] = []
    pending, start = "", 0
    last: list[Command] = []  # the commands of the line before, which a shown error belongs to
    for offset, raw in enumerate(block.text.splitlines()):
        if not pending:
            start = block.line + offset
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        shown, more = SHOWN_ERROR.match(full), SHOWN_MORE.match(full)
        for c in last:
            if shown:
                c.shown_error = shown["text"]
            elif more and c.shown_error is not None:
                c.shown_error += " " + more["text"]
        if not (shown or more and last and last[0].shown_error is not None):
            last = []
        if not full or full.startswith("#"):
            continue
        try:
            lexer = shlex.shlex(full, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            words = list(lexer)
        except ValueError:
            words = full.split()
        text = full.split("  #")[0].strip()
        last = [Command(block, start, text, part) for part in _split_on_operators(words) if part]
        out += last
    return out


def _split_on_operators(words: list[str]) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for w in words:
        if w in (";", "&&", "||", "|", "&"):
            parts.append([])
        else:
            parts[-1].append(w)
    return parts


def program(words: list[str]) -> list[str]:
    """The words after leading VAR=value assignments."""
    i = 0
    while i < len(words) and re.match(r"^[A-Za-z_]\w*=", words[i]):
        i += 1
    return words[i:]


LINK = re.compile(r"(?<!!)\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every inline Markdown link in the prose."""
    prose, _ = split_markdown(text)
    return [(number, m["target"]) for number, line in prose for m in LINK.finditer(INLINE_CODE.sub("", line))]
