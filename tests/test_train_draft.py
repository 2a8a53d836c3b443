"""Draft-head training: TTT attention and unroll, losses, draft vocabulary, the CLI, checkpoints and resume."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import transformers
from helpers import (
    forward_tolerance,
    kl_tolerance,
    longest_reduction,
    probability_error,
    summation_tolerance,
    unit_roundoff,
)

import eagle.train.data as data_module
from eagle import Eagle1Head, Eagle3Head, load_draft
from eagle.train.data import (
    FeatureBatch,
    FeatureStore,
    Sequences,
    collect_features,
    generate_sequences,
    most_frequent_ids,
    token_counts,
)
from eagle.train.draft import (
    StepClock,
    batch_indices,
    build_head,
    check_data_dir,
    fit_schedule,
    generation_limits,
    lr_factor,
    train,
    ttt_depth,
)
from eagle.train.evaluate import continuation_data, evaluate_head
from eagle.train.ttt import head_vocab_ids, target_to_draft, ttt_attention_mask, ttt_loss, ttt_unroll

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)


pytestmark = pytest.mark.usefixtures("single_thread")


def corpus_texts() -> list[str]:
    """Small, repetitive Python-like texts: learnable in a few dozen steps."""
    texts = []
    for i in range(60):
        name = ["alpha", "beta", "gamma", "delta"][i % 4]
        texts.append(f"def {name}_{i}(x, y):\n    total = x + y * {i % 7}\n    return total\n\n"
                     f"class Item{i % 5}:\n    def __init__(self):\n        self.value = {name}_{i}(1, 2)\n")
    return texts


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    """A tiny random Llama target with its own byte-level BPE tokenizer and a JSONL corpus, saved to disk."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("target")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus_texts(), trainer=trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                                     pad_token="<|pad|>")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id, **TINY)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    texts = corpus_texts()
    (root / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:50]))
    (root / "heldout.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[50:]))
    return root


def tiny_target(vocab: int = 256, seed: int = 0, sharpen: float = 40.0):
    """A random Llama; `sharpen` scales its lm_head so that its distributions are peaked enough to learn."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=vocab, **TINY)).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpen)
    return model


def full_sequences(ids: torch.Tensor) -> Sequences:
    return Sequences(ids, torch.full((ids.shape[0],), ids.shape[1]), torch.ones(ids.shape, dtype=torch.bool))


# The precisions the CLI tests pin (the same on every CPU): the target's dtype and the draft's compute.
PINNED = {"float32": "fp32", "bfloat16": "bf16"}


def cli(target_dir: Path, out: Path, *extra: str, dtype: str = "float32") -> list[str]:
    return ["--target", str(target_dir / "model"), "--out", str(out), "--data-jsonl", str(target_dir / "train.jsonl"),
            "--seq-len", "32", "--batch", "2", "--draft-vocab-size", "128", "--ttt-steps", "3", "--lr", "1e-3",
            "--warmup", "2", "--wandb", "off", "--eval-sequences", "0", "--save-every", "3", "--log-every", "5",
            "--target-dtype", dtype, "--precision", PINNED[dtype], *extra]


# --- TTT ------------------------------------------------------------------------------------

def test_ttt_attention_mask_small_case():
    t, f = True, False
    expected = torch.tensor([
        # step 0 (causal)   step 1 (diagonal)   step 2 (self)
        [t, f, f,           t, f, f,            t, f, f],
        [t, t, f,           f, t, f,            f, t, f],
        [t, t, t,           f, f, t,            f, f, t],
    ])
    assert torch.equal(ttt_attention_mask(3, 2), expected)
    assert torch.equal(ttt_attention_mask(3, 0), expected[:, :3])


@pytest.mark.parametrize("kind", ["eagle3", "eagle1"])
def test_ttt_unroll_equals_drafting_one_branch(kind):
    """Step j at position i is exactly what `extend` + j `propose` calls compute at inference."""
    model = tiny_target()
    head = Eagle3Head.for_target(model.config, 128) if kind == "eagle3" else Eagle1Head.for_target(model)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    features = collect_features(model, full_sequences(ids), head.config.feature_layers).features.float()
    outputs = ttt_unroll(head, features, ids, steps=4)
    # The same layers over differently shaped (masked, batched) inputs: equal up to rounding
    # (forward_tolerance), step j through the input projection and j + 1 passes of the head's layer.
    terms = longest_reduction(head, ids.shape[1] * 4)

    def assert_step_close(got, ref, step):
        torch.testing.assert_close(got, ref, atol=forward_tolerance(step + 2, terms, ref.abs().max().item()), rtol=0)

    for b in range(2):
        for i in (0, 4, 7):
            head.reset()
            hidden, _ = head.extend(features[b, : i + 1], ids[b, 1 : i + 2])
            assert_step_close(hidden, outputs[0][b, i], 0)
            hidden = hidden[None]
            for depth in range(1, 4):  # a chain: each node's ancestors are all earlier tentative nodes
                ancestors = torch.ones(1, depth, dtype=torch.bool)
                hidden, _ = head.propose(hidden, ids[b, i + depth + 1 : i + depth + 2], depth, ancestors)
                assert_step_close(hidden[0], outputs[depth][b, i], depth)


def test_target_distribution_is_restricted_to_draft_vocab():
    model = tiny_target(vocab=16)
    head = Eagle3Head.for_target(model.config, 4)
    head.set_draft_vocab(torch.tensor([2, 5, 7, 11]))
    batch = FeatureBatch(
        input_ids=torch.zeros(1, 3, dtype=torch.long), loss_mask=torch.ones(1, 3, dtype=torch.bool),
        features=torch.zeros(1, 3, head.config.feature_size),
        topk_ids=torch.tensor([[[5, 3, 7], [3, 1, 0], [11, 2, 9]]]),  # position 1: nothing in the draft vocab
        topk_probs=torch.tensor([[[0.5, 0.3, 0.2], [0.6, 0.3, 0.1], [0.7, 0.2, 0.1]]]),
    )
    # One step over positions 0..1 predicts positions 1..2 of the distribution.
    result = ttt_loss(head, batch, steps=1)
    assert result.steps[0].count == 1  # position 1 has no draft-vocab mass and is masked
    with torch.no_grad():
        hidden = ttt_unroll(head, batch.features, batch.input_ids, 1)[0]
        logp = torch.log_softmax(head.logits(hidden).float(), -1)
    # Position 2: target ids 11 (0.7) and 2 (0.2) are draft ids 3 and 0, renormalised over 0.9; 9 is dropped.
    expected = -(0.7 / 0.9 * logp[0, 1, 3] + 0.2 / 0.9 * logp[0, 1, 0])
    torch.testing.assert_close(result.loss, expected)


@pytest.mark.parametrize("kind", ["eagle3", "eagle1"])
def test_loss_decreases_on_a_fixed_batch(kind):
    model = tiny_target()
    ids = torch.randint(0, 256, (4, 24), generator=torch.Generator().manual_seed(2))
    head = build_head(kind, model, 128, {})
    if kind == "eagle3":
        head.set_draft_vocab(most_frequent_ids(token_counts(full_sequences(ids), 256), 128))
    batch = collect_features(model, full_sequences(ids), head.config.feature_layers)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    losses = []
    for _ in range(20):
        result = ttt_loss(head, batch, steps=3)
        optimizer.zero_grad()
        result.loss.backward()
        optimizer.step()
        losses.append(result.loss.item())
    assert losses[-1] < 0.6 * losses[0], losses
    if kind == "eagle3":
        assert head.embed_tokens.weight.grad is None  # frozen copy of the target's embedding
        assert torch.equal(head.embed_tokens.weight, model.get_input_embeddings().weight)  # untouched, bit for bit


# --- the full target distribution: forward KL and sum min(p, q) ---------------------------------

def test_full_distribution_kl_and_acceptance_equal_their_definitions():
    """With the target's last hidden state, the loss is KL(p_V || q) against the target's own full softmax
    (p_V: restricted to the draft vocabulary, renormalised) and sample_accept is sum_x min(p, q) over the
    whole vocabulary, q zero outside the draft's; the top-k form overstates that acceptance."""
    model = tiny_target(vocab=64, sharpen=4.0)  # flat enough that the top 4 hold well under the whole mass
    head = Eagle3Head.for_target(model.config, 16)
    head.set_draft_vocab(torch.arange(0, 64, 4))
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(3))
    seqs = full_sequences(ids)
    seqs.loss_mask[1, :3] = False
    full = collect_features(model, seqs, head.config.feature_layers, target_dist="full")
    assert full.topk_ids is None and full.target_dist == "full"
    with torch.no_grad():
        logits = model(ids).logits
    lm_head = model.get_output_embeddings()
    with torch.no_grad():
        stored = lm_head(full.last_hidden)
    # The stored state gives the target's logits, up to the rounding of a forward with a mask against one
    # without (forward_tolerance: every layer, then the lm_head).
    atol = forward_tolerance(model.config.num_hidden_layers + 1, longest_reduction(model, ids.shape[1]),
                             logits.abs().max().item())
    torch.testing.assert_close(stored, logits, atol=atol, rtol=0)

    result = ttt_loss(head, full, steps=2, decay=0.5, target_lm_head=lm_head)
    outputs = ttt_unroll(head, full.features, ids, 2)
    # The definitions below from the logits the loss sees (the stored state's): float32 sums over the
    # target's 64 tokens or the draft's 16, of probabilities off by `probability_error(64)` u.
    p = torch.softmax(stored.float(), -1)
    sum_tol = summation_tolerance(64, 1.0, term_error=probability_error(64))  # per position, of terms <= 1 in all
    expected_tol = 0.0
    vocab = head_vocab_ids(head)
    assert vocab.tolist() == list(range(0, 64, 4))
    expected_loss = 0.0
    for j in range(2):
        q = torch.softmax(head.logits(outputs[j]).float(), -1).detach()  # [B, L, 16]
        kl, accept, mass, count = 0.0, 0.0, 0.0, 0
        for b in range(2):
            for i in range(ids.shape[1] - 1):
                pos = i + j + 1  # step j at position i predicts the target's distribution at i + j + 1
                if pos >= ids.shape[1] or not seqs.loss_mask[b, pos]:
                    continue
                pv = p[b, pos, vocab] / p[b, pos, vocab].sum()
                kl += float((pv * (pv.log() - q[b, i].log())).sum())
                q_full = torch.zeros(64).index_put((vocab,), q[b, i])
                accept += float(torch.minimum(p[b, pos], q_full).sum())
                mass += float(p[b, pos, vocab].sum())
                count += 1
        stats = result.steps[j].means()
        assert stats["positions"] == count
        kl_tol = kl_tolerance(64, kl, count) / count  # the mean's: the sum's over the positions
        assert stats["loss"] == pytest.approx(kl / count, abs=kl_tol)
        assert stats["sample_accept"] == pytest.approx(accept / count, abs=sum_tol)
        assert stats["draft_vocab_mass"] == pytest.approx(mass / count, abs=sum_tol)
        assert stats["draft_vocab_mass"] > stats["sample_accept"]  # its ceiling
        expected_loss += 0.5**j * kl / count
        expected_tol += 0.5**j * kl_tol
    assert result.loss.item() == pytest.approx(expected_loss, abs=expected_tol)

    # The top-k figure is named apart; with k = the whole vocabulary it is the same number.
    for k, same in ((4, False), (64, True)):
        topk = collect_features(model, seqs, head.config.feature_layers, top_k=k)
        stats = ttt_loss(head, topk, steps=1).steps[0].means()
        assert "sample_accept" not in stats
        true_accept = result.steps[0].means()["sample_accept"]
        assert (stats["sample_accept_topk"] == pytest.approx(true_accept, abs=sum_tol)) == same

    with pytest.raises(ValueError, match="needs target_lm_head"):
        ttt_loss(head, full, steps=1)
    with pytest.raises(ValueError, match="target_dist must be one of"):
        collect_features(model, seqs, head.config.feature_layers, target_dist="all")
    with pytest.raises(ValueError, match="carries the target's distribution once"):
        FeatureBatch(ids, seqs.loss_mask, full.features, topk.topk_ids, topk.topk_probs, full.last_hidden)


