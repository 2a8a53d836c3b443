"""Benchmarks as plugins: a registry, one file per benchmark, and how their questions load.

A benchmark declares where its questions come from (a JSONL file in the benchmark directory, side
files such as HumanEval's unit tests, and optionally a public dataset on the Hugging Face hub with
the mapping of its rows to the question layout), its headline metric, whether it is scored against
the same model's vanilla answers, whether its answers run as programs in the sandbox, and how it
scores answers. Adding one, in any module:

    @register_benchmark
    class Riddles(Benchmark):
        name = "riddles"                   # bench.questions=riddles reads riddles.jsonl
        headline = "accuracy"

        def score(self, answers, questions, context):
            each = {qid: {"correct": turns[0].strip() == questions[qid]["reference"][0]} ...}
            return {"accuracy": ...}, each

Question records (the JSONL layout): `question_id`, `category`, `turns` (user turns), optionally
`reference` (reference answers). Answers to score: {str(question_id): [answer turn, ...]}.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from eval.benchmarks.questions import Question, read_question
from eval.config.paths import BENCH_DIR_ENV, bench_dir, bench_path, resolve
from eval.rundirs.jsonl import read_jsonl

BENCHMARKS: dict[str, Benchmark] = {}


@dataclass(frozen=True)
class HubSource:
    """A public set on the Hugging Face hub, read with `datasets` (and cached by it)."""

    dataset: str  # hub id
    split: str
    config: str | None = None
    revision: str | None = None  # a commit or tag to pin; None: the hub's default branch (recorded in the run)

    def describe(self) -> str:
        return f"{self.dataset}" + (f"/{self.config}" if self.config else "") + f" [{self.split}]" + (
            f" @ {self.revision}" if self.revision else "")


@dataclass
class ScoreContext:
    """What a benchmark's scorer may need besides answers and questions."""

    records: list[dict]  # the answer records as read (HumanEval runs them)
    baseline: dict[str, list[str]] | None = None  # the same model's vanilla answers, where given
    judge: Any = None  # an LLM judge's configuration (eval.scoring.judge), where configured
    data_dir: str | Path | None = None
    per_question: bool = False
    extra: dict = field(default_factory=dict)


class Benchmark:
    """Subclass, set the class attributes, implement `score`, and register the class."""

    name: ClassVar[str] = ""
    headline: ClassVar[str] = ""  # the metric reported as the benchmark's quality
    # Each question's figure behind the headline, which quality-recovery intervals resample
    # (eval.scoring.recovery): "" = the headline's own name in the per-question figures.
    question_figure: ClassVar[str] = ""
    vs_vanilla: ClassVar[bool] = False  # scored against the same model's vanilla answers (no references)
    side_files: ClassVar[tuple[str, ...]] = ()  # other files of the set, next to its JSONL
    # Its answers run as programs (in eval.scoring.sandbox): a run checks the sandbox's isolation before any
    # model loads, and the scored result records the level it ran under.
    sandboxed: ClassVar[bool] = False
    hub: ClassVar[HubSource | None] = None
    by_category: ClassVar[bool] = False  # report speed and tau per question category (Spec-Bench)

    def from_hub(self, row: dict, index: int) -> dict:
        """The question record of one row of the hub dataset (benchmarks with a `hub` source)."""
        raise NotImplementedError(f"benchmark {self.name!r} has no mapping from its hub dataset")

    def prepare(self, questions: list, directory: Path | None) -> None:
        """Attach what the side files add to the questions (e.g. HumanEval's completion prompts)."""

    def order(self, questions: list) -> list:
        """The order `num_prompts` takes questions in: as in the file, or (`by_category`) the first question
        of every category, then the second of every category, ..., so that N questions cover the categories
        evenly (Spec-Bench: num_prompts=26 is two per category)."""
        if not self.by_category:
            return questions
        rank: dict[str, int] = {}
        keyed = []
        for i, q in enumerate(questions):
            keyed.append((rank.get(q.category, 0), i, q))
            rank[q.category] = rank.get(q.category, 0) + 1
        return [q for _, _, q in sorted(keyed, key=lambda k: k[:2])]

    def score(self, answers: dict[str, list[str]], questions: dict[str, dict],
              context: ScoreContext) -> tuple[dict, dict]:
        """(metrics including `headline`, per-question figures) of `answers` (checked against `questions`)."""
        raise NotImplementedError

    def figure_of_question(self) -> str:
        """The per-question figure's name (`question_figure`, else the headline's)."""
        return self.question_figure or self.headline


def register_benchmark(cls: type[Benchmark]) -> type[Benchmark]:
    """Class decorator: make a benchmark available by its `name`."""
    if not cls.name or not cls.headline:
        raise ValueError(f"a benchmark needs a name and a headline metric ({cls.__qualname__})")
    BENCHMARKS[cls.name] = cls()
    return cls


def benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; registered: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


# --- loading questions ----------------------------------------------------------------------------

SOURCES = ("local", "hub", "auto")  # where a registered benchmark's questions come from (bench.source)


