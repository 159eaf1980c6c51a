"""Rule rewards that compare a completion's final number with the dataset answer.

`numeric_exact_match` is the calculator / GSM8K-style reward: the *last* number in the
completion is taken as the model's answer (models state the result at the end), and it must
equal the dataset answer numerically, so "10063.0", "10,063" and "10063." all match "10063".
Comparison uses `Decimal`, not floats, so large products compare exactly.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

# A number starts where no word character or decimal point precedes it, so "v2", "x1e5"'s
# exponent and the "5" of "3.5" are not read as numbers, and "3-5" reads as 3 and 5 rather
# than 3 and -5. Thousands groups need exactly three digits and no digit after them.
_NUMBER = re.compile(
    r"(?<![\w.])-?"
    r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)"
    r"(?:\.\d+)?"
)


def extract_last_number(text: str) -> str | None:
    """The last number in `text`, thousands separators removed, or None if there is none.

    Args:
        text: any text, e.g. a model completion.

    Returns:
        The number as written minus commas (e.g. "-1234.5"), or None.
    """
    matches = _NUMBER.findall(text or "")
    return matches[-1].replace(",", "") if matches else None


def numeric_exact_match(completion: str, answer: Any, **_: Any) -> float:
    """1.0 if the last number in `completion` equals `answer` numerically, else 0.0.

    Args:
        completion: the final assistant text.
        answer: the dataset answer: a number, or a string whose last number is the answer
            (so "1,234" and GSM8K's "... #### 1234" both work).

    Returns:
        1.0 or 0.0.
    """
    predicted = _to_decimal(extract_last_number(completion))
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        expected = _to_decimal(str(answer))
    else:
        expected = _to_decimal(extract_last_number("" if answer is None else str(answer)))
    if predicted is None or expected is None:
        return 0.0
    return 1.0 if predicted == expected else 0.0


def _to_decimal(number: str | None) -> Decimal | None:
    if number is None:
        return None
    try:
        return Decimal(number)
    except InvalidOperation:
        return None