def test_features_skip_the_padding_and_keep_the_shard_order(tmp_path):
    """A store's forwards take its sequences by length, each only as wide as its longest sequence, and write
    each row's features in the shard's own order: equal to the row's forward alone up to rounding (and bf16
    storage). Alone, a row's forward is its own length: zeros and a distribution of no mass after it."""
    model = tiny_target(vocab=64)
    head = Eagle3Head.for_target(model.config, 16)
    lengths = torch.tensor([24, 7, 16, 3, 11])
    ids = torch.randint(0, 64, (5, 24), generator=torch.Generator().manual_seed(5))
    mask = torch.arange(24) < lengths[:, None] - 1
    seqs = Sequences(ids, lengths, mask)
    widths = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
                                           with_kwargs=True)
    FeatureStore(tmp_path, seqs, shard_size=8).build(model, head.config.feature_layers, 8, batch_size=2,
                                                     log=lambda _: None)
    hook.remove()
    assert widths == [7, 16, 24]  # lengths 3 and 7, 11 and 16, then 24
    stored = FeatureStore(tmp_path, seqs).batch(torch.arange(5))
    for r, n in enumerate(lengths.tolist()):
        alone = collect_features(model, seqs.select(torch.tensor([r])), head.config.feature_layers, top_k=8)
        assert alone.features.shape[1] == 24 and not alone.features[0, n:].any() and not alone.topk_probs[0, n:].any()
        got, ref = stored.features[r, :n].float(), alone.features[0, :n].float()
        magnitude = ref.abs().max().item()
        atol = forward_tolerance(model.config.num_hidden_layers, longest_reduction(model, n), magnitude) \
            + 2 * magnitude * unit_roundoff(torch.bfloat16)  # then each rounded to bf16 once
        torch.testing.assert_close(got, ref, atol=atol, rtol=0)
        # sorted probabilities (ids may swap where two tie within rounding), stored in float16
        torch.testing.assert_close(stored.topk_probs[r, :n].float(), alone.topk_probs[0, :n], atol=2e-3, rtol=0)


