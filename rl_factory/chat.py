"""Token-level chat formatting: the only place that turns messages into token ids.

The rollout never re-renders the history. It renders the prompt once, then appends generated ids and
*observation deltas*: the ids of the template text that a tool turn adds after the assistant's
end-of-turn token. The delta is found by rendering a short base conversation with and without the tool
messages and keeping the difference, so it works with any chat template (ours, Qwen3's, ...).
"""
from __future__ import annotations

import json
import threading
from array import array
from collections import OrderedDict
from typing import Any

from rl_factory.base.errors import ConfigError

_BASE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
# rendered prompts' ids kept per ChatFormat (a step's prompts, each rolled out n times), as 4-byte ids: 4 MiB
PROMPT_TOKENS_KEPT = 1 << 20


class ChatFormat:
    """Renders prompts and tool observations of one tokenizer's chat template as token ids.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template and an end-of-turn `eos_token`.
        tools: OpenAI-shape tool schemas rendered into the system turn (may be empty).
    """

    def __init__(self, tokenizer: Any, tools: list[dict] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"tokenizer {tokenizer.name_or_path!r} has no chat template")
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.eos_token_id = tokenizer.eos_token_id
        base = self._render(_BASE)
        eos = tokenizer.eos_token
        if eos not in base:
            raise ConfigError(f"chat template never writes the eos token {eos!r}; cannot end turns")
        # What the template writes after the end-of-turn token (Qwen: "\n"); the engine stops on the
        # eos token itself, so observation deltas start with this glue.
        self._glue = base[base.rindex(eos) + len(eos):]
        self._base = base
        self._prompts: OrderedDict[str, array] = OrderedDict()
        self._prompt_tokens = 0
        self._prompts_lock = threading.Lock()

    def _render(self, messages: list[dict], add_generation_prompt: bool = False, tools=None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """Ids of the whole prompt (system turn with tools, history, generation header).

        The n rollouts of a prompt render it once: the latest prompts' ids are kept, up to PROMPT_TOKENS_KEPT ids in
        all. Rendering runs in the agent-loop worker's event loop before each trajectory's first request, so every
        render also delays the next trajectory's start."""
        try:
            key = json.dumps(messages, sort_keys=True)
        except (TypeError, ValueError):  # content that is not JSON (an image object): rendered each time
            return self._prompt_ids(messages)
        with self._prompts_lock:
            kept = self._prompts.get(key)
            if kept is not None:
                self._prompts.move_to_end(key)
                return kept.tolist()
        ids = self._prompt_ids(messages)
        if len(ids) <= PROMPT_TOKENS_KEPT:
            with self._prompts_lock:
                if key not in self._prompts:
                    self._prompts[key] = array("i", ids)
                    self._prompt_tokens += len(ids)
                while self._prompt_tokens > PROMPT_TOKENS_KEPT:
                    self._prompt_tokens -= len(self._prompts.popitem(last=False)[1])
        return ids

    def _prompt_ids(self, messages: list[dict]) -> list[int]:
        return self.encode(self._render(messages, add_generation_prompt=True, tools=self.tools))

    def observation_ids(self, tool_messages: list[dict]) -> list[int]:
        """Ids appended after a generated turn that ended with eos: the tool turn + next header."""
        full = self._render(_BASE + tool_messages, add_generation_prompt=True)
        if not full.startswith(self._base):
            raise ConfigError("chat template renders earlier turns differently once tool turns follow; "
                             "observation deltas cannot be computed for it")
        return self.encode(self._glue + full[len(self._base):])

    def assistant_ids(self, message: dict) -> list[int]:
        """Ids of one assistant turn as the model should generate it, eos included (warm start)."""
        user = [{"role": "user", "content": "x"}]
        head = self._render(user, add_generation_prompt=True)
        full = self._render(user + [message])
        eos = self.tokenizer.eos_token
        return self.encode(full[len(head): full.rindex(eos) + len(eos)])
