"""The embedded target's corpus, tokenizer and trainer, on a tiny corpus and model for a few steps."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle.train import target_lm
from eagle.train.corpus import EOS_TOKEN, split_of, stdlib_files, stdlib_root

TINY = ["--vocab-size", "320", "--batch", "8", "--seq", "64", "--lr", "3e-3", "--warmup", "5",
        "--log-every", "5", "--save-every", "1000", "--minutes", "1000",
        "--shape", json.dumps({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "num_key_value_heads": 2})]


pytestmark = pytest.mark.usefixtures("single_thread")


def test_stdlib_split_is_disjoint_deterministic_and_excludes_site_packages():
    train, heldout = stdlib_files("train"), stdlib_files("heldout")
    assert not set(train) & set(heldout)
    assert sorted(train + heldout) == stdlib_files("all")
    assert 0.02 < len(heldout) / (len(train) + len(heldout)) < 0.10
    root = stdlib_root()
    assert all("site-packages" not in p.relative_to(root).parts for p in train + heldout)
    assert all(split_of(p.relative_to(root).as_posix()) == "heldout" for p in heldout)
    with pytest.raises(ValueError, match="'train', 'heldout' or 'all'"):
        stdlib_files("test")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """About 90 small stdlib files under names that fall in both splits."""
    root = tmp_path_factory.mktemp("corpus")
    sources = [p for p in stdlib_files("train") if 2_000 < p.stat().st_size < 12_000][:90]
    for i, src in enumerate(sources):
        shutil.copy(src, root / f"m{i:03d}.py")
    assert stdlib_files("heldout", root) and stdlib_files("train", root)
    return root


def run(out, corpus, *extra):
    target_lm.main(["--out", str(out), "--corpus-root", str(corpus), *TINY, *extra])


def test_training_lowers_the_loss_and_saves_a_loadable_model(corpus, tmp_path):
    run(tmp_path, corpus, "--steps", "40")
    losses = [json.loads(line)["loss"] for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.5
    final = tmp_path / "final"
    summary = json.loads((final / "training_summary.json").read_text())
    assert summary["step"] == 40 and summary["heldout_loss"] < losses[0]
    model = AutoModelForCausalLM.from_pretrained(final)
    assert model.dtype == torch.bfloat16 and model.config.num_hidden_layers == 2
    tokenizer = AutoTokenizer.from_pretrained(final)
    text = "def f(x):\n    return x ** 2  # é\n"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text and max(ids) < model.config.vocab_size
    assert tokenizer.eos_token == EOS_TOKEN and model.config.eos_token_id == tokenizer.eos_token_id


def test_an_interrupted_run_resumes_to_the_same_model(corpus, tmp_path):
    run(tmp_path / "straight", corpus, "--steps", "12")
    run(tmp_path / "resumed", corpus, "--steps", "12", "--stop-at", "5")
    assert not (tmp_path / "resumed" / "final").exists()
    assert torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=False)["step"] == 5
    run(tmp_path / "resumed", corpus, "--steps", "12")
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "straight" / "final").state_dict()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "resumed" / "final").state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
