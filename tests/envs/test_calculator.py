"""The calculator's safe evaluator: exact arithmetic, bounded work, nothing but arithmetic."""
import time

import pytest

from envs.servers.calculator import CalculatorError, evaluate, format_number


def calc(expression: str) -> str:
    return format_number(evaluate(expression))


@pytest.mark.parametrize("expression, expected", [
    ("2 + 3 * 4", "14"),
    ("(2 + 3) * 4", "20"),
    ("2 ** 100", "1267650600228229401496703205376"),  # ints stay exact
    ("-3 ** 2", "-9"),
    ("+5 - -2", "7"),
    ("6 / 3", "2"),  # exact division is an int
    ("7 / 2", "3.5"),
    ("1 / 3", "0.333333333333"),
    ("10 ** 30 / 10 ** 10", "100000000000000000000"),  # exact even beyond float precision
    ("7 // 2", "3"),
    ("-7 % 3", "2"),
    ("0.1 + 0.2", "0.3"),
    ("2.5 * 4", "10"),
    ("2 ** -1", "0.5"),
])
def test_arithmetic(expression, expected):
    assert calc(expression) == expected


@pytest.mark.parametrize("expression, message", [
    ("__import__('os').system('echo hi')", "unsupported syntax"),
    ("open('/etc/passwd')", "unsupported syntax"),
    ("x + 1", "unsupported syntax"),
    ("(1).__class__", "unsupported syntax"),
    ("'a' * 3", "unsupported syntax"),
    ("True + 1", "unsupported syntax"),
    ("[1, 2]", "unsupported syntax"),
    ("lambda: 1", "unsupported syntax"),
    ("1 if 1 else 2", "unsupported syntax"),
    ("2 < 3", "unsupported syntax"),
    ("1 << 10000", "unsupported syntax"),
    ("1 +", "invalid expression"),
    ("1 / 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("(-8) ** 0.5", "not a real number"),
    ("1e308 * 10", "not a finite number"),
    ("10.0 ** 400", "too large"),
])
def test_rejects(expression, message):
    with pytest.raises(CalculatorError, match=message):
        calc(expression)


@pytest.mark.parametrize("expression", ["9**9**9", "2**10**10", "(10**1000)**(10**1000)",
                                        "10**1000 * 10**1000", "1" * 501])
def test_bounded_work(expression):
    start = time.perf_counter()
    with pytest.raises(CalculatorError, match="too large|longer than"):
        evaluate(expression)
    assert time.perf_counter() - start < 0.5
