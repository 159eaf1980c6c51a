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
