"""The built-in model's tokenizer: the object `build_tokenizer` returns is the one a saved model loads."""
import json

from transformers import AutoTokenizer

from rl_factory.models.tiny import SPECIAL_TOKENS, TAG_TOKENS, build_tokenizer

TEXT = ("<|im_start|>assistant\n<think>\nadd them\n</think>\n<tool_call>\n{\"name\": \"calculator\", "
        "\"arguments\": {\"expression\": \"2 + 3\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n5\n"
        "</tool_response><|im_end|>\n<|endoftext|>")


def test_the_built_tokenizer_decodes_as_it_will_after_save_and_load(tmp_path):
    built = build_tokenizer([TEXT.replace("2 + 3", f"{i} * {i + 1}") for i in range(50)], vocab_size=300)
    built.save_pretrained(tmp_path / "a")
    loaded = AutoTokenizer.from_pretrained(tmp_path / "a")
    ids = built.encode(TEXT)
    assert loaded.encode(TEXT) == ids
    for skip in (True, False):
        assert built.decode(ids, skip_special_tokens=skip) == loaded.decode(ids, skip_special_tokens=skip)
    # As in Qwen3: the tags are added tokens that decoding keeps; only the chat markers are special.
    kept = built.decode(ids, skip_special_tokens=True)
    assert all(tag in kept for tag in TAG_TOKENS) and not any(s in kept for s in SPECIAL_TOKENS)
    loaded.save_pretrained(tmp_path / "b")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()
    configs = [json.loads((tmp_path / d / "tokenizer_config.json").read_text()) for d in ("a", "b")]
    for config in configs:  # where it was loaded from, not what it does
        config.pop("is_local", None), config.pop("local_files_only", None)
    assert configs[0] == configs[1]


def test_the_builtin_model_is_warm_started_with_the_calculator_servers_own_schema(calculator_tools):
    from rl_factory.models.tiny import CALCULATOR_TOOLS

    assert CALCULATOR_TOOLS == calculator_tools


def test_one_builtin_model_for_every_manifest_and_the_doctor_says_what_its_build_costs(tmp_path, monkeypatch):
    """The cache entry and the doctor's plan depend on the seed, not on the task's tools: a new manifest
    never starts a build of its own."""
    from rl_factory.policy import BUILTIN_PLANS

    monkeypatch.setenv("RL_FACTORY_CACHE", str(tmp_path))
    word_count = [{"type": "function", "function": {"name": "word_count", "description": "Count words.",
                                                    "parameters": {"type": "object", "properties": {}}}}]
    plans = [BUILTIN_PLANS["tiny-calculator"](tools, seed) for tools, seed in [([], 0), (word_count, 0), ([], 1)]]
    assert plans[0].path == plans[1].path != plans[2].path
    assert plans[0].path.parent == tmp_path / "models" and not plans[0].built
    steps, step_s = plans[0].estimate()
    assert steps == 1000 and 0 < step_s < 60
    assert not any(tmp_path.rglob("config.json"))  # estimating built nothing
