"""The built-in model's tokenizer: the object `build_tokenizer` returns is the one a saved model loads."""
import json
import os
import re
import sys
from pathlib import Path

from transformers import AutoTokenizer

from rl_factory.models.tiny import SPECIAL_TOKENS, TAG_TOKENS, build_tokenizer
import pytest

pytestmark = pytest.mark.slow  # builds models of its own

REPO = Path(__file__).resolve().parents[2]

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


def test_build_progress_without_a_terminal_logs_the_time_left_and_an_early_stop_shortens_it():
    from rl_factory.models.warmstart import BuildProgress

    lines: list[str] = []
    progress = BuildProgress(100, log=lines.append, every=10)
    for step in range(20):
        progress.step("mechanics", step, 80, 1.0)
    assert len(lines) == 2 and lines[0].startswith("mechanics step 10/80 loss 1.000 (") and "left)" in lines[0]
    assert re.search(r"at most \d+s left\)$", lines[1]), lines[1]
    progress.skip("mechanics", 19, 80, 0.01)
    assert progress.total == 40 and "done early" in lines[-1]


def test_the_build_draws_a_progress_bar_with_an_eta_on_a_terminal(tmp_path, calculator_tools):
    from tests.fakes.terminal import run_in_terminal

    script = ("import json, sys\nfrom pathlib import Path\n"
              "from rl_factory.models.tiny import TinyModelConfig, build_tiny_model\n"
              "from rl_factory.models.warmstart import WarmStartConfig\n"
              "cfg = TinyModelConfig(warmstart=WarmStartConfig(num_transcripts=200, mechanics_steps=6, decision_steps=4,"
              " batch_size=4))\n"
              f"build_tiny_model(Path(sys.argv[1]), json.loads({json.dumps(json.dumps(calculator_tools))}), cfg)\n")
    (tmp_path / "build.py").write_text(script)
    code, screen = run_in_terminal([sys.executable, str(tmp_path / "build.py"), str(tmp_path / "model")],
                                   cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert code == 0, screen[-2000:]
    assert re.search(r"building the default model: 100%\|.*\| 10/10 \[\d\d:\d\d<00:00", screen), screen[-2000:]
    assert (tmp_path / "model" / "config.json").exists()


def test_a_task_warm_start_is_an_explicit_model_built_per_tool_set_whose_tokenizer_fits_its_schemas(tmp_path,
                                                                                                     monkeypatch):
    """`builtin:tiny-calculator-task`: chosen by name, cached per tool set (the calculator's is the default model
    itself), and its tokenizer folds the task's tool preamble as the default's folds the calculator's."""
    from rl_factory.models.tiny import CALCULATOR_TOOLS
    from rl_factory.policy import BUILTIN_PLANS, BUILTIN_TOKENIZERS

    monkeypatch.setenv("RL_FACTORY_CACHE", str(tmp_path))
    words = [{"type": "function", "function": {
        "name": "word_count", "description": "Count the words in a text (runs of characters between whitespace).",
        "parameters": {"properties": {"text": {"title": "Text", "type": "string"}}, "required": ["text"],
                       "type": "object", "title": "word_countArguments"}}}]
    task = BUILTIN_PLANS["tiny-calculator-task"]
    assert task(words, 0).path != task(CALCULATOR_TOOLS, 0).path == BUILTIN_PLANS["tiny-calculator"](words, 0).path
    prompt = [{"role": "user", "content": 'How many words are in this text: "a b c"?'}]
    sizes = {}
    for name in ("tiny-calculator", "tiny-calculator-task"):
        tok = BUILTIN_TOKENIZERS[name](words, 0)
        sizes[name] = len(tok.encode(tok.apply_chat_template(prompt, tools=words, add_generation_prompt=True,
                                                             tokenize=False)))
    assert sizes["tiny-calculator-task"] * 2 < sizes["tiny-calculator"], sizes
    assert not any(tmp_path.rglob("config.json"))
