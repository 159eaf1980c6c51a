"""Config values are checked once, where the config is composed: type and range, one line naming the key."""
import pytest
from omegaconf import OmegaConf

from rl_factory.cli import main
from rl_factory.config import CONFIG_DIR, VALUE_RULES, ConfigError, load_config


@pytest.mark.parametrize("override, message", [
    ("trainer.total_steps=-3", "trainer.total_steps=-3: must be an integer >= 1"),
    ("rollout.n=0", "rollout.n=0: must be an integer >= 1"),
    ("rollout.n=2.5", "rollout.n=2.5: must be an integer >= 1"),
    ("optim.lr=0", "optim.lr=0: must be a number > 0"),
    ("optim.lr=abc", "optim.lr='abc': must be a number > 0"),
    ("rollout.temperature=-0.5", "rollout.temperature=-0.5: must be a number >= 0"),
    ("rollout.top_p=1.5", "rollout.top_p=1.5: must be a number in (0, 1]"),
    ("env.max_turns=0", "env.max_turns=0: must be an integer >= 1"),
    ("data.val_limit=0", "data.val_limit=0: must be null or an integer >= 1"),
    ("trainer.save_every=true", "trainer.save_every=True: must be an integer >= 0"),
    ("reward.on_error=skip", "reward.on_error='skip': must be one of raise, zero"),
])
def test_a_value_out_of_range_is_one_line_naming_key_value_and_range(override, message):
    with pytest.raises(ConfigError) as err:
        load_config("grpo", [override])
    assert str(err.value) == message


def test_eval_keys_are_checked_too():
    with pytest.raises(ConfigError, match=r"^eval.n=0: must be an integer >= 1$"):
        load_config("eval", ["eval.n=0"])
    with pytest.raises(ConfigError, match=r"^trainer.total_steps=0: "):  # the training slices it reuses
        load_config("eval", ["trainer.total_steps=0"])


def test_the_defaults_pass_and_null_is_allowed_where_it_means_off():
    load_config("grpo", ["data.val_limit=null", "optim.micro_batch_tokens=null", "reward.timeout_s=null"])
    load_config("eval", [])


def test_every_rule_names_a_key_of_the_configs():
    keys = set()
    for name in ("grpo", "eval"):
        flat = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / f"{name}.yaml"))

        def walk(node, prefix=""):
            for k, v in node.items():
                keys.add(prefix + k)
                if isinstance(v, dict):
                    walk(v, f"{prefix}{k}.")
        walk(flat)
    assert sorted(set(VALUE_RULES) - keys) == []


def test_a_refused_value_makes_no_run_directory(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", "trainer.total_steps=-3", f"trainer.output_dir={run_dir}"]) == 2
    assert capsys.readouterr().err == "error: trainer.total_steps=-3: must be an integer >= 1\n"
    assert not run_dir.exists()


def test_a_mapping_given_to_an_open_mapping_says_how_to_set_it():
    with pytest.raises(ConfigError, match=r"extra_body is a free-form mapping: set all of it with "
                                          r"\+\+algorithm\.arena\.judge\.extra_body="):
        load_config("grpo", ["algorithm.arena.judge.extra_body={top_k: 1}"])
    cfg = load_config("grpo", ["++algorithm.arena.judge.extra_body={top_k: 1, response_format: {type: json_object}}"])
    assert cfg.algorithm.arena.judge.extra_body.response_format.type == "json_object"
