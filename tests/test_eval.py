"""The evaluation harness: prompt extraction, the parse rule, answer files, bench data, and eval.run end to end."""

from __future__ import annotations

import ast
import json
import os
from collections import Counter

import pytest
import torch
import transformers
from hydra import compose, initialize_config_dir

from eval.benchmarks import load_questions
from eval.benchmarks.prompting import PromptFormat, encode
from eval.benchmarks.questions import Question
from eval.config.methods import method_spec
from eval.config.paths import BENCH_DIR_ENV, DEFAULT_BENCH_DIR, REPO_ROOT, bench_dir
from eval.config.schema import sampling_of, validate
from eval.prompts import build_prompts, extract_prompts
from eval.reporting.metrics import format_table
from eval.rundirs.layout import AnswerFile, answer_record, read_answers
from eval.scoring import quality

SOURCE = '''"""A module."""

import os


def add(a, b):
    """Add two numbers.

    Returns a + b.
    """
    return a + b


def undocumented(x):
    return x


def only_docstring():
    """Nothing else."""


class Box:
    """A box."""

    def put(self, item):
        """Put an item in the box."""
        self.items.append(item)

    async def fetch(self):
        """Fetch it."""
        def inner():
            """Nested functions are not prompts."""
            return 1
        return inner()
'''


# --- prompts ----------------------------------------------------------------------------------

def test_extract_prompts_from_a_synthetic_file():
    found = extract_prompts(SOURCE)
    assert [(name, line) for name, line, _ in found] == [("add", 6), ("Box.put", 25), ("Box.fetch", 29)]
    name, _, prompt = found[0]
    assert prompt == 'def add(a, b):\n    """Add two numbers.\n\n    Returns a + b.\n    """\n    '
    for _, _, prompt in found:
        indent = len(prompt.split("\n")[0]) - len(prompt.split("\n")[0].lstrip())
        assert prompt.split("\n")[0].lstrip().startswith(("def ", "async def "))
        body = prompt + "pass\n"
        ast.parse("\n".join(line[indent:] for line in body.split("\n")))  # well-formed once a body is added
    assert found[1][2].endswith('"""Put an item in the box."""\n        ')
    assert extract_prompts("def broken(:\n") == []


def test_build_prompts_is_deterministic_and_limited(tmp_path):
    for i in range(3):
        (tmp_path / f"m{i}.py").write_text(SOURCE)
    files = sorted(tmp_path.glob("*.py"))
    prompts = build_prompts(files, tmp_path, count=4, per_file=2)
    again = build_prompts(files, tmp_path, count=4, per_file=2)
    assert prompts == again and len(prompts) == 4
    assert [p.question_id for p in prompts] == [0, 1, 2, 3]
    assert all(p.file.startswith("m") for p in prompts)
    assert build_prompts(files, tmp_path, count=64, max_chars=40) == []


def test_build_prompts_puts_first_the_prompts_a_smaller_count_chooses(tmp_path):
    """--first: a calibration set for batch B times the first 24 * B prompts, so the first 24 (batch 1's) must be
    the ones `--count 24` chooses, spread over the corpus, not the first files'."""
    for i in range(8):
        (tmp_path / f"m{i}.py").write_text(SOURCE)
    files = sorted(tmp_path.glob("*.py"))
    small = build_prompts(files, tmp_path, count=4, per_file=3)
    large = build_prompts(files, tmp_path, count=12, per_file=3, first=4)
    key = [(p.file, p.name) for p in large]
    assert key[:4] == [(p.file, p.name) for p in small] and len(set(key)) == 12
    assert sorted(key) == sorted((p.file, p.name) for p in build_prompts(files, tmp_path, count=12, per_file=3))
    assert [p.question_id for p in large] == list(range(12))
    every = build_prompts(files, tmp_path, count=48, per_file=3, first=4)  # more asked than the 24 there are
    assert [(p.file, p.name) for p in every[:4]] == [(p.file, p.name) for p in small] and len(every) == 24
    with pytest.raises(ValueError, match="must divide --count"):
        build_prompts(files, tmp_path, count=10, per_file=3, first=4)


def test_committed_prompt_set_is_well_formed():
    path = REPO_ROOT / "data/prompts/stdlib_heldout.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 64
    assert [r["question_id"] for r in records] == list(range(64))
    for r in records:
        assert {"question_id", "file", "name", "prompt"} <= set(r)
        assert len(r["prompt"]) <= 1000 and r["prompt"].split("\n")[-1].strip() == ""


# --- quality ----------------------------------------------------------------------------------

PROMPT = 'def area(w, h):\n    """Area of a rectangle."""\n    '
METHOD_PROMPT = '    def area(self):\n        """Area."""\n        '


