"""The ceilings gpu_step.py sets a verl step's phases beside, each measured in a fresh process on the same GPU.

    python benchmarks/ceilings.py vllm|vllm_configured|train --spec JSON --result PATH   # (gpu_step.py runs these)

`vllm`: vLLM alone (offline `LLM.generate`) on the step's requests; `vllm_configured`: the same with the engine
arguments the rollout's server ran with; `train`: plain PyTorch forward(+backward) over the step's sequences, packed
by the actor's token budget (gpu_step.py's docstring says what each matches).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RUNS = 5  # timed runs of each vLLM ceiling, after a warm-up run
BUSY_TAG = "ceiling-busy-core"  # the argument that names a spinner beside a ceiling (`busy_cores`)


def ceiling_vllm(spec: dict) -> dict:
    """vLLM alone on the step's requests: the same count, grouped n to a prompt, each generating exactly
    as many tokens as one trajectory of the step did (ignore_eos), all submitted at once.

    Each request keeps its own trajectory's length, not the mean: the longest trajectory is the critical
    path of a rollout, and a ceiling at the mean length would hide it. `spec["frontend"]`: `llm` (vLLM's offline
    `LLM.generate`, the default) or `async` (vLLM's `AsyncLLM`, the engine client verl's server runs, each request
    its own `generate` stream as verl's server reads it): between the two lies what the server's frontend costs.
    """
    import random

    gen_lens = spec["gen_lens"]
    engine = {"gpu_memory_utilization": spec["gpu_memory_utilization"], "seed": 0,
              "max_model_len": spec["prompt_len"] + max(gen_lens) + 16, "enable_prefix_caching": True,
              **spec.get("engine_args", {})}
    rng = random.Random(0)
    prompts = [[rng.randrange(10, spec["vocab"] - 1) for _ in range(spec["prompt_len"])]
               for _ in range(-(-len(gen_lens) // spec["n"]))]
    requests = [{"prompt_token_ids": prompts[k // spec["n"]]} for k in range(len(gen_lens))]
    frontend = spec.get("frontend", "llm")
    if frontend not in FRONTENDS:
        raise ValueError(f"spec frontend {frontend!r}: one of {sorted(FRONTENDS)}")
    return FRONTENDS[frontend](spec, engine, requests, gen_lens)


def _params(gen_lens: list[int], logprobs: int | None, detokenize: bool) -> list:
    from vllm import SamplingParams

    return [SamplingParams(temperature=1.0, max_tokens=n, min_tokens=n, ignore_eos=True, logprobs=logprobs,
                           detokenize=detokenize) for n in gen_lens]


def _profiled(out: Path | None):
    """py-spy on this process's vLLM engine core (VLLM::EngineCore) while the block runs, where `out` is given: the
    engine's loop offline, beside the same loop behind verl's server (gpu_suite.sh profile)."""
    from benchmarks.pyspy_watch import children_titled, recording

    return recording(out, children_titled("EngineCore") if out else [])


def _timed(generate, gen_lens: list[int], logprobs: int | None, detokenize: bool = False,
           profile: Path | None = None) -> dict:
    """RUNS timed passes of `generate(params)` (it returns each request's generated token ids) after a warm-up;
    `profile`: a directory for py-spy's stacks of the engine core over the timed passes."""
    from benchmarks.iterations import PASS_MARK

    params = _params(gen_lens, logprobs, detokenize)
    # Warm up on the whole set: a part of it left Triton's sampling kernels to compile inside the timed run at
    # the batch sizes it had not seen (the first timed run was 0.6 s slower, H200, 2026-12-01).
    generate(params)
    times = []
    # each timed pass marked on stdout, where vLLM's engine core logs too: its collections (VLLM_GC_DEBUG=1) then
    # fall inside or outside the passes (benchmarks/iterations.py, `in_timed_passes`)
    kind_of_pass = ("with_logprobs" if logprobs is not None else "without_logprobs") + ("_detokenize" * detokenize)
    with _profiled(profile) as profiles:
        for _ in range(RUNS):
            print(f"{PASS_MARK} begins: {kind_of_pass}", flush=True)
            t0 = time.perf_counter()
            outs = generate(params)
            times.append(time.perf_counter() - t0)
            print(f"{PASS_MARK} ends: {kind_of_pass}", flush=True)
    # The median, as the step's phases (medians of the steady steps) and the train ceiling are: identical runs
    # spread by up to a third (1.35-1.80 s, H100, 796e663c020c), and the best of them beside a median step
    # would set a lucky run against a typical one. The best is reported beside it.
    tokens, seconds = sum(len(ids) for ids in outs), statistics.median(times)
    return {"seconds": seconds, "all_seconds": [round(t, 3) for t in times], "tokens": tokens,
            "tokens_per_s": tokens / seconds, "best_seconds": min(times), "best_tokens_per_s": tokens / min(times),
            **({"pyspy": profiles} if profile else {})}


def _report(spec: dict, requests: list, run) -> dict:
    """The runs a vLLM ceiling reports, `run(logprobs, detokenize)` timing one kind of pass.

    The rollout asks for each sampled token's log-prob (verl's calculate_log_probs, for the rollout-vs-actor
    check) and no text (our agent loop decodes the ids itself); the ceiling does the same work, and reports
    beside it what the log-probs cost and what vLLM's default detokenization would add."""
    same = run(0, False)
    if spec.get("engine_args"):  # vLLM as the rollout configures it: the same requests, only the rollout's own work
        # (`without_logprobs`: also without them, where this ceiling may set the serial limit; ceiling_variants.py
        # compares the rollout's work alone)
        return {**same, "engine_args": spec["engine_args"], "requests": len(requests),
                **({"frontend": spec["frontend"]} if spec.get("frontend") else {}),
                **({"without_logprobs": run(None, False)} if spec.get("without_logprobs") else {})}
    return {**same, "without_logprobs": run(None, False), "with_detokenize": run(0, True),
            "requests": len(requests), "max_gen_len": max(spec["gen_lens"])}


def _runner(spec: dict, generate, gen_lens: list[int]):
    """`run(logprobs, detokenize)` for _report: one timed kind of pass. Where the spec names a directory (`pyspy`),
    py-spy records the engine core over the passes without log-probs, the work of the job's measured steps."""
    def run(logprobs: int | None, detokenize: bool) -> dict:
        profile = Path(spec["pyspy"]) if spec.get("pyspy") and logprobs is None else None
        return _timed(generate, gen_lens, logprobs, detokenize, profile)
    return run


def _offline(spec: dict, engine: dict, requests: list, gen_lens: list[int]) -> dict:
    from vllm import LLM

    llm = LLM(model=spec["model"], **engine)

    def generate(params: list) -> list[list[int]]:
        return [list(o.outputs[0].token_ids) for o in llm.generate(requests, params, use_tqdm=False)]

    return _report(spec, requests, _runner(spec, generate, gen_lens))


def _async(spec: dict, engine: dict, requests: list, gen_lens: list[int]) -> dict:
    """The same passes through vLLM's AsyncLLM, built from engine arguments as verl's server builds it: its output
    handler runs on one event loop, and the timed passes, synchronous, submit each pass's requests to that loop
    from a worker thread, each request read to its final output as verl's server reads it."""
    import asyncio
    import uuid

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    async def main() -> dict:
        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=spec["model"], **engine))
        loop = asyncio.get_running_loop()

        async def one(request: dict, params) -> list[int]:
            final = None
            async for out in llm.generate(request, params, request_id=uuid.uuid4().hex):
                final = out
            return list(final.outputs[0].token_ids)

        async def every(params: list) -> list[list[int]]:
            return await asyncio.gather(*(one(r, p) for r, p in zip(requests, params)))

        def generate(params: list) -> list[list[int]]:
            return asyncio.run_coroutine_threadsafe(every(params), loop).result()

        try:
            return await asyncio.to_thread(_report, spec, requests, _runner(spec, generate, gen_lens))
        finally:
            llm.shutdown()

    return asyncio.run(main())


