"""`main_eval.sh eval.engine=openai`: a served model generates, our tools and reward score it."""
import json
import re

import pytest

from rl_factory.cli import main

pytestmark = pytest.mark.slow  # an eval run (main_eval.sh's code, in this process) on the built model


def test_eval_against_a_served_model(tiny_model_dir, tokenizer, tmp_path, threaded_server, completion):
    server = threaded_server()

    def answer(body: dict) -> dict:  # a "model" that answers every question right, without tools
        prompt = tokenizer.decode(body["prompt"])
        a, op, b = re.findall(r"What is (\d+) ([*+]) (\d+)\?", prompt)[-1]
        value = int(a) * int(b) if op == "*" else int(a) + int(b)
        ids = tokenizer.encode(f"The answer is {value}.", add_special_tokens=False) + [tokenizer.eos_token_id]
        return completion(ids, [-0.1] * len(ids))

    server.replies = [answer] * 100
    code = main(["eval", f"model.path={tiny_model_dir}", "eval.engine=openai",
                 f"eval.base_url={server.base_url}", "eval.limit=5", f"eval.output_dir={tmp_path}"])
    assert code == 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["rows"] == 5 and result["metrics"]["accuracy"] == 1.0
    assert len(server.requests) == 5 and all(isinstance(r["prompt"][0], int) for r in server.requests)