def test_forward_kl_training_raises_the_acceptance_of_sampled_drafts():
    """A few steps of the full-distribution loss move q towards p: the KL falls and sum min(p, q) rises."""
    model = tiny_target(vocab=64, sharpen=6.0)
    ids = torch.randint(0, 64, (4, 24), generator=torch.Generator().manual_seed(4))
    head = build_head("eagle3", model, 32, {})
    head.set_draft_vocab(most_frequent_ids(token_counts(full_sequences(ids), 64), 32))
    batch = collect_features(model, full_sequences(ids), head.config.feature_layers, target_dist="full")
    lm_head = model.get_output_embeddings()
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-2)
    history = []
    for _ in range(15):
        result = ttt_loss(head, batch, steps=2, target_lm_head=lm_head)
        optimizer.zero_grad()
        result.loss.backward()
        optimizer.step()
        history.append((result.loss.item(), result.steps[0].means()["sample_accept"]))
    (first_loss, first_accept), (last_loss, last_accept) = history[0], history[-1]
    # sum min(p, q) is capped by p's mass on the draft vocabulary (32 of 64 ids here): 0.46 on these positions
    assert last_loss < 0.6 * first_loss and last_accept > first_accept + 0.05, history
    assert lm_head.weight.grad is None  # the target is not trained


