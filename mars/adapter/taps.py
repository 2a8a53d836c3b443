"""The draft's features: hidden states of the target captured by hooks during a forward."""

from __future__ import annotations

from functools import partial

import torch

from eagle.config import text_config


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
