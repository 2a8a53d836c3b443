"""One adapter for any Hugging Face causal LM as the target of speculative decoding.

It uses only transformers' public machinery: a `DynamicCache` subclass whose layers write into
preallocated buffers (growing by concatenation cost a third of small-model decode time), custom
4D attention masks (returned as-is by transformers' mask builders), explicit `position_ids`, and
`output_hidden_states` for the draft's features. No modeling file is copied.
"""

from __future__ import annotations

import threading

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")
EXACT_ATTENTION = "mars_exact"


# --- layout-invariant attention -----------------------------------------------------------------
# In a tree forward, a node's visible keys are interleaved with masked siblings, so the kernel
# reduces over a longer, differently laid out row than plain decoding does for the same token.
# In fp32 that changes the last bits; in bf16 it flips roundings that grow into different greedy
# tokens. `exact_attention_forward` computes every query row over exactly its visible keys,
# gathered in cache order, with no mask, through the same few ops in verification and in plain
# decoding. Where matmuls are batch-invariant (bf16 on CPU for the shapes we tested), strict greedy
# verification then reproduces plain decoding bit for bit.

class _Plan(threading.local):
    # [(query rows [n], cache entries [n, L], additive pad mask [n, 1, L])]; None: plain SDPA.
    groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None


_PLAN = _Plan()
EXACT_BUCKET = 64  # key rows are padded to a multiple of this, so rows of one tree share a few shapes


