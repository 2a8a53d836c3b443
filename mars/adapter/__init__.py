"""The target model of speculative decoding, by role (one job per module, each imported only by those above it):

- `model`: `TargetModel`, the adapter and its forward (prefill, score a tree, keep a path, decode);
- `static`: static shapes (fixed query shapes, the full-capacity cache and masks, the compiled step);
- `cache`: the KV caches that keep a tree path (`TreeCache`, `StaticTreeCache`);
- `routing`: attention implementations that cannot take a tree mask, routed to SDPA for trees;
- `exact`: exact attention, each tree row over exactly its visible keys (bit-exact bf16 verification);
- `taps`: the draft's features, captured by hooks;
- `devices`: where a sharded target's tensors live;
- `sources`: where a target's weights come from, GGUF files converted once (imported by name).
"""

from mars.adapter.cache import PathCache, PreallocatedLayer, StaticTreeCache, StaticTreeLayer, TreeCache, cache_keyword
from mars.adapter.devices import DeviceRoute, module_device, route_devices, synchronize
from mars.adapter.exact import EXACT_ATTENTION, EXACT_BUCKET, ExactPlan, exact_attention_forward, exact_plan
from mars.adapter.model import SUPPORTED_LAYER_TYPES, TargetModel, context_length
from mars.adapter.routing import TAKES_TREE_MASK, routed_attention_forward, tree_route
from mars.adapter.static import DEFAULT_MAX_CACHE_LEN, StaticMasks, StaticShapes, pad_to
from mars.adapter.taps import FeatureTaps

__all__ = [
    "DEFAULT_MAX_CACHE_LEN", "EXACT_ATTENTION", "EXACT_BUCKET", "SUPPORTED_LAYER_TYPES", "TAKES_TREE_MASK",
    "DeviceRoute", "ExactPlan", "FeatureTaps", "PathCache", "PreallocatedLayer", "StaticMasks", "StaticShapes",
    "StaticTreeCache", "StaticTreeLayer", "TargetModel", "TreeCache", "cache_keyword", "context_length",
    "exact_attention_forward", "exact_plan", "module_device", "pad_to", "route_devices",
    "routed_attention_forward", "synchronize", "tree_route",
]