def question_file(name: str, data_dir: str | Path | None = None) -> Path:
    """`name` is a public set (looked up in the bench directory) or a path to a .jsonl file."""
    if name.endswith(".jsonl"):
        path = resolve(name)
        if not path.exists():
            raise FileNotFoundError(f"question file {path} does not exist")
        return path
    path = bench_dir(data_dir) / f"{name}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no {name}.jsonl in {path.parent}")
    return path


def resolved_source(name: str, data_dir: str | Path | None = None, source: str = "auto") -> str:
    """"local" or "hub": where `question_records` will read `name` from under `source`."""
    if source not in SOURCES:
        raise ValueError(f"bench.source must be one of {', '.join(SOURCES)}, got {source!r}")
    if source != "auto":
        return source
    if name.endswith(".jsonl") or (bench_path(data_dir) / f"{name}.jsonl").exists():
        return "local"
    return "hub" if name in BENCHMARKS and BENCHMARKS[name].hub is not None else "local"


def hub_records(name: str, hub=None) -> list[dict]:
    """The question records of registered benchmark `name` from its Hugging Face dataset (`hub`: another
    `HubSource` to read instead, e.g. a local dataset directory), mapped by the benchmark's `from_hub`."""
    spec = benchmark(name)
    hub = hub or spec.hub
    if hub is None:
        raise ValueError(f"benchmark {name!r} names no Hugging Face dataset: use bench.source=local with "
                         f"{name}.jsonl in the benchmark directory")
    try:
        import datasets
    except ImportError as e:
        raise ImportError(f"bench.source=hub needs the `datasets` package ({e}): pip install datasets") from None
    try:
        rows = datasets.load_dataset(hub.dataset, hub.config, split=hub.split, revision=hub.revision)
    except Exception as e:  # offline, a missing dataset, a bad revision: datasets' own error, with the fixes
        raise FileNotFoundError(
            f"could not load {hub.describe()} from the Hugging Face hub "
            f"({type(e).__name__}: {' '.join(str(e).split())[:300]}). "
            f"Either put {name}.jsonl in the benchmark directory ({bench_path()}; bench.data_dir or ${BENCH_DIR_ENV}) "
            "and use bench.source=local (or auto), or connect to the hub and retry with bench.source=hub (datasets "
            "caches the download)") from None
    return [spec.from_hub(dict(row), i) for i, row in enumerate(rows)]


def located_records(name: str, data_dir: str | Path | None = None, source: str = "auto") -> list[tuple[str, dict]]:
    """(where, record) for each question record of set `name` (`question_records`): file:line for a
    local file, the dataset and row for the hub."""
    if resolved_source(name, data_dir, source) == "hub":
        hub = benchmark(name).hub
        return [(f"{hub.describe()} row {i}", record) for i, record in enumerate(hub_records(name))]
    try:
        path = question_file(name, data_dir)
    except FileNotFoundError as e:
        hint = (f"; or read it from the Hugging Face hub: bench.source=hub ({BENCHMARKS[name].hub.describe()})"
                if name in BENCHMARKS and BENCHMARKS[name].hub is not None else "")
        raise FileNotFoundError(f"{e}{hint}") from None
    lines = read_jsonl(path)
    if lines.torn:
        warnings.warn(f"{path}: ignoring an incomplete last line", stacklevel=2)
    return [(f"{path}:{n}", record) for n, record in lines.records]


def question_records(name: str, data_dir: str | Path | None = None, source: str = "auto") -> list[dict]:
    """The question records (JSON objects of the question layout) of set `name`: a registered
    benchmark or any <name>.jsonl in the benchmark directory, or a .jsonl path. `source`: "local"
    reads the JSONL file, "hub" the benchmark's Hugging Face dataset, "auto" the file when there."""
    return [record for _, record in located_records(name, data_dir, source)]


def load_questions(name: str, data_dir: str | Path | None = None, limit: int | None = None,
                   source: str = "auto", max_turns: int | None = None) -> list[Question]:
    """Questions of a set (`question_records`), in order; the first `limit` of them if given, each with its first
    `max_turns` user turns if given (MT-bench's first turns: 1)."""
    questions = [read_question(record, where) for where, record in located_records(name, data_dir, source)]
    if not questions:
        raise ValueError(f"{name} holds no questions")
    stem = Path(name).stem if name.endswith(".jsonl") else name
    if stem in BENCHMARKS:  # side files (HumanEval's completion prompts), by name or by path; its order
        directory = resolve(name).parent if name.endswith(".jsonl") else bench_path(data_dir)
        BENCHMARKS[stem].prepare(questions, directory)
        questions = BENCHMARKS[stem].order(questions)
    if max_turns is not None:
        questions = [replace(q, turns=q.turns[:max_turns]) for q in questions]
    return questions[:limit] if limit else questions


# The built-in benchmarks register themselves on import.
from eval.benchmarks import (  # noqa: E402, F401
    aime2025,
    alpaca,
    gsm8k,
    humaneval,
    mt_bench,
    qa,
    spec_bench,
    sum,
    wmt19,
)
