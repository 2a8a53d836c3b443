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

# One group per key width the tree's rows need: (rows [n] bool, or None for the first group; cache
# entries [n, width] long; additive pad [n, 1, width] float32). Every group lists every row: a row's
# result is taken from the group of its own width.
ExactPlan = list[tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]]
EXACT_BUCKET = 64  # a row's keys are padded to a multiple of this, so rows of one tree share a few shapes


def bucket(keys: int | torch.Tensor) -> int | torch.Tensor:
    """The padded key count of a row that sees `keys` cache entries (a tensor: elementwise, on its device)."""
    return (keys + EXACT_BUCKET - 1) // EXACT_BUCKET * EXACT_BUCKET


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
    kv_heads = key.shape[1]
    # Cast the cache once, then gather: the same float32 values as gathering then casting per row
    # (a cast is elementwise), without casting the shared prefix once per tree row.
    keys, values = key[0].float(), value[0].float()
    rows = query[0].transpose(0, 1)  # [q, heads, d]
    out = None
    for select, entries, pad in mars_exact_plan:
        # A no-op on one device; on a model sharded over devices, the layer's own device.
        entries, pad = entries.to(key.device), pad.to(key.device)
        n, length = entries.shape
        flat = entries.reshape(-1)
        k = keys.index_select(1, flat).view(kv_heads, n, length, -1)
        v = values.index_select(1, flat).view(kv_heads, n, length, -1)
        result = _attend_rows(rows, k, v, pad, scaling)
        # Every row at every width of the plan, each row kept from its own width's group: choosing on
        # the device, where selecting the rows of a width first would read their count on the host.
        out = result if out is None else torch.where(select.to(key.device)[:, None, None], result, out)
    return out[None], None


def exact_plan(prefix: int, depths: torch.Tensor, ancestors: torch.Tensor, levels: int) -> ExactPlan:
    """For tree nodes placed after `prefix` cache entries, each node's visible cache entries (the
    prefix, then its ancestors and itself in cache order, then padding that points at entry 0 and is
    masked out), built on the tree's device without reading it on the host.

    depths [n], ancestors [n, n] bool (True where j is i or an ancestor of i); levels: a bound on the
    depths known on the host (`DraftTree.levels`), which with `prefix` gives the widths the rows need."""
    n, device = depths.shape[0], depths.device
    visible = prefix + depths + 1  # [n] keys each row sees
    index = torch.arange(n, device=device)
    # Per row, its ancestors (itself included) first, in cache order (a parent precedes its children), then the rest.
    order = torch.argsort(torch.where(ancestors, index, index + n), dim=1) + prefix
    widths = range(bucket(prefix + 1), bucket(prefix + levels + 1) + 1, EXACT_BUCKET)
    groups: ExactPlan = []
    for width in widths:
        columns = torch.arange(width, device=device)
        tree_columns = min(n, width - prefix)
        entries = torch.cat([columns[:prefix].expand(n, prefix), order[:, :tree_columns],
                             order.new_zeros(n, width - prefix - tree_columns)], dim=1)
        shown = columns < visible[:, None]  # [n, width]
        entries = torch.where(shown, entries, 0)
        pad = torch.where(shown, 0.0, -torch.inf).float()[:, None]
        select = None if not groups else bucket(visible) == width
        groups.append((select, entries, pad))
    return groups


def exact_route() -> str:
    """Register exact attention with transformers (once per process); returns its name."""
    if EXACT_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(EXACT_ATTENTION, exact_attention_forward)
        # Masks as for SDPA: transformers builds none for an attention name it does not know, which
        # would drop the padding mask of a batched call made with the model meanwhile.
        AttentionMaskInterface.register(EXACT_ATTENTION, sdpa_mask)
    return EXACT_ATTENTION
