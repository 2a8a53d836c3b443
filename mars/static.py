"""Static shapes for the target: a full-capacity KV cache and fixed-size attention masks.

A captured graph (CUDA graphs, `torch.compile(mode="reduce-overhead")`) replays fixed kernels on
fixed buffers: every input must keep its shape, and the tensors it reads or writes in place their
addresses, from call to call. In static mode the target therefore runs two query shapes only:

- a tree forward of exactly `rows` queries (a smaller tree is padded with nodes that see the
  committed prefix and themselves; their logits and cache entries are discarded), and
- a plain decoding step of one query,

both over the whole cache, `width` = `max_cache_len` columns, with masks kept in buffers allocated
once (`StaticMasks`). The cache (`StaticTreeCache`) is transformers' `StaticCache` with the two
operations speculation needs on top: truncate to the committed length and keep an accepted path,
both on the device (the length is a device tensor updated in place, never read on the host).
"""

from __future__ import annotations

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from eagle.config import text_config

DEFAULT_MAX_CACHE_LEN = 2048  # entries, when the caller names none and the model's context is longer


class PathCache:
    """What a cache of the target adapter adds to transformers': keeping a tree path and truncating,
    layer by layer. Mixed into `mars.target.TreeCache` and `StaticTreeCache`, whose layers have
    `keep(start, indices)` and `truncate(length)`."""

    layers: list

    def keep(self, start: int, indices: torch.Tensor) -> None:
        """One gather per layer, with the indices copied once to each device the layers use."""
        on_device: dict[torch.device, torch.Tensor] = {}
        for layer in self.layers:
            where = layer.keys.device if layer.is_initialized else indices.device
            if where not in on_device:
                on_device[where] = indices.to(where)
            layer.keep(start, on_device[where])

    def truncate(self, length: int) -> None:
        for layer in self.layers:
            layer.truncate(length)


class StaticTreeLayer(StaticLayer):
    """A `StaticLayer` (full-capacity `keys`/`values` [1, kv_heads, max_cache_len, d] written at
    `cumulative_length`, a device tensor) that can drop its tail and keep a tree path."""

    def truncate(self, length: int) -> None:
        """Keep the first `length` entries: later writes start there (nothing is cleared: masks hide the rest)."""
        self.cumulative_length.fill_(length)

    def keep(self, start: int, indices: torch.Tensor) -> None:
        """Keep entries start + indices (in that order) at start..start+len(indices); drop the rest.
        indices [n] long, on this layer's device (as `PreallocatedLayer.keep`)."""
        n = indices.shape[0]
        if self.is_initialized:
            source = indices + start
            self.keys[:, :, start : start + n] = self.keys.index_select(2, source)
            self.values[:, :, start : start + n] = self.values.index_select(2, source)
        self.truncate(start + n)

    def reset(self) -> None:
        """An empty sequence, buffers kept (their contents are never read unmasked)."""
        self.truncate(0)


class StaticTreeCache(PathCache, StaticCache):
    """A `StaticCache` of `StaticTreeLayer`s, one per decoder layer, allocated at the first forward
    and then only written in place: its buffers keep their addresses for the generator's lifetime."""

    def __init__(self, config, max_cache_len: int):
        super().__init__(config=config, max_cache_len=max_cache_len)
        self.max_cache_len = max_cache_len
        self.layers = [StaticTreeLayer(max_cache_len) for _ in range(text_config(config).num_hidden_layers)]



class StaticMasks:
    """The additive masks of the two static query shapes, in buffers kept on the device.

    tree [1, 1, rows, width]: row i is tree node i (or padding) over the whole cache; step
    [1, 1, 1, width]: one decoding step. 0 where a query may attend, the dtype's min elsewhere. The
    committed prefix's columns are opened once and stay open while the sequence grows; a tree
    writes only its own `rows`-column block after the prefix (cleared again by the next tree), so
    a cycle writes O(rows * (rows + accepted)) entries, not O(rows * width).
    """

    def __init__(self, rows: int, width: int, dtype: torch.dtype, device: torch.device):
        self.rows, self.width = rows, width
        self.blocked = torch.finfo(dtype).min
        self.tree = torch.full((1, 1, rows, width), self.blocked, dtype=dtype, device=device)
        self.step = torch.full((1, 1, 1, width), self.blocked, dtype=dtype, device=device)
        self._self_only = torch.eye(rows, dtype=torch.bool, device=device)  # pad rows: themselves only
        # Fixed addresses: a captured graph reads them in place instead of copying them in per call.
        torch._dynamo.mark_static_address(self.tree)
        torch._dynamo.mark_static_address(self.step)
        self._tree_open = 0  # prefix columns open in `tree`
        self._step_open = 0  # columns open in `step`
        self._block_at: int | None = None  # first column of the tree block written last

    def reset(self) -> None:
        """Every column closed (a new sequence)."""
        self.tree.fill_(self.blocked)
        self.step.fill_(self.blocked)
        self._tree_open = self._step_open = 0
        self._block_at = None

    def for_tree(self, prefix: int, ancestors: torch.Tensor) -> torch.Tensor:
        """The mask of a tree of n <= rows nodes at columns prefix.. (ancestors [n, n] bool on the
        buffers' device, True where j is i or an ancestor of i); nodes n.. are padding."""
        n = ancestors.shape[0]
        if prefix < self._tree_open:  # the sequence was shortened: start over
            self.reset()
        rows = self.tree[0, 0]
        if self._block_at is not None:
            rows[:, self._block_at : self._block_at + self.rows] = self.blocked
        rows[:, self._tree_open : prefix] = 0.0
        self._tree_open = prefix
        block = self._self_only.clone()
        block[:n, :n] = ancestors
        rows[:, prefix : prefix + self.rows] = torch.where(block, 0.0, self.blocked)
        self._block_at = prefix
        return self.tree

    def for_step(self, prefix: int) -> torch.Tensor:
        """The mask of one query at column `prefix`: it sees the prefix and itself."""
        if prefix + 1 < self._step_open:
            self.reset()
        self.step[0, 0, 0, self._step_open : prefix + 1] = 0.0
        self._step_open = prefix + 1
        return self.step


def pad_to(values: torch.Tensor, length: int) -> torch.Tensor:
    """values [n] -> [length], zeros appended (on the values' device: no upload)."""
    return torch.cat([values, values.new_zeros(length - values.shape[0])])
