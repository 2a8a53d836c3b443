"""Benchmark questions and how they become token ids.

Two file formats, both JSON lines:
  - the public speculative-decoding sets (MT-bench, HumanEval, GSM8K, Alpaca, CNN/DM, NQ, WMT19,
    AIME 2025) as collected by the EAGLE / MARS releases: `question_id`, `category`, `turns`;
  - the project's own held-out stdlib prompts (`eval.prompts`): `question_id`, `file`, `name`, `prompt`.

Chat models get their tokenizer's chat template; turn n of a multi-turn question is asked after the
model's own answers to the earlier turns. Raw prompts (the embedded code model) are fed as text,
after the tokenizer's BOS token if it has one (training joined files with it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR_ENV = "MARS_BENCH_DIR"
DEFAULT_BENCH_DIR = "../shared/data/bench"  # relative to the repository root
PUBLIC_SETS = ("mt_bench", "humaneval", "gsm8k", "alpaca", "sum", "qa", "wmt19", "aime2025")


@dataclass
class Question:
    question_id: int | str
    turns: list[str]
    category: str = ""
    meta: dict = field(default_factory=dict)  # e.g. file and name of a stdlib prompt


def resolve(path: str | Path) -> Path:
    """A path as given if absolute, else relative to the repository root (not the working directory)."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


def bench_dir(data_dir: str | Path | None = None) -> Path:
    """The directory of the public sets: `data_dir`, else $MARS_BENCH_DIR, else ../shared/data/bench."""
    directory = resolve(data_dir or os.environ.get(BENCH_DIR_ENV) or DEFAULT_BENCH_DIR)
    if not directory.is_dir():
        raise FileNotFoundError(
            f"benchmark data directory {directory} does not exist. Point bench.data_dir (or ${BENCH_DIR_ENV}) at a "
            f"directory of <set>.jsonl files ({', '.join(PUBLIC_SETS)}). The public originals are the question files "
            "in the data directories of the EAGLE (github.com/SafeAILab/EAGLE) and MARS (github.com/5SSjw/MARS) "
            "releases; the project expects them in ../shared/data/bench next to the repository."
        )
    return directory


def question_file(name: str, data_dir: str | Path | None = None) -> Path:
    """`name` is a public set (looked up in the bench directory) or a path to a .jsonl file."""
    if name.endswith(".jsonl"):
        path = resolve(name)
        if not path.exists():
            raise FileNotFoundError(f"question file {path} does not exist")
        return path
    path = bench_dir(data_dir) / f"{name}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no {name}.jsonl in {path.parent}; known sets: {', '.join(PUBLIC_SETS)}")
    return path


def _question(record: dict, where: str) -> Question:
    if "turns" in record:
        turns = record["turns"]
    elif "prompt" in record:
        turns = [record["prompt"]]
    else:
        raise ValueError(f"{where}: a question needs 'turns' (list of user turns) or 'prompt'")
    if "question_id" not in record or not turns or not all(isinstance(t, str) for t in turns):
        raise ValueError(f"{where}: a question needs a 'question_id' and non-empty string turns")
    meta = {k: v for k, v in record.items() if k not in ("question_id", "turns", "prompt", "category", "reference")}
    return Question(record["question_id"], list(turns), record.get("category", ""), meta)


def load_questions(name: str, data_dir: str | Path | None = None, limit: int | None = None) -> list[Question]:
    """Questions of a set, in file order; the first `limit` of them if given."""
    path = question_file(name, data_dir)
    questions = []
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                questions.append(_question(json.loads(line), f"{path}:{n}"))
    if not questions:
        raise ValueError(f"{path} holds no questions")
    return questions[:limit] if limit else questions


def encode(tokenizer, turns: list[str], answers: list[str], chat: bool, system_prompt: str | None = None,
           chat_template_kwargs: dict | None = None) -> list[int]:
    """Token ids asking `turns[len(answers)]`, after the earlier turns and the model's `answers` to them."""
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("this benchmark wants a chat template but the tokenizer has none: set "
                             "model.chat_template, or bench.chat=false to feed the turns as raw text")
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        for question, answer in zip(turns, answers, strict=False):
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": turns[len(answers)]})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **(chat_template_kwargs or {}))
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    text = "".join(q + a + "\n" for q, a in zip(turns, answers, strict=False)) + turns[len(answers)]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = tokenizer.bos_token_id
    return ([bos] if bos is not None else []) + ids