FRONTENDS = {"llm": _offline, "async": _async}


# verl's server engine arguments (vllm_async_server.py, launch_server) that a rollout config sets, by its key under
# actor_rollout_ref.rollout; load_format stays vLLM's (verl's `dummy` waits for a weight sync that never comes here).
# max_model_len as the server had it: None (verl's default) is the model's own context, as on the server.
SERVER_ARGS = ("dtype", "max_model_len", "max_num_seqs", "enable_chunked_prefill", "max_num_batched_tokens",
               "enable_prefix_caching", "enable_sleep_mode", "logprobs_mode", "enforce_eager", "scheduling_policy",
               "disable_log_stats")  # AsyncLLM logs stats unless told not to (LLM does not): verl's server tells it


def configured_engine_args(rollout: dict) -> dict:
    """vLLM's engine arguments as verl's server builds them from a composed config's `actor_rollout_ref.rollout`
    (verl's `RolloutConfig`): its own keys, the compilation config with the capture sizes, then
    `engine_kwargs.vllm` over them (our tuning's executor, KV cache and stream interval), without verl's worker
    extension (weight sync, not generation)."""
    from verl.workers.config import RolloutConfig

    fields = RolloutConfig.__dataclass_fields__  # a key the composed YAML leaves out has verl's dataclass default
    args = {key: rollout[key] if rollout.get(key) is not None else fields[key].default for key in SERVER_ARGS}
    kwargs = {k: v for k, v in dict((rollout.get("engine_kwargs") or {}).get("vllm") or {}).items()
              if k != "worker_extension_cls" and v is not None}
    compilation = kwargs.pop("compilation_config", None) or {}
    compilation = json.loads(compilation) if isinstance(compilation, str) else dict(compilation)
    compilation.setdefault("cudagraph_mode", "FULL_AND_PIECEWISE")  # verl's default
    if rollout.get("cudagraph_capture_sizes"):
        compilation["cudagraph_capture_sizes"] = list(rollout["cudagraph_capture_sizes"])
    return {**args, "compilation_config": compilation, **kwargs}


def micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Sequences packed in order into micro-batches of at most `budget` tokens (verl's dynamic batch size; a longer
    sequence rides alone)."""
    batches, current = [], []
    for n in lengths:
        if current and sum(current) + n > budget:
            batches.append(current)
            current = []
        current.append(n)
    return batches + [current]


def ceiling_train(spec: dict) -> dict:
    """Plain PyTorch forward(+backward) over the step's sequences, packed by the actor's token budget."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    import rl_factory.models.varlen_attention  # noqa: F401 - registers rl_factory_varlen
    from rl_factory.backends.verl.tuning import attention_implementation

    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.bfloat16,
                                                 attn_implementation=attention_implementation()).cuda()
    if spec.get("checkpointing"):  # as the actor does where its activations would not fit (the 4B on one GPU)
        model.gradient_checkpointing_enable()
    lengths = spec["lengths"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    packed = []
    for batch in micro_batches(lengths, spec["token_budget"]):
        total = sum(batch)
        ids = torch.randint(0, model.config.vocab_size, (1, total), device="cuda", generator=gen)
        pos = torch.cat([torch.arange(n, device="cuda") for n in batch])[None]
        packed.append((ids, pos))

    def run(backward: bool) -> None:
        for ids, pos in packed:
            with torch.set_grad_enabled(backward):
                logits = model(input_ids=ids, position_ids=pos).logits
                loss = F.cross_entropy(logits[0, :-1].float(), ids[0, 1:])
            if backward:
                loss.backward()
        torch.cuda.synchronize()

    out, tokens = {}, sum(lengths)
    for name, backward in (("forward_backward", True), ("forward", False)):
        model.train(backward)
        run(backward)  # warm up
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            run(backward)
            times.append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
        seconds = statistics.median(times)
        out[name] = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}
    out["attn_implementation"] = attention_implementation()
    out["checkpointing"] = bool(spec.get("checkpointing"))
    return out


