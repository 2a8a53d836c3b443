"""Attention implementations routed for tree forwards.

A tree forward needs an arbitrary additive 4D mask. SDPA and eager apply it as given; flash
attention takes no such mask (transformers would read it as a padding mask and unpad garbage), and
flex attention needs a block mask. Such a model is routed: calls without a mask (the causal
prefill, a lone root) keep the model's own implementation, calls with a tree mask go to SDPA.

An SDPA model with grouped-query attention on CPU is routed too (`gqa_route`): transformers hands SDPA
its GQA mode only without a mask, and with one repeats every cached key and value once per query group,
a copy of the whole cache in every layer of every tree forward, which plain decoding (no mask) never
pays. The adapter's tree forwards run SDPA's GQA mode over the unrepeated keys instead (the same floats
bit for bit on CPU; on CUDA masked GQA falls back to the math kernel, so GPUs keep transformers' path).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from eagle.config import text_config
from mars.adapter.exact import EXACT_ATTENTION

TAKES_TREE_MASK = ("sdpa", "eager", EXACT_ATTENTION)
TREE_ROUTE = "mars_tree"
ROUTE_KWARG = "mars_maskless_attention"  # the forward keyword naming the model's own implementation


def routed_attention_forward(module, query, key, value, attention_mask, mars_maskless_attention: str | None = None,
                             **kwargs):
    """`attn_implementation="mars_tree"`: without a mask, the implementation the forward call names
    (the model's own); with a tree mask, or called without the keyword, SDPA."""
    if attention_mask is None and mars_maskless_attention is not None:
        own = AttentionInterface._global_mapping[mars_maskless_attention]
        return own(module, query, key, value, attention_mask, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def maskless_implementation(implementation: str | None) -> str | None:
    """The model's own implementation when it takes no tree mask (it is then routed), else None."""
    implementation = implementation or "sdpa"
    return None if implementation in TAKES_TREE_MASK else implementation


def tree_route(implementation: str) -> str:
    """Register the routing implementation for a model using `implementation`; returns its name."""
    if implementation not in AttentionInterface._global_mapping:
        raise ValueError(f"the target's attention implementation {implementation!r} takes no tree mask and is not "
                         f"registered with transformers' AttentionInterface, so it cannot be routed: load the model "
                         f"with attn_implementation='sdpa' (or 'eager')")
    if TREE_ROUTE not in AttentionInterface._global_mapping:
        AttentionInterface.register(TREE_ROUTE, routed_attention_forward)
        AttentionMaskInterface.register(TREE_ROUTE, sdpa_mask)  # 4D tree masks pass through as given
    return TREE_ROUTE


GQA_ROUTE = "mars_gqa"
GQA_KWARG = "mars_tree_gqa"  # passed by the adapter's own forwards: only they take the GQA path


def gqa_attention_forward(module, query, key, value, attention_mask, mars_tree_gqa: bool = False, **kwargs):
    """`attn_implementation="mars_gqa"`: an adapter forward with a tree mask (`mars_tree_gqa`) runs SDPA in its
    GQA mode on query [B, H, q, d], key and value [B, H_kv, kv, d] and the mask as given; any other call (the
    prefill, plain decoding's lone rows, the user's own calls) is transformers' SDPA unchanged."""
    plain_sdpa = not kwargs.get("dropout") and kwargs.get("softcap") is None and kwargs.get("position_bias") is None
    if (mars_tree_gqa and attention_mask is not None and getattr(module, "num_key_value_groups", 1) > 1
            and query.device.type == "cpu" and plain_sdpa):
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                               scale=kwargs.get("scaling"), enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def gqa_route(model, implementation: str | None, device: torch.device) -> str | None:
    """The GQA route's name for a model using `implementation` with its inputs on `device`, registered, when
    it applies (SDPA, grouped-query attention, CPU); else None."""
    config = text_config(model.config)
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None)
    if (implementation or "sdpa") != "sdpa" or device.type != "cpu" or not kv_heads or kv_heads >= heads:
        return None
    if GQA_ROUTE not in AttentionInterface._global_mapping:
        AttentionInterface.register(GQA_ROUTE, gqa_attention_forward)
        AttentionMaskInterface.register(GQA_ROUTE, sdpa_mask)  # 4D tree masks pass through as given
    return GQA_ROUTE
