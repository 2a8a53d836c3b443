"""A KV cache layer that grows in place: transformers' `DynamicLayer` concatenates every new entry onto
the whole cache, one full copy of every layer's keys and values per decode step. On SmolLM2 (30 layers)
with 64 rows of ~300 tokens that copy took two thirds of each step on a 2-core AVX2 EPYC. A
`PreallocatedLayer` writes into a buffer with spare room and doubles it when full.

Used by the target adapter's tree caches (`mars.adapter.cache`) and by the draft-training answerer
(`eagle.train.answering`, through `GrownCache`).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from compute.ragged import move_rows


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

    @classmethod
    def holding(cls, keys: torch.Tensor, values: torch.Tensor, room: int) -> PreallocatedLayer:
        """A layer holding `keys`/`values` [rows, heads, length, dim] with room for `room` more entries."""
        out = cls(keys.shape[2] + room)
        out.update(keys, values)
        return out


class GrownCache(DynamicCache):
    """A `DynamicCache` of `PreallocatedLayer`s, filled from per-layer (keys, values) [rows, heads, length, dim]
    with room for `room` more entries before a layer first doubles."""

    def __init__(self, kv: list[tuple[torch.Tensor, torch.Tensor]], room: int):
        super().__init__()
        self.layers = [PreallocatedLayer.holding(k, v, room) for k, v in kv]
        self.layer_class_to_replicate = None
