"""Shared pieces of the verl backend tests: a scripted LLM server, a composed verl config, one local Ray,
per-episode notes."""
from __future__ import annotations

import json
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 29"}}\n</tool_call>'
OBSERVATION = "\n<|im_start|>user\n<tool_response>\n10063\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
QUESTION = "What is 347 * 29?"


class ScriptedServer:
    """verl's LLMServerClient.generate, scripted per request id: turn k of a trajectory gets script[k].

    Request ids take the scripts in the order they first arrive; every token gets a distinct log-prob.
    """

    def __init__(self, tokenizer, scripts: list[list[str]]):
        self.tokenizer, self.scripts = tokenizer, scripts
        self.turns: dict[str, int] = {}
        self.order: dict[str, int] = {}
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids),
                           "sampling_params": dict(sampling_params)})
        script = self.scripts[self.order.setdefault(request_id, len(self.order))]
        turn = self.turns.get(request_id, 0)
        self.turns[request_id] = turn + 1
        ids = self.tokenizer.encode(script[turn], add_special_tokens=False) + [self.tokenizer.eos_token_id]
        first = 1000 * turn
        # weight versions as verl's server client reports them (turn k ran on weights of step 7 + k); log-probs only
        # where asked for, as verl's vLLM server returns them
        logprobs = [-(first + k + 1) / 1000 for k in range(len(ids))] if sampling_params.get("logprobs") else None
        return TokenOutput(token_ids=ids, log_probs=logprobs,
                           stop_reason="completed", num_preempted=0,
                           extra_fields={"min_global_steps": 7 + turn, "max_global_steps": 7 + turn})


@pytest.fixture(scope="package")
def ray_cluster():
    """One local Ray for every test of tests/backends that needs it (started on first use, shut down
    after the package's last test): starting and stopping a cluster per module cost ~10 s each time."""
    ray = pytest.importorskip("ray")
    import ray.cloudpickle

    # The scripted server is test code: ship it to the workers by value, not by import.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield
    close_transfer_queue()
    ray.shutdown()


_transfer_queue: dict = {}


@contextmanager
def transfer_queue(conf):
    """TransferQueue on the local Ray for one test, started by the first test that asks and kept for the next ones,
    as one verl run keeps one (`tq.init` starts a controller and a storage actor, each importing torch: ~8 s of a
    2-core machine a start). The test leaves it empty."""
    import transfer_queue as tq
    from omegaconf import OmegaConf

    wanted = OmegaConf.to_container(conf, resolve=True)
    if _transfer_queue.get("conf") != wanted or not _controller_alive():
        close_transfer_queue()
        tq.init(conf)
        _transfer_queue["conf"] = wanted
    try:
        yield tq
    finally:
        for partition, keys in tq.kv_list().items():
            if keys:
                tq.kv_clear(keys=list(keys), partition_id=partition)


def _controller_alive() -> bool:
    """Whether TransferQueue's named controller still runs: a process that attached to it and closed it (verl's
    TaskRunner does at its end) killed it."""
    import ray

    try:
        ray.get_actor("TransferQueueController", namespace="transfer_queue")
    except ValueError:
        return False
    return True


def close_transfer_queue() -> None:
    """Stop the TransferQueue `transfer_queue` started, if any: for a test that starts its own."""
    if _transfer_queue.pop("conf", None) is not None:
        import transfer_queue as tq

        tq.close()


@pytest.fixture()
def verl_setup(tmp_path, tiny_model_dir):
    """make(*overrides) -> (verl config composed from ours, converted data files) for a calculator run."""
    from omegaconf import OmegaConf

    from rl_factory.backends.verl.config import compose_verl
    from rl_factory.backends.verl.data import convert
    from rl_factory.backends.verl.launcher import absolute
    from rl_factory.config import load_config, parse

    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": QUESTION, "answer": "10063", "topic": "arith"}) + "\n")

    def make(*overrides: str):
        ours = absolute(parse(load_config("grpo", ["trainer.backend=verl", f"data.train_files={data}",
                                                   f"data.val_files={data}", f"trainer.output_dir={tmp_path / 'run'}",
                                                   "rollout.n=3", *overrides])))
        files = {k: str(v) for k, v in convert(ours.data, tmp_path / "verl_data").items()}
        cfg = compose_verl(ours, [], files, str(tiny_model_dir))
        OmegaConf.resolve(cfg)
        return cfg, files
    return make


def load_rows(cfg, files, split="train"):
    """Dataset rows exactly as verl's trainer batches them (our converter, verl's RLHFDataset)."""
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.utils.tokenizer import hf_tokenizer

    dataset = RLHFDataset(data_files=files[split], tokenizer=hf_tokenizer(cfg.actor_rollout_ref.model.path),
                          config=cfg.data)
    return collate_fn([dataset[i] for i in range(len(dataset))])


# ---- episodes (test_verl_episodes.py, test_verl_v1_ray.py) ------------------------------------------

MARKER_VAR = "RL_FACTORY_TEST_RUN"
NOTES = str(Path(__file__).resolve().parents[1] / "fakes" / "notes_server.py")
PUT = '<tool_call>\n{{"name": "put", "arguments": {{"key": "k", "value": "{}"}}}}\n</tool_call>'
RIGHT_NOTE, WRONG_NOTE = [PUT.format("10063"), "Noted."], [PUT.format("5"), "Noted."]
REWARD = """\
import json, os


async def reward(tools, answer, **_):
    me = json.loads((await tools.call("whoami", {})).text)
    kept = (await tools.call("get", {"key": "k"})).text
    return {"score": float(kept == answer), "server_ppid": me["ppid"], "scorer_pid": os.getpid()}
"""


@pytest.fixture()
def episodes(verl_setup, tmp_path):
    """make(*overrides) -> (verl config, data files, marker): the calculator row, a per-episode notes
    server whose processes carry `marker`, and REWARD (which reads the session's note back)."""
    marker = uuid.uuid4().hex
    manifest = tmp_path / "notes.yaml"
    manifest.write_text(yaml.safe_dump({"mcpServers": {"notes": {
        "command": "python", "args": [NOTES], "scope": "episode", "env": {MARKER_VAR: marker}}}}))
    (tmp_path / "notes_reward.py").write_text(REWARD)

    def make(*overrides):
        cfg, files = verl_setup(f"env.tools={manifest}", f"reward.function={tmp_path / 'notes_reward.py'}:reward",
                                *overrides)
        return cfg, files, marker
    return make
