"""Draft checkpoints in the public EAGLE layout: `config.json` + `model.safetensors` or `pytorch_model.bin`.

Published EAGLE-3 / MARS drafts load unchanged. Unlike the reference loader, keys are checked
strictly: every missing or unexpected key is named, and nothing is left randomly initialised.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle.config import DraftConfig, text_config
from eagle.heads import DraftHead, Eagle1Head, Eagle3Head

WEIGHT_FILES = ("pytorch_model.bin", "model.safetensors")  # the reference tries .bin first


def save_draft(head: DraftHead, directory: str | Path) -> None:
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    head.config.save(directory)
    state = {k: v.detach().contiguous() for k, v in head.state_dict().items()}
    if isinstance(head, Eagle3Head) and head.config.draft_vocab_size == head.config.vocab_size:
        state.pop("d2t"), state.pop("t2d")  # absent when the vocabularies are equal, as published
    save_file(state, str(directory / "model.safetensors"))


def read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = directory / name
        if path.exists():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            return torch.load(path, map_location="cpu", weights_only=True)
    raise FileNotFoundError(
        f"no draft weights in {directory}: expected one of {', '.join(WEIGHT_FILES)} "
        "(the EAGLE checkpoint layout). Check the path, or train a draft with `python -m eagle.train.draft`."
    )


def load_draft(path: str | Path, target_model, dtype: torch.dtype | None = None,
               device: torch.device | str | None = None) -> DraftHead:
    """Load an EAGLE-3 or EAGLE-1/2 draft for `target_model` (any HF causal LM) from a directory.

    The head goes to `device`, by default the device of the target's input embeddings (the first
    device of a model sharded with `device_map`, where the prompt enters), in `dtype`, by default
    the embeddings' dtype.
    """
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"draft checkpoint directory {directory} does not exist")
    config_path = directory / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path} is missing: a draft checkpoint needs config.json next to its weights")
    state = read_state_dict(directory)
    config = _read_config(config_path, state, target_model)
    head, optional = _empty_head(config, target_model)
    _check_keys(directory, config, head, state, optional)
    if config.kind == "eagle3":
        _complete_eagle3(state, config, target_model)
    else:
        state.pop("embed_tokens.weight", None)
    head.load_state_dict(state, strict=True)
    embedding = target_model.get_input_embeddings().weight
    return head.to(device=device or embedding.device, dtype=dtype or embedding.dtype).eval()


def _read_config(config_path: Path, state: dict[str, torch.Tensor], target_model) -> DraftConfig:
    """The checkpoint's config (a published one's kind told by its keys), refused for another target."""
    raw = json.loads(config_path.read_text())
    if "kind" not in raw:  # published checkpoints: tell the head type by its keys
        raw["kind"] = "eagle3" if any(k.startswith("midlayer.") for k in state) else "eagle1"
    n_layers = text_config(target_model.config).num_hidden_layers
    config = DraftConfig.from_json(raw, num_target_layers=n_layers)
    if config.num_target_layers != n_layers:
        raise ValueError(
            f"draft was trained on a {config.num_target_layers}-layer target, this target has {n_layers} layers: "
            "load the draft trained for this target."
        )
    config.check_target(target_model)
    return config


def _empty_head(config: DraftConfig, target_model) -> tuple[DraftHead, set[str]]:
    """A head of the config's kind, and the keys a checkpoint of that kind may leave out."""
    if config.kind == "eagle3":
        return Eagle3Head(config), {"d2t", "t2d", "embed_tokens.weight"}
    head = Eagle1Head(config, target_model.get_input_embeddings(), target_model.get_output_embeddings())
    return head, {"embed_tokens.weight"}  # some EAGLE-1 checkpoints carry a copy of the target's embedding


def _check_keys(directory: Path, config: DraftConfig, head: DraftHead, state: dict[str, torch.Tensor],
                optional: set[str]) -> None:
    """Name every missing, unexpected or misshapen key, so that nothing is left randomly initialised."""
    expected = set(head.state_dict())
    missing = sorted(expected - set(state) - optional)
    unexpected = sorted(set(state) - expected - optional)
    if missing or unexpected:
        raise ValueError(
            f"draft checkpoint {directory} does not match the {config.kind} layout: "
            f"missing keys {missing or 'none'}; unexpected keys {unexpected or 'none'}"
        )
    shapes = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(head.state_dict()[k].shape)}"
              for k, v in state.items() if k in expected and v.shape != head.state_dict()[k].shape]
    if shapes:
        raise ValueError(f"draft checkpoint {directory} has wrong shapes: " + "; ".join(shapes))


def _complete_eagle3(state: dict[str, torch.Tensor], config: DraftConfig, target_model) -> None:
    """Fill what an EAGLE-3 checkpoint may leave out, as the reference does: the target's embedding, and the
    vocabulary maps (identity where the vocabularies are equal; t2d from d2t where only d2t ships)."""
    if "embed_tokens.weight" not in state:  # the reference copies the target's embedding
        state["embed_tokens.weight"] = target_model.get_input_embeddings().weight.detach()
    if "d2t" not in state:
        if config.draft_vocab_size != config.vocab_size:
            raise ValueError("draft vocabulary is reduced but the checkpoint has no 'd2t' map")
        state["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
        state["t2d"] = torch.ones(config.vocab_size, dtype=torch.bool)
    state["d2t"] = state["d2t"].long()
    if "t2d" not in state:  # Model Optimizer exports (nvidia/*-Eagle3) ship d2t alone; t2d follows from it
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[torch.arange(config.draft_vocab_size) + state["d2t"]] = True
        state["t2d"] = t2d
    state["t2d"] = state["t2d"].bool()
