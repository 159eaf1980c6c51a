"""The doctor's checks of the model side: the chat template renders the tools, a builtin model's build,
prompts fit their budget, the parser reads back what the template writes, and the trained token stream
equals the template's rendering. They run after rl_factory.doctor.checks' and only read the tokenizer.
"""
from __future__ import annotations

from rl_factory.doctor import template
from rl_factory.doctor.checks import PROMPT_ROWS
from rl_factory.doctor.registry import CheckFailed, check, one_line


@check("chat template", needs=("model", "cfg", "tools"), gives=("fmt",))
async def chat_template(doc) -> str:
    from rl_factory.chat import ChatFormat

    tokenizer, where = _tokenizer(doc)
    try:
        doc.state["fmt"] = ChatFormat(tokenizer, doc.state["tools"])
    except ValueError as exc:
        raise CheckFailed(str(exc), "use a model (or tokenizer) whose chat template ends turns with its eos token")
    return f"{where}: eos {tokenizer.eos_token!r}"


@check("model build", needs=("model", "cfg"))
async def model_build(doc) -> str | None:
    """A builtin model: built already (where), or what the first run's build will cost on this machine."""
    model = doc.state["model"]
    if not model.path.startswith("builtin:"):
        return None
    from rl_factory.policy import BUILTIN_PLANS

    plan_of = BUILTIN_PLANS.get(model.path.split(":", 1)[1])
    if plan_of is None:
        return None
    plan = plan_of(doc.state.get("tools") or [], int(doc.state["cfg"].seed))
    if plan.built:
        return f"{model.path} is built ({plan.path}); no build before the first step"
    import os

    steps, step_s = plan.estimate()
    load = f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs" if hasattr(os, "getloadavg") else ""
    return (f"{model.path} is not built yet: the first run builds it once into {plan.path} (at most {steps} "
            f"warm-start steps at ~{step_s:.2f}s here: at most {steps * step_s / 60:.1f} min{load}), "
            f"then {plan.reused_by} reuses it")


@check("tool schemas fit", needs=("fmt", "all_rows", "rollout"))
async def tool_schemas(doc) -> str:
    prompts = [row["messages"] for row in doc.state["all_rows"][:PROMPT_ROWS]]
    opening = doc.state.get("env_opening")
    if opening is not None:  # row 0's prompt as the rollout builds it: the environment's reset messages after it
        prompts[0] = [*prompts[0], *opening]
    budget, key = _prompt_budget(doc)
    detail = _finding(template.check_tools_render(doc.state["fmt"], doc.state["tools"], prompts, budget, key))
    if opening:
        detail += f"; row 0 with the {len(opening)} message(s) env.environment's reset added"
    return detail


def _prompt_budget(doc) -> tuple[int, str]:
    """verl caps prompts at its data.max_prompt_length; the embedded trainer leaves a turn's room in the total."""
    if doc.mode == "train" and doc.state["cfg"].trainer.backend == "verl":
        from omegaconf import OmegaConf

        from rl_factory.config import CONFIG_DIR

        given = [o.split("=", 1)[1] for o in doc.overrides if o.lstrip("+").startswith("data.max_prompt_length=")]
        default = OmegaConf.load(CONFIG_DIR / "verl.yaml").data.max_prompt_length
        return int(given[-1]) if given else int(default), "data.max_prompt_length"
    r = doc.state["rollout"]
    return r.max_total_tokens - r.max_response_tokens, "rollout.max_total_tokens - rollout.max_response_tokens"


@check("parser round-trip", needs=("fmt", "env_cfg"))
async def parser_round_trip(doc) -> str:
    if not doc.state["tools"]:
        return "no tools: nothing to parse"
    return _finding(template.check_parser_round_trip(doc.state["fmt"], doc.state["tools"], doc.state["env_cfg"].parser))


@check("token stream", needs=("fmt", "rows", "rollout"))
async def token_stream(doc) -> str:
    r = doc.state["rollout"]
    opening = doc.state.get("env_opening") or []
    messages = template.conversation(doc.state["tools"], [*doc.state["rows"][0]["messages"], *opening],
                                     environment=bool(doc.state["env_cfg"].environment))
    return _finding(template.check_token_stream(doc.state["fmt"], messages, r.context,
                                                processor=r.context_processor, keep_turns=r.context_keep_turns))


def _tokenizer(doc):
    model, seed = doc.state["model"], int(doc.state["cfg"].seed)
    if model.path.startswith("builtin:"):
        from rl_factory.policy import BUILTIN_MODELS, BUILTIN_TOKENIZERS

        name = model.path.split(":", 1)[1]
        BUILTIN_MODELS.lookup(name)
        return BUILTIN_TOKENIZERS.lookup(name)(doc.state["tools"], seed), model.path
    from transformers import AutoTokenizer

    from rl_factory.hub import check_hub_model

    try:
        check_hub_model(model.path)
        return AutoTokenizer.from_pretrained(model.path), model.path
    except (OSError, ValueError) as exc:
        raise CheckFailed(one_line(exc), "point model.path at a model directory or a reachable hub id")


def _finding(finding: template.Finding) -> str:
    if not finding.ok:
        raise CheckFailed(finding.detail, finding.fix)
    return finding.detail