@pytest.mark.parametrize("prompt,completion,eos,expected", [
    (PROMPT, "return w * h\n\n\ndef next_one():\n    pass\n", False, True),   # ends at the next def
    (PROMPT, "return w * h\n", True, True),                                  # ends at EOS
    (PROMPT, "if w > 0:\n        return w * h\n    return 0\n\nclass", False, True),
    (PROMPT, "result = max(w,\n                 h", False, True),         # cut inside a bracket: valid prefix
    (PROMPT, "for i in range(w):\n        total += i\n        if i >", False, True),  # partial last line dropped
    (PROMPT, "if w:\n", True, False),                                       # EOS with an open block
    (PROMPT, "return w * * h\n\ndef x(): pass\n", False, False),            # syntax error, then ended
    (PROMPT, "return ) w (\n        x = 1\n        y", False, False),       # syntax error before the cut
    (PROMPT, "x = 1\n      y = 2\n    z", False, False),                    # bad indentation
    (METHOD_PROMPT, "return self.w * self.h\n\n    def other(self):\n", False, True),  # method ended by dedent
    (METHOD_PROMPT, "return self.w *\n    x = 1\n", False, False),
    (PROMPT, "\n\ndef other():\n", False, False),                          # ended with an empty body
    (PROMPT, "", True, False),                                              # EOS straight away
    (PROMPT, "fierfierfier fa fa fa", False, False),                        # one garbage partial line
    (PROMPT, "return w", False, True),                                      # one partial line, valid so far
])
def test_parse_rule(prompt, completion, eos, expected):
    assert quality.parses(prompt, completion, eos) is expected


def test_function_source_cuts_at_the_end_of_the_function():
    source, ended, written = quality.function_source(PROMPT, "return w * h\nprint(area(1, 2))\n", False)
    assert ended and written == 1 and source == 'def area(w, h):\n    """Area of a rectangle."""\n    return w * h\n'
    source, ended, written = quality.function_source(METHOD_PROMPT, "return 1\n        x", False)
    assert not ended and written == 1 and source.startswith("def area(self):") and source.endswith("return 1\n")


def test_loglik_matches_a_full_forward_for_every_completion_of_a_kept_prompt():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)).eval()
    prompt = [1, 5, 7]

    def full_forward(completion):
        with torch.no_grad():
            logprobs = model(torch.tensor([prompt + completion])).logits[0].float().log_softmax(-1)
        return sum(logprobs[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion))

    total, n = quality.completion_loglik(model, prompt, [9, 11, 2])
    expected = full_forward([9, 11, 2])
    assert n == 3 and total == pytest.approx(expected, abs=1e-4)
    assert quality.token_prob(total, n) == pytest.approx(torch.tensor(expected / 3).exp().item(), rel=1e-4)
    kept = quality.PromptLoglik(model, prompt)  # the cache is cut back to the prompt after each completion
    for completion in ([9, 11, 2], [4], [30, 31, 32, 33, 34], [9, 11, 2]):
        total, n = kept(completion)
        assert n == len(completion) and total == pytest.approx(full_forward(completion), abs=1e-4)
    assert kept([]) == (0.0, 0)


# --- answer files -----------------------------------------------------------------------------

def _record(qid):
    return answer_record(qid, "m-strict", ["text"], [3], [7], [0.5], {"accepted": [4]})


def test_answers_are_written_incrementally_and_resume_skips_finished(tmp_path):
    path = tmp_path / "answers" / "strict.jsonl"
    f = AnswerFile(path)
    f.append(_record(1))
    assert [r["question_id"] for r in read_answers(path)] == [1]  # on disk before the next question
    f.append(_record(2))
    first = read_answers(path)
    assert first[0]["choices"][0] == {"index": 0, "turns": ["text"], "idxs": [3], "new_tokens": [7], "wall_time": [0.5]}
    assert {"question_id", "answer_id", "model_id", "tstamp", "choices"} <= set(first[0])
    with path.open("a") as out:
        out.write('{"question_id": 3, "answ')  # a run killed mid-write

    resumed = AnswerFile(path)
    assert resumed.done(1) and resumed.done(2) and not resumed.done(3)
    assert [r["answer_id"] for r in read_answers(path)] == [r["answer_id"] for r in first]  # torn line dropped
    resumed.append(_record(3))
    assert [r["question_id"] for r in read_answers(path)] == [1, 2, 3]
    assert AnswerFile(path).done(3)  # opening a file never truncates it


# --- bench data -------------------------------------------------------------------------------

