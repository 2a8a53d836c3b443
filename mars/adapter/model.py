"""One adapter for any Hugging Face causal LM as the target of speculative decoding.

It uses only transformers' public machinery: its own caches (`mars.adapter.cache`), custom 4D
attention masks (returned as-is by transformers' mask builders), explicit `position_ids`, forward
hooks (or `output_hidden_states`) for the draft's features (`mars.adapter.taps`), and attention
functions registered with `AttentionInterface` (`mars.adapter.exact`, `mars.adapter.routing`) that
receive what they need as forward keyword arguments, the way transformers hands attention kwargs
down to every layer. Static shapes are `mars.adapter.static`'s. No modeling file is copied.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.nn.utils.rnn import pad_sequence

from compute.ragged import RowLengths, kept_columns
from eagle.config import text_config
from eagle.precision import needs_exact_attention
from eagle.tree import DraftTree
from mars.adapter.cache import StaticTreeCache, TreeCache, cache_keyword
from mars.adapter.devices import route_devices
from mars.adapter.exact import EXACT_ATTENTION, PLAN_KWARG, ExactPlan, exact_plan, exact_plan_rows, exact_route
from mars.adapter.routing import GQA_KWARG, ROUTE_KWARG, gqa_route, maskless_implementation, tree_route
from mars.adapter.static import StaticMasks, StaticShapes, check_static_settings
from mars.adapter.taps import FeatureTaps

SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")


def context_length(config) -> int:
    return int(getattr(text_config(config), "max_position_embeddings", None) or 2**31)


class TargetModel:
    """A causal LM seen as: prefill, score a token tree on top of the cache, keep one path.

    `feature_layers` are indices into the model's `hidden_states` (the input of that decoder
    layer; the last index is the final, post-norm hidden state). Features are their concatenation,
    gathered to `feature_device` (the draft head's). With `exact_attention` the model's attention
    implementation is switched to "mars_exact" until `close()` restores the previous one; "auto"
    turns it on where plain verification would not reproduce plain decoding (a bf16/fp16
    full-attention model; `eagle.precision.needs_exact_attention`).

    static: fixed shapes (`mars.adapter.static.StaticShapes`, to which the adapter then delegates its
    forwards), so that the tree forward and the decoding step can be captured (CUDA graphs) or
    compiled once: a `StaticTreeCache` of `max_cache_len` entries made here, once, and reused by
    every sequence; every tree padded to `tree_rows` queries (None: the tree's own size); masks of
    width `max_cache_len` in buffers. Full-attention models only, without exact attention ("auto"
    resolves to off). The prefill stays eager and of the prompt's length.
    compile: a `torch.compile` mode ("default", "reduce-overhead", "max-autotune", ...) for the
    static tree forward and decoding step (needs `static`). Each shape compiles at its first call;
    dynamo keeps the code for the process, guarded on shapes, not on the cache's or weights'
    addresses, so later adapters of the same architecture and tree size reuse it.
    """

    def __init__(self, model, feature_layers: list[int] | None = None, exact_attention: bool | str = False,
                 feature_device: torch.device | str | None = None, *, static: bool = False,
                 max_cache_len: int | None = None, tree_rows: int | None = None, compile: str | None = None):
        self.model = model
        self.config = text_config(model.config)
        n_layers = self.config.num_hidden_layers
        self.feature_layers = list(feature_layers or [n_layers])
        self.taps: FeatureTaps | None = None  # hooks on the model, only inside `tapped()`
        self._read_layer_types()
        self.devices = route_devices(model)
        self.all_devices = {p.device for p in model.parameters()}  # a sharded model: every device it uses
        self.feature_device = torch.device(feature_device) if feature_device is not None else self.devices.inputs
        self.dtype = model.get_input_embeddings().weight.dtype
        self.cache: TreeCache | StaticTreeCache | None = None
        self.cache_keyword = cache_keyword(model)  # `cache`, or `past_key_values` before transformers 5.24
        self._mask_buffer: torch.Tensor | None = None  # tree masks are written into it (see `_tree_mask`)
        self._mask_written = (0, 0, 0)  # rows, first and last column the previous tree mask wrote
        self.committed = 0  # tokens of the sequence in the cache; tree nodes sit after them until keep_path
        self.rows: RowLengths | None = None  # batched decoding: tokens of each sequence in the cache
        self.max_length = context_length(model.config)
        self.exact_attention: bool = self._resolved_exact(exact_attention, static=static, compile=compile,
                                                          max_cache_len=max_cache_len)
        # The model's own implementation, when it takes no tree mask: kept for maskless calls (routed).
        self.maskless = None if self.exact_attention else maskless_implementation(model.config._attn_implementation)
        self.static = static
        self.shapes: StaticShapes | None = None
        if static:
            self.shapes = StaticShapes(model, feature_layers=self.feature_layers, feature_device=self.feature_device,
                                       dtype=self.dtype, device=self.devices.inputs, maskless=self.maskless,
                                       max_length=self.max_length, max_cache_len=max_cache_len, tree_rows=tree_rows,
                                       compile=compile)
            self.cache = self.shapes.cache
        self._restore_attention: str | None = None
        self._route_attention()

    def _read_layer_types(self) -> None:
        """Refuse layers whose state cannot roll back to a tree path; read the sliding window and whether masks
        go per layer type."""
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

    def _resolved_exact(self, exact_attention: bool | str, *, static: bool, compile: str | None,
                        max_cache_len: int | None) -> bool:
        """Exact attention on or off ("auto": where plain verification would not reproduce plain decoding),
        checked with the static settings it must agree with."""
        if exact_attention == "auto":
            exact_attention = needs_exact_attention(self.dtype) and self.sliding_window is None and not static
        elif not isinstance(exact_attention, bool):
            raise ValueError(f"exact_attention must be True, False or 'auto', got {exact_attention!r}")
        check_static_settings(static, sliding_window=self.sliding_window, exact_attention=exact_attention,
                              compile=compile, max_cache_len=max_cache_len)
        if exact_attention and self.sliding_window is not None:
            raise NotImplementedError("exact_attention supports full-attention models only (no sliding window): "
                                      "pass exact_attention=False or 'auto' (model.exact_attention=false)")
        return exact_attention

    def _route_attention(self) -> None:
        """Switch the model's attention to the adapter's (exact, a maskless model's tree route, or SDPA's GQA
        mode on CPU) where one is needed, keeping the model's own to restore at `close`."""
        model, exact_attention, static = self.model, self.exact_attention, self.static
        # An SDPA model with grouped-query attention on CPU: tree forwards without transformers' repeated keys.
        gqa = None if exact_attention or self.maskless or static else \
            gqa_route(model, model.config._attn_implementation, self.devices.inputs)
        self.gqa = gqa is not None
        if exact_attention or self.maskless or gqa:
            implementation = exact_route() if exact_attention else tree_route(self.maskless) if self.maskless else gqa
            self._restore_attention = model.config._attn_implementation
            model.set_attn_implementation(implementation)

    @property
    def own_attention(self) -> str:
        """The model's own attention implementation (what `model.generate` decodes with), before this adapter's."""
        return self._restore_attention or self.model.config._attn_implementation

    # --- static mode's settings, as the adapter's (`self.shapes` holds them) --------------------

    @property
    def tree_rows(self) -> int | None:
        """Static mode: the query rows every tree is padded to (None: the tree's own size)."""
        return self.shapes.tree_rows if self.shapes is not None else None

    @tree_rows.setter
    def tree_rows(self, rows: int | None) -> None:
        if self.shapes is not None:
            self.shapes.tree_rows = rows

    @property
    def max_cache_len(self) -> int | None:
        """Static mode: the entries of the one cache (None: a dynamic cache, sized per sequence)."""
        return self.shapes.max_cache_len if self.shapes is not None else None

    @property
    def masks(self) -> StaticMasks | None:
        """Static mode: the mask buffers of the current tree shape (None before the first prefill)."""
        return self.shapes.masks if self.shapes is not None else None

    @contextmanager
    def tapped(self):
        """Inside: the draft's features are captured by hooks instead of `output_hidden_states` (where
        the model's layers can be found); outside, the model carries no hooks of ours. Static mode
        installs none (see `StaticShapes`)."""
        if self.static or self.taps is not None or not FeatureTaps.fits(self.model):
            yield self
            return
        self.taps = FeatureTaps(self.model, self.feature_layers)
        try:
            yield self
        finally:
            self.taps.remove()
            self.taps = None

    @contextmanager
    def exact_plans(self, exact: bool):
        """Inside: forwards make exact attention's per-row plans or not (`exact` False: the model's own SDPA
        over a mask; cheaper for a lone decoding row, ~2.4 ms of a 25 ms SmolLM2 bf16 step on the AVX-512
        EPYC). Turning them on needs an adapter built with exact attention (its implementation in place)."""
        if exact and not self.exact_attention:
            raise ValueError("exact attention plans need an adapter built with exact_attention=True")
        before, self.exact_attention = self.exact_attention, exact
        try:
            yield self
        finally:
            self.exact_attention = before

    def close(self) -> None:
        """Give the model back its own attention implementation (when exact attention took it over)."""
        if self._restore_attention is not None:
            self.model.set_attn_implementation(self._restore_attention)
            self._restore_attention = None

    def _tree_mask(self, ancestors: torch.Tensor) -> torch.Tensor | None:
        """Additive mask [1, 1, q, committed + q] of a tree's q queries, a view of a buffer kept on the
        device: the committed prefix's columns stay 0 (visible to every node) from cycle to cycle,
        only the tree's own q x q block is written, and last cycle's block is cleared first."""
        q, prefix, device = ancestors.shape[0], self.committed, self.devices.inputs
        if q == 1:  # a lone root sees the whole sequence: the model's own masking (flash where it has it)
            return None
        width = prefix + q
        buf = self._mask_buffer
        if buf is None or buf.shape[0] < q or buf.shape[1] < width:
            rows = max(q, buf.shape[0] if buf is not None else 0)
            cols = max(width, self.cache.capacity if self.cache is not None else 0)
            buf = self._mask_buffer = torch.zeros(rows, cols, dtype=self.dtype, device=device)
        else:
            r, c0, c1 = self._mask_written
            buf[:r, c0:c1] = 0.0
        block = buf[:q, prefix:width]
        block.copy_(torch.where(ancestors.to(device), 0.0, torch.finfo(self.dtype).min))
        self._mask_written = (q, prefix, width)
        return buf[:q, :width][None, None]

    def _mask(self, positions: torch.Tensor, tree_ancestors: torch.Tensor):
        """Additive 4D mask for queries at `positions` over (cache prefix + these queries)."""
        if self.sliding_window is None:
            return self._tree_mask(tree_ancestors)
        prefix, device = self.committed, self.devices.inputs
        q = positions.shape[0]
        positions, tree_ancestors = positions.to(device), tree_ancestors.to(device)
        allowed = torch.cat([torch.ones(q, prefix, dtype=torch.bool, device=device), tree_ancestors], dim=1)

        def additive(ok: torch.Tensor) -> torch.Tensor:
            m = torch.zeros(ok.shape, dtype=self.dtype, device=device)
            return m.masked_fill_(~ok, torch.finfo(self.dtype).min)[None, None]

        key_pos = torch.cat([torch.arange(prefix, device=device), positions])
        windowed = allowed & (positions[:, None] - key_pos[None, :] < self.sliding_window)
        if self.mask_by_type:
            return {"full_attention": additive(allowed), "sliding_attention": additive(windowed)}
        return additive(windowed)

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask, logits_to_keep: int | torch.Tensor,
                 plan: ExactPlan | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens, positions [B, q] -> (logits [B, kept, V] float32, features [B, q, F]).
        mask: an additive 4D mask (or one per layer type), or None for the model's own causal mask.
        logits_to_keep: 0 for every position, 1 for the last, or a tensor of positions (transformers')."""
        extra = {ROUTE_KWARG: self.maskless} if self.maskless else {GQA_KWARG: True} if self.gqa else {}
        if plan is not None:
            if self.model.config._attn_implementation != EXACT_ATTENTION:
                raise RuntimeError("the target's attention implementation is no longer 'mars_exact' (was a "
                                   "SpeculativeGenerator sharing this model closed?): create a new generator")
            extra[PLAN_KWARG] = plan
        out = self.model(
            input_ids=tokens.to(self.devices.inputs),
            position_ids=positions.to(self.devices.inputs),
            attention_mask=mask,
            use_cache=True,
            output_hidden_states=self.taps is None,
            logits_to_keep=logits_to_keep,
            **{self.cache_keyword: self.cache},
            **extra,
        )
        # Taps of a sharded model come from several devices: gathered to the draft head's.
        taps = self.taps.captured if self.taps is not None else dict(enumerate(out.hidden_states))
        features = torch.cat([taps[i].to(self.feature_device) for i in self.feature_layers], dim=-1)
        if self.taps is not None:
            self.taps.captured.clear()
        return out.logits.float(), features

    def end_sequence(self) -> None:
        """Forget the sequence: a dynamic cache is freed, the static one kept (empty) for the next."""
        self.committed = 0
        if self.static:
            self.cache.truncate(0)
        else:
            self.cache = None

    # --- the adapter's operations ------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Start a new sequence. Returns (logits at the last prompt token [V], features [T, F]).
        capacity: the cache entries the sequence may need (static mode: checked against max_cache_len)."""
        tokens = input_ids.reshape(-1).to(self.devices.inputs)
        n, device = tokens.shape[0], self.devices.inputs
        self.committed = 0
        if self.shapes is not None:
            logits, features = self.shapes.prefill(tokens, capacity)
            self.committed = n
            return logits[-1], features
        self.cache = TreeCache(self.model.config, capacity)
        self._mask_buffer = None  # sized for this sequence at the first tree
        # No explicit mask: the model's own causal masking (flash/SDPA's causal kernels where it has them).
        logits, features = self._forward(tokens[None], torch.arange(n, device=device)[None], None, 1)
        self.committed = n
        return logits[0, -1], features[0]

    @torch.inference_mode()
    def score_tree(self, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over every tree node, placed after the committed sequence (node i at position
        committed + depth i, attending to the sequence and its own ancestors).

        The nodes stay in the cache until `keep_path` selects which survive; scoring another tree
        first discards them. Returns (logits [n, V] float32 on `devices.logits`, features [n, F]).
        """
        if self.shapes is not None:
            return self.shapes.score(tree, self.committed)
        self.cache.truncate(self.committed)
        depths = tree.depths.to(self.devices.inputs)
        plan = None
        if self.exact_attention:
            plan = exact_plan(self.committed, depths, tree.ancestors.to(self.devices.inputs), tree.levels)
        positions = self.committed + depths
        mask = None if plan is not None else self._mask(positions, tree.ancestors)
        logits, features = self._forward(tree.tokens[None], positions[None], mask, 0, plan)
        return logits[0], features[0]

    def keep_path(self, path: list[int], index: torch.Tensor | None = None) -> None:
        """After `score_tree`: commit the nodes of `path` (tree indices, root first) to the sequence.
        index: the same path as a tensor on a device, when the caller has one (saves an upload)."""
        if path == list(range(len(path))):  # already in place (e.g. a lone root): no copy
            self.cache.truncate(self.committed + len(path))
        else:
            self.cache.keep(self.committed, index if index is not None else torch.tensor(path, dtype=torch.long))
        self.committed += len(path)

    # --- batched decoding: B sequences of different lengths in one cache (`compute.ragged`) ---------------

    def check_batching(self) -> None:
        """Raise a ValueError naming the setting if this adapter cannot decode a batch."""
        if self.static:
            raise ValueError("batched decoding runs on the dynamic cache: create the generator with static=False "
                             "(static shapes and compile are batch-1 only for now)")

    @torch.inference_mode()
    def prefill_rows(self, prompts: list[torch.Tensor], capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Start B sequences, one per prompt [T_b]: each prompt's prefill alone, then their caches as the rows
        of one (`TreeCache.stacked`). Why not one right-padded forward: for a prompt shorter than the
        longest, attention and products over the padded batch reduce in another order than over the prompt
        alone (on the embedded target, last-token logits 4e-6 apart in float32, 0.03 in bf16), and every row
        must start from exactly its prompt's prefill; one prompt tensor given for several rows is prefilled once,
        its rows copies of that prefill (the same forward would give the same cache). capacity: cache entries per row.
        Returns (logits at each prompt's last token [B, V], features [B, max T_b, F]).

        One prompt is one sequence (`prefill`; `rows` stays None): the `*_rows` operations then run the
        single-sequence ones, which static shapes, compile and exact attention's plans are built for."""
        if len(prompts) == 1:
            self.rows = None
            logits, features = self.prefill(prompts[0], capacity)
            return logits[None], features[None]
        self.check_batching()
        caches, logits, features = [], [], []
        # One tensor given for several rows (k samples of one question, pass@k) is one forward. Told by identity:
        # comparing prompts' values would read them on the host, a wait on a GPU (`mars.diagnostics.syncs`).
        done: dict[int, tuple] = {}
        for prompt in prompts:
            if id(prompt) not in done:
                last, feature = self.prefill(prompt, capacity)
                done[id(prompt)] = (self.cache, last, feature)
            cache, last, feature = done[id(prompt)]
            caches.append(cache)
            logits.append(last)
            features.append(feature)
        self.committed = 0  # batched: the rows' lengths say what is committed
        self.cache = TreeCache.stacked(self.model.config, caches)
        self.rows = RowLengths.of([len(p) for p in prompts], self.devices.inputs)
        return torch.stack(logits), pad_sequence(features, batch_first=True)

    def _row_mask(self, positions: torch.Tensor, ancestors: torch.Tensor, start: int):
        """Additive mask [B, 1, q, start + q] of each row's queries at `positions` [B, q] over the cache's
        first `start` columns (row b sees its first rows[b]) and the new block (ancestors [B, q, q])."""
        b, q = positions.shape
        device = self.devices.inputs
        allowed = torch.cat([self.rows.prefix_visible(start)[:, None, :].expand(b, q, start), ancestors.to(device)], 2)

        def additive(ok: torch.Tensor) -> torch.Tensor:
            mask = torch.zeros(ok.shape, dtype=self.dtype, device=device)
            return mask.masked_fill_(~ok, torch.finfo(self.dtype).min)[:, None]

        if self.sliding_window is None:
            return additive(allowed)
        key_positions = torch.cat([torch.arange(start, device=device).expand(b, start), positions], dim=1)
        windowed = allowed & (positions[:, :, None] - key_positions[:, None, :] < self.sliding_window)
        if self.mask_by_type:
            return {"full_attention": additive(allowed), "sliding_attention": additive(windowed)}
        return additive(windowed)

    @torch.inference_mode()
    def score_rows(self, forest: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        """`score_tree` for a forest of B trees (`DraftTree.forest`), row b's tree after row b's sequence,
        in one forward. Returns (logits [B n, V] float32, features [B n, F]), nodes in forest order."""
        if self.rows is None:  # one sequence (`prefill_rows` of one prompt)
            return self.score_tree(forest)
        start = self.rows.write_at
        self.cache.truncate(start)
        device = self.devices.inputs
        depths = forest.by_row(forest.depths).to(device)
        positions = self.rows.device[:, None] + depths
        plan = mask = None
        if self.exact_attention:
            span, ancestors = (min(self.rows.host), max(self.rows.host)), forest.row_ancestors.to(device)
            plan = exact_plan_rows(self.rows.device, span, start, depths, ancestors, forest.levels)
        else:
            mask = self._row_mask(positions, forest.row_ancestors, start)
        logits, features = self._forward(forest.by_row(forest.tokens), positions, mask, 0, plan)
        return logits.flatten(0, 1), features.flatten(0, 1)

    def keep_rows(self, paths: list[list[int]], paths_device: torch.Tensor, counts_device: torch.Tensor) -> None:
        """After `score_rows`: row b commits its tree's nodes `paths[b]` (tree-local indices, root first),
        given on the device as paths_device [B, m] (padded by repeating the last) with their lengths
        counts_device [B]."""
        if self.rows is None:  # one sequence
            self.keep_path(paths[0], paths_device[0, : len(paths[0])])
            return
        counts = [len(p) for p in paths]
        start = self.rows.write_at
        put = kept_columns(self.rows.device, counts_device.to(self.rows.device.device), paths_device.shape[1])
        self.cache.keep_rows(put, start + paths_device.to(put.device))
        self.rows.advance(counts, counts_device)
        self.cache.truncate(self.rows.write_at)

    def select_rows(self, rows: list[int], rows_device: torch.Tensor) -> None:
        """Keep only these sequences of the batch (finished ones leave)."""
        self.cache.select_rows(rows_device)
        self.rows.select(rows, rows_device)
        self.cache.truncate(self.rows.write_at)

    @torch.inference_mode()
    def decode(self, token: int) -> torch.Tensor:
        """Plain decoding: feed one token, commit it, return the logits that follow it [V]."""
        logits, _ = self.score_tree(DraftTree.roots_only(token))
        self.keep_path([0])
        return logits[0]
