"""Exact attention: every tree row attends over exactly its visible keys, as plain decoding does.

In a tree forward, a node's visible keys are interleaved with masked siblings, so the kernel
reduces over a longer, differently laid out row than plain decoding does for the same token.
In fp32 that changes the last bits; in bf16 it flips roundings that grow into different greedy
tokens. `exact_attention_forward` computes every query row over exactly its visible keys,
gathered in cache order, with no mask, through the same few ops in verification and in plain
decoding. Where matmuls are batch-invariant (bf16 on CPU for the shapes we tested), strict greedy
verification then reproduces plain decoding bit for bit.

It is an attention function registered with transformers' `AttentionInterface`; the adapter hands
it a plan (`exact_plan`) as a forward keyword argument, which transformers passes down to every layer.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

EXACT_ATTENTION = "mars_exact"
PLAN_KWARG = "mars_exact_plan"  # the forward keyword that carries an exact-attention plan to every layer

ExactPlan = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # [(query rows [n], entries [n, L], pad [n, 1, L])]
EXACT_BUCKET = 64  # key rows are padded to a multiple of this, so rows of one tree share a few shapes


def _attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor, scaling: float) -> torch.Tensor:
    """q [n, heads, d], k/v float32 [kv_heads, n, L, d] (contiguous), pad [n, 1, L] (0 or -inf) -> [n, heads, d].

    In float32: CPUs without bf16 matrix instructions run bf16 matmuls of these shapes several times
    slower. Each row is its own batch entry of the same shape as in plain decoding (matmuls are
    batch-invariant on CPU; they are not invariant to the number of rows of one product)."""
    n, heads, d = q.shape
    kv_heads = k.shape[0]
    grouped = q.float().view(n, kv_heads, heads // kv_heads, d).transpose(0, 1)  # query head j reads kv head j // group
    scores = torch.matmul(grouped, k.transpose(-1, -2)) * scaling + pad
    probs = scores.softmax(dim=-1)  # padded keys get exactly 0
    return torch.matmul(probs, v).to(q.dtype).transpose(0, 1).reshape(n, heads, v.shape[-1])


def exact_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                            mars_exact_plan: ExactPlan | None = None, **kwargs):
    """`attn_implementation="mars_exact"`: plain SDPA unless the forward call carries a plan (the
    prefill and any other use of the model); with a plan every query row attends to its own gathered
    keys, padded at the end to a multiple of EXACT_BUCKET. A row's result depends only on its visible
    keys and their count, never on the other rows of the tree."""
    if mars_exact_plan is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = query.new_empty(query.shape[2], query.shape[1], value.shape[-1])  # [q, heads, d]
    kv_heads = key.shape[1]
    # Cast the cache once, then gather: the same float32 values as gathering then casting per row
    # (a cast is elementwise), without casting the shared prefix once per tree row.
    keys, values = key[0].float(), value[0].float()
    for rows, entries, pad in mars_exact_plan:
        # A no-op on one device; on a model sharded over devices, the layer's own device.
        rows, entries, pad = rows.to(key.device), entries.to(key.device), pad.to(key.device)
        n, length = entries.shape
        flat = entries.reshape(-1)
        k = keys.index_select(1, flat).view(kv_heads, n, length, -1)
        v = values.index_select(1, flat).view(kv_heads, n, length, -1)
        out[rows] = _attend_rows(query[0][:, rows].transpose(0, 1), k, v, pad, scaling)
    return out[None], None


def exact_plan(prefix: int, depths: torch.Tensor, ancestors: torch.Tensor) -> ExactPlan:
    """Tree nodes grouped by padded key count, each with its visible cache entries (the prefix, then
    its ancestors, then padding that points at entry 0 and is masked out)."""
    visible = prefix + depths + 1
    padded = (visible + EXACT_BUCKET - 1) // EXACT_BUCKET * EXACT_BUCKET
    groups = []
    for width in sorted(set(padded.tolist())):
        rows = (padded == width).nonzero()[:, 0]
        entries = torch.zeros(len(rows), width, dtype=torch.long)
        entries[:, :prefix] = torch.arange(prefix)
        pad = torch.full((len(rows), 1, width), -torch.inf)
        for r, node in enumerate(rows.tolist()):
            tree_part = ancestors[node].nonzero()[:, 0] + prefix
            count = prefix + len(tree_part)
            entries[r, prefix:count] = tree_part
            pad[r, ..., :count] = 0.0
        groups.append((rows, entries, pad))
    return groups


def exact_route() -> str:
    """Register exact attention with transformers (once per process); returns its name."""
    if EXACT_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(EXACT_ATTENTION, exact_attention_forward)
        # Masks as for SDPA: transformers builds none for an attention name it does not know, which
        # would drop the padding mask of a batched call made with the model meanwhile.
        AttentionMaskInterface.register(EXACT_ATTENTION, sdpa_mask)
    return EXACT_ATTENTION