def measure_ceiling(name: str, spec: dict, out_dir: Path) -> dict:
    """Runs one ceiling in a fresh process; its spec is kept beside its result (ceiling_variants.py reruns it)."""
    path = out_dir / f"ceiling-{name}.json"
    (out_dir / f"ceiling-{name}.spec.json").write_text(json.dumps(spec))
    # `busy_cores`: that many processes spinning on the host throughout, as a job's other processes keep cores
    # busy beside its rollout: whether vLLM's engine loop, one busy core of its own, slows when the host is not idle
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass", BUSY_TAG])
            for _ in range(int(spec.get("busy_cores") or 0))]
    try:
        proc = subprocess.run([sys.executable, __file__, name, "--spec", json.dumps(spec), "--result", str(path)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "VLLM_USE_FLASHINFER_SAMPLER": "0",
                                   **{k: str(v) for k, v in (spec.get("env") or {}).items()}})
    finally:
        for spinner in busy:
            spinner.kill()
            spinner.wait()
    # vLLM's own log, kept: what its engine logged per iteration where the rollout's engine arguments ask for it
    # (enable_logging_iteration_details), beside the job's log of the same lines from the rollout's server. One
    # stream, in the order written: the engine's lines fall between the passes' marks wherever vLLM logs to.
    log = proc.stdout
    (out_dir / f"ceiling-{name}.log").write_text(log)
    if proc.returncode != 0 or not path.exists():
        return {"error": log[-1500:]}
    result = json.loads(path.read_text())
    from benchmarks.iterations import gc_pauses

    # vLLM's logged engine steps, and its collections where the caller set VLLM_GC_DEBUG=1
    logged = {"engine_steps": engine_steps(log, result), "engine_gc": gc_pauses(log)}
    return {**result, **{key: value for key, value in logged.items() if value}}


def engine_steps(log: str, result: dict) -> dict | None:
    """vLLM's logged iterations over this ceiling's runs (benchmarks/iterations.py), where it logged them: each run
    is a warm-up then RUNS timed passes over the requests."""
    from benchmarks import iterations

    steps = iterations.parse(log)
    if not steps:
        return None
    runs = 1 + sum(key in result for key in ("without_logprobs", "with_detokenize"))
    return iterations.summary(steps, rollouts=runs * (RUNS + 1))


# issue-level targets for one GPU at the 0.6B shape: each phase against its ceiling measured in the same run
TARGETS = {"step_vs_serial_limit": ("max", 1.6), "generate_vs_vllm": ("min", 0.85),
           "update_vs_forward_backward": ("min", 0.7), "weight_sync_s": ("max", 0.15)}


def fastest_vllm(vllm: dict, configured: dict | None) -> tuple[str | None, dict]:
    """vLLM alone as the phases' ceiling: the faster (median tokens/s with log-probs) of its defaults (`vllm`) and
    the rollout's engine arguments (`configured`). Either can be the faster: on an H100, vLLM's defaults ran the
    0.6B step's requests in 2.21 s (runs of 1.37-3.37 s) and the rollout's arguments in 1.27 s (1.20-1.32 s),
    at 58270373a9cd; a ceiling that is not vLLM at its fastest would call a slow rollout fast."""
    measured = {name: c for name, c in (("defaults", vllm), ("configured", configured or {})) if c.get("tokens_per_s")}
    if not measured:
        return None, {}
    name = max(measured, key=lambda k: measured[k]["tokens_per_s"])
    return name, measured[name]


def like_rollout(ceiling: dict | None, logprobs: bool) -> dict:
    """The run of a vLLM ceiling that did the rollout's work: with log-probs, or its `without_logprobs` run."""
    ceiling = ceiling or {}
    return ceiling if logprobs else ceiling.get("without_logprobs") or {}


