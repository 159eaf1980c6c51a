"""Our agent loop inside verl's own AgentLoopWorker, on CPU, against the real verl package.

The only fake is verl's LLM server client (vLLM needs a GPU): `ScriptedServer.generate` returns
scripted token ids and distinct log-probs in verl's `TokenOutput`. Everything else is real: the data
goes through our converter and verl's RLHFDataset and collate_fn, verl's AgentLoopWorker loads our loop
from agent_loop.yaml by path and instantiates it per sample, our loop runs the calculator MCP server,
and verl pads the result into its DataProto. The expected ids are built from the chat template, not
from our ChatFormat.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")

from omegaconf import OmegaConf  # noqa: E402

from rl_factory.backends.verl.records import RECORD_KEY, from_record  # noqa: E402
from rl_factory.backends.verl.reward import compute_score  # noqa: E402
from tests.backends.conftest import CALL, OBSERVATION, QUESTION, ROOT, ScriptedServer, load_rows  # noqa: E402

def make_worker(cfg, server):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    return AgentLoopWorker(cfg, llm_client=server)


def test_two_turn_tool_trajectory_through_verls_worker(verl_setup):
    from verl.protocol import DataProto

    cfg, files = verl_setup()
    batch = load_rows(cfg, files)
    assert json.loads(batch["rl_factory_sample"][0])["topic"] == "arith"  # every dataset column survives
    server = None

    async def run():
        nonlocal server
        worker = make_worker(cfg, None)
        server = ScriptedServer(worker.tokenizer, [[CALL, "The answer is 10063."]])
        worker.llm_client = server
        out = await worker.generate_sequences(DataProto.from_single_dict(batch, meta_info={"global_steps": 1}))
        return worker, out

    worker, out = asyncio.run(run())
    tok = worker.tokenizer
    # Expected ids from the chat template and literal template text, independent of ChatFormat.
    first, second = server.calls
    prompt = first["prompt_ids"]
    rendered = tok.apply_chat_template([{"role": "user", "content": QUESTION}], tools=_tool_schemas(),
                                       tokenize=False, add_generation_prompt=True)
    assert prompt == tok.encode(rendered, add_special_tokens=False)
    turn1 = tok.encode(CALL, add_special_tokens=False) + [tok.eos_token_id]
    turn2 = tok.encode("The answer is 10063.", add_special_tokens=False) + [tok.eos_token_id]
    observation = tok.encode(OBSERVATION, add_special_tokens=False)
    assert second["prompt_ids"] == prompt + turn1 + observation  # the history is appended, never re-rendered
    assert first["request_id"] == second["request_id"]  # sticky routing: one request id per trajectory
    assert first["sampling_params"]["max_tokens"] == cfg.rl_factory.rollout.max_response_tokens
    # the server hands back ids only: vLLM is not asked to detokenize (no stop strings configured)
    assert first["sampling_params"]["detokenize"] is False and first["sampling_params"]["logprobs"] is True

    # verl's padded batch: prompt left-padded, response = turn1 + observation + turn2, then padding.
    response = turn1 + observation + turn2
    n = len(response)
    prompts, responses = out.batch["prompts"][0].tolist(), out.batch["responses"][0].tolist()
    assert prompts[-len(prompt):] == prompt and out.batch["attention_mask"][0, -n - (len(responses) - n):].sum() == n
    assert responses[:n] == response
    mask = out.batch["response_mask"][0].tolist()
    assert mask[:n] == [1] * len(turn1) + [0] * len(observation) + [1] * len(turn2) and sum(mask[n:]) == 0
    logprobs = out.batch["rollout_log_probs"][0].tolist()
    expected_lp = ([-(k + 1) / 1000 for k in range(len(turn1))] + [0.0] * len(observation)
                   + [-(1000 + k + 1) / 1000 for k in range(len(turn2))])
    assert np.allclose(logprobs[:n], expected_lp)
    assert out.non_tensor_batch["__num_turns__"][0] == 4  # user, assistant, tool, assistant
    # weight versions for verl's staleness control: the first turn's min, the last turn's max
    assert (out.non_tensor_batch["min_global_steps"][0], out.non_tensor_batch["max_global_steps"][0]) == (7, 8)

    # The trajectory record reaches the reward, which scores it like the embedded backend does.
    # (verl flattens extra_fields into the batch; its reward worker merges them into extra_info)
    extra = {k: out.non_tensor_batch[k][0] for k in (RECORD_KEY, "tool_calls", "tool_errors", "stop_reason")}
    assert extra["tool_calls"] == 1 and extra["tool_errors"] == 0 and extra["stop_reason"] == "answer"
    traj = from_record(extra[RECORD_KEY])
    assert traj.tool_results[0].text == "10063" and traj.completion == "The answer is 10063."
    reward_kwargs = OmegaConf.to_container(cfg.reward.custom_reward_function.reward_kwargs)
    score = asyncio.run(compute_score("rl_factory", "ignored", "10063",
                                      extra_info={**extra, "index": 0}, **reward_kwargs))
    assert score["score"] == 1.0


@pytest.mark.parametrize("step,every,asked", [(2, 10, False), (11, 10, True), (2, 1, True)])
def test_sampling_logprobs_asked_for_on_check_steps_only(verl_setup, step, every, asked):
    """Under old_log_probs=update only the health checks read vLLM's log-probs: steps 1, 1+N, ... ask for them;
    the others hand verl ABSENT on the generated tokens, and the guard's entropy estimate counts none of them."""
    from verl.protocol import DataProto

    from rl_factory.backends.verl.sampling_logprobs import ABSENT

    cfg, files = verl_setup()
    assert cfg.sampling_logprobs_every == 10  # the default, kept: nothing trains on them here
    cfg.sampling_logprobs_every = every
    batch = load_rows(cfg, files)
    batch["global_steps"] = np.array([step] * len(batch["rl_factory_sample"]), dtype=object)  # as verl's V1 passes it

    async def run():
        worker = make_worker(cfg, None)
        worker.llm_client = ScriptedServer(worker.tokenizer, [[CALL, "The answer is 10063."]])
        return worker.llm_client, await worker.generate_sequences(DataProto.from_single_dict(batch))

    server, out = asyncio.run(run())
    assert [c["sampling_params"]["logprobs"] for c in server.calls] == [asked, asked]
    mask = out.batch["response_mask"][0].bool()
    generated = out.batch["rollout_log_probs"][0][mask]
    assert bool((generated < 0).all()) if asked else bool((generated == ABSENT).all())
    record = json.loads(out.non_tensor_batch[RECORD_KEY][0])
    assert record["guard"]["neg_logprob_count"] == (int(mask.sum()) if asked else 0)


