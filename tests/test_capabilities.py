"""The capability table (rl_factory/capabilities.py): every limit is refused, in its one form, by the real
entry of the backend that lacks it; what a backend supports passes; no refusal bypasses the table; the
docs' table lists every registered name.

Embedded: `rl_factory.trainer.train` on the composed config (the refusal comes before any server, model or
file). verl: the launcher's `train(..., print_only="job")`, the path of `bash main_grpo.sh trainer.backend=verl
--cfg job` (our plugin, the table, verl's composed config with raw verl keys, the pipeline checks; no Ray).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from rl_factory import capabilities, capabilities_page
from rl_factory.capabilities import LIMITS, Unsupported
from rl_factory.config import load_config, section

ROOT = Path(__file__).resolve().parents[1]
# key=value is not supported on the <backend> backend | any backend [with k=v [and k=v]]: why; instead
ONE_FORM = re.compile(r"^[\w. ]+=[^\n]+ is not supported on (the (embedded|verl) backend|any backend)"
                      r"( with [\w. ]+=[^\n]+?)?: [^\n]+; [^\n]+$")
TEST_ESTIMATOR = "test_token_level_only"

# (overrides, raw verl keys, a fragment of the message) per limit the verl backend has
VERL_CASES = [
    (["algorithm.advantage=gae", "algorithm.critic.type=value_head"], [],
     "algorithm.critic.type=value_head is not supported on the verl backend with algorithm.advantage=gae"),
    (["algorithm.advantage=gae", "algorithm.critic.vf_coef=1.0"], [], "algorithm.critic.vf_coef=1.0 is not supported"),
    (["algorithm.advantage=gae", "rollout.context=step"], [],
     "algorithm.advantage=gae is not supported on any backend"),
    (["rollout.context=step", "algorithm.advantage=rloo"], [], "with algorithm.advantage=rloo"),
    (["rollout.context=step"], ["trainer.use_v1=false"], "rollout.context=step is not supported on the verl backend "
                                                         "with trainer.use_v1=false"),
    (["algorithm.advantage=arena"], ["trainer.use_v1=false"], "algorithm.advantage=arena is not supported"),
    (["algorithm.advantage=arena", "algorithm.arena.anchor=greedy"], [], "algorithm.arena.anchor=greedy"),
    (["reward.process.tool_error_penalty=-0.1", "reward.process.outcome_mode=ignore"], [],
     "reward.process.outcome_mode=ignore is not supported on the verl backend with reward.process=on"),
    (["env.tools={mcpServers:{db:{command:python,args:['${sample.db_path}'],scope:episode}}}"], [],
     "put it in a file and set env.tools=path/to/tools.yaml"),
    (["rollout.filters=[zero_variance]", "algorithm.advantage=gae"], [], "rollout.filters=zero_variance"),
    (["rollout.augment=[per_turn]", "rollout.context=step"], [], "rollout.augment=per_turn is not supported on any"),
    (["rollout.augment=[per_turn]", "algorithm.advantage=gae"], [], "with algorithm.advantage=gae"),
    (["rollout.filters=[truncated]"], ["trainer.use_v1=false"], "rollout.filters=truncated is not supported"),
    (["rollout.augment=[per_turn]"], ["trainer.use_v1=false"], "rollout.augment=per_turn is not supported on the verl"),
    (["rollout.augment=[per_turn]", "rollout.filters=[truncated]"], [], "with rollout.augment=per_turn"),
    (["rollout.context=step", "rollout.filters=[zero_variance,truncated]"], [], "rollout.filters=truncated"),
    (["rollout.augment=[per_turn]", "algorithm.advantage=rloo"], [], "verl gives a session's outputs"),
    (["rollout.augment=[tool_prefix]"], [], "verl has no per-sample weight"),
    (["rollout.dynamic_sampling.min_groups=4"], [], "rollout.dynamic_sampling.min_groups=4 is not supported on the "
                                                    "verl backend: verl's batch always holds data.train_batch_size=16"),
    (["rollout.dynamic_sampling.min_groups=16"], ["trainer.v1.trainer_mode=colocate_async"], "refill on their own"),
    (["rollout.dynamic_sampling.min_groups=16"], ["trainer.v1.sampler.custom_sampler.path=pkg://mine",
                                                  "trainer.v1.sampler.custom_sampler.name=Mine"], "installs its own"),
    (["algorithm.old_log_probs=update"], ["trainer.use_v1=false"], "verl's legacy trainer replaces our policy loss"),
    (["algorithm.old_log_probs=rollout"], ["algorithm.rollout_correction.rollout_is=token"], "rollout correction"),
    (["algorithm.old_log_probs=update", "optim.ppo_epochs=2"], [], "with optimizer steps per batch=2"),
    (["algorithm.old_log_probs=update"], ["algorithm.rollout_correction.bypass_mode=false"], "bypass mode off"),
    (["algorithm.old_log_probs=recompute"], ["algorithm.rollout_correction.bypass_mode=true"], "bypass mode on"),
    (["algorithm.old_log_probs=update", "trainer.max_staleness=1"], [],
     "algorithm.old_log_probs=update is not supported on any backend with trainer.max_staleness=1"),
    (["trainer.max_staleness=1", "trainer.partial_rollouts=false"], [],
     "trainer.partial_rollouts=false is not supported on the verl backend with trainer.max_staleness=1"),
    (["trainer.max_staleness=1"], ["trainer.use_v1=false"], "only verl's V1 trainer has asynchronous modes"),
]
EMBEDDED_CASES = [
    ([f"algorithm.advantage={TEST_ESTIMATOR}"], f"algorithm.advantage={TEST_ESTIMATOR} is not supported on the "
                                                "embedded backend with estimator inputs=response_mask"),
    (["algorithm.advantage=gae", "rollout.context=step"], "use rollout.context=append"),
    (["algorithm.advantage=gae", "algorithm.critic.type=model"], "algorithm.critic.type=model is not supported on "
                                                                 "the embedded backend"),
    (["rollout.filters=[zero_variance]", "algorithm.advantage=gae"], "gae's advantages are not zero"),
    (["rollout.augment=[per_turn]", "rollout.context=step"], "views are cut from one token stream"),
    (["rollout.augment=[per_turn]", "algorithm.advantage=gae"], "use an outcome estimator"),
    (["algorithm.old_log_probs=recompute"], "algorithm.old_log_probs=recompute is not supported on the embedded"),
    (["algorithm.old_log_probs=update", "optim.mini_batches=2"], "with optimizer steps per batch=2"),
    (["algorithm.correction.type=tis", "optim.ppo_epochs=2"],
     "algorithm.correction.type=tis is not supported on the embedded backend with optimizer steps per batch=2"),
    (["algorithm.correction.type=mis", "algorithm.old_log_probs=rollout"], "use algorithm.old_log_probs=auto"),
    (["algorithm.old_log_probs=update", "trainer.max_staleness=2"], "with trainer.max_staleness=2 and "
                                                                   "algorithm.correction.type=none"),
]


@pytest.fixture
def token_level_estimator():
    """A registered estimator that needs a per-token input (removed again: the registries are global)."""
    from rl_factory.algorithms.advantages import ADVANTAGES, REQUIRED_INPUTS, register_advantage

    register_advantage(TEST_ESTIMATOR, requires=("response_mask",))(lambda inputs: inputs.rewards)
    yield
    del ADVANTAGES[TEST_ESTIMATOR], REQUIRED_INPUTS[TEST_ESTIMATOR]


def embedded_refusal(tmp_path, overrides: list[str]) -> Unsupported | None:
    from rl_factory.trainer import train

    out = tmp_path / "run"
    try:
        train(load_config("grpo", [f"trainer.output_dir={out}", *overrides]))
    except Unsupported as exc:
        assert not out.exists()  # refused before anything was written
        return exc
    raise AssertionError(f"{overrides}: trained instead of refusing")


def verl_refusal(tmp_path, overrides: list[str], raw: list[str]) -> Unsupported | None:
    from rl_factory.backends.verl.launcher import train

    try:
        train(load_config("grpo", ["trainer.backend=verl", f"trainer.output_dir={tmp_path / 'run'}", *overrides]),
              raw, print_only="job")
    except Unsupported as exc:
        return exc
    return None


def test_every_embedded_limit_is_refused_in_one_form(tmp_path, token_level_estimator):
    hit = set()
    for overrides, fragment in EMBEDDED_CASES:
        exc = embedded_refusal(tmp_path, overrides)
        assert fragment in str(exc) and ONE_FORM.match(str(exc)), str(exc)
        assert "embedded" in exc.limit.backends
        hit.add(exc.limit)
    missing = [lim.feature.text() for lim in LIMITS if "embedded" in lim.backends and lim not in hit]
    assert missing == [], f"no case refuses {missing}"


@pytest.mark.slow  # composes verl's config once per limit (~10 s)
def test_every_verl_limit_is_refused_in_one_form(tmp_path, capsys):
    pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")
    hit = set()
    for overrides, raw, fragment in VERL_CASES:
        exc = verl_refusal(tmp_path, overrides, raw)
        assert exc is not None, f"{overrides} {raw}: verl accepted it"
        assert fragment in str(exc) and ONE_FORM.match(str(exc)), str(exc)
        assert "verl" in exc.limit.backends
        hit.add(exc.limit)
    missing = [lim.feature.text() for lim in LIMITS if "verl" in lim.backends and lim not in hit]
    assert missing == [], f"no case refuses {missing}"
    capsys.readouterr()


@pytest.mark.parametrize("overrides", [
    [], ["algorithm.advantage=gae"], ["algorithm.advantage=gae", "algorithm.critic.type=value_head"],
    ["algorithm.advantage=arena", "algorithm.arena.anchor=greedy"],
    ["rollout.context=step", "algorithm.advantage=rloo"],
    ["reward.process.tool_error_penalty=-0.1", "reward.process.outcome_mode=ignore"],
    ["rollout.augment=[tool_prefix]", "rollout.filters=[truncated]", "algorithm.advantage=rloo"],
    ["algorithm.old_log_probs=update"], ["model.lora_rank=4"],
])
def test_what_the_embedded_backend_supports_passes_its_checks(overrides):
    from rl_factory.components import RewardConfig, SamplingConfig
    from rl_factory.trainer import check_supported
    from rl_factory.update import AlgorithmConfig, OptimConfig

    cfg = load_config("grpo", overrides)
    check_supported(section(cfg, "algorithm", AlgorithmConfig), section(cfg, "rollout", SamplingConfig),
                    section(cfg, "optim", OptimConfig), section(cfg, "reward", RewardConfig))


@pytest.mark.parametrize("overrides, raw", [
    ([], []), (["algorithm.advantage=gae"], []), (["algorithm.advantage=gae", "algorithm.critic.type=model"], []),
    (["algorithm.advantage=arena", "algorithm.arena.anchor=reference"], []), (["rollout.context=step"], []),
    (["rollout.filters=[truncated,zero_variance]", "rollout.dynamic_sampling.min_groups=16"], []),
    (["rollout.augment=[{function: tool_prefix, kwargs: {normalize: false}}]", "rollout.filters=[zero_variance]"], []),
    (["reward.process.tool_error_penalty=-0.1"], []), (["model.lora_rank=4"], []),
    (["algorithm.old_log_probs=rollout"], ["algorithm.rollout_correction.bypass_mode=true"]),
    (["algorithm.critic.vf_coef=1.0"], []),  # grpo trains no critic on either backend
])
def test_what_the_verl_backend_supports_composes(tmp_path, overrides, raw, capsys):
    pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")
    assert verl_refusal(tmp_path, overrides, raw) is None
    assert "rl_factory:" in capsys.readouterr().out  # the composed config was printed


def test_the_critic_names_one_thing_per_backend():
    """gae's critic is a value head on the embedded backend and verl's critic model on verl: `auto` is each
    backend's own, the other's name is refused, and verl's critic has no value-loss weight."""
    from rl_factory.critic import CRITIC_TYPES, CriticConfig

    assert CriticConfig().type == "auto" and set(CRITIC_TYPES) == {"auto", "value_head", "model"}
    vf = next(lim for lim in LIMITS if lim.feature.key == "algorithm.critic.vf_coef")
    assert vf.feature.values == (CriticConfig().vf_coef,)  # the default is what verl leaves alone
    gae = {"algorithm.advantage": "gae"}
    for backend, own, other in (("embedded", "value_head", "model"), ("verl", "model", "value_head")):
        for name in ("auto", own):
            capabilities.check(backend, {**gae, "algorithm.critic.type": name})
        with pytest.raises(Unsupported, match=f"critic.type={other} is not supported on the {backend} backend"):
            capabilities.check(backend, {**gae, "algorithm.critic.type": other})
    with pytest.raises(Unsupported, match="use algorithm.critic.type=model"):
        capabilities.check("verl", {**gae, "algorithm.critic.type": "value_head"})
    with pytest.raises(Unsupported, match="algorithm.critic.vf_coef=0.25 is not supported on the verl backend"):
        capabilities.check("verl", {**gae, "algorithm.critic.vf_coef": 0.25})
    capabilities.check("embedded", {**gae, "algorithm.critic.vf_coef": 0.25})


