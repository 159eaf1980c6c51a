"""Shared fixtures for the envs tests: manifests in tmp dirs, the fake slow and fault servers.

Helpers are handed out as fixtures (not imported from here) so that test modules do not depend
on how pytest names this conftest module.
"""
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
# Lets `pytest tests/envs` import `envs` before the project is pip-installed.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def calculator_manifest() -> Path:
    return REPO_ROOT / "configs" / "tools" / "calculator.yaml"


@pytest.fixture(scope="session")
def write_manifest():
    """write_manifest(directory, servers, name="tools.yaml") -> path of an mcpServers YAML."""
    def write(directory: Path, servers: dict, name: str = "tools.yaml") -> Path:
        path = Path(directory) / name
        path.write_text(yaml.safe_dump({"mcpServers": servers}))
        return path
    return write


@pytest.fixture(scope="session")
def slow_server():
    """slow_server(**knobs) -> manifest entry running tests/fakes/slow_server.py over stdio."""
    script = REPO_ROOT / "tests" / "fakes" / "slow_server.py"
    return lambda **knobs: {"command": "python", "args": [str(script)], **knobs}


@pytest.fixture(scope="session")
def fault_server():
    """fault_server(*flags, **knobs) -> manifest entry running tests/fakes/fault_server.py."""
    script = REPO_ROOT / "tests" / "fakes" / "fault_server.py"
    return lambda *flags, **knobs: {"command": "python", "args": [str(script), *flags], **knobs}
