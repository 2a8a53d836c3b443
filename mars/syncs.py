"""Count the points where a decoding loop would wait for a GPU, on any device (CPU included).

On a GPU the host queues kernels and runs ahead until it needs something from the device or sends
it host data: reading a device tensor (`.item()`, `.tolist()`, `int(t)`, `bool(t)`, `.cpu()`,
`.numpy()`), an operation whose output shape depends on device values (`nonzero`, boolean-mask
indexing), or an upload of a tensor made on the host (`torch.tensor(data)`, a factory call without
`device=`, then `.to(device)` or use next to device tensors). Each point drains the queue; a loop
with many of them runs at the speed of its kernel launches, not of its kernels.

`SyncCounter` tells host tensors from device tensors by where they were made, not by their actual
device, so that it counts on a CPU (where tests run) what would synchronise on a GPU:
- host tensors: made inside the counter by a factory without `device=` (`torch.tensor([...])`,
  `torch.arange(n)`), or by `.cpu()`, and whatever is computed from host tensors only. Reading them
  is free.
- device tensors: everything else (model parameters and outputs, factories given `device=`).
Counted: a read of a device tensor (kind = the call), `nonzero`/boolean indexing of a device tensor,
an upload (`to(device)` of a host tensor, or an operation mixing host and device tensors).

    with SyncCounter() as syncs:
        out = gen.generate(prompt, max_new_tokens=64)
    syncs.total, syncs.by_kind          # e.g. 9, Counter({"tolist": 6, "upload": 3})
"""

from __future__ import annotations

import weakref
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy"}
SHAPE_FROM_VALUES = {"nonzero", "masked_select", "unique", "unique_consecutive", "repeat_interleave"}
FACTORIES = {"tensor", "as_tensor", "arange", "zeros", "ones", "full", "empty", "eye", "rand", "randn", "randint",
             "linspace", "randperm"}
MOVES = {"to", "cuda"}


def _tensors(args, kwargs) -> list[torch.Tensor]:
    return [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]


def _moves_device(func_name: str, args, kwargs) -> bool:
    """`t.to(device...)` / `t.cuda()`: a transfer (a dtype-only `to` is not one)."""
    if func_name == "cuda":
        return True
    kwargs = kwargs or {}
    if "device" in kwargs:
        return True
    return any(isinstance(a, (torch.device, str, int)) and not isinstance(a, bool) for a in args[1:2]) or any(
        isinstance(a, torch.Tensor) for a in args[1:2])


class SyncCounter(TorchFunctionMode):
    """Counts host synchronisation points by kind (`by_kind`) and in all (`total`) while active."""

    def __init__(self):
        super().__init__()
        self.by_kind: Counter[str] = Counter()
        self._host: dict[int, weakref.ref] = {}

    def is_host(self, t: torch.Tensor) -> bool:
        ref = self._host.get(id(t))
        return ref is not None and ref() is t

    def _mark_host(self, result) -> None:
        for t in tree_flatten(result)[0]:
            if isinstance(t, torch.Tensor):
                self._host[id(t)] = weakref.ref(t)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        inputs = _tensors(args, kwargs)
        host = [self.is_host(t) for t in inputs]
        on_host = bool(inputs) and all(host)
        if name in ("tensor", "as_tensor") and not inputs and (kwargs or {}).get("device") is not None:
            self.by_kind["upload"] += 1  # host data straight to the device
        if name in MOVES and _moves_device(name, args, kwargs):
            if inputs and host[0]:
                self.by_kind["upload"] += 1
            return func(*args, **(kwargs or {}))  # lands on the device
        if name in READS and inputs and not host[0]:
            self.by_kind[name] += 1
        elif name in SHAPE_FROM_VALUES and not on_host:
            self.by_kind[name] += 1
        elif name == "__getitem__" and not on_host and any(t.dtype == torch.bool for t in inputs[1:]):
            self.by_kind["bool_index"] += 1
        elif any(host) and not on_host and name not in READS:
            self.by_kind["upload"] += 1  # a host tensor used next to device tensors is copied up
        result = func(*args, **(kwargs or {}))
        made_on_host = name in FACTORIES and (kwargs or {}).get("device") is None and not (inputs and not on_host)
        if name == "cpu" or on_host or made_on_host:
            self._mark_host(result)
        return result

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())