def test_the_docs_table_lists_every_registered_name_with_each_backends_support():
    from rewards.judge import JUDGES
    from rl_factory.algorithms.advantages import ADVANTAGES
    from rl_factory.algorithms.arena import TOPOLOGIES
    from rl_factory.group_arena import ANCHORS
    from rl_factory.algorithms.losses import POLICY_LOSSES
    from rl_factory.context import CONTEXT_POLICIES, CONTEXT_PROCESSORS
    from rl_factory.critic import CRITIC_TYPES
    from rl_factory.pipeline import AUGMENTERS, FILTERS

    page = capabilities_page.render_markdown()
    rows = {tuple(c.strip(" `") for c in line.strip("|").split("|")[1:5])
            for line in page.splitlines() if line.startswith("| ") and line.count("|") == 6}
    for key, names in [("algorithm.advantage", ADVANTAGES), ("algorithm.policy_loss", POLICY_LOSSES),
                       ("algorithm.critic.type", CRITIC_TYPES), ("rollout.context", CONTEXT_POLICIES),
                       ("rollout.context_processor", CONTEXT_PROCESSORS), ("rollout.filters", FILTERS),
                       ("rollout.augment", AUGMENTERS), ("algorithm.arena.topology", TOPOLOGIES),
                       ("algorithm.arena.anchor", ANCHORS), ("algorithm.arena.judge.type", JUDGES),
                       ("algorithm.old_log_probs", ("auto", "update", "rollout", "recompute"))]:
        listed = {name for k, name, _, _ in rows if k == key}
        assert listed == set(names), key
    support = {(k, name): (emb, verl) for k, name, emb, verl in rows}
    assert support["algorithm.old_log_probs", "recompute"][0].startswith("no (")
    assert support["algorithm.critic.type", "model"][0].startswith("yes, see")  # refused with gae only
    assert support["algorithm.advantage", "grpo"] == ("yes", "yes")
    assert support["rollout.context", "step"][1].startswith("yes, see")
    assert support["env.tools", capabilities.INLINE_SAMPLE_REFS] == ("yes", support["env.tools",
                                                                     capabilities.INLINE_SAMPLE_REFS][1])
    assert support["env.tools", capabilities.INLINE_SAMPLE_REFS][1].startswith("no (")
    assert page.count("\n| ") - len(rows) - 1 == len(LIMITS)  # the limits table: one row per limit (+ header)


