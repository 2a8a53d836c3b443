"""Assemble the embedded default pair under data/models/ from finished training runs.

Usage:
    python -m eagle.train.export --target runs/target/final --draft runs/draft/final --out data/models \
        [--sampling-draft runs/draft_kl/final]

Copies the target (bf16 safetensors, config, tokenizer, training summary) to <out>/target and the
draft (public EAGLE layout, its evaluation) to <out>/draft; with --sampling-draft, a head for
temperature > 0 to <out>/draft_sampling (`model.sampling_draft`). A head's `embed_tokens.weight` is
dropped when it equals the target's embedding, as published EAGLE-3 drafts do: `load_draft` copies
it from the target. Every model is then loaded back strictly and checked against the size budget.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

SIZE_BUDGET_MB = 70.0  # the repository carries the pair: a clone stays small
TARGET_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json", "training_summary.json")
DRAFT_FILES = ("config.json", "eval.json", "eval_own_t1.json", "confidence.json", "training_summary.json")


def _copy(src: Path, dst: Path, names: tuple[str, ...], required: tuple[str, ...]) -> None:
    for name in required:
        if not (src / name).exists():
            raise FileNotFoundError(f"{src / name} is missing: is {src} a finished training run's final/ directory?")
    for name in names:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)


def _export_head(src: Path, dst: Path, target) -> None:
    """A finished head run's final/ directory as a bf16 EAGLE checkpoint in `dst`."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    _copy(src, dst, DRAFT_FILES, ("config.json",))
    state = load_file(str(src / "model.safetensors"))
    state = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in state.items()}
    embed = state.get("embed_tokens.weight")
    if embed is not None and torch.equal(embed, target.get_input_embeddings().weight.detach()):
        del state["embed_tokens.weight"]
    save_file(state, str(dst / "model.safetensors"))


def export_pair(target_dir: Path, draft_dir: Path, out: Path, sampling_dir: Path | None = None,
                copy_target: bool = True) -> dict:
    """The heads (and, with `copy_target`, the target) under `out`, each loaded back strictly. Without
    `copy_target` the target stays where it is (a converted GGUF: the package is its source)."""
    from transformers import AutoModelForCausalLM

    from eagle.checkpoint import load_draft

    heads = {"draft": draft_dir, **({"draft_sampling": sampling_dir} if sampling_dir else {})}
    for src in (target_dir, *heads.values()):
        if any(src.resolve() == (out / part).resolve() for part in ("target", "draft", "draft_sampling")):
            raise ValueError(f"{src} is where the export writes: export from a training run's final/ directory, "
                             "or to another --out")
    for part in ("target", "draft", "draft_sampling"):  # a head not exported now must not linger from before
        shutil.rmtree(out / part, ignore_errors=True)
    parts = ("target", *heads) if copy_target else tuple(heads)
    if copy_target:
        (out / "target").mkdir(parents=True, exist_ok=True)
        _copy(target_dir, out / "target", TARGET_FILES, ("config.json", "model.safetensors", "tokenizer.json"))
    target = AutoModelForCausalLM.from_pretrained(out / "target" if copy_target else target_dir, dtype=torch.bfloat16)
    loaded = {}
    for part, src in heads.items():
        _export_head(src, out / part, target)
        loaded[part] = load_draft(out / part, target)  # strict: every key present, shapes and sizes match
    sizes = {part: sum(f.stat().st_size for f in (out / part).iterdir()) / 1e6 for part in parts}
    total = sum(sizes.values())
    if total > SIZE_BUDGET_MB:
        raise ValueError(f"the models take {total:.1f} MB, over the {SIZE_BUDGET_MB:.0f} MB budget: shrink a model")
    head = loaded["draft"]
    return {**{f"{part}_mb": round(sizes[part], 2) for part in parts},
            "target_params": sum(p.numel() for p in target.parameters()),
            "draft_params": sum(p.numel() for p in head.parameters()),
            "draft_kind": head.config.kind, "draft_vocab_size": head.config.draft_vocab_size}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, required=True, help="the target run's final/ directory")
    ap.add_argument("--draft", type=Path, required=True, help="the draft run's final/ directory")
    ap.add_argument("--sampling-draft", type=Path, default=None,
                    help="a head for temperature > 0 (its final/ directory), exported to <out>/draft_sampling")
    ap.add_argument("--out", type=Path, default=Path("data/models"))
    ap.add_argument("--heads-only", action="store_true", help="leave the target where it is (e.g. a converted GGUF)")
    args = ap.parse_args(argv)
    print(json.dumps(export_pair(args.target, args.draft, args.out, args.sampling_draft, not args.heads_only),
                     indent=2))


if __name__ == "__main__":
    main()
