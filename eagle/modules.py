"""The draft head's building blocks: RMSNorm, rotary embeddings, attention, MLP, and a KV cache.

A draft head is one Llama-style decoder layer. It is written out here (rather than borrowed from a
transformers modeling file) because EAGLE-3's layer attends over [embedding ; feature], an input
twice the hidden width, which no stock layer accepts, and because drafting a tree needs a cache
that can append tentative nodes and drop them again.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from compute.ragged import RowLengths, move_rows


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """weight * (x / sqrt(mean(x^2) + eps)), normalised in float32. torch's `rms_norm` does that arithmetic in
        one call (bit for bit the written-out form on CPU, values and gradients): a head step runs four norms, and
        each written-out one cost seven dispatched operations."""
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the factor positions are divided by (linear scaling), per rope config.

    Supported `rope_scaling`: None, {"type"|"rope_type": "linear"|"dynamic"|"llama3"|"default", ...}.
    Dynamic NTK scaling is applied in `rotary_cos_sin` because it depends on the sequence length.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if not scaling:
        return inv_freq.float(), 1.0
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ("default", "dynamic"):
        return inv_freq.float(), 1.0
    if kind == "linear":
        return inv_freq.float(), float(scaling["factor"])
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        scaled = torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
        return scaled.float(), 1.0
    raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: linear, dynamic, llama3, or null")


class Rotary(nn.Module):
    def __init__(self, head_dim: int, theta: float, scaling: dict | None, max_positions: int):
        super().__init__()
        inv_freq, self.linear_factor = rope_inverse_frequencies(head_dim, theta, scaling)
        self.inv_freq = inv_freq  # a plain attribute: module.to(bfloat16) must not round it
        self._inv_freq_on: dict[torch.device, torch.Tensor] = {}  # copies per device, made once
        self.head_dim, self.theta, self.max_positions = head_dim, theta, max_positions
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
        self.dynamic_factor = float(scaling["factor"]) if kind == "dynamic" else None

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [len(positions), head_dim] for integer positions."""
        device = positions.device
        if device not in self._inv_freq_on:
            self._inv_freq_on[device] = self.inv_freq.to(device)
        inv_freq = self._inv_freq_on[device]
        if self.dynamic_factor is not None:  # dynamic NTK scaling reads the sequence length on the host
            seq_len = int(positions.max()) + 1 if positions.numel() else 0
            if seq_len > self.max_positions:
                f = self.dynamic_factor
                base = self.theta * ((f * seq_len / self.max_positions) - (f - 1)) ** (
                    self.head_dim / (self.head_dim - 2))
                exponents = torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim
                inv_freq = 1.0 / (base**exponents)
        angles = (positions.float() / self.linear_factor)[:, None] * inv_freq[None]
        emb = torch.cat([angles, angles], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class KVCache:
    """Keys and values of one attention layer: a committed prefix plus tentative (tree) entries.

    `length` counts committed positions; tentative entries live after them and are dropped by
    `rollback()`. The buffer grows by doubling, so appends never concatenate.
    Batched decoding (`rows` set): row b's committed entries are its first `rows.host[b]`, and
    `length` is where every row's next block goes, the longest row's end (`compute.ragged`).
    """

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.length = 0  # committed
        self.total = 0  # committed + tentative
        self.rows: RowLengths | None = None  # batched decoding: committed entries per row

    def _ensure(self, like: torch.Tensor, needed: int) -> None:
        if self.keys is not None and self.keys.shape[2] >= needed:
            return
        capacity = max(needed, 2 * (self.keys.shape[2] if self.keys is not None else 64))
        shape = (like.shape[0], like.shape[1], capacity, like.shape[3])
        keys, values = like.new_zeros(shape), like.new_zeros(shape)
        if self.keys is not None:
            keys[:, :, : self.total] = self.keys[:, :, : self.total]
            values[:, :, : self.total] = self.values[:, :, : self.total]
        self.keys, self.values = keys, values

    def append(self, k: torch.Tensor, v: torch.Tensor, commit: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Add entries at the end; return all keys/values so far (views)."""
        if commit and self.total != self.length:
            raise RuntimeError("commit after tentative entries: call rollback() first")
        n = k.shape[2]
        self._ensure(k, self.total + n)
        self.keys[:, :, self.total : self.total + n] = k
        self.values[:, :, self.total : self.total + n] = v
        self.total += n
        if commit:
            self.length = self.total
        return self.keys[:, :, : self.total], self.values[:, :, : self.total]

    def rollback(self) -> None:
        self.total = self.length

    def reset(self, rows: RowLengths | None = None) -> None:
        """Forget everything; `rows` (empty lengths, [B]) starts a batch of B sequences."""
        if rows is not None or self.rows is not None:  # the buffers' batch size changes: new ones
            self.keys = self.values = None
        self.length = self.total = 0
        self.rows = rows

    def keep_rows(self, put: torch.Tensor, take: torch.Tensor, counts: list[int], counts_device: torch.Tensor) -> None:
        """Batched: row b keeps entries take[b, :counts[b]] at put[b, :counts[b]] (padded by repeats,
        `compute.ragged.kept_columns`) and commits them; tentative entries are dropped."""
        move_rows(self.keys, put, take)
        move_rows(self.values, put, take)
        self.rows.advance(counts, counts_device)
        self.length = self.total = self.rows.write_at

    def select_rows(self, rows: list[int], rows_device: torch.Tensor) -> None:
        """Batched: keep only `rows` of the batch, in that order (finished sequences leave)."""
        if self.keys is not None:
            self.keys, self.values = self.keys.index_select(0, rows_device), self.values.index_select(0, rows_device)
        self.rows.select(rows, rows_device)
        self.length = self.total = self.rows.write_at


class DraftAttention(nn.Module):
    def __init__(
        self, input_size: int, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, bias: bool = False
    ):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(input_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(input_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(input_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVCache | None = None,
        commit: bool = True,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, q, in]; mask bool [B or 1, 1, q, kv] (True = attend) or None for causal over x alone.

        Keys are `past` (training-time test) or the cache's contents, followed by x's own keys.
        Returns (output [B, q, hidden], k, v) where k, v are x's own rotated keys/values.
        """
        b, q, _ = x.shape
        qs = self.q_proj(x).view(b, q, self.num_heads, self.head_dim).transpose(1, 2)
        ks = self.k_proj(x).view(b, q, self.num_kv_heads, self.head_dim).transpose(1, 2)
        vs = self.v_proj(x).view(b, q, self.num_kv_heads, self.head_dim).transpose(1, 2)
        qs, ks = apply_rotary(qs, cos, sin), apply_rotary(ks, cos, sin)
        if cache is not None:
            keys, values = cache.append(ks, vs, commit)
        elif past is not None:
            keys, values = torch.cat([past[0], ks], dim=2), torch.cat([past[1], vs], dim=2)
        else:
            keys, values = ks, vs
        out = F.scaled_dot_product_attention(
            qs, keys, values, attn_mask=mask, is_causal=mask is None and q > 1,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, q, -1)), ks, vs


class DraftMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
