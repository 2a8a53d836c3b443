"""Count the points where a decoding loop would wait for a GPU, on any device (CPU included).

On a GPU the host queues kernels and runs ahead until it needs something from the device or sends
it host data. Each such point drains the queue; a loop with many of them runs at the speed of its
kernel launches, not of its kernels. `SyncCounter` counts them by kind (`by_kind`, `total`):

- reads of a device tensor on the host: `.item()`, `.tolist()`, `int/float/bool(t)`, `.numpy()`,
  `np.asarray(t)`, `x in t`, `str(t)` / `repr(t)` / `print(t)` / `f"{t}"` (`__repr__`, `__format__`),
  results that are Python values (`torch.equal`, `torch.allclose`, `is_nonzero`), and moves to the
  host: `.cpu()` (kind "cpu"), `.to(<host>)` (kind "to_host"), a device tensor copied or assigned into a
  host tensor (`host.copy_(t)`, `host[i] = t`, kind "to_host");
- operations whose output shape depends on device values: `nonzero`, one-argument `torch.where(c)`,
  `argwhere`, `masked_select`, `unique`, `bincount`, `repeat_interleave` with tensor repeats and no
  `output_size`, boolean-mask indexing `t[mask]` ("bool_index") and boolean-mask assignment
  `t[mask] = x` / `index_put_` ("bool_assign"; except `t[mask] = <a number>`, which torch turns
  into a `masked_fill_` on the device: no wait);
- uploads of host data: a factory given host data and a device (`torch.tensor(data, device=d)`,
  `t.new_tensor(data)`), `.to(d)` / `.cuda()` of a host tensor, a host tensor used next to device
  tensors (kind "upload"), and indexing a device tensor with a Python list (`t[[1, 2]]`: the list
  is made into a tensor on the host and copied up; kind "list_index", one per list).
Free: everything else, e.g. `where(c, x, y)`, `masked_fill`, `masked_scatter` (its size check is
asynchronous since torch 2.1), `.to(d)` of a device tensor (to its own device, or another device:
device-to-device copies are queued like kernels), and any work on host tensors.

Host and device on a CPU. Tests run on CPUs, where the host and "the device" are the same memory,
so the counter tells them apart by where a tensor was made, not by its `.device`:
- host tensors: made inside the counter by a factory without a device or with the host named
  (`torch.tensor([...])`, `torch.arange(n)`, `torch.zeros(n, device="cpu")`), by a read that moves
  data to the host (`.cpu()`, `.to("cpu")`), and whatever is computed from host tensors only.
  Reading them is free; using them next to device tensors is an upload.
- device tensors: everything else (model parameters and outputs, factories given the run's
  device, results of device work).

Moves name their destination, and the counter must tell a move to the host (a read on a GPU) from a
move to the run's own device (free on a GPU; often a no-op). By value this is exact on a GPU: a
device tensor moved to the CPU is a read, however the CPU is spelled. On a CPU run the CPU is both,
so `torch.device("cpu")` as a value cannot say which one a caller meant; the counter then reads the
spelling, which is how code says what it wants:
- a destination spelled as a string naming the CPU (`.to("cpu")`, `.to(device="cpu")`,
  `torch.tensor(x, device="cpu")`) is the host: the caller asked for host memory by name, and the same
  line on a GPU run copies to the host. `.cpu()` and `.numpy()` likewise.
- a destination given as a `torch.device` or an int (`.to(t.device)`, `.to(gen.target.devices.inputs)`,
  `.to(device=torch.device(name))` with `name` a variable, `.to(0)`) is the run's device when it is
  the CPU and the CPU is one of the run's devices; our code moves with device objects read from the
  model or its tensors. Without `devices=`, the CPU counts as one of the run's devices when the moved
  tensor is itself a device tensor on the CPU (a CPU run) or a host tensor (whose target cannot be
  told: an upload is assumed).
- a destination given as a tensor (`.to(other)`) is the host exactly when `other` is a host tensor.
So a CPU test catches every host read a GPU run pays for except `.to(torch.device("cpu"))` spelled
with a `torch.device` object, which on a CPU run is indistinguishable from a move to the run's own
device (on a GPU the value rule catches it; a device map that stands in for several devices on a
CPU must therefore name them as `torch.device` objects, not as the string "cpu").
`devices=` names the run's devices when known (e.g. `[torch.device("cuda:0")]` on a GPU run): a
destination outside them is the host whatever its spelling, one inside them is not (except a string
naming the CPU, always the host). On a CPU a move to where a tensor already is returns the tensor
itself; when the counter sees it change sides (an upload, a move to the host) it hands back a new
view instead, standing for the copy a GPU run makes, so that the original keeps its side.

Compiled code: `torch.compile` traces the active modes into its graphs. The counter keeps out of a
compiled graph (it runs kernels only; what would read the host breaks the graph and runs eagerly,
counted), so its bookkeeping adds no guards; a compiled function first called under a counter is
compiled once more for it (dynamo guards on the type of the active modes), then reused.

    with SyncCounter() as syncs:
        out = gen.generate(prompt, max_new_tokens=64)
    syncs.total, syncs.by_kind          # e.g. 9, Counter({"tolist": 6, "upload": 3})
"""