def _attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor, scaling: float) -> torch.Tensor:
    """q [n, heads, d], k/v [kv_heads, n, L, d] (contiguous), pad [n, 1, L] (0 or -inf) -> [n, heads, d]."""
    n, heads, d = q.shape
    kv_heads = k.shape[0]
    grouped = q.view(n, kv_heads, heads // kv_heads, d).transpose(0, 1)  # query head j reads kv head j // group
    scores = torch.matmul(grouped, k.transpose(-1, -2)).float() * scaling + pad
    probs = scores.softmax(dim=-1).to(v.dtype)  # padded keys get exactly 0
    return torch.matmul(probs, v).transpose(0, 1).reshape(n, heads, v.shape[-1])


def exact_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """`attn_implementation="mars_exact"`: SDPA while no plan is set (prefill), else every query row
    attends to its own gathered keys, padded at the end to a multiple of EXACT_BUCKET. A row's
    result depends only on its visible keys and their count, never on the other rows of the tree."""
    groups = _PLAN.groups
    if groups is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = query.new_empty(query.shape[2], query.shape[1], value.shape[-1])  # [q, heads, d]
    kv_heads = key.shape[1]
    for rows, entries, pad in groups:
        n, length = entries.shape
        flat = entries.reshape(-1)
        k = key[0].index_select(1, flat).view(kv_heads, n, length, -1)
        v = value[0].index_select(1, flat).view(kv_heads, n, length, -1)
        out[rows] = _attend_rows(query[0][:, rows].transpose(0, 1), k, v, pad, scaling)
    return out[None], None


AttentionInterface.register(EXACT_ATTENTION, exact_attention_forward)


def exact_plan(prefix: int, depths: torch.Tensor, ancestors: torch.Tensor) -> list:
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


class PreallocatedLayer(DynamicLayer):
    """A `DynamicLayer` backed by a buffer with spare room; `keys`/`values` are views of its prefix."""

    def __init__(self, capacity: int = 256):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, dk = key_states.shape
        self._k = key_states.new_zeros(b, h, self.capacity, dk)
        self._v = value_states.new_zeros(b, h, self.capacity, value_states.shape[-1])
        self.is_initialized = True
        self._views()

    def _views(self) -> None:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self.length + n > self._k.shape[2]:  # out of room: grow once, by doubling
            grow = max(self.length + n, 2 * self._k.shape[2]) - self._k.shape[2]
            self._k = torch.cat([self._k, self._k.new_zeros(*self._k.shape[:2], grow, self._k.shape[3])], dim=2)
            self._v = torch.cat([self._v, self._v.new_zeros(*self._v.shape[:2], grow, self._v.shape[3])], dim=2)
        self._k[:, :, self.length : self.length + n] = key_states
        self._v[:, :, self.length : self.length + n] = value_states
        self.length += n
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        self.length = max(0, self.length + tokens_to_remove)
        if self.is_initialized:
            self._views()

    def keep(self, start: int, indices: torch.Tensor) -> None:
        """Keep entries start + indices (in that order) at start..start+len(indices); drop the rest."""
        if self.is_initialized:
            idx = indices.to(self._k.device) + start
            self._k[:, :, start : start + len(indices)] = self._k[:, :, idx]
            self._v[:, :, start : start + len(indices)] = self._v[:, :, idx]
        self.length = start + len(indices)
        if self.is_initialized:
            self._views()

    def reset(self) -> None:
        self.length = 0
        if self.is_initialized:
            self._views()


class TreeCache(DynamicCache):
    """A `DynamicCache` of `PreallocatedLayer`s, one per decoder layer, that can keep a tree path."""

    def __init__(self, config, capacity: int):
        super().__init__(config=config)
        num_layers = config.get_text_config(decoder=True).num_hidden_layers
        self.layers = [PreallocatedLayer(capacity) for _ in range(num_layers)]

    def keep(self, start: int, indices: torch.Tensor) -> None:
        for layer in self.layers:
            layer.keep(start, indices)


def text_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def context_length(config) -> int:
    return int(getattr(text_config(config), "max_position_embeddings", None) or 2**31)


class TargetModel:
    """A causal LM seen as: prefill, score a token tree on top of the cache, keep one path.

    `feature_layers` are indices into the model's `hidden_states` (the input of that decoder
    layer; the last index is the final, post-norm hidden state). Features are their concatenation.
    """

    def __init__(self, model, feature_layers: list[int] | None = None, exact_attention: bool = False):
        self.model = model
        self.config = text_config(model.config)
        n_layers = self.config.num_hidden_layers
        self.feature_layers = list(feature_layers or [n_layers])
        layer_types = list(getattr(self.config, "layer_types", None) or [])
        unsupported = sorted(set(layer_types) - set(SUPPORTED_LAYER_TYPES))
        if unsupported:
            raise NotImplementedError(
                f"layer types {unsupported} keep recurrent state that cannot be rolled back to a tree path; "
                f"supported: {SUPPORTED_LAYER_TYPES}"
            )
        window = getattr(self.config, "sliding_window", None)
        if getattr(self.config, "use_sliding_window", True) is False:
            window = None
        self.sliding_window = window
        # Models that build one mask per layer type take a dict; others take one tensor.
        self.mask_by_type = "sliding_attention" in layer_types
        if layer_types and not self.mask_by_type:
            self.sliding_window = None  # every layer attends fully
        self.cache: TreeCache | None = None
        self.max_length = context_length(model.config)
        self.exact_attention = exact_attention
        if exact_attention:
            if self.sliding_window is not None:
                raise NotImplementedError("exact_attention supports full-attention models only (no sliding window)")
            # The model keeps this implementation; with no plan set it is plain SDPA, so other uses are unchanged.
            model.set_attn_implementation(EXACT_ATTENTION)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def length(self) -> int:
        """Tokens committed to the KV cache."""
        return self.cache.layers[0].length

    def _mask(self, positions: torch.Tensor, tree_ancestors: torch.Tensor):
        """Additive 4D mask for queries at `positions` over (cache prefix + these queries)."""
        prefix = self.length
        q = positions.shape[0]
        allowed = torch.cat([torch.ones(q, prefix, dtype=torch.bool), tree_ancestors], dim=1).to(self.device)

        def additive(ok: torch.Tensor) -> torch.Tensor:
            m = torch.zeros(ok.shape, dtype=self.dtype, device=self.device)
            return m.masked_fill_(~ok, torch.finfo(self.dtype).min)[None, None]

        if self.sliding_window is None:
            return additive(allowed)
        key_pos = torch.cat([torch.arange(prefix, device=self.device), positions.to(self.device)])
        windowed = allowed & (positions.to(self.device)[:, None] - key_pos[None, :] < self.sliding_window)
        if self.mask_by_type:
            return {"full_attention": additive(allowed), "sliding_attention": additive(windowed)}
        return additive(windowed)

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, ancestors: torch.Tensor, all_logits: bool,
                 plan: list | None = None):
        _PLAN.groups = plan
        try:
            out = self.model(
                input_ids=tokens[None].to(self.device),
                position_ids=positions[None].to(self.device),
                attention_mask=None if plan else self._mask(positions, ancestors),
                past_key_values=self.cache,
                use_cache=True,
                output_hidden_states=True,
                logits_to_keep=0 if all_logits else 1,
            )
        finally:
            _PLAN.groups = None
        features = torch.cat([out.hidden_states[i][0] for i in self.feature_layers], dim=-1)
        return out.logits[0].float(), features

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Start a new sequence. Returns (logits at the last prompt token [V], features [T, F])."""
        self.cache = TreeCache(self.model.config, capacity)
        tokens = input_ids.reshape(-1)
        n = tokens.shape[0]
        logits, features = self._forward(tokens, torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril(), False)
        return logits[-1], features

    @torch.inference_mode()
    def verify(
        self, tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Score tree nodes placed after the cache (node i at position length + depths[i]).

        The nodes stay in the cache until `keep_path` selects which survive.
        Returns (logits [n, V] float32, features [n, F]).
        """
        plan = None
        if self.exact_attention:
            groups = exact_plan(self.length, depths, ancestors)
            plan = [tuple(t.to(self.device) for t in group) for group in groups]
        return self._forward(tokens, self.length + depths, ancestors, True, plan)

    def keep_path(self, prefix_length: int, nodes: list[int]) -> None:
        """After `verify`: keep the KV entries of `nodes` (tree indices) right after the prefix."""
        self.cache.keep(prefix_length, torch.tensor(nodes, dtype=torch.long))
