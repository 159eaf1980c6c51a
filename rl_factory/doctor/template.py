"""Chat-template checks: the silent mismatches between template, parser and trained tokens.

Three questions, each answered by running the project's own code (ChatFormat, the context policy,
the registered parser) on a conversation built from the run's real tool schemas:

1. Do the tool schemas reach the prompt, and does the longest prompt fit the token budget?
2. Does the parser read back what the template writes? An assistant message with one call per tool
   is rendered by the template, encoded, decoded the way the rollout decodes generated ids
   (`skip_special_tokens=True`), and parsed: the calls must come back with the same names and
   arguments. On failure, every registered parser is tried, and the one that round-trips is named.
3. Is the token stream we train on what the template renders? A two-turn conversation (reasoning in
   a `<think>` block, a tool call, its result, a final answer) is rolled through the configured
   context policy exactly as a rollout appends ids, then compared with the template's rendering of
   the same messages (with `rollout.context=step`, each turn's sample with the template's generation
   prompt for that turn). Differences are listed and classified: thinking dropped from history,
   whitespace, special tokens, or the same text tokenized differently.
"""
from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from typing import Any

from rl_factory.chat import ChatFormat
from rl_factory.engines.base import Generation

THINK = "<think>\nThe user wants a tool result first.\n</think>\n\n"


@dataclass
class Finding:
    ok: bool
    detail: str
    fix: str = ""


def example_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments that satisfy a tool's JSON schema: one plausible value per property."""
    props = (schema.get("parameters") or {}).get("properties") or {}
    return {name: _example(spec) for name, spec in props.items()}


def _example(spec: dict[str, Any]) -> Any:
    kind = spec.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if spec.get("enum"):
        return spec["enum"][0]
    if kind == "array":
        return [_example(spec.get("items") or {})]
    if kind == "object":
        return {k: _example(v) for k, v in (spec.get("properties") or {}).items()}
    return {"integer": 3, "number": 2.5, "boolean": True, "null": None}.get(kind, "2 + 3")


def tool_calls_message(tools: list[dict[str, Any]], content: str = "") -> dict[str, Any]:
    calls = [{"type": "function", "function": {"name": t["function"]["name"],
                                               "arguments": example_arguments(t["function"])}} for t in tools]
    return {"role": "assistant", "content": content, "tool_calls": calls}


def check_tools_render(fmt: ChatFormat, tools: list[dict], prompts: list[list[dict]], budget: int,
                       budget_key: str) -> Finding:
    """Every tool name appears in the rendered prompt, and the longest prompt fits `budget` tokens."""
    text = fmt.tokenizer.decode(fmt.prompt_ids(prompts[0]), skip_special_tokens=False)
    missing = [t["function"]["name"] for t in tools if t["function"]["name"] not in text]
    if missing:
        return Finding(False, f"the chat template does not render the tool schemas: {missing[:3]} never appear "
                              "in the prompt", "use a model whose chat template takes `tools` (Qwen2.5/Qwen3 do), "
                              "or put the tool descriptions in data.system_prompt")
    lengths = [len(fmt.prompt_ids(p)) for p in prompts]
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    if lengths[longest] >= budget:
        return Finding(False, f"row {longest}'s prompt is {lengths[longest]} tokens with the tool schemas; "
                              f"{budget_key}={budget} leaves no room to generate",
                       f"raise {budget_key}, shorten the tool descriptions, or drop long rows")
    return Finding(True, f"{len(tools)} tool schema(s) in the prompt; longest prompt {lengths[longest]} of "
                         f"{budget} tokens ({budget_key}) over {len(prompts)} row(s)")


