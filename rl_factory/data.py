"""Prompt datasets: read JSONL / JSON / Parquet rows into chat messages, and sample batches.

Every row comes back as the original columns plus `messages`, the prompt as a chat list. A
string prompt becomes `[system?, user]`; a prompt that already is a chat list is validated and
kept, with `system_prompt` prepended only when it has no system message of its own. `answer`
is copied from `answer_key` (None when the row has none) so rewards can always name `answer`.
`answer_key` may be a dotted path into nested columns (`reward_model.ground_truth`); with the
default key, a row without an `answer` column takes verl's `reward_model.ground_truth`, so a
dataset written by verl's preprocessing scripts loads as it is. The list that comes back (`Rows`)
knows where each row came from, so a later check can name "file row k", and counts which column
each row's answer came from (`answer_paths`; the doctor prints it).

Errors name the file and the line (JSONL) or row (Parquet) so a bad row in a 100k-line file
is found at once. `PromptSampler` reshuffles deterministically per epoch and checkpoints its
position, so a resumed run draws exactly the batches the killed run would have drawn.
"""
from __future__ import annotations

import json
import logging
import random
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rl_factory.base.errors import ConfigError, UserError

logger = logging.getLogger(__name__)

CHAT_ROLES = ("system", "user", "assistant", "tool")
DEFAULT_ANSWER_KEY = "answer"
# Where verl's preprocessing layout keeps the reference answer (data_source, prompt, ability, reward_model, extra_info)
VERL_ANSWER_PATH = "reward_model.ground_truth"


class DatasetError(UserError, ValueError):
    """A dataset file is missing, unreadable, or has a row that cannot become a prompt."""


def _read_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path} line {line_no}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(
                    f"{where}: malformed JSON ({exc.msg} at column {exc.colno})") from exc


