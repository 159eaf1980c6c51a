"""The long-context benchmark's tool: every call returns the next ~1k-token page of a report."""
from __future__ import annotations

import random

WORDS = ("alpha beta gamma delta engine river market signal harbor copper window garden ledger orbit "
         "cabin velvet summit quartz meadow lantern").split()


def next_page(page: int = 0) -> str:
    """Return the next page of the report.

    Args:
        page: Page number (the server counts pages itself when omitted).
    """
    rng = random.Random(page)
    return f"Page {page}: " + " ".join(rng.choice(WORDS) for _ in range(190))
