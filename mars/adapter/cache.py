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
from transformers.cache_utils import DynamicLayer, StaticLayer

from eagle.config import cache_keyword, text_config  # noqa: F401  (cache_keyword: re-exported for mars.adapter)
from eagle.rows import move_rows


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
        """Batched decoding: in every row b, entries take[b] move to put[b] ([B, m] each; `eagle.rows`)."""
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

    def truncate(self, length: int) -> None:
        """Keep the first `length` entries."""
        self.length = min(self.length, length)
        if self.is_initialized:
            self._views()

    def keep(self, start: int, indices: torch.Tensor) -> None:
        """Keep entries start + indices (in that order) at start..start+len(indices); drop the rest.
        indices: on this layer's device (`TreeCache.keep` moves them once per device)."""
        if self.is_initialized:
            idx = indices + start
            self._k[:, :, start : start + len(indices)] = self._k[:, :, idx]
            self._v[:, :, start : start + len(indices)] = self._v[:, :, idx]
        self.length = start + len(indices)
        if self.is_initialized:
            self._views()

    def keep_rows(self, put: torch.Tensor, take: torch.Tensor) -> None:
        move_rows(self._k, put, take)
        move_rows(self._v, put, take)

    @classmethod
    def stacked(cls, layers: list[PreallocatedLayer]) -> PreallocatedLayer:
        """One layer whose rows are these one-sequence layers' (equal capacities), written at the longest one's end."""
        out = cls(layers[0].capacity)
        out.dtype, out.device, out.is_initialized = layers[0].dtype, layers[0].device, True
        out._k = torch.cat([layer._k for layer in layers])
        out._v = torch.cat([layer._v for layer in layers])
        out.length = max(layer.length for layer in layers)
        out._views()
        return out

    def select_rows(self, rows: torch.Tensor) -> None:
        self._k, self._v = self._k.index_select(0, rows), self._v.index_select(0, rows)
        self._views()

    def reset(self) -> None:
        self.length = 0
        if self.is_initialized:
            self._views()


class TreeCache(PathCache, DynamicCache):
    """A `DynamicCache` of `PreallocatedLayer`s, one per decoder layer, that can keep a tree path."""

    def __init__(self, config, capacity: int):
        super().__init__(config=config)
        num_layers = text_config(config).num_hidden_layers
        self.capacity = capacity
        self.layers = [PreallocatedLayer(capacity) for _ in range(num_layers)]

    @classmethod
    def stacked(cls, config, caches: list[TreeCache]) -> TreeCache:
        """The rows of a batch (`eagle.rows`) from one-sequence caches of equal capacity, row b = caches[b]."""
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
