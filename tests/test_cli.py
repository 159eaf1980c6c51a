"""Which exceptions the entry points print as one line (exit 2) and which keep their traceback."""
import pytest

from envs.manifest import ManifestError
from envs.mcp_client import ServerStartError, ToolEnvError
from rewards.loader import RewardError, RewardLoadError
from rl_factory.cli import USER_ERRORS, print_user_error
from rl_factory.config import ConfigError
from rl_factory.data import DatasetError
from rl_factory.base.errors import UnknownName
from rl_factory.hub import HubUnreachable
from rl_factory.pipeline import PipelineError
from rl_factory.base.registry import Registry
from rl_factory.tracking import TrackingError


@pytest.mark.parametrize("cls", [ConfigError, DatasetError, ManifestError, ToolEnvError, ServerStartError,
                                 RewardLoadError, RewardError, TrackingError, PipelineError, HubUnreachable,
                                 UnknownName, FileNotFoundError])
def test_the_projects_own_errors_are_one_line(cls):
    assert issubclass(cls, USER_ERRORS)


@pytest.mark.parametrize("cls", [ValueError, KeyError, TypeError, RuntimeError, AttributeError])
def test_any_other_exception_is_a_bug_and_keeps_its_traceback(cls):
    assert not issubclass(cls, USER_ERRORS)


def test_an_unknown_name_is_one_line_without_quotes(capsys):
    registry = Registry("widget")
    registry.register("round")(object())
    with pytest.raises(KeyError) as err:  # still a KeyError for code that catches one
        registry.lookup("square")
    assert print_user_error(err.value) == 2
    assert capsys.readouterr().err == "error: unknown widget 'square'; valid: ['round']\n"
