"""GPU placement arithmetic (eval.runner.placement), on CPU with published model configs: one GPU when the
target and decoding's headroom fit, spread with that headroom kept free when they do not."""

from __future__ import annotations

import pytest
import torch
import transformers
from hydra import compose, initialize_config_dir

from eval.config.paths import REPO_ROOT
from eval.config.schema import validate
from eval.runner import models
from eval.runner.placement import GiB, decoding_headroom, plan, weight_bytes

LLAMA31_8B = transformers.LlamaConfig(
    vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, max_position_embeddings=131072)
LLAMA33_70B = transformers.LlamaConfig(
    vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
    num_key_value_heads=8, max_position_embeddings=131072)


def test_weights_and_headroom_of_llama31_8b():
    weights = weight_bytes(LLAMA31_8B, torch.bfloat16)
    assert weights == 8_030_261_248 * 2  # Llama-3.1-8B's published parameter count, in bf16
    room = decoding_headroom(LLAMA31_8B, torch.bfloat16, context=9216, tree_nodes=61, draft_bytes=GiB)
    assert room["kv_cache"] == 2 * 32 * 8 * 128 * 9216 * 2  # keys and values, every layer, bf16
    assert room["logits"] == 61 * 128256 * (2 + 4)  # bf16 and float32 copies of a 61-node tree's logits
    assert 2 * GiB < sum(room.values()) < 6 * GiB


def test_a_target_that_fits_one_gpu_stays_on_the_first():
    room = decoding_headroom(LLAMA31_8B, torch.bfloat16, 9216, 61, GiB)
    assert plan(weight_bytes(LLAMA31_8B, torch.bfloat16), room, {3: 80 * GiB, 5: 80 * GiB}) == {"device_map": {"": 3}}


def test_a_target_that_does_not_fit_is_spread_with_the_headroom_kept_free():
    weights = weight_bytes(LLAMA33_70B, torch.bfloat16)  # ~141 GB
    room = decoding_headroom(LLAMA33_70B, torch.bfloat16, 9216, 61, 2 * GiB)
    got = plan(weights, room, {0: 80 * GiB, 1: 80 * GiB})
    assert got["device_map"] == "auto"
    budget = got["max_memory"]
    assert sum(budget.values()) >= weights  # the weights fit in what is left
    assert 80 * GiB - budget[0] >= room["draft"] + room["runtime"]  # the draft sits with the inputs
    assert 80 * GiB - budget[1] >= room["logits"] + room["runtime"]  # the logits with the lm_head
    with pytest.raises(RuntimeError, match="gpus_per_job"):
        plan(weights, room, {0: 80 * GiB})


def test_eval_run_places_by_the_plan(monkeypatch, tmp_path):
    LLAMA31_8B.save_pretrained(tmp_path)  # a config only: nothing is loaded
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        cfg = compose(config_name="config", overrides=["model=llama31_8b", f"model.target={tmp_path}"])
    run = validate(cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(models, "gpu_bytes", lambda index: 80 * GiB)
    assert models.placement(run, None, torch.bfloat16) == {"device_map": {"": 0}}
    assert models.placement(run, [1], torch.bfloat16) == {"device_map": {"": 1}}
    monkeypatch.setattr(models, "gpu_bytes", lambda index: 12 * GiB)  # two 12 GB GPUs: spread
    spread = models.placement(run, None, torch.bfloat16)
    assert spread["device_map"] == "auto" and set(spread["max_memory"]) == {0, 1}
