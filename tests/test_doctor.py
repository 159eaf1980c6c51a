"""`--doctor`: each check passes on a sound setup and fails, with its fix, on a setup built to break it.

The broken setups are the tiny model's own tokenizer with a modified chat template (or tokenizer), a
config, data or reward changed to break one thing: nothing is mocked.
"""
import asyncio
import json
import re
import subprocess

import pytest

from rl_factory.doctor import FAIL, PASS, SKIP, run_doctor
from rl_factory.models.tiny import CHAT_TEMPLATE
from tests.e2e.test_main_scripts import REPO, run_script, script_env

pytestmark = pytest.mark.slow  # --doctor through the launch scripts, the built model's checks (~10 s a test)

# As DeepSeek-R1-style templates do: an earlier assistant turn is rendered without its <think> block.
DROPS_PAST_THINKING = CHAT_TEMPLATE.replace(
    "{%- for message in messages %}",
    "{%- set ns = namespace(last=-1) %}{%- for m in messages %}{%- if m.role == 'assistant' %}"
    "{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}\n{%- for message in messages %}", 1).replace(
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}",
    "{%- set content = message.content or '' %}{%- if loop.index0 < ns.last and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content }}", 1)
# Tool calls written in the Qwen3-Coder XML format (the hermes parser cannot read them).
XML_CALLS = CHAT_TEMPLATE.replace(
    """{{- '<tool_call>\\n{"name": "' + tc.name + '", "arguments": ' }}
            {%- if tc.arguments is string %}
                {{- tc.arguments }}
            {%- else %}
                {{- tc.arguments | tojson }}
            {%- endif %}
            {{- '}\\n</tool_call>' }}""",
    """{{- '<tool_call>\\n<function=' + tc.name + '>\\n' }}
            {%- for k, v in tc.arguments.items() %}
                {{- '<parameter=' + k + '>\\n' + (v | string) + '\\n</parameter>\\n' }}
            {%- endfor %}
            {{- '</function>\\n</tool_call>' }}""", 1)
# A template that never shows the model its tools.
NO_TOOLS = CHAT_TEMPLATE.replace("{%- if tools %}", "{%- if false %}", 1)
# History rendered with an extra newline after the tool calls, which the turn as generated lacks
# (a whitespace-only drift).
EXTRA_NEWLINE = CHAT_TEMPLATE.replace(
    "{{- '<|im_end|>\\n' }}\n    {%- elif message.role == 'tool' %}",
    "{{- ('\\n' if message.tool_calls and not loop.last else '') + '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'tool' %}", 1)


def tokenizer_dir(tiny_model_dir, tmp_path, template=None, special_tags=False):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    if template is not None:
        tok.chat_template = template
    if special_tags:  # the tool-call tags become special tokens, which decoding skips
        tok.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    out = tmp_path / "tokenizer"
    tok.save_pretrained(out)
    return out


def doctor(*overrides, mode="train"):
    report = asyncio.run(run_doctor(list(overrides), mode=mode))
    return report, {c.name: c for c in report.checks}


def base(model_dir, tmp_path):
    return [f"model.path={model_dir}", f"trainer.output_dir={tmp_path / 'run'}", "data.val_limit=8"]


def test_sound_setup_passes_every_check(tiny_model_dir, tmp_path):
    report, checks = doctor(*base(tiny_model_dir, tmp_path))
    assert report.ok, report.table()
    assert [c.name for c in report.checks] == ["config", "run directory", "reward loads", "data", "tools",
                                               "reward scores a row", "chat template", "tool schemas fit",
                                               "parser round-trip", "token stream"]
    assert "equal the template's rendering token for token" in checks["token stream"].detail
    assert not (tmp_path / "run").exists()  # the doctor writes nothing into the run directory