# --- draft vocabulary ---------------------------------------------------------------------------

def test_draft_vocab_is_the_most_frequent_next_tokens_and_maps_both_ways():
    # Next tokens (positions 1..) of trained positions: 9 x4, 3 x3, 7 x2, 1 x1; id 5 only at position 0
    # (never a next token); the masked position's next token (8) does not count.
    ids = torch.tensor([[5, 9, 9, 3, 7, 8], [5, 9, 3, 9, 3, 7], [5, 1, 0, 0, 0, 0]])
    seqs = Sequences(ids, torch.tensor([6, 6, 2]), torch.ones(3, 6, dtype=torch.bool))
    seqs.loss_mask[0, 4] = False
    counts = token_counts(seqs, 12)
    assert counts.tolist() == [0, 1, 0, 3, 0, 0, 0, 2, 0, 4, 0, 0]
    chosen = most_frequent_ids(counts, 4)
    assert chosen.tolist() == [1, 3, 7, 9]
    assert most_frequent_ids(counts, 5).tolist() == [0, 1, 3, 7, 9]  # ties: lowest id first

    head = Eagle3Head.for_target(tiny_target(vocab=12).config, 4)
    head.set_draft_vocab(chosen)
    assert head.to_target_ids(torch.arange(4)).tolist() == [1, 3, 7, 9]
    assert head.t2d.nonzero().flatten().tolist() == [1, 3, 7, 9]
    inverse = target_to_draft(head)
    assert inverse[chosen].tolist() == [0, 1, 2, 3]
    assert (inverse[~head.t2d] == -1).all()


# --- data --------------------------------------------------------------------------------------

