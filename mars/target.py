"""One adapter for any Hugging Face causal LM as the target of speculative decoding.

It uses only transformers' public machinery: a `DynamicCache` subclass whose layers write into
preallocated buffers (growing by concatenation cost a third of small-model decode time), or in
static mode a `StaticCache` subclass with fixed query shapes (`mars.static`), custom
4D attention masks (returned as-is by transformers' mask builders), explicit `position_ids`,
forward hooks (or `output_hidden_states`) for the draft's features, and (for exact attention) an attention function
registered with `AttentionInterface` that receives its plan as a forward keyword argument, the
way transformers hands attention kwargs down to every layer. No modeling file is copied.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from eagle.config import text_config
from eagle.precision import needs_exact_attention
from eagle.tree import DraftTree
from mars.static import DEFAULT_MAX_CACHE_LEN, PathCache, StaticMasks, StaticTreeCache, pad_to

SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")
EXACT_ATTENTION = "mars_exact"
PLAN_KWARG = "mars_exact_plan"  # the forward keyword that carries an exact-attention plan to every layer


# --- layout-invariant attention -----------------------------------------------------------------
# In a tree forward, a node's visible keys are interleaved with masked siblings, so the kernel
# reduces over a longer, differently laid out row than plain decoding does for the same token.
# In fp32 that changes the last bits; in bf16 it flips roundings that grow into different greedy
# tokens. `exact_attention_forward` computes every query row over exactly its visible keys,
# gathered in cache order, with no mask, through the same few ops in verification and in plain
# decoding. Where matmuls are batch-invariant (bf16 on CPU for the shapes we tested), strict greedy
# verification then reproduces plain decoding bit for bit.

ExactPlan = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # [(query rows [n], entries [n, L], pad [n, 1, L])]
EXACT_BUCKET = 64  # key rows are padded to a multiple of this, so rows of one tree share a few shapes


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
    out = query.new_empty(query.shape[2], query.shape[1], value.shape[-1])  # [q, heads, d]
    kv_heads = key.shape[1]
    # Cast the cache once, then gather: the same float32 values as gathering then casting per row
    # (a cast is elementwise), without casting the shared prefix once per tree row.
    keys, values = key[0].float(), value[0].float()
    for rows, entries, pad in mars_exact_plan:
        # A no-op on one device; on a model sharded over devices, the layer's own device.
        rows, entries, pad = rows.to(key.device), entries.to(key.device), pad.to(key.device)
        n, length = entries.shape
        flat = entries.reshape(-1)
        k = keys.index_select(1, flat).view(kv_heads, n, length, -1)
        v = values.index_select(1, flat).view(kv_heads, n, length, -1)
        out[rows] = _attend_rows(query[0][:, rows].transpose(0, 1), k, v, pad, scaling)
    return out[None], None


def exact_plan(prefix: int, depths: torch.Tensor, ancestors: torch.Tensor) -> ExactPlan:
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


# --- attention implementations that cannot take a tree mask -------------------------------------
# A tree forward needs an arbitrary additive 4D mask. SDPA and eager apply it as given; flash
# attention takes no such mask (transformers would read it as a padding mask and unpad garbage), and
# flex attention needs a block mask. Such a model is routed: calls without a mask (the causal
# prefill, a lone root) keep the model's own implementation, calls with a tree mask go to SDPA.

TAKES_TREE_MASK = ("sdpa", "eager", EXACT_ATTENTION)
TREE_ROUTE = "mars_tree"
ROUTE_KWARG = "mars_maskless_attention"  # the forward keyword naming the model's own implementation


def routed_attention_forward(module, query, key, value, attention_mask, mars_maskless_attention: str | None = None,
                             **kwargs):
    """`attn_implementation="mars_tree"`: without a mask, the implementation the forward call names
    (the model's own); with a tree mask, or called without the keyword, SDPA."""
    if attention_mask is None and mars_maskless_attention is not None:
        own = AttentionInterface._global_mapping[mars_maskless_attention]
        return own(module, query, key, value, attention_mask, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def tree_route(implementation: str) -> str:
    """Register the routing implementation for a model using `implementation`; returns its name."""
    if implementation not in AttentionInterface._global_mapping:
        raise ValueError(f"the target's attention implementation {implementation!r} takes no tree mask and is not "
                         f"registered with transformers' AttentionInterface, so it cannot be routed: load the model "
                         f"with attn_implementation='sdpa' (or 'eager')")
    if TREE_ROUTE not in AttentionInterface._global_mapping:
        AttentionInterface.register(TREE_ROUTE, routed_attention_forward)
        AttentionMaskInterface.register(TREE_ROUTE, sdpa_mask)  # 4D tree masks pass through as given
    return TREE_ROUTE


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



def context_length(config) -> int:
    return int(getattr(text_config(config), "max_position_embeddings", None) or 2**31)


# --- feature taps -------------------------------------------------------------------------------

class FeatureTaps:
    """The hidden states the draft reads, captured by hooks during a forward.

    `output_hidden_states=True` would keep every layer's hidden states to use a few (~11 GB at an 8k
    prefill of a 70B target). Index i < num_layers is the input of decoder layer i (a pre-hook on
    it), index num_layers the base model's final, normed output (a hook on the base model), as in
    transformers' `hidden_states`. `FeatureTaps.fits(model)` tells whether the model exposes its
    decoder layers as `base_model.layers`; otherwise the adapter asks for `hidden_states`.
    """

    def __init__(self, model, indices: list[int]):
        base = model.base_model
        self.captured: dict[int, torch.Tensor] = {}
        self.handles = []
        for index in sorted(set(indices)):
            if index < len(base.layers):
                hook = partial(self._layer_input, index)
                self.handles.append(base.layers[index].register_forward_pre_hook(hook, with_kwargs=True))
            else:
                self.handles.append(base.register_forward_hook(partial(self._final, index)))

    @staticmethod
    def fits(model) -> bool:
        layers = getattr(model.base_model, "layers", None)
        return isinstance(layers, torch.nn.ModuleList) and len(layers) == text_config(model.config).num_hidden_layers

    def _layer_input(self, index: int, module, args, kwargs) -> None:
        self.captured[index] = args[0] if args else kwargs["hidden_states"]

    def _final(self, index: int, module, args, output) -> None:
        self.captured[index] = output[0] if isinstance(output, tuple) else output.last_hidden_state

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


# --- devices ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceRoute:
    """Where each tensor of a decoding step lives when the target may be sharded over devices.

    inputs: token ids, positions and masks enter at the input embeddings' device. logits: the
    lm_head's device; verification (processed logits, acceptance) and the sampling RNG run there.
    The draft head's device is its own; target features are gathered to it.
    """

    inputs: torch.device
    logits: torch.device


def synchronize(devices) -> None:
    """Wait for every queued kernel on these devices (a no-op on CPUs): for timing, never in the hot loop."""
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def module_device(model, name: str) -> torch.device:
    """The device of submodule `name` (e.g. "model.embed_tokens", "lm_head").

    A model loaded with `device_map` records its placement in `hf_device_map` ({module prefix:
    device}); the longest prefix of `name` found there wins. Otherwise the device of the module's
    first parameter.
    """
    placement = getattr(model, "hf_device_map", None)
    if placement:
        prefixes = [p for p in placement if p == "" or name == p or name.startswith(p + ".")]
        if prefixes:
            where = placement[max(prefixes, key=len)]
            return torch.device(f"cuda:{where}" if isinstance(where, int) else where)
    return next(model.get_submodule(name).parameters()).device


def route_devices(model) -> DeviceRoute:
    """The `DeviceRoute` of a causal LM: its input embeddings' device and its lm_head's device."""
    names = {module: name for name, module in model.named_modules()}
    embed_name = names.get(model.get_input_embeddings())
    head_name = names.get(model.get_output_embeddings())
    if embed_name is None or head_name is None:
        raise ValueError("the target model has no input embeddings or lm_head registered as submodules")
    return DeviceRoute(inputs=module_device(model, embed_name), logits=module_device(model, head_name))


# --- the adapter --------------------------------------------------------------------------------

class TargetModel:
    """A causal LM seen as: prefill, score a token tree on top of the cache, keep one path.

    `feature_layers` are indices into the model's `hidden_states` (the input of that decoder
    layer; the last index is the final, post-norm hidden state). Features are their concatenation,
    gathered to `feature_device` (the draft head's). With `exact_attention` the model's attention
    implementation is switched to "mars_exact" until `close()` restores the previous one; "auto"
    turns it on where plain verification would not reproduce plain decoding (a bf16/fp16
    full-attention model; `eagle.precision.needs_exact_attention`).

    static: fixed shapes (`mars.static`), so that the tree forward and the decoding step can be
    captured (CUDA graphs) or compiled once: a `StaticTreeCache` of `max_cache_len` entries made
    here, once, and reused by every sequence; every tree padded to `tree_rows` queries (None: the
    tree's own size); masks of width `max_cache_len` in buffers. Full-attention models only, without
    exact attention ("auto" resolves to off). The prefill stays eager and of the prompt's length.
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
        self.devices = route_devices(model)
        self.all_devices = {p.device for p in model.parameters()}  # a sharded model: every device it uses
        self.feature_device = torch.device(feature_device) if feature_device is not None else self.devices.inputs
        self.dtype = model.get_input_embeddings().weight.dtype
        self.cache: TreeCache | StaticTreeCache | None = None
        self._mask_buffer: torch.Tensor | None = None  # tree masks are written into it (see `_tree_mask`)
        self._mask_written = (0, 0, 0)  # rows, first and last column the previous tree mask wrote
        self.committed = 0  # tokens of the sequence in the cache; tree nodes sit after them until keep_path
        self.max_length = context_length(model.config)
        if exact_attention == "auto":
            exact_attention = needs_exact_attention(self.dtype) and self.sliding_window is None and not static
        elif not isinstance(exact_attention, bool):
            raise ValueError(f"exact_attention must be True, False or 'auto', got {exact_attention!r}")
        self.static = static
        self._setup_static(max_cache_len, tree_rows, compile, exact_attention)
        self.exact_attention: bool = exact_attention
        self._restore_attention: str | None = None
        self.maskless: str | None = None  # the model's own implementation, when it takes no tree mask
        if exact_attention:
            if self.sliding_window is not None:
                raise NotImplementedError("exact_attention supports full-attention models only (no sliding window): "
                                          "pass exact_attention=False or 'auto' (model.exact_attention=false)")
            if EXACT_ATTENTION not in AttentionInterface._global_mapping:
                AttentionInterface.register(EXACT_ATTENTION, exact_attention_forward)
                # Masks as for SDPA: transformers builds none for an attention name it does not know, which
                # would drop the padding mask of a batched call made with the model meanwhile.
                AttentionMaskInterface.register(EXACT_ATTENTION, sdpa_mask)
            self._restore_attention = model.config._attn_implementation
            model.set_attn_implementation(EXACT_ATTENTION)
        elif (implementation := model.config._attn_implementation or "sdpa") not in TAKES_TREE_MASK:
            self._restore_attention = self.maskless = implementation
            model.set_attn_implementation(tree_route(implementation))

    def _setup_static(self, max_cache_len: int | None, tree_rows: int | None, compile: str | None,
                      exact_attention: bool) -> None:
        """Static mode's cache, made once, and its step function, compiled once (see the class docstring)."""
        self.tree_rows = tree_rows
        self.masks: StaticMasks | None = None  # made at the first prefill
        self.compile_mode = compile  # a torch.compile mode, or None (eager)
        self._step = self._static_step
        if not self.static:
            if compile is not None or max_cache_len is not None:
                raise ValueError("compile and max_cache_len apply to static shapes: pass static=True as well")
            return
        if self.sliding_window is not None:
            raise NotImplementedError("static shapes support full-attention models only (no sliding window): "
                                      "pass static=False for this model")
        if exact_attention:
            raise ValueError("exact attention gathers each tree row's own keys, in shapes that change from tree to "
                             "tree, so it cannot run with static shapes: pass exact_attention=False (or 'auto')")
        if max_cache_len is None:
            max_cache_len = min(DEFAULT_MAX_CACHE_LEN, self.max_length + (tree_rows or 1))
        if not isinstance(max_cache_len, int) or isinstance(max_cache_len, bool) or max_cache_len < 1:
            raise ValueError(f"max_cache_len must be an integer >= 1, got {max_cache_len!r}")
        self.max_cache_len = max_cache_len
        self.cache = StaticTreeCache(self.model.config, max_cache_len)
        if compile is not None:
            if not isinstance(compile, str):
                raise ValueError(f"compile must be a torch.compile mode name such as 'default' or "
                                 f"'reduce-overhead', got {compile!r}")
            # dynamic=False: one graph per query shape (the tree's, the decoding step's), never per length.
            self._step = torch.compile(self._static_step, mode=compile, dynamic=False)

    @contextmanager
    def tapped(self):
        """Inside: the draft's features are captured by hooks instead of `output_hidden_states` (where
        the model's layers can be found); outside, the model carries no hooks of ours. Static mode
        installs none: hooks would change what a compiled forward is guarded on at every call, so it
        asks transformers for the feature layers' hidden states only (`output_hidden_states=[...]`)."""
        if self.static or self.taps is not None or not FeatureTaps.fits(self.model):
            yield self
            return
        self.taps = FeatureTaps(self.model, self.feature_layers)
        try:
            yield self
        finally:
            self.taps.remove()
            self.taps = None

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

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask, all_logits: bool,
                 plan: ExactPlan | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """mask: an additive 4D mask (or one per layer type), or None for the model's own causal mask."""
        extra = {ROUTE_KWARG: self.maskless} if self.maskless else {}
        if plan is not None:
            if self.model.config._attn_implementation != EXACT_ATTENTION:
                raise RuntimeError("the target's attention implementation is no longer 'mars_exact' (was a "
                                   "SpeculativeGenerator sharing this model closed?): create a new generator")
            extra[PLAN_KWARG] = plan
        out = self.model(
            input_ids=tokens[None].to(self.devices.inputs),
            position_ids=positions[None].to(self.devices.inputs),
            attention_mask=mask,
            past_key_values=self.cache,
            use_cache=True,
            output_hidden_states=self.taps is None,
            logits_to_keep=0 if all_logits else 1,
            **extra,
        )
        # Taps of a sharded model come from several devices: gathered to the draft head's.
        taps = self.taps.captured if self.taps is not None else dict(enumerate(out.hidden_states))
        features = torch.cat([taps[i][0].to(self.feature_device) for i in self.feature_layers], dim=-1)
        if self.taps is not None:
            self.taps.captured.clear()
        return out.logits[0].float(), features

    # --- static shapes (`mars.static`) ---------------------------------------------------------

    def _static_step(self, tokens: torch.Tensor, positions: torch.Tensor,
                     mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens, positions [1, q] and mask [1, 1, q, max_cache_len] -> (logits [q, V] float32,
        features [q, F]), the q entries written into the cache at its length. What `compile`
        compiles: tensors in and out, the cache updated in place, no hooks."""
        return self._static_forward(tokens, positions, mask, 0)

    def _static_forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                        logits_to_keep: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A forward of the static cache; the features come from transformers' hidden states, asking
        for the feature layers' only (a compiled graph keeps no others)."""
        extra = {ROUTE_KWARG: self.maskless} if self.maskless else {}
        out = self.model(input_ids=tokens, position_ids=positions, attention_mask=mask, past_key_values=self.cache,
                         use_cache=True, output_hidden_states=self.feature_layers, logits_to_keep=logits_to_keep,
                         **extra)
        features = torch.cat([out.hidden_states[i][0].to(self.feature_device) for i in self.feature_layers], dim=-1)
        return out.logits[0].float(), features

    def _static_masks(self, rows: int | None = None) -> StaticMasks:
        """The mask buffers, made again only when a tree needs another row count (a new shape)."""
        if self.masks is None or (rows is not None and self.masks.rows != rows):
            self.masks = StaticMasks(rows or self.tree_rows or 1, self.max_cache_len, self.dtype, self.devices.inputs)
        return self.masks

    def _static_prefill(self, tokens: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        """prefill in static mode: the same cache, emptied; eager, of the prompt's length.

        The causal mask [1, 1, T, max_cache_len] (additive, as every attention implementation takes
        it) is ours: transformers would build the same from the cache's length, but reads that device
        tensor on the host to do so."""
        if capacity > self.max_cache_len:
            raise ValueError(f"this sequence needs {capacity} cache entries but the static cache holds "
                             f"max_cache_len={self.max_cache_len}: pass a larger max_cache_len")
        self.cache.truncate(0)
        self._static_masks(self.tree_rows).reset()
        positions = torch.arange(tokens.shape[0], device=tokens.device)
        future = torch.arange(self.max_cache_len, device=tokens.device)[None, :] > positions[:, None]
        mask = torch.zeros(future.shape, dtype=self.dtype, device=tokens.device).masked_fill_(
            future, torch.finfo(self.dtype).min)
        return self._static_forward(tokens[None], positions[None], mask[None, None], 1)

    def _static_score(self, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        """score_tree in static mode: a lone root as one decoding step, any other tree padded to
        `tree_rows` queries (the pad nodes, at the root's position, see the prefix and themselves).
        Under CUDA graphs the results are views of the graph's output buffers, valid until the next
        tree forward or decoding step (the loop consumes them before)."""
        n, device = tree.size, self.devices.inputs
        if self.tree_rows is not None and n > self.tree_rows:
            raise ValueError(f"a tree of {n} nodes does not fit the static tree forward of {self.tree_rows} rows")
        self.cache.truncate(self.committed)
        tokens, depths = tree.tokens.to(device), tree.depths.to(device)
        if n == 1:
            mask = self._static_masks().for_step(self.committed)
        else:
            rows = self.tree_rows or n
            tokens, depths = pad_to(tokens, rows), pad_to(depths, rows)
            mask = self._static_masks(rows).for_tree(self.committed, tree.ancestors.to(device))
        if self.compile_mode is not None:
            # The previous step's outputs are consumed: CUDA graphs may overwrite them (reduce-overhead).
            torch.compiler.cudagraph_mark_step_begin()
        logits, features = self._step(tokens[None], (self.committed + depths)[None], mask)
        return logits[:n], features[:n]

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
        if self.static:
            logits, features = self._static_prefill(tokens, capacity)
            self.committed = n
            return logits[-1], features
        self.cache = TreeCache(self.model.config, capacity)
        self._mask_buffer = None  # sized for this sequence at the first tree
        # No explicit mask: the model's own causal masking (flash/SDPA's causal kernels where it has them).
        logits, features = self._forward(tokens, torch.arange(n, device=device), None, False)
        self.committed = n
        return logits[-1], features

    @torch.inference_mode()
    def score_tree(self, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over every tree node, placed after the committed sequence (node i at position
        committed + depth i, attending to the sequence and its own ancestors).

        The nodes stay in the cache until `keep_path` selects which survive; scoring another tree
        first discards them. Returns (logits [n, V] float32 on `devices.logits`, features [n, F]).
        """
        if self.static:
            return self._static_score(tree)
        self.cache.truncate(self.committed)
        plan = exact_plan(self.committed, tree.depths, tree.ancestors) if self.exact_attention else None
        if plan is not None:
            plan = [tuple(t.to(self.devices.inputs) for t in group) for group in plan]
        positions = self.committed + tree.depths.to(self.devices.inputs)
        mask = None if plan is not None else self._mask(positions, tree.ancestors)
        return self._forward(tree.tokens, positions, mask, True, plan)

    def keep_path(self, path: list[int], index: torch.Tensor | None = None) -> None:
        """After `score_tree`: commit the nodes of `path` (tree indices, root first) to the sequence.
        index: the same path as a tensor on a device, when the caller has one (saves an upload)."""
        if path == list(range(len(path))):  # already in place (e.g. a lone root): no copy
            self.cache.truncate(self.committed + len(path))
        else:
            self.cache.keep(self.committed, index if index is not None else torch.tensor(path, dtype=torch.long))
        self.committed += len(path)

    @torch.inference_mode()
    def decode(self, token: int) -> torch.Tensor:
        """Plain decoding: feed one token, commit it, return the logits that follow it [V]."""
        logits, _ = self.score_tree(DraftTree.root_only(token))
        self.keep_path([0])
        return logits[0]
