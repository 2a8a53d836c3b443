"""The target's KV caches: transformers' caches that can keep a tree path and drop the rest.

After a tree forward the cache holds the committed sequence and then every tree node; `keep`
moves the accepted path's entries to follow the sequence and drops the rest, `truncate` drops a
tail. Two kinds, one interface (`PathCache`):
- `TreeCache`: a `DynamicCache` of `PreallocatedLayer`s, written into buffers with spare room
  (growing by concatenation cost a third of small-model decode time), one per sequence;
- `StaticTreeCache`: a `StaticCache` of `StaticTreeLayer`s, full-capacity buffers made once and
  written in place, whose length is a device tensor (static shapes, `mars.adapter.static`).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import StaticLayer

from compute.growing_cache import PreallocatedLayer  # noqa: F401  (re-exported for mars.adapter)
from eagle.config import cache_keyword, text_config  # noqa: F401  (cache_keyword: re-exported for mars.adapter)


class PathCache:
    """What a cache of the target adapter adds to transformers': keeping a tree path and truncating,
    layer by layer. Mixed into `TreeCache` and `StaticTreeCache`, whose layers have
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

    def keep_rows(self, put: torch.Tensor, take: torch.Tensor) -> None:
        """Batched decoding: in every row b, entries take[b] move to put[b] ([B, m] each; `compute.ragged`)."""
        on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        for layer in self.layers:
            where = layer.keys.device
            if where not in on_device:
                on_device[where] = put.to(where), take.to(where)
            layer.keep_rows(*on_device[where])

    def select_rows(self, rows: torch.Tensor) -> None:
        """Batched decoding: keep only these rows of the batch (finished sequences leave)."""
        for layer in self.layers:
            layer.select_rows(rows.to(layer.keys.device))


class TreeCache(PathCache, DynamicCache):
    """A `DynamicCache` of `PreallocatedLayer`s, one per decoder layer, that can keep a tree path."""

    def __init__(self, config, capacity: int):
        super().__init__(config=config)
        num_layers = text_config(config).num_hidden_layers
        self.capacity = capacity
        self.layers = [PreallocatedLayer(capacity) for _ in range(num_layers)]

    @classmethod
    def stacked(cls, config, caches: list[TreeCache]) -> TreeCache:
        """The rows of a batch (`compute.ragged`) from one-sequence caches of equal capacity, row b = caches[b]."""
        out = cls(config, caches[0].capacity)
        out.layers = [PreallocatedLayer.stacked([c.layers[i] for c in caches]) for i in range(len(out.layers))]
        return out


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
        self.layers = [StaticTreeLayer(max_cache_len) for _ in range(text_config(config).num_hidden_layers)]