# Refusals for the machine or the installation, not for what the config asks: not capabilities. And
# turn_spans' guard of its input (a trajectory that is not one token stream), reached only by library calls
# that skip the config checks.
MACHINE_CHECKS = {"check_plugin", "check_gpus", "check_rollout_engine", "check_trl", "train", "_cfg_flag", "turn_spans"}
# How a capability refusal used to read, outside the table.
AD_HOC = re.compile(r"not supported|not available|on verl|verl backend|embedded backend|verl-backend|only drives|"
                    r"works with .* only|needs? (trainer\.use_v1|rollout\.context|verl's V1|one optimizer step)|"
                    r"contradicts|refill on their own|per-sample weight", re.IGNORECASE)


def ad_hoc_refusals(root: Path) -> list[str]:
    """`raise <Error>(...)` lines under `root`/rl_factory whose message reads like a capability refusal."""
    found = []
    for path in sorted((root / "rl_factory").rglob("*.py")):
        if path.name == "capabilities.py" and path.parent.name == "rl_factory":
            continue
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name in MACHINE_CHECKS:
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                    text = " ".join(s.value for s in ast.walk(node.exc) if isinstance(s, ast.Constant)
                                    and isinstance(s.value, str))
                    if AD_HOC.search(text):
                        found.append(f"{path.relative_to(root)}:{node.lineno} {fn.name}: {text[:80]}")
    return found


