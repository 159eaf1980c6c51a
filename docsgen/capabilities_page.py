"""The backend capability page: the table rl_factory/capabilities.py enforces, rendered by that module."""
from __future__ import annotations

HEADER = """# Backend capabilities

Which backend supports which estimator, critic, context policy, anchor and filter. Generated when the site
is built from `rl_factory/capabilities.py`, the table the backends check a config against before a run
starts, so this page and the errors a run gives say the same.
"""


def render() -> str:
    """The page; without the module (a checkout that predates it) a page that says where the table lives."""
    try:
        from rl_factory.capabilities_page import render_markdown
    except ImportError:
        return HEADER + "\n*The table is generated from `rl_factory/capabilities.py`, which this checkout does not have.*\n"
    return HEADER + "\n" + render_markdown().strip() + "\n"