def test_template_that_drops_past_thinking_is_listed(tiny_model_dir, tmp_path):
    tok = tokenizer_dir(tiny_model_dir, tmp_path, DROPS_PAST_THINKING)
    report, checks = doctor(*base(tok, tmp_path))
    stream = checks["token stream"]
    assert stream.status == FAIL and "thinking block dropped from history" in stream.detail
    assert "rollout.context=step" in stream.fix
    assert [c.name for c in report.checks if c.status != PASS] == ["token stream"]
    # The step policy renders each prompt with the template: the same template is consistent there.
    _, checks = doctor(*base(tok, tmp_path), "rollout.context=step")
    assert checks["token stream"].status == PASS, checks["token stream"].detail


def test_parser_mismatch_names_the_parser_that_fits(tiny_model_dir, tmp_path):
    tok = tokenizer_dir(tiny_model_dir, tmp_path, XML_CALLS)
    _, checks = doctor(*base(tok, tmp_path))
    parser = checks["parser round-trip"]
    assert parser.status == FAIL and "env.parser=hermes parsed a malformed call (invalid JSON" in parser.detail
    assert "<function=calculator>" in parser.detail
    assert parser.fix == "set env.parser=qwen3_xml (it reads this template's format)"
    _, checks = doctor(*base(tok, tmp_path), "env.parser=qwen3_xml")
    assert checks["parser round-trip"].status == PASS, checks["parser round-trip"].detail


def test_tool_tags_as_special_tokens_are_dropped_by_decoding(tiny_model_dir, tmp_path):
    tok = tokenizer_dir(tiny_model_dir, tmp_path, special_tags=True)
    _, checks = doctor(*base(tok, tmp_path))
    parser = checks["parser round-trip"]
    assert parser.status == FAIL and "special tokens that decoding drops" in parser.fix, parser


def test_template_without_tools_and_a_prompt_that_does_not_fit(tiny_model_dir, tmp_path):
    tok = tokenizer_dir(tiny_model_dir, tmp_path, NO_TOOLS)
    _, checks = doctor(*base(tok, tmp_path))
    assert checks["tool schemas fit"].status == FAIL
    assert "does not render the tool schemas: ['calculator']" in checks["tool schemas fit"].detail
    _, checks = doctor(*base(tiny_model_dir, tmp_path), "rollout.max_total_tokens=100", "rollout.max_response_tokens=64")
    fit = checks["tool schemas fit"]
    assert fit.status == FAIL and "leaves no room to generate" in fit.detail and "raise rollout.max_total_tokens" in fit.fix
    # On verl the cap is verl's data.max_prompt_length (default 1024 from configs/verl.yaml)
    _, checks = doctor(*base(tiny_model_dir, tmp_path), "trainer.backend=verl")
    assert checks["tool schemas fit"].status == PASS and "of 1024 tokens (data.max_prompt_length)" in \
        checks["tool schemas fit"].detail
    _, checks = doctor(*base(tiny_model_dir, tmp_path), "trainer.backend=verl", "data.max_prompt_length=40")
    assert checks["tool schemas fit"].status == FAIL and "data.max_prompt_length=40" in checks["tool schemas fit"].detail


def test_whitespace_drift_between_history_and_generation(tiny_model_dir, tmp_path):
    assert EXTRA_NEWLINE != CHAT_TEMPLATE
    tok = tokenizer_dir(tiny_model_dir, tmp_path, EXTRA_NEWLINE)
    _, checks = doctor(*base(tok, tmp_path))
    stream = checks["token stream"]
    assert stream.status == FAIL and "1 whitespace" in stream.detail, stream.detail


def test_data_without_the_columns_the_reward_names(tiny_model_dir, tmp_path):
    reward = tmp_path / "needs_level.py"
    reward.write_text("def reward(completion, answer, level, **_):\n    return 1.0\n")
    _, checks = doctor(*base(tiny_model_dir, tmp_path), f"reward.function={reward}:reward")
    assert checks["data"].status == FAIL and "no 'level' column" in checks["data"].detail
    _, checks = doctor(*base(tiny_model_dir, tmp_path), "data.answer_key=solution")
    assert checks["data"].status == FAIL and "no 'solution' column" in checks["data"].detail
    assert checks["data"].fix.startswith("set data.answer_key to the answer column")
    assert checks["reward scores a row"].status == SKIP


