"""Pointwise LLM-as-judge reward: a model over an OpenAI-compatible endpoint grades one rollout.

    reward:
      function: null
      functions:
        - {function: rewards.rules:exact_match, weight: 1.0, name: correct}
        - function: rewards.llm_reward:llm_judge
          weight: 0.5
          name: judge
          kwargs: {model: gpt-4o-mini, base_url: "https://api.openai.com/v1", api_key_env: OPENAI_API_KEY}

`llm_judge` renders a rubric prompt (the question, the reference answer when the row has one, the
agent's tool-call path and its final answer), sends it through the `ChatClient` (`rewards.chat`) that the
pairwise arena judge also uses (API key from the environment, concurrency limit, retries with backoff,
reply cache) and reads a score from the reply, normalized to [0, 1]. One client is kept per distinct
endpoint configuration, so every call of a run shares its concurrency limit and cache. A reply without a
parsable score is retried; when none comes after the retries it raises `JudgeError`, and the reward's
`on_error` policy applies. From Python, `make_llm_reward(model=..., ...)` returns the same reward as an
object (assign it in a reward file and name it with `reward.function=my_file.py:judge`).

`parse_score` reads `{"score": 7}` / `{"score": 0.7}` JSON, `[[8]]`, `Score: 7/10`, `rating: 8 out of
10` and a bare number, taking the last one when the reply has several. A number written with a decimal
point in [0, 1] is already a fraction; any other number is on the rubric's `0..scale` scale, and an
explicit `x/N` or `x out of N` uses N. Scores off their scale count as no score.
"""
from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

from rewards.chat import CACHE_SIZE, ChatClient, fill_template, json_objects, load_template
from rewards.pairwise import NO_PATH, final_answer, render_path

DEFAULT_RUBRIC = """\
You are grading an AI agent's answer to a user request; the agent may have called tools.
Judge the final answer first (correct, complete, relevant, clear; when a reference answer is given,
agreement with it matters most), then the tool-call path (right tools, sensible arguments, no waste).
Do not reward length for its own sake.

[USER REQUEST]
{question}

[REFERENCE ANSWER]
{reference}

[AGENT: TOOL-CALL PATH]
{path}

[AGENT: FINAL ANSWER]
{answer}

Reply with one JSON object and nothing else:
{"reason": "<one or two sentences>", "score": <integer 0-10>}
"""
PLACEHOLDERS = ("{question}", "{reference}", "{path}", "{answer}")
NO_REFERENCE = "(none given)"

_NUMBER = r"(\d+(?:\.\d+)?)"
_OUT_OF = rf"(?:\s*(?:/|out\s+of)\s*{_NUMBER})?"
_PATTERNS = (
    re.compile(rf"\[\[\s*{_NUMBER}{_OUT_OF}\s*\]\]", re.I),
    re.compile(rf"\b(?:score|rating|grade)\b[^\d\n]{{0,12}}?{_NUMBER}{_OUT_OF}", re.I),
)
_BARE = re.compile(rf"^\W*{_NUMBER}{_OUT_OF}\W*$")


def parse_score(text: str, scale: float = 10.0) -> float:
    """A judge reply's score in [0, 1] (see the module docstring for the forms read).

    Raises:
        ValueError: no score, or a score off its scale.
    """
    found: list[tuple[str, str | None]] = []
    # Decimal keeps "0.7" (a fraction) apart from "7" (on the rubric's scale).
    for obj in json_objects(text, parse_float=Decimal):
        value = obj.get("score", obj.get("rating"))
        if isinstance(value, (int, Decimal)) and not isinstance(value, bool):
            found.append((str(value), None))
        elif isinstance(value, str) and re.fullmatch(rf"\s*{_NUMBER}{_OUT_OF}\s*", value, re.I):
            found.append(re.fullmatch(rf"\s*{_NUMBER}{_OUT_OF}\s*", value, re.I).groups())
    if not found:
        for pattern in _PATTERNS:
            found = [m.groups() for m in pattern.finditer(text)]
            if found:
                break
    if not found and _BARE.match(text.strip()):
        found = [_BARE.match(text.strip()).groups()]
    if not found:
        from rl_factory.base.secrets import redact_known  # scrubbed before the cut, which could split a key it echoed

        raise ValueError(f"no score in judge reply {redact_known(text)[:120]!r}")
    value, denominator = found[-1]
    number = float(value)
    if denominator is not None:
        top = float(denominator)
    elif "." in value and 0.0 <= number <= 1.0:
        top = 1.0
    else:
        top = scale
    if top <= 0 or not 0.0 <= number <= top:
        raise ValueError(f"score {value}{'/' + denominator if denominator else ''} is off its scale "
                         f"in judge reply {text[:120]!r}")
    return number / top