def ratios(phases: dict, step_s: float, vllm: dict, train: dict, configured: dict | None = None) -> dict:
    """Each phase against its ceiling, the step against the serial limit (vLLM alone without log-probs, then
    plain forward+backward: the least a step that generates and then trains could take), and which targets hold.

    `phases`: gpu_step.py's (generate / old_log_prob / update with `tokens_per_s`, update_weights with `s`);
    `configured`: vLLM alone with the rollout's engine arguments (`vllm_configured`), where it was measured.
    vLLM alone is the faster of the two (`vllm_ceiling` names it; `generate_vs_vllm_defaults` and
    `generate_vs_vllm_configured` set generation beside each); the serial limit takes the fastest of their runs.
    Generation is set beside vLLM doing the same work: with log-probs, or without them where the measured steps'
    rollouts asked for none (`phases.generate.sampling_logprobs` false: sampling_logprobs_every); then
    `generate_vs_vllm_with_logprobs` sets it beside vLLM's runs with them too."""
    def ratio(ours, ceiling):
        return ours / ceiling if ours is not None and ceiling else None

    generated = phases["generate"].get("tokens_per_s")
    logprobs = phases["generate"].get("sampling_logprobs", True)
    which, alone = fastest_vllm(like_rollout(vllm, logprobs), like_rollout(configured, logprobs))
    # the serial limit's vLLM: the fastest run of these requests, without log-probs or with them (a run that also
    # returned log-probs bounds one without from above: a configured ceiling measured with log-probs only still
    # lowers the limit below the defaults' slower run without)
    ceilings = (vllm, configured or {})
    without = [c["without_logprobs"].get("seconds") for c in ceilings if c.get("without_logprobs")]
    ran = [t for t in (*without, *(c.get("seconds") for c in ceilings)) if t is not None]
    forward_backward = train.get("forward_backward", {})
    parts = (min(ran) if any(t is not None for t in without) else None, forward_backward.get("seconds"))
    serial = sum(parts) if all(p is not None for p in parts) else None
    out = {
        "vllm_ceiling": which,
        "generate_vs_vllm": ratio(generated, alone.get("tokens_per_s")),
        # against that ceiling's best run instead of its median (records from before the median have only this one)
        "generate_vs_vllm_best": ratio(generated, alone.get("best_tokens_per_s")),
        "generate_vs_vllm_defaults": ratio(generated, like_rollout(vllm, logprobs).get("tokens_per_s")),
        "generate_vs_vllm_configured": ratio(generated, like_rollout(configured, logprobs).get("tokens_per_s")),
        **({} if logprobs else {"generate_vs_vllm_with_logprobs":
                                ratio(generated, fastest_vllm(vllm, configured)[1].get("tokens_per_s"))}),
        "old_log_prob_vs_forward": ratio(phases["old_log_prob"].get("tokens_per_s"),
                                         train.get("forward", {}).get("tokens_per_s"))
        if phases["old_log_prob"].get("mode") == "recompute" else None,
        "update_vs_forward_backward": ratio(phases["update"].get("tokens_per_s"), forward_backward.get("tokens_per_s")),
        "serial_limit_s": serial,
        "step_vs_serial_limit": ratio(step_s, serial),
    }
    measured = {**out, "weight_sync_s": (phases.get("update_weights") or phases.get("weight_sync") or {}).get("s")}
    out["targets_met"] = {key: (measured[key] <= bound if side == "max" else measured[key] >= bound)
                          for key, (side, bound) in TARGETS.items() if measured[key] is not None}
    return out


CEILINGS = {"vllm": ceiling_vllm, "vllm_configured": ceiling_vllm, "train": ceiling_train}

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", choices=sorted(CEILINGS))
    ap.add_argument("--spec", required=True)
    ap.add_argument("--result", required=True)
    args = ap.parse_args()
    Path(args.result).write_text(json.dumps(CEILINGS[args.name](json.loads(args.spec))))