def test_no_refusal_bypasses_the_table():
    assert ad_hoc_refusals(ROOT) == []


def test_the_check_for_ad_hoc_refusals_finds_them():
    """The scan is not vacuous: a refusal written outside the table, as they all used to be, is found."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        package = Path(tmp) / "rl_factory"
        shutil.copytree(ROOT / "rl_factory", package, ignore=shutil.ignore_patterns("__pycache__"))
        (package / "extra.py").write_text(
            "def check(cfg):\n    if cfg.context == 'step':\n"
            "        raise ValueError('rollout.context=step on verl works with algorithm.advantage=grpo only')\n")
        assert [line.split()[0] for line in ad_hoc_refusals(Path(tmp))] == ["rl_factory/extra.py:3"]


def test_a_verl_worker_refuses_through_the_table_too(tmp_path):
    """What only a worker sees (a user augmenter's view weights) or a config handed to it by hand (a greedy
    anchor) is refused with the table's line as well."""
    pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")
    import asyncio

    from rl_factory.backends.verl.group import ArenaGroups
    from rl_factory.backends.verl.pipeline import augmented
    from rl_factory.config import parse
    from rl_factory.pipeline import build_augmenters
    from tests.test_critic import two_turn_traj

    views = tmp_path / "views.py"
    views.write_text("def halves(trajectory, spans, **_):\n    return [(0, len(trajectory.token_ids), 0.5)]\n")
    augmenters = build_augmenters([f"{views}:halves"])  # as the worker builds them from rollout.augment
    with pytest.raises(ValueError, match=r"^sample 0: view weight=0.5 is not supported on the verl backend with "
                                         r"rollout.augment=halves: verl has no per-sample weight"):
        asyncio.run(augmented(two_turn_traj(), augmenters, validate=False))
    ours = load_config("grpo", ["trainer.backend=verl", "algorithm.advantage=arena", "algorithm.arena.anchor=greedy"])
    with pytest.raises(Unsupported, match="algorithm.arena.anchor=greedy is not supported on the verl backend"):
        ArenaGroups.from_config(parse(ours), None, tmp_path / "arena")