def _read_json(path: Path) -> Iterator[tuple[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if not text.lstrip().startswith("["):  # many ".json" datasets are really JSON lines
        yield from _read_jsonl(path)
        return
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: malformed JSON ({exc.msg} at line {exc.lineno})") from exc
    for i, row in enumerate(rows):
        yield f"{path} item {i}", row


def _read_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq  # only Parquet users pay for the import

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:
        raise DatasetError(f"{path}: not a readable Parquet file ({exc})") from exc
    row_no = 0
    for batch in parquet.iter_batches():
        for row in batch.to_pylist():
            yield f"{path} row {row_no}", row
            row_no += 1


READERS: dict[str, Callable[[Path], Iterator[tuple[str, Any]]]] = {
    ".jsonl": _read_jsonl,
    ".json": _read_json,
    ".parquet": _read_parquet,
}


class Rows(list):
    """The rows `load_dataset` read: a plain list that also knows each row's file and index in it
    (`origins`) and how many rows took their `answer` from which column (`answer_paths`; None: no answer)."""

    def __init__(self, rows: Sequence[dict[str, Any]] = (), origins: Sequence[tuple[Path, int]] = (),
                 answer_paths: Counter | None = None):
        super().__init__(rows)
        self.origins = list(origins)
        self.answer_paths: Counter = answer_paths if answer_paths is not None else Counter()

    def origin(self, i: int) -> str:
        """Row `i` as "<file> row <index in that file>" (0-based, as a dataframe counts)."""
        if i < len(self.origins):
            path, k = self.origins[i]
            return f"{path} row {k}"
        return f"row {i}"


def load_dataset(files: str | Path | Sequence[str | Path], prompt_key: str = "prompt",
                 answer_key: str = DEFAULT_ANSWER_KEY, system_prompt: str | None = None,
                 limit: int | None = None) -> Rows:
    """Read prompt rows from one or more JSONL / JSON / Parquet files.

    Args:
        files: a path or a list of paths, read in order.
        prompt_key: the column holding the prompt: a string, or a list of {"role", "content"}.
        answer_key: the column copied to `answer`, or a dotted path into nested columns; absent ->
            verl's `reward_model.ground_truth` for the default key, else None.
        system_prompt: prepended as a system message unless the prompt has its own.
        limit: keep at most this many rows in total.

    Returns:
        One dict per row: the original columns, plus `messages` and `answer` (a `Rows` list;
        `answer_paths` counts where the answers came from).

    Raises:
        DatasetError: missing file, unknown extension, malformed JSON, a row without the
            prompt field, a malformed chat message, or no rows at all.
    """
    paths = [Path(files)] if isinstance(files, (str, Path)) else [Path(f) for f in files]
    rows = Rows()
    for path in paths:
        if limit is not None and len(rows) >= limit:
            break
        reader = READERS.get(path.suffix.lower())
        if reader is None:
            raise DatasetError(f"{path}: unsupported file type {path.suffix!r}; "
                               f"supported: {sorted(READERS)}")
        if not path.is_file():
            raise DatasetError(f"dataset file not found: {path} (looked at {path.resolve()})")
        for k, (where, raw) in enumerate(reader(path)):
            row, answer_path = _to_row(raw, where, prompt_key, answer_key, system_prompt)
            rows.answer_paths[answer_path] += 1
            rows.append(row)
            rows.origins.append((path, k))
            if limit is not None and len(rows) >= limit:
                break
    if not rows:
        raise DatasetError(f"no rows in {', '.join(map(str, paths))}")
    if rows.answer_paths.get(VERL_ANSWER_PATH):
        logger.info("answer: from %s in %d row(s) (verl's dataset layout; no %r column)",
                    VERL_ANSWER_PATH, rows.answer_paths[VERL_ANSWER_PATH], answer_key)
    return rows


def _to_row(raw: Any, where: str, prompt_key: str, answer_key: str,
            system_prompt: str | None) -> tuple[dict[str, Any], str | None]:
    if not isinstance(raw, dict):
        raise DatasetError(f"{where}: expected an object per row, got {type(raw).__name__}")
    if prompt_key not in raw:
        raise DatasetError(f"{where}: row has no {prompt_key!r} field (keys: {sorted(raw)})")
    row = dict(raw)
    row["messages"] = to_messages(raw[prompt_key], system_prompt, where=f"{where}: {prompt_key!r}")
    path = answer_path(raw, answer_key)
    row["answer"] = None if path is None else column(raw, path)
    return row, path


def column(row: dict[str, Any], path: str) -> Any:
    """The value at `path` in a row: a column's name, or a dotted path into nested columns
    (`reward_model.ground_truth`); a column whose own name holds the dots wins. None when absent."""
    if path in row:
        return row[path]
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def answer_path(row: dict[str, Any], answer_key: str = DEFAULT_ANSWER_KEY) -> str | None:
    """Which column of a dataset row (as read from its file) becomes `answer`: `answer_key`, else (for
    the default key only) verl's `reward_model.ground_truth`; None when the row has neither."""
    if column(row, answer_key) is not None:
        return answer_key
    if answer_key == DEFAULT_ANSWER_KEY and column(row, VERL_ANSWER_PATH) is not None:
        return VERL_ANSWER_PATH
    return None


def to_messages(prompt: Any, system_prompt: str | None = None,
                where: str = "prompt") -> list[dict[str, Any]]:
    """Normalize a string or chat-list prompt into a chat list (see the module docstring).

    Raises:
        DatasetError: the prompt is neither a string nor a list of valid chat messages.
    """
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, (list, tuple)) and prompt:
        messages = [_check_message(m, i, where) for i, m in enumerate(prompt)]
    else:
        raise DatasetError(f"{where} must be a string or a non-empty list of chat messages, "
                           f"got {type(prompt).__name__} {prompt!r:.80}")
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def _check_message(message: Any, i: int, where: str) -> dict[str, Any]:
    if not isinstance(message, dict) or "role" not in message or "content" not in message:
        raise DatasetError(f"{where} message {i} must be a dict with 'role' and 'content', "
                           f"got {message!r:.80}")
    if message["role"] not in CHAT_ROLES:
        raise DatasetError(f"{where} message {i} has role {message['role']!r}; "
                           f"expected one of {list(CHAT_ROLES)}")
    content = message["content"]
    if not (content is None or isinstance(content, (str, list))):
        raise DatasetError(f"{where} message {i} content must be a string or a list of parts, "
                           f"got {type(content).__name__}")
    # Parquet stores messages as structs, so absent fields (tool_calls, name) come back as None.
    return {k: v for k, v in message.items() if v is not None or k == "content"}


class PromptSampler:
    """Yields batches of dataset rows forever, reshuffled each epoch with a seeded permutation.

    Batches run across epoch boundaries (the tail of epoch e is topped up from the start of
    epoch e+1), so every batch is full and every row is seen once per epoch.

    Args:
        rows: the dataset, from `load_dataset`.
        batch_size: prompts per batch.
        seed: the permutation of epoch e depends only on (seed, e).
        shuffle: False keeps the dataset order (evaluation, debugging).
    """

    def __init__(self, rows: Sequence[dict[str, Any]], batch_size: int, seed: int = 0,
                 shuffle: bool = True):
        if not rows:
            raise DatasetError("PromptSampler needs at least one row")
        if batch_size < 1:
            raise ConfigError(f"data.train_batch_size must be >= 1, got {batch_size}")
        self.rows, self.batch_size, self.seed, self.shuffle = rows, batch_size, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            # A str seed hashes the same in every process and Python version (no PYTHONHASHSEED).
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next_indices(self, size: int | None = None) -> list[int]:
        """Row indices of the next `size` rows (default: a batch); advances the sampler."""
        size = self.batch_size if size is None else size
        indices: list[int] = []
        while len(indices) < size:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            take = self._order[self.position:self.position + size - len(indices)]
            indices.extend(take)
            self.position += len(take)
        return indices

    def __iter__(self) -> PromptSampler:
        return self

    def __next__(self) -> list[dict[str, Any]]:
        return [self.rows[i] for i in self.next_indices()]

    def state_dict(self) -> dict[str, int]:
        """What `load_state_dict` needs to continue with exactly the same next batch."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "num_rows": len(self.rows)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        saved = (state.get("num_rows", len(self.rows)), state.get("seed", self.seed))
        if saved != (len(self.rows), self.seed):
            logger.warning("PromptSampler state saved with (rows, seed)=%s resumed with %s: "
                           "batches will differ from the original run", saved,
                           (len(self.rows), self.seed))
        self.epoch = int(state["epoch"])
        self._order = self._permutation(self.epoch)
        self.position = min(int(state["position"]), len(self._order))
