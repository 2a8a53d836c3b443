"""The draft-training recipe's levers: packed windows, the TTT curriculum, the warm start from the target, the
run's counters, and the continuous-batching answerer that writes the training data."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers import forward_tolerance, longest_reduction
from test_train_draft import TINY, cli, target_dir, tiny_target  # noqa: F401  (target_dir: a fixture)

from eagle import Eagle3Head
from eagle.config import eos_token_ids
from eagle.train.answering import LoopCap, answer_prompts
from eagle.train.data import FeatureBatch, Sequences, collect_features, pack_windows
from eagle.train.draft import PackedEpochs, train, ttt_depth, warm_start
from eagle.train.ttt import ttt_loss

pytestmark = pytest.mark.usefixtures("single_thread")


def test_pack_windows_places_every_sequence_once_within_the_width():
    lengths = torch.tensor([30, 5, 17, 32, 8, 8, 1, 20, 12, 31])
    windows = pack_windows(list(range(10)), lengths, width=32, group=4)
    assert sorted(i for w in windows for i in w) == list(range(10))
    assert all(sum(int(lengths[i]) for i in w) <= 32 for w in windows)
    assert {frozenset(w) for w in windows} >= {frozenset([3])}  # a full-width sequence alone
    with pytest.raises(ValueError, match="more than the packed width"):
        pack_windows([0], torch.tensor([40]), width=32)


def test_packed_epochs_resume_exactly_and_reshuffle():
    lengths = torch.randint(4, 30, (40,), generator=torch.Generator().manual_seed(0))
    epochs = PackedEpochs(lengths, 32, global_batch=3, seed=5)
    first = [epochs.batch(s) for s in range(2 * epochs.steps_per_epoch)]
    again = PackedEpochs(lengths, 32, global_batch=3, seed=5)
    assert [again.batch(s) for s in reversed(range(len(first)))] == first[::-1]  # any step, in any order
    one_epoch = [i for s in range(epochs.steps_per_epoch) for w in first[s] for i in w]
    assert len(one_epoch) == len(set(one_epoch))  # no sequence twice within an epoch
    assert first[0] != first[epochs.steps_per_epoch]


def test_a_packed_window_trains_as_its_sequences_do_alone():
    """Two sequences laid end to end in one row give each position the loss, agreement and counts it has with
    the sequences in rows of their own: attention and targets stay within a sequence."""
    model = tiny_target()
    head = Eagle3Head.for_target(model.config, 128)
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, 256, (1, 9), generator=gen), torch.randint(0, 256, (1, 13), generator=gen)
    width = 24
    alone = []
    for ids in (a, b):
        seqs = Sequences(ids, torch.tensor([ids.shape[1]]), torch.ones_like(ids, dtype=torch.bool))
        seqs.loss_mask[0, :2] = False  # a prompt of two tokens
        alone.append(collect_features(model, seqs, head.config.feature_layers))
    ids = torch.zeros(1, width, dtype=torch.long)
    mask = torch.zeros(1, width, dtype=torch.bool)
    docs = torch.zeros(1, width, dtype=torch.long)
    features = torch.zeros(1, width, alone[0].features.shape[-1], dtype=alone[0].features.dtype)
    topk_ids = torch.zeros(1, width, alone[0].topk_ids.shape[-1], dtype=torch.long)
    topk_probs = torch.zeros(1, width, alone[0].topk_probs.shape[-1])
    at = 0
    for doc, part in enumerate(alone, start=1):
        n = part.input_ids.shape[1]
        ids[0, at : at + n], mask[0, at : at + n], docs[0, at : at + n] = part.input_ids[0], part.loss_mask[0], doc
        features[0, at : at + n], topk_ids[0, at : at + n] = part.features[0], part.topk_ids[0]
        topk_probs[0, at : at + n] = part.topk_probs[0]
        at += n
    packed = ttt_loss(head, FeatureBatch(ids, mask, features, topk_ids, topk_probs, doc_ids=docs), steps=3)
    separate = [ttt_loss(head, part, steps=3) for part in alone]
    terms = longest_reduction(head, width * 3)
    for j in range(3):
        counts = [s.steps[j].count for s in separate]
        assert packed.steps[j].count == sum(counts) > 0
        assert packed.steps[j].correct == sum(s.steps[j].correct for s in separate)
        summed = sum(s.steps[j].loss for s in separate)
        tolerance = forward_tolerance(j + 3, terms, abs(summed)) * sum(counts)
        assert abs(packed.steps[j].loss - summed) <= tolerance


def test_warm_start_gives_the_target_logits_on_the_draft_vocabulary():
    model = tiny_target()
    head = Eagle3Head.for_target(model.config, 64)
    head.set_draft_vocab(torch.arange(0, 256, 4))
    warm_start(head, model)
    hidden = torch.randn(5, TINY["hidden_size"], generator=torch.Generator().manual_seed(0))
    # The target's last decoder output h becomes logits as lm_head(norm(h)): the head's now does the same.
    expected = model.get_output_embeddings()(model.get_decoder().norm(hidden))[:, torch.arange(0, 256, 4)]
    torch.testing.assert_close(head.logits(hidden), expected)


def test_ttt_curriculum_unrolls_short_first_then_full():
    assert [ttt_depth(s, 10, 5, "2:0.8") for s in range(10)] == [2] * 8 + [5] * 2
    assert ttt_depth(3, 10, 5, None) == 5
    with pytest.raises(ValueError, match="STEPS:FRACTION"):
        ttt_depth(0, 10, 5, "2")


def test_cli_with_every_lever_counts_what_it_spent_and_resumes(target_dir, tmp_path):  # noqa: F811
    out = tmp_path / "draft"
    levers = ("--pack", "--ttt-curriculum", "2:0.5", "--warm-start", "--steps", "6")
    train(cli(target_dir, out, *levers, "--stop-at", "3"))
    first = torch.load(out / "checkpoint.pt", weights_only=False)["counters"]
    assert first["loss_positions"] > 0 and first["cpu_seconds"] > 0
    train(cli(target_dir, out, *levers))
    summary = json.loads((out / "final" / "training_summary.json").read_text())
    assert summary["step"] == 6 and summary["pack"] and summary["warm_start"]
    assert summary["loss_positions"] > first["loss_positions"] and summary["cpu_seconds"] > first["cpu_seconds"]
    from eagle.train.status import status

    said = status(tmp_path)
    assert "draft: step 6/6" in said and "(schedule done)" in said and "features: " in said, said
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [row["ttt_depth"] for row in log if row["step"] in (5, 6)] == [3, 3]
    with pytest.raises(ValueError, match="--warm-start"):
        train(cli(target_dir, tmp_path / "again", "--warm-start", "--kind", "eagle1", "--steps", "1"))


def test_continuous_answers_equal_one_row_greedy_decoding(target_dir):  # noqa: F811
    model = transformers.AutoModelForCausalLM.from_pretrained(target_dir / "model").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(target_dir / "model")
    eos = eos_token_ids(model, tokenizer)
    prompts = [[5 + i, 6, 7 + i % 3, 9, 11][: 2 + i % 4] for i in range(7)]
    answers, stats = answer_prompts(model, prompts, 16, eos, tokenizer.pad_token_id, batch_size=3, loop_cap=None,
                                    log=lambda _: None)
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16 - len(prompt),
                             do_sample=False, eos_token_id=sorted(eos), pad_token_id=tokenizer.pad_token_id)
        assert answers[i] == out[0, len(prompt):].tolist(), i
    assert stats.answers == 7 and stats.answer_tokens == sum(len(a) for a in answers.values())
    assert stats.row_steps < 7 * 15  # finished rows left the batch


def test_sampled_answers_depend_on_their_prompt_and_seed_not_on_their_batch(target_dir):  # noqa: F811
    model = transformers.AutoModelForCausalLM.from_pretrained(target_dir / "model").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(target_dir / "model")
    eos = eos_token_ids(model, tokenizer)
    prompts = {k: [5 + k, 6, 7 + k % 3, 9][: 2 + k % 3] for k in range(9)}

    def answer(keys, batch_size, seed=0, temperature=1.0):
        return answer_prompts(model, {k: prompts[k] for k in keys}, 24, eos, tokenizer.pad_token_id,
                              batch_size=batch_size, temperature=temperature, seed=seed, loop_cap=None,
                              log=lambda _: None)[0]

    together = answer(range(9), batch_size=4)  # rows finish, wait for a quarter of the batch, leave, join
    alone = {k: answer([k], batch_size=1)[k] for k in (0, 4, 8)}
    assert all(together[k] == alone[k] for k in alone), (together, alone)
    greedy = answer(range(9), batch_size=4, temperature=0.0)
    assert sum(together[k] != greedy[k] for k in prompts) >= 5  # samples, not the argmax
    assert sum(answer(range(9), batch_size=4, seed=1)[k] != together[k] for k in prompts) >= 5


def test_loop_cap_ends_a_repeating_block_and_nothing_else():
    cap = LoopCap(max_period=4, span=8)
    assert cap.looping([1, 2, 3] + [7, 8, 9] * 4)
    assert not cap.looping(list(range(30)))
    assert not cap.looping([1, 2, 3, 4, 5] * 3)  # period 5 > max_period
    assert not cap.looping([7, 8] * 4)  # not longer than the span yet


def test_offline_tau_replays_strict_greedy_decoding_on_the_embedded_pair():
    """The learning curve's offline tau (the head alone over teacher-forced features) is what strict greedy
    decoding with the same fixed tree accepts, cycle by cycle, on the target's own greedy answers (float32:
    the pieces decoding computes and the one teacher-forced forward agree up to rounding, so allow one
    flipped cycle in a hundred)."""
    from pathlib import Path

    from eagle import load_draft
    from eagle.train.data import generate_sequences
    from eagle.train.evaluate import offline_tau
    from mars import SpeculativeGenerator
    from mars.decoding.settings import TreeShape

    models = Path(__file__).resolve().parent.parent / "data" / "models"
    target = transformers.AutoModelForCausalLM.from_pretrained(models / "target", dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(models / "target")
    head = load_draft(models / "draft", target)
    texts = ("def fibonacci(n):\n", "import os\n\n\ndef read_config(path):\n", "class Stack:\n    def push(self):\n")
    prompts = [tokenizer(text)["input_ids"] for text in texts]
    seqs = generate_sequences(target, tokenizer, prompts, seq_len=96, batch_size=3, loop_cap=None, log=lambda _: None)
    replayed = offline_tau(head, target, seqs, depth=4, branching=3, total_tokens=10)
    generator = SpeculativeGenerator(target, head, TreeShape(10, 4, 3))
    same = cycles = 0
    for n, prompt in enumerate(prompts):
        length = int(seqs.lengths[n])
        out = generator.generate(torch.tensor([prompt]), max_new_tokens=length - len(prompt))
        assert out.tokens == seqs.input_ids[n, len(prompt) : length].tolist()  # strict greedy = the answer
        # every cycle but the last, which the length cap may cut short in either
        online, offline = out.accept_lengths[:-1], replayed["accept_lengths"][n][: len(out.accept_lengths) - 1]
        same += sum(a == b for a, b in zip(online, offline, strict=True))
        cycles += len(online)
    assert replayed["tau"] > 1.5  # the embedded head drafts well: a replay that accepted nothing would show 1
    assert cycles > 30 and cycles - same <= max(1, cycles // 100), (same, cycles)


# --- the measurement scripts of the recipe (experiments/), at a tiny size ---------------------------------

def run_experiment(name: str, *args: str, monkeypatch) -> None:
    import runpy
    import sys

    from eval.config.paths import REPO_ROOT

    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.setattr(sys, "argv", [f"experiments/{name}.py", *args])
    runpy.run_path(str(REPO_ROOT / "experiments" / f"{name}.py"), run_name="__main__")


def test_answer_rate_times_the_old_and_the_continuous_answering(target_dir, tmp_path, monkeypatch):  # noqa: F811
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"def f{i}(x):"}]}) + "\n"
                               for i in range(3)))
    out = tmp_path / "rate.json"
    run_experiment("answer_rate", "--target", str(target_dir / "model"), "--prompts", str(prompts), "--count", "3",
                   "--seq-len", "16", "--configs", "generate:float32:2", "continuous:float32:2", "--out", str(out),
                   monkeypatch=monkeypatch)
    rows = json.loads(out.read_text())["rows"]
    assert [r["config"] for r in rows] == ["generate:float32:2", "continuous:float32:2"]
    assert all(r["answer_tokens"] > 0 and r["tokens_per_s"] > 0 for r in rows)


def test_recipe_cost_and_learning_curve_measure_finished_heads(target_dir, tmp_path, monkeypatch):  # noqa: F811
    run = tmp_path / "run"
    train(cli(target_dir, run, "--pack", "--steps", "2"))
    cost = tmp_path / "cost.json"
    run_experiment("recipe_cost", "--target", str(target_dir / "model"), "--data-dir", str(run / "data"),
                   "--draft-vocab-size", "128", "--batch", "2", "--variants", "unpacked:2", "packed:1",
                   "--rounds", "1", "--steps", "1", "--precision", "fp32", "--out", str(cost), monkeypatch=monkeypatch)
    rows = {r["variant"]: r for r in json.loads(cost.read_text())["rows"]}
    assert rows["unpacked:2"]["loss_positions"] > 0 and rows["packed:1"]["cpu_seconds"] > 0
    prompts = tmp_path / "heldout.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"class C{i}:"}]}) + "\n"
                               for i in range(2)))
    curve = tmp_path / "curve.json"
    run_experiment("learning_curve", "--target", str(target_dir / "model"), "--runs", str(run), "--prompts",
                   str(prompts), "--count", "2", "--seq-len", "24", "--tree", "2:2:4", "--online", "1",
                   "--cache-dir", str(tmp_path / "heldout"), "--out", str(curve), monkeypatch=monkeypatch)
    point = json.loads(curve.read_text())["points"][0]
    assert len(point["t0"]["top1"]) == 5 and point["offline_tau"]["tau"] >= 1.0
    assert point["online_tau"]["identical"] == 1  # strict greedy decoding emits the greedy answer
    assert curve.with_suffix(".png").exists()
    paired = tmp_path / "paired.json"
    run_experiment("paired_runs", str(run), str(run), "--window", "1", "--out", str(paired), monkeypatch=monkeypatch)
    windows = json.loads(paired.read_text())["windows"]
    assert windows and all(d["a_minus_b"] == 0 for w in windows for d in w["per_draft_step"])  # a run against itself
    unfinished = tmp_path / "unfinished"
    train(cli(target_dir, unfinished, "--steps", "4", "--stop-at", "1"))
    with pytest.raises(SystemExit, match="finished model"):
        run_experiment("learning_curve", "--target", str(target_dir / "model"), "--runs", str(unfinished),
                       "--prompts", str(prompts), "--count", "2", "--seq-len", "24", "--cache-dir",
                       str(tmp_path / "heldout"), "--out", str(curve), monkeypatch=monkeypatch)
