"""Attention implementations that cannot take a tree mask, routed around it.

A tree forward needs an arbitrary additive 4D mask. SDPA and eager apply it as given; flash
attention takes no such mask (transformers would read it as a padding mask and unpad garbage), and
flex attention needs a block mask. Such a model is routed: calls without a mask (the causal
prefill, a lone root) keep the model's own implementation, calls with a tree mask go to SDPA.
"""

from __future__ import annotations

from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

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
