"""Static shapes for the target: fixed query shapes over a full-capacity KV cache and fixed-size masks.

A captured graph (CUDA graphs, `torch.compile(mode="reduce-overhead")`) replays fixed kernels on
fixed buffers: every input must keep its shape, and the tensors it reads or writes in place their
addresses, from call to call. In static mode the target therefore runs two query shapes only:

- a tree forward of exactly `rows` queries (a smaller tree is padded with nodes that see the
  committed prefix and themselves; their logits and cache entries are discarded), and
- a plain decoding step of one query,

both over the whole cache, `width` = `max_cache_len` columns, with masks kept in buffers allocated
once (`StaticMasks`). The cache (`mars.adapter.cache.StaticTreeCache`) is transformers'
`StaticCache` with the two operations speculation needs on top: truncate to the committed length
and keep an accepted path, both on the device (the length is a device tensor updated in place,
never read on the host). `StaticShapes` is static mode whole: its settings, cache, masks, the
prefill, the tree forward and the (compiled) step; the adapter delegates to it.
"""

from __future__ import annotations

import os

import torch

from eagle.tree import DraftTree
from mars.adapter.cache import StaticTreeCache, cache_keyword
from mars.adapter.routing import ROUTE_KWARG

DEFAULT_MAX_CACHE_LEN = 2048  # entries, when the caller names none and the model's context is longer


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


def check_static_options(static: bool, compile: str | None, max_cache_len: int | None) -> None:
    """Refuse, with the fix, static-shape options given without static shapes or of the wrong kind (what a
    generator's arguments and a run's `model.static`, `model.compile`, `model.max_cache_len` both need)."""
    if not static:
        if compile is not None or max_cache_len is not None:
            raise ValueError("compile and max_cache_len apply to static shapes: pass static=True as well "
                             "(model.static=true in a run's config)")
        return
    if max_cache_len is not None and (not isinstance(max_cache_len, int) or isinstance(max_cache_len, bool)
                                      or max_cache_len < 1):
        raise ValueError(f"max_cache_len must be an integer >= 1, got {max_cache_len!r}")
    if compile is not None and not isinstance(compile, str):
        raise ValueError(f"compile must be a torch.compile mode name such as 'default' or "
                         f"'reduce-overhead', got {compile!r}")


def check_static_settings(static: bool, *, sliding_window: int | None, exact_attention: bool,
                          compile: str | None, max_cache_len: int | None) -> None:
    """Refuse, with the fix, the settings static shapes cannot run (before the model is touched)."""
    check_static_options(static, compile, max_cache_len)
    if not static:
        return
    if sliding_window is not None:
        raise NotImplementedError("static shapes support full-attention models only (no sliding window): "
                                  "pass static=False for this model")
    if exact_attention:
        raise ValueError("exact attention gathers each tree row's own keys, in shapes that change from tree to "
                         "tree, so it cannot run with static shapes: pass exact_attention=False (or 'auto')")