def test_generated_sequences_mask_the_prompt(target_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(target_dir / "model").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(target_dir / "model")
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    seqs = generate_sequences(model, tokenizer, prompts, seq_len=16, batch_size=2, log=lambda _: None)
    for n, prompt in enumerate(prompts):
        length = int(seqs.lengths[n])
        assert seqs.input_ids[n, : len(prompt)].tolist() == prompt
        assert seqs.loss_mask[n].nonzero().flatten().tolist() == list(range(len(prompt) - 1, length - 1))
        logits = model(seqs.input_ids[n : n + 1, : length - 1]).logits[0]  # greedy, in the model's own precision
        assert logits[len(prompt) - 1 :].argmax(-1).tolist() == seqs.input_ids[n, len(prompt) : length].tolist()


def test_generation_killed_after_a_save_resumes_to_what_one_run_writes(target_dir, tmp_path, monkeypatch):
    model = transformers.AutoModelForCausalLM.from_pretrained(target_dir / "model").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(target_dir / "model")
    prompts = [[5 + i, 6, 7 + i % 3][: 2 + i % 2] for i in range(7)]
    whole = generate_sequences(model, tokenizer, prompts, seq_len=12, batch_size=2, temperature=1.0, seed=3,
                               log=lambda _: None)

    class Killed(Exception):
        pass

    saves = []
    real_save = data_module.save_atomic

    def killed_after_the_fourth_save(obj, path):
        real_save(obj, path)
        saves.append(len(obj["rows"]))
        if len(saves) == 4:
            raise Killed

    monkeypatch.setattr(data_module, "save_atomic", killed_after_the_fourth_save)
    monkeypatch.setattr(data_module, "SAVE_SECONDS", 0.0)  # save after every answer
    progress = tmp_path / "generating.pt"
    with pytest.raises(Killed):
        generate_sequences(model, tokenizer, prompts, seq_len=12, batch_size=2, temperature=1.0, seed=3,
                           log=lambda _: None, progress=progress)
    monkeypatch.setattr(data_module, "save_atomic", real_save)
    said = []
    resumed = generate_sequences(model, tokenizer, prompts, seq_len=12, batch_size=2, temperature=1.0, seed=3,
                                 log=said.append, progress=progress)
    assert said[0] == "resuming generation: 4/7 responses already written"
    assert said[-1].startswith("generated 3 responses")
    for name in ("input_ids", "lengths", "loss_mask"):  # each sample seeded by its prompt, not by its batch
        assert torch.equal(getattr(resumed, name), getattr(whole, name)), name


def test_a_spent_time_budget_keeps_whole_answers_and_a_rerun_continues_to_the_full_run(target_dir, tmp_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(target_dir / "model").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(target_dir / "model")
    prompts = [[5 + i, 6, 7 + i % 3][: 2 + i % 2] for i in range(7)]
    whole = generate_sequences(model, tokenizer, prompts, seq_len=12, batch_size=2, temperature=1.0, seed=3,
                               log=lambda _: None)
    progress, said = tmp_path / "generating.pt", []
    # a budget spent at once: the first group joins (nothing decodes yet), then no prompt joins after it
    cut = generate_sequences(model, tokenizer, prompts, seq_len=12, batch_size=2, temperature=1.0, seed=3,
                             log=said.append, progress=progress, seconds=0.0)
    assert len(cut.lengths) == 2 and any("5 prompts left unanswered" in line for line in said)
    shortest = sorted(range(7), key=lambda i: len(prompts[i]))[:2]
    for n, i in enumerate(sorted(shortest)):  # whole answers, as the unbounded run wrote them
        assert torch.equal(cut.input_ids[n], whole.input_ids[i])
    resumed = generate_sequences(model, tokenizer, prompts, seq_len=12, batch_size=2, temperature=1.0, seed=3,
                                 log=lambda _: None, progress=progress)
    for name in ("input_ids", "lengths", "loss_mask"):
        assert torch.equal(getattr(resumed, name), getattr(whole, name)), name


def test_a_generation_limit_answers_the_shortest_prompts_as_an_unlimited_run_does(target_dir, tmp_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(target_dir / "model").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(target_dir / "model")
    prompts = [[5 + i, 6, 7 + i % 3, 9][: 4 - i % 3] for i in range(7)]  # lengths 4, 3, 2, 4, 3, 2, 4
    kwargs = dict(seq_len=12, batch_size=2, temperature=1.0, seed=3, log=lambda _: None)
    whole = generate_sequences(model, tokenizer, prompts, **kwargs)
    progress = tmp_path / "generating.pt"
    limited = generate_sequences(model, tokenizer, prompts, progress=progress, limit=4, **kwargs)
    shortest = [2, 5, 1, 4]  # by length, ties in prompt order; answered in prompt order
    for name in ("input_ids", "lengths", "loss_mask"):
        assert torch.equal(getattr(limited, name), getattr(whole, name)[sorted(shortest)]), name
    said = []
    raised = generate_sequences(model, tokenizer, prompts, progress=progress, limit=6, **{**kwargs, "log": said.append})
    assert said[0] == "resuming generation: 4/6 responses already written"
    assert said[-1].startswith("generated 2 responses")
    assert torch.equal(raised.input_ids, whole.input_ids[:6])
    with pytest.raises(ValueError, match="positive"):
        generate_sequences(model, tokenizer, prompts, limit=0, **kwargs)


def test_a_generation_limit_may_change_until_the_sequences_exist(tmp_path):
    spec = {"seq_len": 12, "gen_limit": None}
    check_data_dir(tmp_path, spec)
    check_data_dir(tmp_path, {**spec, "gen_limit": [4]})  # still generating: the limit is updated
    assert json.loads((tmp_path / "meta.json").read_text())["gen_limit"] == [4]
    with pytest.raises(ValueError, match="seq_len"):
        check_data_dir(tmp_path, {"seq_len": 16, "gen_limit": [4]})
    (tmp_path / "sequences.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="gen_limit"):
        check_data_dir(tmp_path, {**spec, "gen_limit": [6]})
    assert generation_limits(None, 2, 1) == [None, None]
    assert generation_limits([5], 2, 2) == [3, 3]
    assert generation_limits([8, 3], 2, 1) == [8, 3]
    with pytest.raises(ValueError, match="one per --gen-temperature"):
        generation_limits([1, 2, 3], 2, 1)


def test_batches_cover_each_epoch_once():
    seen = torch.cat([batch_indices(step, 10, 3, seed=0) for step in range(3)])
    assert sorted(seen.tolist()) == sorted(set(seen.tolist())) and len(seen) == 9
    assert not torch.equal(batch_indices(0, 10, 3, seed=0), batch_indices(3, 10, 3, seed=0))  # reshuffled


def test_lr_warms_up_then_decays_to_a_tenth():
    factors = [lr_factor(step, total=100, warmup=10) for step in range(101)]
    assert factors[0] == 0.1 and factors[9] == 1.0 and factors[10] == 1.0
    assert all(a >= b for a, b in zip(factors[10:], factors[11:], strict=False))
    assert factors[100] == pytest.approx(0.1)


def test_a_deadline_keeps_the_longest_schedule_that_fits_with_the_curriculum_moving_along():
    clock = StepClock(margin=1.5)
    clock.record(2, 1.0)
    clock.record(2, 3.0)
    assert clock.seconds(2) == 2.0 and clock.seconds(5) == 2.0 * 5 / 2 * 1.5 and clock.seconds(1) == 1.0

    def depth(s: int, length: int) -> int:
        return ttt_depth(s, length, 5, "2:0.75")

    def cost(start: int, length: int) -> float:
        return sum(clock.seconds(depth(s, length)) for s in range(start, length))

    assert fit_schedule(10, 100, cost(10, 100) + 1, clock, depth) == 100  # it fits: unchanged, never longer
    for left in (50.0, 333.3, 1000.0):
        length = fit_schedule(10, 1000, left, clock, depth)
        assert cost(10, length) <= left < cost(10, length + 1)
    assert fit_schedule(10, 1000, 0.0, clock, depth) == 11  # nothing left: the step in hand ends it


def test_fitting_a_very_long_schedule_to_a_deadline_sums_only_the_steps_that_could_fit():
    # A --steps of 10^6 cut to a deadline summed every step of every candidate: seconds of Python, which under
    # load overran the deadline (the CLI test below stopped uncooled at step 40 of 117).
    clock = StepClock()
    clock.record(1, 0.5)
    calls = []

    def depth(s: int, length: int) -> int:
        calls.append(s)
        return ttt_depth(s, length, 5, "1:0.5")

    length = fit_schedule(10, 10_000_000, 60.0, clock, depth)
    assert 10 < length < 10 + 60.0 / 0.5 and sum(clock.seconds(depth(s, length)) for s in range(10, length)) <= 60
    assert len(calls) < 20 * (60.0 / 0.5)  # a dozen sums over at most the 121 steps that could fit


# --- CLI: store, final checkpoint, resume ---------------------------------------------------------

def test_cli_fits_its_schedule_to_a_deadline_and_ends_it_cooled(target_dir, tmp_path):
    out = tmp_path / "run"
    train(cli(target_dir, out, "--steps", "1000000", "--ttt-curriculum", "1:0.5", "--log-every", "1000000",
              "--deadline", str(time.time() + 8)))
    summary = json.loads((out / "final" / "training_summary.json").read_text())
    assert 25 <= summary["step"] == summary["schedule_steps"] < 1_000_000  # shortened, and run to its end
    last = json.loads((out / "train_log.jsonl").read_text().splitlines()[-1])  # the end of a schedule is logged
    assert last["step"] == summary["step"] and last["lr"] == pytest.approx(0.1 * 1e-3)  # cooled to a tenth


@pytest.mark.parametrize("dtype", list(PINNED))
def test_cli_trains_saves_a_loadable_head_and_stores_features(target_dir, tmp_path, dtype):
    out = tmp_path / "run"
    head = train(cli(target_dir, out, "--steps", "6", "--eval-sequences", "2",
                     "--eval-jsonl", str(target_dir / "heldout.jsonl"), dtype=dtype))
    # the precision training loaded the target in
    target = transformers.AutoModelForCausalLM.from_pretrained(target_dir / "model", dtype=getattr(torch, dtype))
    loaded = load_draft(out / "final", target, dtype=torch.float32)
    assert torch.equal(loaded.d2t, head.d2t) and torch.equal(loaded.t2d, head.t2d)
    for name, value in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    features = torch.randn(7, head.config.feature_size)
    tokens = torch.randint(0, head.config.vocab_size, (7,))
    head.reset()
    loaded.reset()
    assert all(torch.equal(a, b) for a, b in zip(head.extend(features, tokens), loaded.extend(features, tokens),
                                                 strict=True))

    seqs = Sequences.load(out / "data" / "sequences.pt")
    store = FeatureStore(out / "data", seqs)
    assert not store.missing()
    rows = torch.tensor([3, 0])
    stored = store.batch(rows)
    fresh = collect_features(target, seqs.select(rows), head.config.feature_layers, top_k=32)
    assert torch.equal(stored.features, fresh.features)
    assert torch.equal(stored.topk_ids, fresh.topk_ids)
    held = FeatureStore(out / "data", seqs)  # every shard read into memory once (what a GPU run does)
    held.preload("cpu")
    windows = [[3, 0], [1]]
    for a, b in ((stored, held.batch(rows)), (store.packed(windows, 64), held.packed(windows, 64))):
        for name in ("input_ids", "loss_mask", "features", "topk_ids", "topk_probs", "doc_ids"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None and y is None) if x is None else torch.equal(x, y), name
    # The same forward (the features are equal), the stored probabilities rounded once to float16: within
    # u of each (half a subnormal step below float16's normal range), twice that for float32's last bits.
    half = torch.float16
    torch.testing.assert_close(stored.topk_probs, fresh.topk_probs, rtol=2 * unit_roundoff(half),
                               atol=2 * unit_roundoff(half) * torch.finfo(half).smallest_normal)

    report = json.loads((out / "final" / "eval.json").read_text())
    assert 0.0 <= report["first_token_acc"] <= report["first_token_top10_acc"] <= 1.0
    assert len(report["steps"]) == 3 and report["steps"][0]["positions"] > 0
    assert json.loads((out / "final" / "training_summary.json").read_text())["step"] == 6


def test_resume_continues_to_the_same_result(target_dir, tmp_path):
    data = ["--data-dir", str(tmp_path / "data")]
    interrupted, straight = tmp_path / "a", tmp_path / "b"
    train(cli(target_dir, interrupted, "--steps", "8", "--stop-at", "5", *data))
    assert torch.load(interrupted / "checkpoint.pt", weights_only=False)["step"] == 5
    resumed = train(cli(target_dir, interrupted, "--steps", "8", *data))
    assert torch.load(interrupted / "checkpoint.pt", weights_only=False)["step"] == 8
    logged = [json.loads(line)["step"] for line in (interrupted / "train_log.jsonl").read_text().splitlines()]
    assert logged == [5, 8]  # the second run picked up after step 5
    reference = train(cli(target_dir, straight, "--steps", "8", *data))
    for name, value in reference.state_dict().items():  # the same steps on the same batches: bit for bit
        assert torch.equal(resumed.state_dict()[name], value), name


def test_cli_eagle1_head_round_trip(target_dir, tmp_path):
    out = tmp_path / "e1"
    head = train(cli(target_dir, out, "--kind", "eagle1", "--steps", "3", "--ttt-steps", "2"))
    target = transformers.AutoModelForCausalLM.from_pretrained(target_dir / "model", dtype=torch.float32)
    loaded = load_draft(out / "final", target, dtype=torch.float32)
    assert isinstance(loaded, Eagle1Head)
    for name, value in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


def test_self_distillation_continues_a_head_on_greedy_and_sampled_continuations(target_dir, tmp_path):
    """EAGLE-3's recipe for a real target: --init a trained head, --generate the target's own continuations
    of prompts, greedily and at T=1 (--gen-temperature 0 1 splits the prompts between them)."""
    base = train(cli(target_dir, tmp_path / "base", "--steps", "4"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):\n    return"}) + "\n" for i in range(8)))
    out = tmp_path / "self"
    args = ["--target", str(target_dir / "model"), "--out", str(out), "--init", str(tmp_path / "base" / "final"),
            "--data-jsonl", str(prompts), "--generate", "--gen-temperature", "0", "1", "--gen-batch", "4",
            "--seq-len", "24", "--batch", "2", "--ttt-steps", "4", "--steps", "2", "--lr", "1e-3", "--warmup", "1",
            "--wandb", "off", "--eval-sequences", "0", "--log-every", "1", "--target-dtype", "float32",
            "--precision", "fp32"]
    head = train(args)
    # the head kept the initial head's shape and draft vocabulary, and trained on from its weights
    assert torch.equal(head.d2t, base.d2t) and head.config.to_json() == base.config.to_json()
    assert any(not torch.equal(head.state_dict()[k], v) for k, v in base.state_dict().items())
    summary = json.loads((out / "final" / "training_summary.json").read_text())
    assert summary["init"] == str(tmp_path / "base" / "final") and summary["gen_temperature"] == [0.0, 1.0]
    seqs = Sequences.load(out / "data" / "sequences.pt")
    model = transformers.AutoModelForCausalLM.from_pretrained(target_dir / "model", dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(target_dir / "model")
    greedy = generate_sequences(model, tokenizer, [tokenizer(json.loads(line)["prompt"])["input_ids"]
                                                   for line in prompts.read_text().splitlines()[0::2]],
                                seq_len=24, batch_size=4, log=lambda _: None)
    assert len(seqs) == 8 and torch.equal(seqs.input_ids[:4], greedy.input_ids)  # the greedy half, then sampled
    assert not torch.equal(seqs.input_ids[4:], greedy.input_ids)
    with pytest.raises(ValueError, match="eagle3 head but --kind is eagle1"):
        train([*args[:2], "--out", str(tmp_path / "other"), *args[4:], "--kind", "eagle1"])


def test_training_data_from_a_hub_dataset_of_conversations(tmp_path):
    """--data-hub reads ShareGPT ('conversations') and UltraChat ('messages') layouts through `datasets`
    (here a dataset directory built in the test): the same tokens as the same records from a JSONL file."""
    from transformers import AutoTokenizer

    from eagle.train.data import corpus_tokens, hub_records, read_jsonl
    from eagle.train.draft import parse_args, training_records

    tokenizer = AutoTokenizer.from_pretrained(Path(__file__).resolve().parents[1] / "data" / "models" / "target")
    layouts = {
        "sharegpt": {"conversations": [{"from": "human", "value": "def add(a, b):"},
                                       {"from": "gpt", "value": "    return a + b"}]},
        "ultrachat": {"messages": [{"role": "user", "content": "def sub(a, b):"},
                                   {"role": "assistant", "content": "    return a - b"}]},
    }
    for name, record in layouts.items():
        directory = tmp_path / name
        directory.mkdir()
        (directory / "train.jsonl").write_text(json.dumps(record) + "\n" + json.dumps(record) + "\n")
        from_hub = corpus_tokens(tokenizer, hub_records(str(directory), "train"), "train", tmp_path)
        from_jsonl = corpus_tokens(tokenizer, read_jsonl(directory / "train.jsonl"), "train", tmp_path)
        assert from_hub.numel() > 0 and torch.equal(from_hub, from_jsonl)
    args = parse_args(["--target", "t", "--out", "o", "--data-hub", str(tmp_path / "sharegpt"), "--data-split",
                       "train"])
    assert len(list(training_records(args))) == 2
    both = parse_args(["--target", "t", "--out", "o", "--data-hub", "x", "--data-jsonl", "y"])
    with pytest.raises(ValueError, match="--data-jsonl or --data-hub"):
        training_records(both)
    with pytest.raises(FileNotFoundError, match="could not load the dataset"):
        list(hub_records(str(tmp_path / "missing"), "train"))


def test_cli_full_distribution_stores_the_last_hidden_state_and_keeps_data_apart(target_dir, tmp_path):
    """--target-dist full: shards hold the target's final hidden state (its lm_head gives the target's own
    logits), training runs on the forward KL, and a data directory built one way refuses the other."""
    out = tmp_path / "full"
    train(cli(target_dir, out, "--steps", "3", "--target-dist", "full"))
    summary = json.loads((out / "final" / "training_summary.json").read_text())
    assert summary["target_dist"] == "full" and summary["loss"].startswith("forward KL")
    seqs = Sequences.load(out / "data" / "sequences.pt")
    shard = torch.load(out / "data" / "shard_00000.pt", weights_only=True)
    assert set(shard) == {"features", "last_hidden"}
    target = transformers.AutoModelForCausalLM.from_pretrained(target_dir / "model", dtype=torch.float32)
    with torch.no_grad():
        logits = target(seqs.input_ids[:2], attention_mask=(torch.arange(seqs.seq_len) < seqs.lengths[:2, None]).long()
                        ).logits
        torch.testing.assert_close(target.get_output_embeddings()(shard["last_hidden"][:2]), logits)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 3 and log[-1]["loss"] > 0
    with pytest.raises(ValueError, match="target_dist"):
        train(cli(target_dir, tmp_path / "other", "--steps", "3", "--data-dir", str(out / "data")))


def test_evaluation_on_the_targets_own_sampled_continuations(target_dir, tmp_path):
    """eagle.train.evaluate --prompts: the target continues the prompts (seeded, sampled at T = 1), and the
    report gives sum min(p, q) against the full distribution per draft step, over the continuations only."""
    target = transformers.AutoModelForCausalLM.from_pretrained(target_dir / "model", dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(target_dir / "model")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):\n    return"}) + "\n" for i in range(3)))
    seqs = continuation_data(target, tokenizer, prompts, seq_len=20, count=None, temperature=1.0, seed=5)
    again = continuation_data(target, tokenizer, prompts, seq_len=20, count=None, temperature=1.0, seed=5)
    assert len(seqs) == 3 and torch.equal(seqs.input_ids, again.input_ids)  # seeded
    prompt_len = len(tokenizer("def f0(x):\n    return")["input_ids"])
    assert not seqs.loss_mask[0, : prompt_len - 1].any()
    head = build_head("eagle3", target, 128, {})
    report = evaluate_head(head, target, seqs, steps=2)
    assert report["steps"][0]["positions"] == int(seqs.loss_mask[:, 1:].sum())
    assert 0.0 < report["first_token_sample_accept"] == report["steps"][0]["sample_accept"] < 1.0
    with pytest.raises(ValueError, match="must be >= 0"):
        continuation_data(target, tokenizer, prompts, 20, None, -1.0)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="holds no prompts"):
        continuation_data(target, tokenizer, empty, 20, None, 1.0)
