"""Tool-call parsing time on adversarial model output: seconds to parse 1 MB texts, per parser.

A parser runs on the event loop for every turn of every trajectory, so a text that makes it
super-linear stalls the whole rollout. Each text below is `--mb` MB of one repeated fragment chosen to
defeat a naive pattern (an opening tag never closed, a name never ended, thousands of blocks):

    .venv/bin/python benchmarks/parsers.py            # 1 MB texts, best of 3

Prints one JSON line: `seconds[parser][text]` (best of `--repeats`), `worst_s` per parser, the text
size, and the load average at start and end.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.record import emit  # noqa: E402
from envs.parsers import PARSERS, get_parser  # noqa: E402

# name -> (prefix, fragment repeated to the size)
TEXTS = {
    "function_open": ("<tool_call>", "<function="),
    "parameter_open": ("<tool_call><function=f>", "<parameter="),
    "parameter_values": ("<tool_call><function=f>", "<parameter=a>x"),
    "tool_call_open": ("", "<tool_call>"),
    "tool_call_blocks": ("", "<tool_call><function=f><parameter=a>1</parameter></function></tool_call>"),
    "hermes_blocks": ("", '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'),
    "json_name_open": ("<tool_call>", '{"name": "'),
    "json_nesting": ("<tool_call>", '{"a": ['),
    "angle_brackets": ("", "<"),
    "plain_text": ("", "The answer is 42. "),
}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}}}}]


def adversarial_text(prefix: str, fragment: str, size: int) -> str:
    return prefix + fragment * max(1, (size - len(prefix)) // len(fragment))


def time_parse(parser_name: str, text: str, repeats: int) -> float:
    parser = get_parser(parser_name, tools=TOOLS)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        parser.parse(text)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=1.0, help="size of each text in MB (10^6 characters)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    size = int(args.mb * 1_000_000)
    load_start = os.getloadavg()[0]
    seconds = {name: {key: round(time_parse(name, adversarial_text(*TEXTS[key], size), args.repeats), 4)
                      for key in TEXTS} for name in sorted(PARSERS)}
    emit("parsers", {
        "text_chars": size, "repeats": args.repeats, "seconds": seconds,
        "worst_s": {name: max(times.values()) for name, times in seconds.items()},
        "loadavg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)],
    })


if __name__ == "__main__":
    main()