from __future__ import annotations

import numbers
import weakref
from collections import Counter
from collections.abc import Iterable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

# Calls that hand a device tensor's values to the host (kind = the call's name).
READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__complex__", "__index__", "numpy", "__array__",
         "__contains__", "__repr__", "__format__", "equal", "allclose", "is_nonzero"}
# Calls whose output shape is read from device values (kind = the call's name).
SHAPE_FROM_VALUES = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount"}
FACTORIES = {"tensor", "as_tensor", "arange", "zeros", "ones", "full", "empty", "eye", "rand", "randn", "randint",
             "linspace", "randperm"}
NEW_FACTORIES = {"new_tensor", "new_zeros", "new_ones", "new_full", "new_empty"}
MASKS = (torch.bool, torch.uint8)  # index dtypes torch treats as masks

DeviceSpec = str | int | torch.device


def _tensors(args, kwargs) -> list[torch.Tensor]:
    return [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]


def _to_destination(args, kwargs) -> DeviceSpec | torch.Tensor | None:
    """Where `t.to(...)` sends `t`: a device (as spelled), a tensor, or None (a dtype-only `to`)."""
    if kwargs.get("device") is not None:
        return kwargs["device"]
    if isinstance(kwargs.get("other"), torch.Tensor):
        return kwargs["other"]
    if len(args) > 1 and isinstance(args[1], (str, torch.device, torch.Tensor, int)) and not isinstance(args[1], bool):
        return args[1]
    return None


def _index_lists(index) -> int:
    """How many Python lists of numbers an index holds (each is made into a tensor and uploaded)."""
    parts = index if isinstance(index, tuple) else (index,)
    return sum(isinstance(p, list) and all(isinstance(x, numbers.Number) for x in tree_flatten(p)[0]) for p in parts)