def _tool_schemas():
    from envs import ToolEnv

    async def schemas():
        async with ToolEnv.from_manifest(ROOT / "configs" / "tools" / "calculator.yaml") as env:
            return await env.list_tools()
    return asyncio.run(schemas())


def test_arena_plays_the_group_in_the_worker(verl_setup):
    """V1 runs a prompt's n sessions in one worker (`_run_prompt`); they meet and get tournament scores."""
    cfg, files = verl_setup("algorithm.advantage=arena")
    batch = load_rows(cfg, files)
    kwargs = {k: v[0] for k, v in batch.items() if not hasattr(v, "shape") or v.dtype == object}
    kwargs.pop("agent_name", None)
    wrong = [CALL, "The answer is 5."]
    right = [CALL, "The answer is 10063."]

    async def run():
        worker = make_worker(cfg, None)
        worker.llm_client = ScriptedServer(worker.tokenizer, [right, wrong, right])
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
        tasks = []
        for session in range(3):  # as AgentLoopWorkerTQ._run_prompt does
            trajectory = {"step": 1, "sample_index": 0, "rollout_n": session, "validate": False}
            tasks.append(worker._run_agent_loop(sampling, trajectory, agent_name="rl_factory", trace=False,
                                                uid="prompt-0", session_id=session, global_steps=1, **kwargs))
            await asyncio.sleep(0.05)  # keep the script order = session order
        return await asyncio.gather(*tasks)

    outputs = asyncio.run(run())
    scores = [o.reward_score for o in outputs]
    assert scores[0] == scores[2] > scores[1]  # both right answers beat the wrong one
    rankings = list((Path(cfg.rl_factory.trainer.output_dir) / "arena").glob("*/rankings.csv"))
    assert len(rankings) == 1 and len(rankings[0].read_text().splitlines()) == 1 + 3


def test_validation_rows_are_not_played(verl_setup):
    """Validation runs val_kwargs.n rollouts per prompt: they are scored pointwise, never wait for a group."""
    cfg, files = verl_setup("algorithm.advantage=arena")
    batch = load_rows(cfg, files, split="val")
    assert list(batch["rl_factory_split"]) == ["val"]

    from verl.protocol import DataProto

    async def run():
        worker = make_worker(cfg, None)
        worker.llm_client = ScriptedServer(worker.tokenizer, [["The answer is 10063."]])
        return await asyncio.wait_for(
            worker.generate_sequences(DataProto.from_single_dict(batch, meta_info={"validate": True})), 60)

    out = asyncio.run(run())
    assert out.non_tensor_batch["stop_reason"][0] == "answer"