ISA_LIMIT_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def separate_inductor_cache() -> None:
    """Under `ATEN_CPU_CAPABILITY` / `ONEDNN_MAX_CPU_ISA` limits, compile into an inductor cache of their
    own (unless the user chose one with TORCHINDUCTOR_CACHE_DIR). inductor's on-disk cache is not keyed
    by these limits: kernels compiled by an unlimited process on an AVX-512 CPU, reused by a process
    limited to AVX2, gave NaN tree logits (torch 2.13; `tests/test_static.py` under the limits)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    limits = [f"{name}={os.environ[name]}" for name in ISA_LIMIT_VARIABLES if os.environ.get(name)]
    default = os.path.abspath(default_cache_dir())
    # Importing torch._inductor writes its default into the variable: that value is not a user's choice.
    if limits and os.environ.get("TORCHINDUCTOR_CACHE_DIR", default) == default:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(default, "limited-" + "-".join(limits).lower())


class StaticShapes:
    """Static mode of the target adapter: one `StaticTreeCache` of `max_cache_len` entries made
    here, once, and reused by every sequence; every tree padded to `tree_rows` queries (None: the
    tree's own size); masks of width `max_cache_len` in buffers (made at the first prefill).

    compile: a `torch.compile` mode for the tree forward and the decoding step (`step`), or None
    (eager). The prefill stays eager and of the prompt's length. The model's forward is asked for
    the feature layers' hidden states only (`output_hidden_states=[...]`): hooks would change what a
    compiled forward is guarded on at every call, and a compiled graph keeps no other states.
    """

    def __init__(self, model, *, feature_layers: list[int], feature_device: torch.device, dtype: torch.dtype,
                 device: torch.device, maskless: str | None, max_length: int, max_cache_len: int | None,
                 tree_rows: int | None, compile: str | None):
        self.model = model
        self.feature_layers, self.feature_device = feature_layers, feature_device
        self.dtype, self.device = dtype, device
        self.extra = {ROUTE_KWARG: maskless} if maskless else {}  # forward keywords of a routed model
        self.tree_rows = tree_rows
        if max_cache_len is None:
            max_cache_len = min(DEFAULT_MAX_CACHE_LEN, max_length + (tree_rows or 1))
        self.max_cache_len = max_cache_len
        self.cache = StaticTreeCache(model.config, max_cache_len)
        self.cache_keyword = cache_keyword(model)
        self.masks: StaticMasks | None = None  # made at the first prefill
        self.compile_mode = compile
        # dynamic=False: one graph per query shape (the tree's, the decoding step's), never per length.
        if compile is not None:
            separate_inductor_cache()
        self.step = self._step if compile is None else torch.compile(self._step, mode=compile, dynamic=False)

    def _step(self, tokens: torch.Tensor, positions: torch.Tensor,
              mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens, positions [1, q] and mask [1, 1, q, max_cache_len] -> (logits [q, V] float32,
        features [q, F]), the q entries written into the cache at its length. What `compile`
        compiles: tensors in and out, the cache updated in place, no hooks."""
        return self._forward(tokens, positions, mask, 0)

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                 logits_to_keep: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A forward over the static cache; the features from transformers' hidden states."""
        out = self.model(input_ids=tokens, position_ids=positions, attention_mask=mask, use_cache=True,
                         output_hidden_states=self.feature_layers, logits_to_keep=logits_to_keep,
                         **{self.cache_keyword: self.cache}, **self.extra)
        features = torch.cat([out.hidden_states[i][0].to(self.feature_device) for i in self.feature_layers], dim=-1)
        return out.logits[0].float(), features

    def masks_for(self, rows: int | None = None) -> StaticMasks:
        """The mask buffers, made again only when a tree needs another row count (a new shape)."""
        if self.masks is None or (rows is not None and self.masks.rows != rows):
            self.masks = StaticMasks(rows or self.tree_rows or 1, self.max_cache_len, self.dtype, self.device)
        return self.masks

    def prefill(self, tokens: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt `tokens` [T] (on `device`) into the same cache, emptied; eager, of the prompt's
        length. Returns (logits of the last prompt token [1, V] float32, features [T, F]).

        The causal mask [1, 1, T, max_cache_len] (additive, as every attention implementation takes
        it) is ours: transformers would build the same from the cache's length, but reads that device
        tensor on the host to do so."""
        if capacity > self.max_cache_len:
            raise ValueError(f"this sequence needs {capacity} cache entries but the static cache holds "
                             f"max_cache_len={self.max_cache_len}: pass a larger max_cache_len")
        self.cache.truncate(0)
        self.masks_for(self.tree_rows).reset()
        positions = torch.arange(tokens.shape[0], device=tokens.device)
        future = torch.arange(self.max_cache_len, device=tokens.device)[None, :] > positions[:, None]
        mask = torch.zeros(future.shape, dtype=self.dtype, device=tokens.device).masked_fill_(
            future, torch.finfo(self.dtype).min)
        return self._forward(tokens[None], positions[None], mask[None, None], 1)

    def score(self, tree: DraftTree, committed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A tree placed after `committed` tokens: a lone root as one decoding step, any other tree
        padded to `tree_rows` queries (the pad nodes, at the root's position, see the prefix and
        themselves). Under CUDA graphs the results are views of the graph's output buffers, valid
        until the next tree forward or decoding step (the loop consumes them before)."""
        n, device = tree.size, self.device
        if self.tree_rows is not None and n > self.tree_rows:
            raise ValueError(f"a tree of {n} nodes does not fit the static tree forward of {self.tree_rows} rows")
        self.cache.truncate(committed)
        tokens, depths = tree.tokens.to(device), tree.depths.to(device)
        if n == 1:
            mask = self.masks_for().for_step(committed)
        else:
            rows = self.tree_rows or n
            tokens, depths = pad_to(tokens, rows), pad_to(depths, rows)
            mask = self.masks_for(rows).for_tree(committed, tree.ancestors.to(device))
        if self.compile_mode is not None:
            # The previous step's outputs are consumed: CUDA graphs may overwrite them (reduce-overhead).
            torch.compiler.cudagraph_mark_step_begin()
        logits, features = self.step(tokens[None], (committed + depths)[None], mask)
        return logits[:n], features[:n]
