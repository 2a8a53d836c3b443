"""Shared fixtures: tiny fp32 models of each supported architecture, built from configs (no downloads)."""

from __future__ import annotations

import os

import pytest
import torch
import transformers

torch.set_num_threads(min(2, os.cpu_count() or 1))

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
ARCHITECTURES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": 4096}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 16}),
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                  {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                   "decoder_sparse_step": 1, "mlp_only_layers": []}),
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM,
                {"num_local_experts": 4, "num_experts_per_tok": 2}),
}


def tiny_model(arch: str = "llama", seed: int = 0, sharpen: float = 4.0, **overrides):
    """A random fp32 causal LM. `sharpen` scales the lm_head so that greedy paths are not ties."""
    config_cls, model_cls, extra = ARCHITECTURES[arch]
    torch.manual_seed(seed)
    config = config_cls(**{**COMMON, **extra, **overrides})
    model = model_cls(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpen)
    return model


@pytest.fixture(params=list(ARCHITECTURES))
def arch(request) -> str:
    return request.param