def check_parser_round_trip(fmt: ChatFormat, tools: list[dict], parser_name: str) -> Finding:
    """Render a call per tool through the template, decode as the rollout does, parse, compare."""
    from envs.parsers import PARSERS, get_parser

    message = tool_calls_message(tools)
    text = _generated_text(fmt, message)
    want = [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    got = _parse(get_parser(parser_name, tools=tools), text)
    if got == want:
        return Finding(True, f"env.parser={parser_name} reads back the {len(want)} call(s) the template writes")
    fitting = [name for name in sorted(PARSERS) if name != parser_name
               and _parse(get_parser(name, tools=tools), text) == want]
    shown = text if len(text) < 160 else text[:157] + "..."
    detail = (f"env.parser={parser_name} parsed {_show(got)} from the template's {_show(want)}; the model "
              f"writes {json.dumps(shown)}")
    if fitting:
        return Finding(False, detail, f"set env.parser={fitting[0]} (it reads this template's format)")
    if _decoding_drops_tags(fmt, message):
        return Finding(False, detail, "the tool-call tags are special tokens that decoding drops: add them to the "
                                      "tokenizer as normal (non-special) added tokens")
    return Finding(False, detail, "register a parser for this format (envs/parsers, @register_parser)")


def _parse(parser, text: str) -> list[tuple[str, Any]]:
    """(name, arguments) per call; a call the parser could not read is (None, its error)."""
    _, calls = parser.parse(text)
    return [(c.name, c.arguments) if c.error is None else (None, c.error) for c in calls]


def _show(calls: list[tuple[str, Any]]) -> str:
    shown = [f"a malformed call ({a})" if n is None else f"{n}({json.dumps(a)})" for n, a in calls]
    return "no call" if not calls else "; ".join(shown)[:160]


def _decoding_drops_tags(fmt: ChatFormat, message: dict) -> bool:
    """Decoding the template's call with special tokens skipped loses markup that it keeps otherwise.

    Asked of decode itself, not of the tokens' flags: a tokenizer can call a tag non-special and still
    skip it (the Rust tokenizer's set of special tokens outlives a token re-added as a plain one)."""
    ids = fmt.assistant_ids(message)
    kept = fmt.tokenizer.decode(ids, skip_special_tokens=False)
    skipped = fmt.tokenizer.decode(ids, skip_special_tokens=True)
    return any(tag in kept and tag not in skipped for tag in re.findall(r"</?[A-Za-z_][\w-]*>", kept))


def _generated_text(fmt: ChatFormat, message: dict) -> str:
    """The text the model writes for `message` (the template's last-turn form), decoded as the rollout
    decodes generated ids: through the token ids, special tokens skipped."""
    ids = fmt.assistant_ids(message)
    return fmt.tokenizer.decode(ids, skip_special_tokens=True)


def conversation(tools: list[dict], prompt: list[dict], environment: bool = False) -> list[dict]:
    """prompt -> assistant (thinking + a call per tool) -> tool results -> assistant (thinking + answer).

    Without tools: prompt -> assistant (thinking + answer), the one turn a tool-less rollout has. With an
    environment (`env.environment`), its reply (a user message) follows the first turn's tool results, in
    the same observation, as the rollout appends it; without tools the first turn is a plain answer.
    """
    final = {"role": "assistant", "content": THINK + "The answer is 5."}
    reply = [{"role": "user", "content": "Not yet: try again."}] if environment else []
    if not tools:
        first = {"role": "assistant", "content": THINK + "The answer is 4."}
        return [*prompt, first, *reply, final] if environment else [*prompt, final]
    call = tool_calls_message(tools, content=THINK.rstrip("\n"))
    results = [{"role": "tool", "content": "5"} for _ in call["tool_calls"]]
    return [*prompt, call, *results, *reply, final]


def check_token_stream(fmt: ChatFormat, messages: list[dict], context: str, **context_options: Any) -> Finding:
    """Roll `messages` through the context policy as a rollout would and compare with the template."""
    from rl_factory.context import get_context_policy

    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ctx = get_context_policy(context)(fmt, messages[:first], 1 << 30, **context_options)
    process = getattr(ctx, "process", None)  # step: the history as the context processor cuts it
    history, streams, i = list(messages[:first]), [], first
    while i < len(messages):
        assistant = messages[i]
        ctx.next_prompt(history if i > first else [])
        seen = process(history) if process is not None and i > first else list(history)
        ids = fmt.assistant_ids(assistant)  # what the model generates for this turn, eos included
        ctx.add_generation(Generation(ids, [0.0] * len(ids), "stop"))
        history.append(assistant)
        streams.append((list(ctx.ids), seen + [assistant]))
        observation, i = [], i + 1  # tool results, then what an environment says: one observation
        while i < len(messages) and messages[i]["role"] in ("tool", "user"):
            observation.append(messages[i])
            i += 1
        if observation:
            history += observation
            ctx.add_observation(observation)
    # append: one sequence, compared with the template's rendering of the whole conversation. step: one
    # sample per turn, compared with what inference shows the model at that turn (the template's
    # generation prompt for the history so far) followed by the turn as the template writes it.
    samples = streams[-1:] if context == "append" else streams
    for ids, msgs in samples:
        if context == "append":
            text = fmt._render(msgs, tools=fmt.tools)
            eos = fmt.tokenizer.eos_token  # a rollout's turn ends at eos; what the template writes after it is glue
            rendered = fmt.encode(text[: text.rindex(eos) + len(eos)] if eos in text else text)
        else:
            rendered = fmt.prompt_ids(msgs[:-1]) + fmt.assistant_ids(msgs[-1])
        if ids != rendered:
            return Finding(False, _describe(fmt, ids, rendered), _token_fix(context))
    roles = {m["role"] for m in messages[first:]}
    kind = " and ".join(k for k, role in (("tool", "tool"), ("environment", "user")) if role in roles) or "plain"
    return Finding(True, f"rollout.context={context}: the {len(samples)} trained sequence(s) of a {len(streams)}-turn "
                         f"{kind} conversation equal the template's rendering token for token")


def _describe(fmt: ChatFormat, ours: list[int], theirs: list[int]) -> str:
    """What differs between our stream and the template's, in words (first differences shown)."""
    decode = fmt.tokenizer.decode
    a, b = decode(ours, skip_special_tokens=False), decode(theirs, skip_special_tokens=False)
    if a == b:
        return (f"same text, different token ids ({len(ours)} vs {len(theirs)} tokens): the template's text is "
                "tokenized across the turn boundaries differently")
    kinds, shown = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        ours_part, theirs_part = a[i1:i2], b[j1:j2]
        kinds.append(_classify(fmt, ours_part, theirs_part))
        if len(shown) < 2:
            shown.append(f"ours {json.dumps(ours_part[:60])} vs template {json.dumps(theirs_part[:60])}")
    counts = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))
    return f"the trained tokens differ from the template's rendering ({counts}): " + "; ".join(shown)


def _classify(fmt: ChatFormat, ours: str, theirs: str) -> str:
    if ("<think>" in ours or "</think>" in ours) and "<think>" not in theirs:
        return "thinking block dropped from history"
    if not ours.strip() and not theirs.strip():
        return "whitespace"
    special = set(getattr(fmt.tokenizer, "all_special_tokens", []))
    if any(s in ours or s in theirs for s in special):
        return "special tokens"
    return "text"


def _token_fix(context: str) -> str:
    if context == "append":
        return ("the model is trained on history it will not see when the template re-renders it: keep thinking in "
                "history (a template that preserves it), or use rollout.context=step, which renders each turn's "
                "prompt with the template")
    return "the template renders a turn differently as history than as a generation; use a consistent template"
