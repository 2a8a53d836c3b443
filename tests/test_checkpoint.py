"""Draft checkpoints (public EAGLE layout, strict keys) and the errors bad input must produce."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import tiny_model

from eagle import Eagle1Head, Eagle3Head, load_draft
from eagle.checkpoint import save_draft
from mars import SpeculativeGenerator
from mars.decoding.settings import TreeShape

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama")


def randomize(head: torch.nn.Module, seed: int = 0) -> None:
    """Give every float parameter distinctive values so a round trip cannot pass by accident."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def reduced_vocab_head(target, draft_vocab: int = 48) -> Eagle3Head:
    head = Eagle3Head.for_target(target.config, draft_vocab_size=draft_vocab)
    randomize(head)
    kept = torch.randperm(target.config.vocab_size, generator=torch.Generator().manual_seed(1))[:draft_vocab].sort()
    head.set_draft_vocab(kept.values)
    return head


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def draft_once(head, target) -> tuple[torch.Tensor, torch.Tensor]:
    head.reset()
    torch.manual_seed(3)
    features = torch.randn(7, head.config.feature_size)
    return head.extend(features, torch.arange(1, 8))


def test_eagle3_round_trip_keeps_weights_vocab_maps_and_outputs(target, tmp_path):
    head = reduced_vocab_head(target)
    save_draft(head, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"config.json", "model.safetensors"}
    loaded = load_draft(tmp_path, target)
    assert isinstance(loaded, Eagle3Head) and loaded.config == head.config
    assert_same_state(head, loaded)
    for x, y in zip(draft_once(head, target), draft_once(loaded, target), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    # Draft ids map back to target ids and only to ids in the draft vocabulary.
    ids = loaded.to_target_ids(torch.arange(48))
    assert bool(loaded.t2d[ids].all()) and int(loaded.t2d.sum()) == 48


def test_eagle1_round_trip_shares_the_target_lm_head(target, tmp_path):
    head = Eagle1Head.for_target(target)
    randomize(head.fc)
    randomize(head.layers, seed=1)
    save_draft(head, tmp_path)
    loaded = load_draft(tmp_path, target)
    assert isinstance(loaded, Eagle1Head)
    assert_same_state(head, loaded)
    assert loaded._target_parts[1] is target.get_output_embeddings()


def public_eagle3_checkpoint(target, directory, weights: str = "pytorch_model.bin") -> dict[str, torch.Tensor]:
    """Write what a published EAGLE-3 draft looks like: its config fields and key names, no extras of ours."""
    head = reduced_vocab_head(target)
    tc = target.config
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_act": "silu", "hidden_size": tc.hidden_size,
        "intermediate_size": tc.intermediate_size, "num_attention_heads": tc.num_attention_heads,
        "num_key_value_heads": tc.num_key_value_heads, "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 2048, "rope_theta": 10000.0, "rope_scaling": None,
        "vocab_size": tc.vocab_size, "draft_vocab_size": 48, "torch_dtype": "float16", "tie_word_embeddings": False,
    }
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    # Published drafts store the maps but not the embedding (it is copied from the target), often in fp16.
    state = {k: v.clone() for k, v in head.state_dict().items() if k != "embed_tokens.weight"}
    state = {k: (v.half() if v.is_floating_point() else v) for k, v in state.items()}
    public_keys = {
        "d2t", "t2d", "fc.weight", "norm.weight", "lm_head.weight",
        *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
        *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
        *(f"midlayer.{n}.weight" for n in ("hidden_norm", "input_layernorm", "post_attention_layernorm")),
    }
    assert set(state) == public_keys
    if weights.endswith(".bin"):
        torch.save(state, directory / weights)
    else:
        from safetensors.torch import save_file

        save_file(state, str(directory / weights))
    return state


