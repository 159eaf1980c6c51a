"""The local Hugging Face judge on a freshly built (untrained) tiny model: the mechanics, not the taste."""
import asyncio

import pytest

from rewards.judge import Candidate, JudgeConfig, build_judge

TEMPLATE = "Question: {query}\nAgent A: {answer_a}\nAgent B: {answer_b}"


@pytest.fixture(scope="module")
def untrained_model_dir(tmp_path_factory):
    from rl_factory.models.tiny import TinyModelConfig, build_tiny_model
    from rl_factory.models.warmstart import WarmStartConfig

    out = tmp_path_factory.mktemp("judge_model")
    cfg = TinyModelConfig(warmstart=WarmStartConfig(num_transcripts=20, mechanics_steps=1, decision_steps=1, batch_size=2))
    build_tiny_model(out, [], cfg, log=lambda *_: None)
    return out


def test_hf_judge_reads_a_probability_from_the_next_token(untrained_model_dir):
    judge = build_judge(JudgeConfig(type="hf", model_path=str(untrained_model_dir), prompt=TEMPLATE))
    a, b = Candidate("It is 10063."), Candidate("I think 7.")

    async def run():
        ab = await judge.compare("What is 347 * 29?", a, b)
        ba = await judge.compare("What is 347 * 29?", b, a)
        await judge.aclose()
        return ab, ba

    ab, ba = asyncio.run(run())
    assert 0.0 < ab < 1.0
    assert ab + ba == pytest.approx(1.0)  # both orders judged: P(a > b) + P(b > a) = 1
    assert judge.stats["requests"] == 2 and judge.stats["cache_hits"] == 2


def test_hf_judge_prompt_too_long_is_a_judge_error(untrained_model_dir):
    from rewards.judge import JudgeError

    judge = build_judge(JudgeConfig(type="hf", model_path=str(untrained_model_dir), prompt=TEMPLATE))
    with pytest.raises(JudgeError, match="tokens; .* takes 1024"):
        asyncio.run(judge.compare("q", Candidate("x " * 3000), Candidate("y")))
