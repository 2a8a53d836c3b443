"""Where a target's tensors live: the devices of a model that may be sharded over several."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