@pytest.mark.parametrize("weights", ["pytorch_model.bin", "model.safetensors"])
def test_loads_the_public_eagle3_layout(target, tmp_path, weights):
    state = public_eagle3_checkpoint(target, tmp_path, weights)
    head = load_draft(tmp_path, target)
    assert isinstance(head, Eagle3Head)
    assert head.config.draft_vocab_size == 48 and head.config.feature_layers == [2, 3, 3]
    loaded = head.state_dict()
    for k, v in state.items():
        assert torch.equal(loaded[k].to(v.dtype), v), k
    assert torch.equal(loaded["embed_tokens.weight"], target.get_input_embeddings().weight)
    assert head.dtype == torch.float32  # follows the target, whatever the file's dtype
    gen = SpeculativeGenerator(target, head, TreeShape(8, 3, 2))
    prompt = torch.tensor([[5, 6, 7, 8]])
    assert gen.generate(prompt, max_new_tokens=12).tokens == gen.vanilla(prompt, max_new_tokens=12).tokens


def test_missing_and_unexpected_keys_are_all_named(target, tmp_path):
    state = public_eagle3_checkpoint(target, tmp_path)
    del state["midlayer.mlp.up_proj.weight"], state["norm.weight"]
    state["midlayer.extra.weight"] = torch.zeros(2)
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError) as err:
        load_draft(tmp_path, target)
    message = str(err.value)
    for key in ("midlayer.mlp.up_proj.weight", "norm.weight", "midlayer.extra.weight"):
        assert key in message


def test_wrong_shapes_are_named(target, tmp_path):
    state = public_eagle3_checkpoint(target, tmp_path)
    state["fc.weight"] = state["fc.weight"][:, :64]
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="fc.weight"):
        load_draft(tmp_path, target)


def test_reduced_vocabulary_without_d2t_is_refused(target, tmp_path):
    state = public_eagle3_checkpoint(target, tmp_path)
    del state["d2t"], state["t2d"]
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="d2t"):
        load_draft(tmp_path, target)


def test_missing_files_name_the_path_and_the_fix(target, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_draft(tmp_path / "nowhere", target)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_draft(tmp_path, target)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 96, "draft_vocab_size": 96}))
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin, model.safetensors"):
        load_draft(tmp_path, target)


def test_draft_for_another_target_is_refused(target, tmp_path):
    save_draft(reduced_vocab_head(target), tmp_path)
    wider = tiny_model("llama", hidden_size=96, head_dim=16)
    with pytest.raises(ValueError, match="hidden size"):
        load_draft(tmp_path, wider)
    bigger_vocab = tiny_model("llama", vocab_size=128)
    with pytest.raises(ValueError, match="vocab"):
        load_draft(tmp_path, bigger_vocab)
    deeper = tiny_model("llama", num_hidden_layers=8)
    with pytest.raises(ValueError, match="layers"):
        load_draft(tmp_path, deeper)
    with pytest.raises(ValueError, match="another target"):
        SpeculativeGenerator(bigger_vocab, Eagle3Head.for_target(target.config))


@pytest.mark.parametrize("setting", ["total_tokens", "depth", "branching"])
@pytest.mark.parametrize("value", [0, -1])
def test_tree_settings_below_one_are_refused(target, setting, value):
    head = Eagle3Head.for_target(target.config)
    with pytest.raises(ValueError, match=f"tree.{setting} must be an integer >= 1"):
        SpeculativeGenerator(target, head, TreeShape(**{"total_tokens": 4, "depth": 2, "branching": 2, setting: value}))


def test_bad_prompts_are_refused_with_the_fix(target):
    gen = SpeculativeGenerator(target, Eagle3Head.for_target(target.config), TreeShape(4, 2, 2))
    for call in (gen.generate, gen.vanilla):
        with pytest.raises(ValueError, match="prompt is empty"):
            call(torch.zeros(1, 0, dtype=torch.long))
        with pytest.raises(ValueError, match="exceeds the target's context of 512 tokens"):
            call(torch.ones(1, 500, dtype=torch.long), max_new_tokens=13)
        with pytest.raises(ValueError, match=r"shape \[1, T\] \(one prompt\)"):
            call(torch.ones(2, 5, dtype=torch.long))
        with pytest.raises(TypeError, match="LongTensor"):
            call(torch.ones(1, 5))
    # Exactly at the limit is fine.
    assert len(gen.generate(torch.ones(1, 500, dtype=torch.long), max_new_tokens=12).tokens) == 12