def test_an_answer_column_some_rows_lack_is_named_with_its_row_and_said_right(tiny_model_dir, tmp_path):
    rows = [json.loads(line) for line in (REPO / "examples/calculator/data/train.jsonl").read_text().splitlines()[:10]]
    for row in rows[7:]:
        del row["answer"]
    data = tmp_path / "partial.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, checks = doctor(*base(tiny_model_dir, tmp_path), f"data.train_files={data}")
    assert checks["data"].status == FAIL
    assert checks["data"].detail == (
        f"{data} row 7 has no 'answer' column, which reward exact_match.py:numeric_exact_match needs (as `answer`, "
        "from data.answer_key); 7 of 10 rows of data.train_files have it; this row's columns: ['kind', 'prompt']")
    assert checks["data"].fix == "give every row a value in column 'answer', or drop the rows without one"
    # the checks that need the rows say so in the table's words, not by internal names
    assert checks["token stream"].detail == "not run: needs the data check to pass"
    assert checks["reward scores a row"].detail == "not run: needs the data check to pass"


def test_reward_that_raises_and_a_server_that_does_not_start(tiny_model_dir, tmp_path):
    reward = tmp_path / "raising.py"
    reward.write_text("def reward(completion, answer):\n    raise ValueError('no score today')\n")
    _, checks = doctor(*base(tiny_model_dir, tmp_path), f"reward.function={reward}:reward")
    assert checks["reward scores a row"].status == FAIL and "no score today" in checks["reward scores a row"].detail
    ghost = "{mcpServers:{ghost:{command:rlf-no-such-command-xyz}}}"
    report, checks = doctor(*base(tiny_model_dir, tmp_path), f"env.tools={ghost}")
    assert checks["tools"].status == FAIL and "ghost" in checks["tools"].detail
    assert {c.name for c in report.checks if c.status == SKIP} >= {"chat template", "parser round-trip", "token stream"}


def test_a_config_typo_fails_first_and_skips_the_rest(tmp_path):
    report, checks = doctor("trainer.totl_steps=3")
    assert checks["config"].status == FAIL and "totl_steps" in checks["config"].detail
    assert all(c.status == SKIP for c in report.checks[1:])
    assert checks["chat template"].detail == "not run: needs the config and tools checks to pass"


@pytest.mark.parametrize("overrides, line", [
    (["algorithm.old_log_probs=recompute"], "algorithm.old_log_probs=recompute is not supported on the embedded backend"),
    (["trainer.backend=verl", "rollout.context=step", "algorithm.advantage=rloo"],
     "rollout.context=step is not supported on the verl backend with algorithm.advantage=rloo"),
])
def test_what_the_backend_cannot_train_fails_the_config_check_with_the_runs_own_line(overrides, line):
    _, checks = doctor(*overrides)
    assert checks["config"].status == FAIL and checks["config"].detail.startswith(line)


@pytest.mark.parametrize("script", ["main_grpo.sh", "main_eval.sh"])
def test_doctor_flag_prints_the_table_and_sets_the_exit_code(script, tiny_model_dir, tmp_path):
    good = run_script(script, "--doctor", f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path / 'run'}")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "all checks passed" in good.stdout and "token stream" in good.stdout
    assert ("run directory" in good.stdout) == (script == "main_grpo.sh")
    if script == "main_grpo.sh":  # the failing path once (the checks themselves are tested above)
        bad = run_script(script, "--doctor", f"model.path={tokenizer_dir(tiny_model_dir, tmp_path, XML_CALLS)}")
        assert bad.returncode == 1 and "fix: set env.parser=qwen3_xml" in bad.stdout


