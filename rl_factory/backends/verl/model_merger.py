"""verl's model merger for the checkpoints our defaults write: the same arguments as `python -m verl.model_merger`.

    python -m rl_factory.backends.verl.model_merger merge --backend fsdp \
        --local_dir outputs/run/checkpoints/global_step_200/actor --target_dir outputs/run/hf/step_200

Without flash-attn, the tuned defaults train with `attn_implementation=rl_factory_varlen`
(rl_factory/models/varlen_attention.py). verl applies `override_config` by setting the attribute on the
Hugging Face config, so the name lands in the checkpoint's config.json, and transformers refuses a name it
does not know: verl's merger alone stops with "Specified `attn_implementation="rl_factory_varlen"` is not
supported" (seen on the H200, 2026-12-01). Here the name is registered before verl's merger runs, and the
merged model's config.json drops it again: the result is a plain Hugging Face model that any transformers
loads with its own default attention.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from rl_factory.models import varlen_attention


def strip_custom_attention(model_dir: str | Path) -> bool:
    """Remove our attention name from `model_dir/config.json`; True if it was there."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return False
    config = json.loads(path.read_text())
    if config.get("attn_implementation") != varlen_attention.NAME:
        return False
    del config["attn_implementation"]
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return True


def main(argv: list[str] | None = None) -> None:
    from verl.model_merger.__main__ import main as verl_main
    from verl.model_merger.base_model_merger import parse_args

    sys.argv = [sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
    args = parse_args()  # verl's own parser: its errors and --help, unchanged
    verl_main()
    if args.operation == "merge" and strip_custom_attention(args.target_dir):
        print(f"{args.target_dir}/config.json: dropped attn_implementation={varlen_attention.NAME} "
              "(a training-time setting; the merged model loads with transformers' default attention)")


if __name__ == "__main__":
    main()