def test_prompt_carries_full_json_schemas_that_verls_tool_model_drops(verl_setup, tmp_path):
    """A nested tool schema reaches the prompt whole; verl's own OpenAIFunctionToolSchema would cut it."""
    (tmp_path / "trip_tools.py").write_text(
        "def plan(stops: list[dict[str, int]], budget: float | None = None) -> str:\n"
        '    """Plan a trip.\n\n    Args:\n        stops: the stops, each a mapping of city to nights.\n'
        '        budget: the budget in euros.\n    """\n    return "ok"\n')
    manifest = tmp_path / "tools.yaml"
    manifest.write_text(f"functions: ['{tmp_path / 'trip_tools.py'}:plan']\n")
    cfg, files = verl_setup(f"env.tools={manifest}")
    batch = load_rows(cfg, files)

    from verl.protocol import DataProto
    from verl.tools.schemas import OpenAIFunctionToolSchema

    from envs import ToolEnv

    async def run():
        worker = make_worker(cfg, None)
        worker.llm_client = ScriptedServer(worker.tokenizer, [["No tool needed."]])
        await worker.generate_sequences(DataProto.from_single_dict(batch, meta_info={"global_steps": 1}))
        async with ToolEnv.from_manifest(manifest) as env:
            return worker, worker.llm_client.calls[0]["prompt_ids"], await env.list_tools()

    worker, prompt, schemas = asyncio.run(run())
    (schema,) = schemas
    stops = schema["function"]["parameters"]["properties"]["stops"]
    assert stops["items"]["additionalProperties"] == {"type": "integer"}  # nested: a list of mappings
    rendered = worker.tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tools=schemas,
                                                    tokenize=False, add_generation_prompt=True)
    assert prompt == worker.tokenizer.encode(rendered, add_special_tokens=False)
    assert '"additionalProperties": {"type": "integer"}' in worker.tokenizer.decode(prompt)
    # verl's ToolAgentLoop would refuse the Optional parameter (anyOf, no "type") and cut the nested list
    import copy

    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="budget.type"):
        OpenAIFunctionToolSchema.model_validate(schema)
    no_budget = copy.deepcopy(schema)
    del no_budget["function"]["parameters"]["properties"]["budget"]
    dumped = OpenAIFunctionToolSchema.model_validate(no_budget).model_dump(exclude_unset=True, exclude_none=True)
    assert "items" not in dumped["function"]["parameters"]["properties"]["stops"]


def test_a_prompt_over_verls_cap_fails_before_generating(verl_setup):
    cfg, files = verl_setup()
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.prompt_length", 20)
    batch = load_rows(cfg, files)

    from verl.protocol import DataProto

    async def run():
        worker = make_worker(cfg, None)
        worker.llm_client = ScriptedServer(worker.tokenizer, [["The answer is 10063."]])
        with pytest.raises(ValueError, match=r"sample 0: prompt of \d+ tokens .* exceeds data.max_prompt_length=20"):
            await worker.generate_sequences(DataProto.from_single_dict(batch, meta_info={"global_steps": 1}))
        return worker.llm_client.calls

    assert asyncio.run(run()) == []  # nothing was sent to the server


ADVERSARIAL = [  # what the parsers once crashed on, each in its own block of one assistant turn
    # nested past json's recursion limit (RecursionError), a 10,000-digit number (ValueError),
    # lone surrogates in a name and in an argument (UnicodeEncodeError when written), a cut-off block
    '<tool_call>\n{"name": "calculator", "arguments": ' + "[" * 1500 + "]" * 1500 + "}\n</tool_call>",
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": ' + "9" * 10_000 + "}}\n</tool_call>",
    '<tool_call>\n{"name": "calc\\ud800ulator", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "\\udfff 1 + 1"}}\n</tool_call>',
    CALL,
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 +',  # cut off: no closing tag
]


def test_adversarial_tool_calls_through_verls_worker_are_tool_errors(verl_setup):
    from verl.protocol import DataProto

    cfg, files = verl_setup("rollout.max_response_tokens=16000", "rollout.max_total_tokens=16000")
    batch = load_rows(cfg, files)

    async def run():
        worker = make_worker(cfg, None)
        worker.llm_client = ScriptedServer(worker.tokenizer, [["\n".join(ADVERSARIAL), "The answer is 10063."]])
        return await asyncio.wait_for(
            worker.generate_sequences(DataProto.from_single_dict(batch, meta_info={"global_steps": 1})), 120)

    out = asyncio.run(run())
    traj = from_record(out.non_tensor_batch[RECORD_KEY][0])
    kinds = [r.error_kind for r in traj.tool_results]
    assert kinds == ["parse", "parse", "parse", "server_error", None, "parse"], [r.text for r in traj.tool_results]
    assert traj.tool_results[4].text == "10063" and traj.completion == "The answer is 10063."
    assert "nested" in traj.tool_results[0].text and "valid Unicode" in traj.tool_results[2].text
    assert traj.tool_calls[3].arguments == {"expression": "\ufffd 1 + 1"}  # repaired, then run (and refused)
    assert out.non_tensor_batch["tool_errors"][0] == 5 and out.non_tensor_batch["stop_reason"][0] == "answer"