def test_loads_mt_bench_from_the_shared_directory(monkeypatch):
    directory = bench_dir()  # $MARS_BENCH_DIR or ../shared/data/bench
    # Without the data (a user's checkout) there is nothing to load; CI sets MARS_BENCH_DIR, and then
    # the file must be there, so this test can never be skipped to green in CI.
    if not os.environ.get(BENCH_DIR_ENV) and not (directory / "mt_bench.jsonl").exists():
        pytest.skip(f"no mt_bench.jsonl in {directory} (set {BENCH_DIR_ENV} to run this test)")
    questions = load_questions("mt_bench")
    assert len(questions) == 80 and all(len(q.turns) == 2 for q in questions)
    assert questions[0].question_id == 81 and questions[0].category == "writing"
    # a subset takes the categories in turn (the file lists them ten by ten): 12 = one of each, then four more
    twelve = load_questions("mt_bench", limit=12)
    assert Counter(q.category for q in twelve[:8]) == Counter({c: 1 for c in {q.category for q in questions}})
    assert [q.question_id for q in twelve[8:]] == [82, 92, 102, 112]


def test_missing_bench_dir_is_a_clear_error(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere"
    monkeypatch.setenv(BENCH_DIR_ENV, str(missing))
    with pytest.raises(FileNotFoundError, match="nowhere.*MARS_BENCH_DIR"):
        load_questions("mt_bench")
    monkeypatch.delenv(BENCH_DIR_ENV)
    if (REPO_ROOT / DEFAULT_BENCH_DIR).is_dir():
        assert bench_dir() == REPO_ROOT / DEFAULT_BENCH_DIR
    with pytest.raises(FileNotFoundError, match="no_such_set.jsonl"):
        load_questions("no_such_set", data_dir=tmp_path)


# --- tiny stand-in pair -----------------------------------------------------------------------

def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([SOURCE] * 4, trainer=trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                                bos_token="<|endoftext|>", pad_token="<|pad|>")


def test_encode_completion_chat_and_fastchat():
    tok = tiny_tokenizer()
    completion, chat = PromptFormat(kind="completion"), PromptFormat(kind="chat")
    raw = encode(tok, Question(0, ["def f():\n"]), [], completion)
    assert raw[0] == tok.bos_token_id and tok.decode(raw[1:]) == "def f():\n"
    with pytest.raises(ValueError, match="chat template"):
        encode(tok, Question(0, ["hi"]), [], chat)
    tok.chat_template = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}[assistant]"
                         "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}")
    ids = encode(tok, Question(0, ["q1", "q2"]), ["a1"], chat)
    assert tok.decode(ids) == "[user]q1[assistant]a1[user]q2[assistant]"
    no_think = encode(tok, Question(0, ["q"]), [], PromptFormat(kind="chat", thinking=False, system_prompt="S"))
    assert tok.decode(no_think) == "[system]S[user]q[assistant]<no-think>"
    from fastchat.conversation import get_conv_template

    conv = get_conv_template("vicuna_v1.1")
    for role, text in zip(conv.roles * 2, ["q1", "a1", "q2", None], strict=True):
        conv.append_message(role, text)
    fmt = PromptFormat(kind="fastchat", fastchat_template="vicuna_v1.1")
    vicuna = encode(tok, Question(0, ["q1", "q2"]), ["a1"], fmt)
    assert tok.decode(vicuna, skip_special_tokens=True) == conv.get_prompt()
    with pytest.raises(ValueError, match="not a FastChat template"):
        PromptFormat(kind="fastchat", fastchat_template="no-such-template")
    with pytest.raises(ValueError, match="completion"):
        PromptFormat(kind="raw")


def test_humaneval_questions_keep_references_and_carry_the_completion_prompt():
    questions = load_questions("humaneval", limit=3)
    assert all(q.reference for q in questions)
    prompt = questions[0].meta["completion_prompt"]
    assert prompt.lstrip().startswith("from typing import List") and prompt.rstrip().endswith('"""')
    assert prompt.strip() in questions[0].turns[0]  # the chat turn wraps the same code


def test_a_malformed_question_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question_id": 0, "turns": ["a"]}\n{"question_id": 1, "turns": \n')
    with pytest.raises(ValueError, match=r"q.jsonl:2: malformed JSON"):
        load_questions(str(path))


def test_unknown_methods_and_bad_theta_fail_clearly():
    with pytest.raises(ValueError, match="unknown method 'fast'"):
        method_spec("fast")
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        run = validate(compose("config"))
    with pytest.raises(ValueError, match="theta=1.5"):
        sampling_of(method_spec("mars@1.5"), run.sampling)


def test_format_table_handles_missing_figures():
    table = format_table({"vanilla": {"tokens_per_s": 10.0, "tau": 1.0}, "mars@0.9": {"tokens_per_s": 20.0,
                                                                                       "speedup": 2.0}})
    assert "2.00x" in table and table.count("\n") == 3
