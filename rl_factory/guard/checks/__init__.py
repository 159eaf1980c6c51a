"""The guard's checks, one module per family; importing this package registers them all."""
from rl_factory.guard.checks import logprobs, numerics, receipts, rewards, tokens, tools  # noqa: F401
