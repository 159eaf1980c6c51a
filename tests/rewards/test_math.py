import pytest

from rewards.exact_match import extract_last_number, numeric_exact_match


@pytest.mark.parametrize("text, expected", [
    ("347 * 29 = 10063", "10063"),
    ("The total is 1,234,567.", "1234567"),
    ("It is -12.5 degrees", "-12.5"),
    ("so the answer is 10063.", "10063"),
    ("3-5 is a range", "5"),
    ("no digits here", None),
    ("list 1,2,3", "3"),
    ("version v2 of 7", "7"),
    ("", None),
])
def test_extract_last_number(text, expected):
    assert extract_last_number(text) == expected


@pytest.mark.parametrize("completion, answer, expected", [
    ("The answer is 10063.0", "10063", 1.0),
    ("The answer is 10,063", "10063", 1.0),
    ("**10063**.", "10063", 1.0),
    ("-42", "-42", 1.0),
    ("I think 10062", "10063", 0.0),
    ("first 10063 then 5", "10063", 0.0),
    ("no number", "10063", 0.0),
    ("0.5", 0.5, 1.0),
    ("1234", 1234, 1.0),
    ("72", "He earns 3 * 24 = 72.\n#### 72", 1.0),
    ("72", None, 0.0),
])
def test_numeric_exact_match(completion, answer, expected):
    assert numeric_exact_match(completion=completion, answer=answer) == expected
