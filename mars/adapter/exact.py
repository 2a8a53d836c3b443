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
    keys and their count, never on the other rows of the tree (or of the batch: the plan's entries index
    the batch's keys laid end to end, row b's at b * key length + its cache positions)."""
    if mars_exact_plan is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    batch, kv_heads, length, _ = key.shape
    # Cast the cache once, then gather: the same float32 values as gathering then casting per row
    # (a cast is elementwise), without casting the shared prefix once per tree row.
    keys = key.float().transpose(0, 1).reshape(kv_heads, batch * length, -1)
    values = value.float().transpose(0, 1).reshape(kv_heads, batch * length, -1)
    rows = query.transpose(1, 2).reshape(-1, query.shape[1], query.shape[-1])  # [B q, heads, d]
    out = None
    for select, entries, pad in mars_exact_plan:
        # A no-op on one device; on a model sharded over devices, the layer's own device.
        entries, pad = entries.to(key.device), pad.to(key.device)
        n, width = entries.shape
        flat = entries.reshape(-1)
        k = keys.index_select(1, flat).view(kv_heads, n, width, -1)
        v = values.index_select(1, flat).view(kv_heads, n, width, -1)
        result = _attend_rows(rows, k, v, pad, scaling)
        # Every row at every width of the plan, each row kept from its own width's group: choosing on
        # the device, where selecting the rows of a width first would read their count on the host.
        out = result if out is None else torch.where(select.to(key.device)[:, None, None], result, out)
    return out.view(batch, -1, *out.shape[1:]), None


def exact_plan(prefix: int, depths: torch.Tensor, ancestors: torch.Tensor, levels: int) -> ExactPlan:
    """For tree nodes placed after `prefix` cache entries, each node's visible cache entries (the
    prefix, then its ancestors and itself in cache order, then padding that points at entry 0 and is
    masked out), built on the tree's device without reading it on the host.

    depths [n], ancestors [n, n] bool (True where j is i or an ancestor of i); levels: a bound on the
    depths known on the host (`DraftTree.levels`), which with `prefix` gives the widths the rows need."""
    lengths = torch.full((1,), prefix, dtype=torch.long, device=depths.device)
    return exact_plan_rows(lengths, (prefix, prefix), prefix, depths[None], ancestors[None], levels)


def exact_plan_rows(lengths: torch.Tensor, span: tuple[int, int], start: int, depths: torch.Tensor,
                    ancestors: torch.Tensor, levels: int) -> ExactPlan:
    """`exact_plan` for B trees at once (batched decoding, `compute.ragged`): row b's committed entries are its
    first lengths[b] [B] (on the device; span = their (min, max), known on the host), its tree nodes sit at
    `start` + node index. depths [B, n], ancestors [B, n, n]. Entries index the batch's keys laid end to
    end (row b's at b * (start + n) + position), rows in batch-major order (b * n + node)."""
    b, n, device = depths.shape[0], depths.shape[1], depths.device
    visible = lengths[:, None] + depths + 1  # [B, n] keys each row sees
    index = torch.arange(n, device=device)
    # Per row, its ancestors (itself included) first, in cache order (a parent precedes its children), then the rest.
    order = torch.argsort(torch.where(ancestors, index, index + n), dim=-1) + start  # [B, n, n]
    offset = (torch.arange(b, device=device) * (start + n))[:, None, None]
    widths = range(bucket(span[0] + 1), bucket(span[1] + levels + 1) + 1, EXACT_BUCKET)
    groups: ExactPlan = []
    for width in widths:
        columns = torch.arange(width, device=device)
        prefix = lengths[:, None, None]
        in_tree = order.gather(2, (columns - prefix).clamp(0, n - 1).expand(b, n, width))
        entries = torch.where(columns < prefix, columns, in_tree)  # [B, n, width]
        shown = columns < visible[:, :, None]
        entries = torch.where(shown, entries + offset, offset)  # padding: the row's own entry 0, masked out
        pad = torch.where(shown, 0.0, -torch.inf).float().view(b * n, 1, width)
        select = None if not groups else (bucket(visible) == width).view(-1)
        groups.append((select, entries.view(b * n, width), pad))
    return groups


def exact_route() -> str:
    """Register exact attention with transformers (once per process); returns its name."""
    if EXACT_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(EXACT_ATTENTION, exact_attention_forward)
        # Masks as for SDPA: transformers builds none for an attention name it does not know, which
        # would drop the padding mask of a batched call made with the model meanwhile.
        AttentionMaskInterface.register(EXACT_ATTENTION, sdpa_mask)
    return EXACT_ATTENTION