def load_rubric(prompt: str | None) -> str:
    """The default rubric, a template file's text, or an inline template (it must use {answer};
    the others are {question}, {reference} and {path})."""
    return load_template(prompt, DEFAULT_RUBRIC, ("{answer}",), "judge rubric")


def render_rubric(template: str, question: str, answer: str, path: str = "", reference: Any = None) -> str:
    """Fill the placeholders by plain replacement; a list of acceptable reference answers is joined."""
    if isinstance(reference, dict) and "target" in reference:  # Search-R1's ground-truth shape
        reference = reference["target"]
    if isinstance(reference, (list, tuple)):
        reference = " | ".join(str(r) for r in reference)
    return fill_template(template, dict(zip(PLACEHOLDERS, (
        question, NO_REFERENCE if reference in (None, "") else str(reference), path or NO_PATH, answer))))


class LLMReward:
    """The pointwise judge as a reward function: `await reward(prompt=..., completion=..., ...)`.

    Args:
        model: the endpoint's model name.
        base_url: the OpenAI-compatible API root (`.../v1`).
        api_key_env: the environment variable holding the API key (None: send none).
        prompt: a rubric template (file path or inline text with `{answer}`); default `DEFAULT_RUBRIC`.
        scale: the top of the rubric's scale (a bare "7" means 7/scale).
        The rest configure the `ChatClient` (concurrency, retries, backoff, timeout, sampling, cache).
    """

    def __init__(self, model: str, base_url: str = "http://127.0.0.1:8000/v1",
                 api_key_env: str | None = "OPENAI_API_KEY", prompt: str | None = None, scale: float = 10.0,
                 max_concurrency: int = 8, max_retries: int = 3, backoff_s: float = 1.0, timeout_s: float = 60.0,
                 temperature: float = 0.0, max_tokens: int = 512, cache_size: int = CACHE_SIZE,
                 extra_body: dict[str, Any] | None = None):
        self.template = load_rubric(prompt)
        self.scale = scale
        self.client = ChatClient(base_url, model, api_key_env, max_concurrency, max_retries, backoff_s,
                                 timeout_s, temperature, max_tokens, cache_size=cache_size, extra_body=extra_body)

    @property
    def stats(self) -> dict[str, int]:
        return self.client.stats

    async def __call__(self, prompt: str, completion: str, answer: Any = None,
                       messages: list[dict] | None = None) -> float:
        text = render_rubric(self.template, prompt, final_answer(messages) if messages else completion,
                             render_path(messages or []), answer)
        return await self.client.chat([{"role": "user", "content": text}],
                                      parse=lambda reply: parse_score(reply, self.scale))

    async def aclose(self) -> None:
        await self.client.aclose()


def make_llm_reward(**config: Any) -> LLMReward:
    """A pointwise judge reward; `config` is `LLMReward`'s arguments."""
    return LLMReward(**config)


_REWARDS: dict[str, LLMReward] = {}


async def llm_judge(prompt: str, completion: str, answer: Any = None, messages: list[dict] | None = None, *,
                    model: str, base_url: str = "http://127.0.0.1:8000/v1", api_key_env: str | None = "OPENAI_API_KEY",
                    rubric: str | None = None, scale: float = 10.0, max_concurrency: int = 8, max_retries: int = 3,
                    backoff_s: float = 1.0, timeout_s: float = 60.0, temperature: float = 0.0,
                    max_tokens: int = 512, extra_body: dict[str, Any] | None = None) -> float:
    """The pointwise judge for `reward.functions`: its `kwargs` are `LLMReward`'s arguments (the
    template is `rubric` here, since `prompt` is the row's question). No `**kwargs`, so a misspelled
    config key fails when the reward loads.

    Returns:
        The judge's score in [0, 1].

    Raises:
        JudgeError: the endpoint refused the request, or gave no parsable score after the retries.
    """
    config = dict(model=model, base_url=base_url, api_key_env=api_key_env, prompt=rubric, scale=scale,
                  max_concurrency=max_concurrency, max_retries=max_retries, backoff_s=backoff_s,
                  timeout_s=timeout_s, temperature=temperature, max_tokens=max_tokens, extra_body=extra_body)
    key = json.dumps(config, sort_keys=True)
    if key not in _REWARDS:  # one client per configuration: a shared concurrency limit and cache
        _REWARDS[key] = LLMReward(**config)
    return await _REWARDS[key](prompt=prompt, completion=completion, answer=answer, messages=messages)
