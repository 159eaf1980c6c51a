"""The figure of the arena-vs-pointwise experiment, from the runs.json that benchmarks/arena_vs_pointwise.py keeps.

    .venv/bin/python -m examples.arena_vs_pointwise.plot outputs/arena_vs_pointwise/runs.json \
        -o docs/guides/arena-vs-pointwise.png

One column per judge noise level. Top: the greedy policy's true quality against the training step
(mean over seeds, the band its 95% bootstrap interval). Bottom: the same means against the judge
requests spent in training so far, from the first validation after step 0 (log scale; the oracle
spends none and is the dashed line).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.arena_vs_pointwise import summarize_arm  # noqa: E402

STYLE = {"oracle": ("black", "--"), "pointwise": ("tab:red", "-"), "anchor": ("tab:olive", "-"),
         "swiss": ("tab:green", "-"), "single_elimination": ("tab:blue", "-"),
         "double_elimination": ("tab:purple", "-"), "round_robin": ("tab:orange", "-")}


def plot(runs_json: Path, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    data = json.loads(runs_json.read_text())
    settings, noises = data["settings"], data["noise"]
    by = {}
    for r in data["runs"]:
        by.setdefault((r["arm"], r["noise"]), []).append(r)
    arms = [a for a in STYLE if any(k[0] == a for k in by)]
    fig, axes = plt.subplots(2, len(noises), figsize=(4.6 * len(noises), 7.2), squeeze=False, sharey=True)
    for col, noise in enumerate(noises):
        top, bottom = axes[0][col], axes[1][col]
        for arm in arms:
            runs = by.get((arm, None if arm == "oracle" else noise))
            if not runs:
                continue
            s = summarize_arm(runs, settings["n"], settings["train_batch_size"])
            color, dash = STYLE[arm]
            steps = [c[0] for c in s["curve"]]
            mean, low, high = ([c[k] for c in s["curve"]] for k in (1, 2, 3))
            label = f"{arm} ({len(runs)} seeds)"
            top.plot(steps, mean, dash, color=color, label=label, marker="o", ms=3)
            top.fill_between(steps, low, high, color=color, alpha=0.12)
            if arm == "oracle":
                bottom.axhline(mean[-1], color=color, ls=dash, lw=1, label="oracle (no judge), final")
            else:
                # from the first validation after step 0 (step 0 spent nothing: no place on a log axis)
                bottom.plot(s["judge_requests_at_val"][1:], mean[1:], dash, color=color, label=arm, marker="o", ms=3)
        top.set_title(f"judge noise {noise:g} (score points, band 2)")
        top.set_xlabel("training step")
        bottom.set_xlabel("judge requests in training (log)")
        bottom.set_xscale("log")
        bottom.xaxis.set_minor_formatter(NullFormatter())  # 2x10^2, 3x10^2, ... labels overlap
        bottom.set_xticks([100, 200, 500, 1000, 2000], ["100", "200", "500", "1000", "2000"])
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("greedy true quality (32 val rows)")
    axes[1][0].set_ylabel("greedy true quality")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    axes[1][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"builtin:tiny-calculator, {settings['train_batch_size']} prompts x {settings['n']} rollouts "
                 "a step: grpo on a pointwise judge vs arena topologies on a pairwise judge", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs_json", type=Path)
    parser.add_argument("-o", "--out", type=Path, default=ROOT / "docs" / "guides" / "arena-vs-pointwise.png")
    args = parser.parse_args(argv)
    print(f"wrote {plot(args.runs_json, args.out)}")


if __name__ == "__main__":
    main()