class SyncCounter(TorchFunctionMode):
    """Counts host synchronisation points by kind (`by_kind`) and in all (`total`) while active (see
    the module docstring). devices: the run's devices, when known (default: inferred per move)."""

    def __init__(self, devices: Iterable[torch.device | str] | None = None):
        super().__init__()
        self.by_kind: Counter[str] = Counter()
        self.devices = None if devices is None else {torch.device(d) for d in devices}
        self._host: dict[int, weakref.ref] = {}

    def is_host(self, t: torch.Tensor) -> bool:
        ref = self._host.get(id(t))
        return ref is not None and ref() is t

    def _mark_host(self, result) -> None:
        for t in tree_flatten(result)[0]:
            if isinstance(t, torch.Tensor):
                self._host[id(t)] = weakref.ref(t)

    def names_host(self, where: DeviceSpec | torch.Tensor, moved: torch.Tensor | None = None) -> bool:
        """Whether a destination (as spelled) is the host, for `moved` (None: a factory's output)."""
        if isinstance(where, torch.Tensor):
            return self.is_host(where)
        if isinstance(where, int):
            return False  # an accelerator's index
        device = torch.device(where)
        if device.type != "cpu":
            return False
        if isinstance(where, str):
            return True  # the host asked for by name
        if self.devices is not None:
            return all(d.type != "cpu" for d in self.devices)
        # A device object naming the CPU: the host when a tensor on another device moves there (exact,
        # a GPU run); the run's own device otherwise (a CPU run, or a host tensor or new data going there).
        return moved is not None and not self.is_host(moved) and moved.device.type != "cpu"

    def _kind(self, name: str, args, kwargs, inputs: list[torch.Tensor], host: list[bool]) -> str | None:
        """The kind of synchronisation this call is, if any."""
        on_host = bool(inputs) and all(host)
        device_input = bool(inputs) and not on_host
        if name in FACTORIES and not inputs:
            where = kwargs.get("device")
            if name in ("tensor", "as_tensor") and where is not None and not self.names_host(where):
                return "upload"  # host data straight to the device
            return None
        if name in NEW_FACTORIES:
            where = kwargs.get("device")
            to_device = not self.names_host(where) if where is not None else not host[0]
            data = args[1] if len(args) > 1 else kwargs.get("data")
            if name == "new_tensor" and to_device and not isinstance(data, torch.Tensor):
                return "upload"
            return None
        if name == "cpu":
            return "cpu" if not host[0] else None
        if name == "cuda":
            return "upload" if host[0] else None
        if name == "to":
            where = _to_destination(args, kwargs)
            if where is not None:
                to_host = self.names_host(where, args[0])
                if host[0] and not to_host:
                    return "upload"
                if not host[0] and to_host:
                    return "to_host"
                return None  # host to host, or device to device (queued like a kernel)
        if name in READS:
            return name if device_input else None
        if name in SHAPE_FROM_VALUES:
            return name if device_input else None
        if name == "where" and len(inputs) == 1 and len(args) + len(kwargs) == 1:
            return "where" if device_input else None  # torch.where(c): nonzero(c, as_tuple=True)
        if name == "repeat_interleave" and "output_size" not in kwargs:
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if len(args) == 1 else None)
            if isinstance(repeats, torch.Tensor) and device_input:
                return name  # the output's length is the sum of the repeats
        if name in ("copy_", "__setitem__") and host[0] and not on_host:
            return "to_host"  # device values written into host memory
        if name == "__getitem__" and device_input and any(t.dtype in MASKS for t in inputs[1:]):
            return "bool_index"
        if name in ("__getitem__", "__setitem__") and not host[0] and _index_lists(args[1]):
            return "list_index"
        if name in ("__setitem__", "index_put_", "index_put") and not host[0]:
            indices = _tensors(args[1:2], {})
            if any(t.dtype in MASKS for t in indices):
                return None if self._masked_fill(args, kwargs, indices) else "bool_assign"
        if any(host) and not on_host:
            return "upload"  # a host tensor used next to device tensors is copied up
        return None

    def _masked_fill(self, args, kwargs, indices: list[torch.Tensor]) -> bool:
        """`t[mask] = value` that torch runs as `t.masked_fill_(mask, value)` (no wait): one mask on
        the device, no other tensor index, a value of one element already on the host, no accumulation."""
        value = args[2] if len(args) > 2 else kwargs.get("values", kwargs.get("value"))
        if (args[3] if len(args) > 3 else kwargs.get("accumulate", False)):
            return False
        host_value = isinstance(value, numbers.Number) or (
            isinstance(value, torch.Tensor) and value.numel() == 1 and self.is_host(value))
        return len(indices) == 1 and not self.is_host(indices[0]) and host_value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():
            # torch.compile traces active modes into its graphs: a compiled graph runs kernels only (what
            # would read the host breaks the graph and runs here eagerly, counted), so the counter keeps
            # out of it, which also keeps its bookkeeping out of dynamo's guards (no recompilation per call).
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        inputs = _tensors(args, kwargs)
        host = [self.is_host(t) for t in inputs]
        kind = self._kind(name, args, kwargs, inputs, host)
        if kind is not None:
            self.by_kind[kind] += _index_lists(args[1]) if kind == "list_index" else 1  # one upload per list
        result = func(*args, **kwargs)
        lands_on_host = self._lands_on_host(name, args, kwargs, inputs, host, kind)
        if inputs and result is inputs[0] and lands_on_host != host[0]:
            # A move to where the tensor already is returns the tensor itself on a CPU, where a GPU run
            # makes a copy in other memory: a new view stands for the copy, so that the original keeps
            # its own side (host or device) and the copy gets the other.
            result = result.view_as(result)
        if lands_on_host:
            self._mark_host(result)
        return result

    def _lands_on_host(self, name: str, args, kwargs, inputs, host, kind) -> bool:
        if kind in ("cpu", "to_host"):
            return name in ("cpu", "to")  # a move's result (not the host tensor written into)
        if name == "to" and _to_destination(args, kwargs) is not None:
            return host[0] and kind is None  # host to host; device to device stays on the device
        if name in ("cuda", "copy_", "__setitem__"):
            return False
        if name in NEW_FACTORIES:
            where = kwargs.get("device")
            return self.names_host(where) if where is not None else host[0]
        if name in FACTORIES and not inputs:
            where = kwargs.get("device")
            return where is None or self.names_host(where)
        return bool(inputs) and all(host)

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())
