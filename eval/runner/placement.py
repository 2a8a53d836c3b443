"""Where the target goes on GPUs: one device when it fits, spread only when it does not.

`device_map="auto"` in transformers spreads a model over every visible GPU and leaves no room for
what decoding adds beside the weights: the KV cache, the tree's logits (kept in two precisions), the
draft head and prefill activations. Here `model.device_map: auto` means *fit first*: the weights plus
that headroom (`decoding_headroom`, or `model.headroom_gib`) on the job's first GPU if they fit,
else transformers' `auto` over the job's GPUs with each GPU's `max_memory` lowered by its share of
the headroom. Any other `device_map` value (`balanced`, `sequential`, a dict) is passed as given.
Nothing here has run on a GPU; the arithmetic is tested on CPU with published model configs.
"""

from __future__ import annotations

import torch

from eagle.config import text_config

GiB = 2**30
PLACEMENT_CONTEXT = 8192  # prompt tokens budgeted for (plus max_new_tokens); model.headroom_gib overrides
RUNTIME_BYTES = GiB  # CUDA context, allocator slack


def parameter_count(config) -> int:
    """The model's parameters, counted on the meta device (nothing allocated)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def weight_bytes(config, dtype: torch.dtype) -> int:
    """Bytes of the model's parameters in `dtype`."""
    return parameter_count(config) * dtype.itemsize


def decoding_headroom(config, dtype: torch.dtype, context: int, tree_nodes: int, draft_bytes: int) -> dict[str, int]:
    """Bytes decoding needs beside the target's weights, by use: the KV cache for `context` tokens,
    prefill activations, a tree's logits (model dtype and float32), the draft head, the runtime."""
    text = text_config(config)
    size = torch.empty((), dtype=dtype).element_size()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    intermediate = getattr(text, "intermediate_size", None) or 4 * text.hidden_size
    return {
        "kv_cache": 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * context * size,
        "activations": context * (4 * text.hidden_size + 2 * intermediate) * size,
        "logits": tree_nodes * text.vocab_size * (size + 4),
        "draft": draft_bytes,
        "runtime": RUNTIME_BYTES,
    }


def plan(weights: int, headroom: dict[str, int], gpus: dict[int, int]) -> dict:
    """from_pretrained's placement for `weights` bytes on `gpus` ({index: bytes}, in job order).

    One GPU (the first) when weights + headroom fit it; otherwise `device_map="auto"` with a
    `max_memory` per GPU that leaves its share free: the KV cache and activations spread with the
    layers (in proportion to each GPU's size), the draft on the first GPU (inputs), the logits on
    the last (lm_head), the runtime on each."""
    order = list(gpus)
    first, last = order[0], order[-1]
    need = weights + sum(headroom.values())
    if need <= gpus[first]:
        return {"device_map": {"": first}}
    total = sum(gpus.values())
    spread = headroom["kv_cache"] + headroom["activations"]
    budget = {}
    for g, size in gpus.items():
        keep = spread * size / total + headroom["runtime"]
        keep += headroom["draft"] if g == first else 0
        keep += headroom["logits"] if g == last else 0
        budget[g] = int(size - keep)
    if sum(max(b, 0) for b in budget.values()) < weights:
        raise RuntimeError(
            f"the target ({weights / GiB:.1f} GiB) and what decoding needs beside it "
            f"({sum(headroom.values()) / GiB:.1f} GiB) do not fit the job's {len(gpus)} GPU(s) "
            f"({total / GiB:.1f} GiB): give the job more GPUs (gpus_per_job), lower model.headroom_gib, "
            f"or set model.allow_offload=true")
    return {"device_map": "auto", "max_memory": {g: max(b, 0) for g, b in budget.items()}}


def draft_bytes(config, dtype: torch.dtype, weights: int) -> int:
    """An EAGLE head's size, estimated before it is loaded: one decoder layer of the target plus two
    vocabulary x hidden matrices (embedding and lm_head)."""
    text = text_config(config)
    size = torch.empty((), dtype=dtype).element_size()
    return 2 * text.vocab_size * text.hidden_size * size + weights // text.num_hidden_layers


def fit_first(config, dtype: torch.dtype, gpus: dict[int, int], max_new_tokens: int, tree_nodes: int,
              headroom_gib: float | None = None) -> dict:
    """`plan` for a target of `config` in `dtype`: headroom estimated for PLACEMENT_CONTEXT prompt
    tokens + `max_new_tokens` and a tree of `tree_nodes`, or `headroom_gib` as given."""
    weights = weight_bytes(config, dtype)
    if headroom_gib is not None:
        headroom = dict.fromkeys(("kv_cache", "activations", "logits", "draft"), 0)
        headroom["runtime"] = int(headroom_gib * GiB)
    else:
        headroom = decoding_headroom(config, dtype, PLACEMENT_CONTEXT + max_new_tokens, tree_nodes,
                                     draft_bytes(config, dtype, weights))
    return plan(weights, headroom, gpus)


def parse_bytes(value) -> int:
    """A max_memory entry (bytes, or "70GiB" / "70GB" / "512MiB") as bytes."""
    if isinstance(value, int):
        return value
    text = str(value).strip()
    units = {"GiB": 2**30, "MiB": 2**20, "GB": 10**9, "MB": 10**6}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    raise ValueError(f"model.max_memory entry {value!r} is not a size: give bytes or e.g. '70GiB'")