def test_fresh_machine_doctor_passes_with_the_builtin_model_not_built_yet(tmp_path):
    """The docs' `bash main_grpo.sh --doctor` on a machine that never built the model: only its tokenizer is
    built (in about a second), which must decode as the saved one will."""
    cache = tmp_path / "cache"
    env = {**script_env(), "RL_FACTORY_CACHE": str(cache)}
    done = subprocess.run(["bash", "main_grpo.sh", "--doctor", f"trainer.output_dir={tmp_path / 'run'}",
                           "data.val_limit=8"], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "all checks passed" in done.stdout
    assert re.search(r"parser round-trip\s+PASS", done.stdout), done.stdout
    assert "builtin:tiny-calculator" in done.stdout
    assert re.search(r"model build\s+PASS\s+builtin:tiny-calculator is not built yet: the first run builds it once "
                     r"into .*\(at most 1000 warm-start steps at ~[\d.]+s here: at most [\d.]+ min.*\), then every task "
                     r"reuses it", done.stdout), done.stdout
    assert not cache.exists() or not any(cache.rglob("config.json"))  # the model itself was not built


GUESS = ["model.path=builtin:tiny-guess", "env.tools=null", "env.environment=examples/guess/environment.py:GuessEnv",
         "env.max_turns=4", "data.train_files=examples/guess/data/train.jsonl",
         "data.val_files=examples/guess/data/val.jsonl", "reward.function=examples/guess/reward.py:reward",
         "reward.success_threshold=0.1", "rollout.max_response_tokens=8"]


def test_environment_task_is_checked_as_the_multi_turn_episode_it_is(tmp_path):
    """examples/guess (env.tools=null, env.environment set): the environment drives the turns, its class and
    reset are checked, and the reward row plays the reference answer as one turn instead of scoring the
    state nobody played (which read 0.000 for a reward that reads `state`)."""
    report, checks = doctor(*GUESS, f"trainer.output_dir={tmp_path / 'run'}")
    assert report.ok, report.table()
    tools = checks["tools"].detail
    assert "single-turn" not in tools and "GuessEnv drives the turns (up to env.max_turns=4)" in tools
    env = checks["environment"].detail
    assert "hooks reset, step, close are async" in env and "reset(data.train_files row 0) returned 0 message(s)" in env
    reward = checks["reward scores a row"].detail
    assert reward.startswith("scored 1.000 on row 0: its reference answer '1' played as the one turn") \
        and "the environment ended the episode (env_done)" in reward, reward
    assert "reset added" not in checks["tool schemas fit"].detail  # GuessEnv's reset says nothing
    assert "2-turn environment conversation equal" in checks["token stream"].detail


WORLDS = '''
class SyncStep:
    async def reset(self, sample): return []
    def step(self, trajectory): return [], True
    async def close(self): pass

class Chatty:  # opens with a long speech, never ends the episode, and keeps no state
    async def reset(self, sample): return [{"role": "user", "content": "and now a word " * 200}]
    async def step(self, trajectory): return [{"role": "user", "content": "go on"}], False
    async def close(self): pass

class BadReset:
    async def reset(self, sample): return "hello"
    async def step(self, trajectory): return [], True
    async def close(self): pass
'''


def test_environment_that_cannot_run_is_named_and_what_the_reward_saw_is_said(tmp_path):
    (tmp_path / "worlds.py").write_text(WORLDS)
    common = [*GUESS[:2], *GUESS[3:6], f"trainer.output_dir={tmp_path / 'run'}", "data.val_limit=2",
              "reward.function=rewards/exact_match.py:numeric_exact_match"]
    report, checks = doctor(*common, f"env.environment={tmp_path / 'worlds.py'}:SyncStep")
    assert checks["environment"].status == FAIL and "step is not `async def`" in checks["environment"].detail
    assert checks["tools"].status == PASS and "SyncStep drives the turns" in checks["tools"].detail
    assert checks["reward scores a row"].status == SKIP  # not scored without the environment
    _, checks = doctor(*common, f"env.environment={tmp_path / 'worlds.py'}:BadReset")
    assert checks["environment"].status == FAIL and "reset() returned str" in checks["environment"].detail
    assert checks["reward scores a row"].status == SKIP  # not played again: the environment row says why
    _, checks = doctor(*common, f"env.environment={tmp_path / 'worlds.py'}:Chatty", "rollout.max_total_tokens=300")
    assert "returned 1 message(s) (user)" in checks["environment"].detail
    assert "no `state` dict" in checks["environment"].detail
    reward = checks["reward scores a row"].detail
    assert "the environment answered and went on: the reward read the state of an unfinished episode" in reward
    fit = checks["tool schemas fit"]  # the reset's speech is part of row 0's prompt
    assert fit.status == FAIL and "row 0's prompt is" in fit.detail, fit.detail


SQL = REPO / "examples" / "sql"


def test_tools_that_are_none_and_a_reward_that_reads_its_episode_say_so(tmp_path):
    """A manifest that lists no tools is single-turn (not "0 tool(s) listed ()"); examples/sql's reward reads
    the row's own database through `tools`, so its 0.000 is said to be the state before any call."""
    run = f"trainer.output_dir={tmp_path / 'run'}"
    (tmp_path / "none.yaml").write_text("mcpServers: {}\n")
    report, checks = doctor(run, f"env.tools={tmp_path / 'none.yaml'}", "data.val_limit=2")
    assert report.ok, report.table()
    assert checks["tools"].detail == "no tools (env.tools lists none): single-turn"
    assert "1-turn plain conversation" in checks["token stream"].detail
    report, checks = doctor(run, f"env.tools={SQL / 'tools.yaml'}", f"reward.function={SQL / 'reward.py'}:reward",
                            f"data.train_files={SQL / 'data' / 'train.jsonl'}",
                            f"data.val_files={SQL / 'data' / 'val.jsonl'}", "env.max_turns=3")
    assert report.ok, report.table()
    assert checks["reward scores a row"].detail == (
        "scored 0.000 on row 0 in its own episode before any tool call (an empty completion: no row has "
        "'answer'): the reward reads the episode through `tools`, so what the agent's calls leave there is "
        "scored at rollout")


def test_a_per_episode_server_given_the_samples_own_file_is_warned_about(tmp_path):
    import json

    notes = REPO / "tests" / "fakes" / "notes_server.py"
    (tmp_path / "row.json").write_text("{}")
    rows = [json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1), "notes": str(tmp_path / "row.json")})
            for i in range(2)]
    (tmp_path / "data.jsonl").write_text("\n".join(rows) + "\n")
    common = [f"trainer.output_dir={tmp_path / 'run'}", f"data.train_files={tmp_path / 'data.jsonl'}",
              f"data.val_files={tmp_path / 'data.jsonl'}"]
    shared = tmp_path / "shared.yaml"
    shared.write_text(json.dumps({"mcpServers": {"notes": {
        "command": "python", "args": [str(notes), "--file", "${sample.notes}"], "scope": "episode"}}}))
    _, checks = doctor(*common, f"env.tools={shared}")
    assert checks["tools"].status == PASS
    assert ("warning: mcpServers.notes.args names ${sample.notes}, an existing file (" + str(tmp_path / "row.json")
            + "): every trajectory of a sample gets that same file") in checks["tools"].detail
    copied = tmp_path / "copied.yaml"
    copied.write_text(json.dumps({"mcpServers": {"notes": {
        "command": "python", "args": [str(notes), "--file", "${episode.dir}/notes.json"], "scope": "episode",
        "files": {"notes.json": "${sample.notes}"}}}}))
    _, checks = doctor(*common, f"env.tools={copied}")
    assert checks["tools"].status == PASS and "warning" not in checks["tools"].detail, checks["tools"].detail
