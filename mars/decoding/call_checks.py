"""What `SpeculativeGenerator` checks before it decodes (a call's prompts and random generator) or builds
(plain decoding's kernels): each refusal names the argument and its fix, before any forward runs."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from compute.kernels import choose_packing
from mars.adapter import TargetModel
from mars.decoding.settings import Kernels


def checked_plain_kernels(target: TargetModel, tree_kernels: Kernels, plain: Kernels | None, model) -> Kernels:
    """Plain decoding's kernels (`plain`; None: the tree's) on `model` (None: the target), refused where they
    cannot run beside the tree's on `target`."""
    if plain is None:
        if model is not None:
            raise ValueError("plain_model needs plain_kernels (of its precision)")
        return tree_kernels
    if not isinstance(plain, Kernels):
        raise TypeError(f"plain_kernels must be a mars.decoding.settings.Kernels, got {type(plain).__name__}")
    loaded = str((model or target.model).get_input_embeddings().weight.dtype).removeprefix("torch.")
    if plain.dtype != loaded:
        fix = "pass the target loaded in that precision as plain_model" if model is None else \
            "give plain_model in plain_kernels' precision"
        raise ValueError(f"plain_kernels are {plain.dtype} but the model plain decoding runs on is {loaded}: {fix}")
    if model is not None and model.config.to_dict().get("vocab_size") != target.model.config.vocab_size:
        raise ValueError("plain_model is not the target: load the same model in plain_kernels' precision")
    if model is None and plain.exact_attention and not target.exact_attention:
        raise ValueError("plain_kernels with exact attention need the tree's too (exact_attention=True): "
                         "the model's attention implementation is chosen once, for both")
    if plain.prepack and not choose_packing([model or target.model], "auto")[0]:
        raise ValueError("plain_kernels ask for prepacked weights, which oneDNN cannot pack here (or the packed "
                         "copy does not fit in memory): give plain_kernels with prepack=False")
    if plain != tree_kernels and target.static:
        raise ValueError("static shapes run one set of kernels: leave plain_kernels unset with static=True")
    return plain


def call_prompts(target: TargetModel, input_ids: torch.Tensor | Sequence[torch.Tensor], max_new_tokens: int,
                 nodes: int) -> list[torch.Tensor]:
    """The prompts as 1-D tensors, after checking the call's arguments and that each sequence fits
    (with room for one tree of `nodes` nodes after it)."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"input_ids must have shape [1, T] (one prompt), got {tuple(input_ids.shape)}: "
                             "give several prompts as a list of LongTensors, each [T] or [1, T]")
        prompts = [input_ids]
    elif isinstance(input_ids, (list, tuple)) and input_ids:
        prompts = list(input_ids)
    else:
        raise TypeError("input_ids must be a LongTensor [1, T] or a non-empty list of LongTensors, "
                        "each [T] or [1, T]")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    checked: dict[int, torch.Tensor] = {}  # one tensor given for several rows stays one (one prefill)
    for p in prompts:
        if id(p) not in checked:
            checked[id(p)] = checked_prompt(target, p, max_new_tokens, nodes)
    return [checked[id(p)] for p in prompts]


def checked_prompt(target: TargetModel, prompt: torch.Tensor, max_new_tokens: int, nodes: int) -> torch.Tensor:
    """One prompt as a 1-D LongTensor, refused where it (with its new tokens and one tree) does not fit."""
    if not isinstance(prompt, torch.Tensor) or prompt.dtype != torch.long:
        raise TypeError("a prompt must be a LongTensor of token ids, [T] or [1, T]")
    if prompt.dim() == 2 and prompt.shape[0] == 1:
        prompt = prompt[0]
    if prompt.dim() != 1:
        raise ValueError(f"a prompt must have shape [T] or [1, T], got {tuple(prompt.shape)}")
    if prompt.shape[0] == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. the BOS token)")
    limit = target.max_length
    if len(prompt) + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the target's "
            f"context of {limit} tokens: shorten the prompt or lower max_new_tokens"
        )
    needed = len(prompt) + max_new_tokens + nodes
    if target.static and needed > target.max_cache_len:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) + one tree ({nodes} nodes) "
            f"need {needed} cache entries, more than max_cache_len={target.max_cache_len}: pass "
            f"SpeculativeGenerator(..., max_cache_len={needed}) or more, or a shorter prompt / fewer new tokens"
        )
    return prompt


def check_generator(target: TargetModel, generator: torch.Generator | None) -> None:
    """Refuse a random generator on another device type than the target's logits (where sampling runs)."""
    device = target.devices.logits
    if generator is not None and torch.device(generator.device).type != device.type:
        raise ValueError(f"the random generator is on {generator.device} but sampling runs where the target's "
                         f"logits are, {device}: pass torch.Generator(device='{device}')")
