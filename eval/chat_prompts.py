"""Chat prompts to train a draft head for a chat model, from what can be had legally with no download.

Four sources, each record a user turn `{"messages": [{"role": "user", "content": ...}], "source": ...}`
(the form `eagle.train.draft --data-jsonl` reads; the target writes the answers itself, `--generate`):

- **self** (Magpie, arXiv 2406.08464): the target is given its own chat template up to the start of a
  user turn and writes the user's message, sampled at temperature 1, ending at its end-of-turn token.
  What it asks is what it expects to be asked, in its own style, at no cost but its decoding.
- **self-task**: the same, with the user's message begun by one of a few generic task openers ("Write",
  "Imagine you are", "Solve", ...; `TASK_OPENERS`) that the target continues. Left to itself the target
  asks for advice and facts; benchmarks such as MT-bench ask it to write, play a role, reason, compute, code
  and extract, and a head trained on the first agrees less on the second.
- **chatterbot**: the first line of every English conversation of the `chatterbot-corpus` package
  (BSD-3-Clause; installed by the build script with --no-deps), read as YAML files, never imported.
- **docstrings**: questions about functions of the standard library's *train* split (eagle.train.corpus;
  the held-out split is the embedded pair's benchmark), built from their names and docstrings with a few
  fixed phrasings, parsed with `ast` (no module is imported).

Then: whitespace-normalised, near-duplicates dropped (the same lowercase word sequence), and any prompt
that **overlaps a benchmark question** dropped. The rule: lowercase both, keep letters and digits as
words; a prompt overlaps a question if it shares any run of OVERLAP_WORDS (8) consecutive words with
one of the question's turns, or, when either has fewer words than that, if the shorter one's word sequence
is contained in the other's (equal included). Questions are every turn of every registered benchmark and every other
question file in the bench directory (`../shared/data/bench`), read with `eval.benchmarks.load_questions`.

    python -m eval.chat_prompts --target <model dir> --self 4000 --out runs/smollm2/prompts.jsonl
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import random
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from eagle.config import eos_token_ids
from eagle.precision import resolve_dtype
from eagle.train.answering import answer_prompts
from eagle.train.corpus import read_source, stdlib_files, stdlib_root
from eagle.train.data import read_jsonl
from eval.benchmarks import BENCHMARKS, load_questions
from eval.config.paths import bench_path

OVERLAP_WORDS = 8
SENTINEL = "\u2063mars-user-turn\u2063"  # a user message no template alters, to find where it would start


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def record(text: str, source: str) -> dict:
    return {"messages": [{"role": "user", "content": text}], "source": source}


# --- sources -----------------------------------------------------------------------------------

def user_turn_prefix(tokenizer) -> str:
    """The chat template rendered up to where a user's message begins (its default system message included)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False,
                                         add_generation_prompt=False)
    return text[: text.index(SENTINEL)]


# Generic openers of task requests, one per kind of task a chat benchmark asks for (writing, role play,
# reasoning, math, code, extraction, explanation, discussion): the target writes the rest of the request.
TASK_OPENERS = (
    "Write a", "Compose a", "Draft an email", "Write a short story", "Create a list of", "Rewrite the following",
    "Imagine you are", "Pretend to be", "Act as a", "You are a",
    "Suppose that", "If a", "Which of the following", "Explain why",
    "Solve", "Calculate", "A train", "Find the value of",
    "Write a Python function", "Implement a", "Write a program that", "Here is some code",
    "Extract", "Summarize the following", "Given the following", "Identify the",
    "Describe", "Explain how", "What are the main", "How does",
    "Discuss", "Compare", "Analyze", "What would happen if",
)


def self_prompts(model, tokenizer, count: int, batch: int = 64, max_tokens: int = 96, seed: int = 0,
                 openers: Sequence[str] = (), log=print) -> list[str]:
    """`count` user messages the target writes at temperature 1 from `user_turn_prefix` (Magpie), kept when
    they end with its end-of-turn token within `max_tokens`. Written by continuous batching
    (`eagle.train.answering`), each row sampled from its own generator seeded by (seed, its number).
    With `openers`, row k's message begins with `openers[k % len(openers)]`, which the kept text includes."""
    template, starts = user_turn_prefix(tokenizer), list(openers) or [""]
    # each opener tokenized together with the template, as the model reads them
    prefixes = [tokenizer(template + o, add_special_tokens=False)["input_ids"] for o in starts]
    eos = eos_token_ids(model, tokenizer)  # its end-of-turn token(s), as the engine stops on them
    out: list[str] = []
    first = 0
    while len(out) < count:
        # ~80% of the rows end in time and are long enough: ask for a little more than is missing
        asked = max(batch, int(1.3 * (count - len(out))))
        answers, _ = answer_prompts(model, {k: prefixes[k % len(starts)] for k in range(first, first + asked)},
                                    max(map(len, prefixes)) + max_tokens, eos, min(eos), batch_size=batch,
                                    temperature=1.0, seed=seed, loop_cap=None, log=log)
        first += asked
        for k in sorted(answers):
            row = answers[k]
            if row and row[-1] in eos:
                text = (starts[k % len(starts)] + tokenizer.decode(row[:-1], skip_special_tokens=True)).strip()
                if len(words(text)) >= 3:
                    out.append(text)
        log(f"self prompts: {min(len(out), count)}/{count}")
    return out[:count]


def chatterbot_prompts() -> list[str]:
    """The first line of every English conversation in the installed chatterbot-corpus package."""
    import yaml

    spec = importlib.util.find_spec("chatterbot_corpus")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("chatterbot-corpus is not installed: pip install --no-deps chatterbot-corpus==1.3.3")
    root = Path(next(iter(spec.submodule_search_locations))) / "data" / "english"
    prompts = []
    for path in sorted(root.glob("*.yml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for conversation in data.get("conversations") or []:
            if conversation and isinstance(conversation[0], str):
                text = conversation[0].strip()
                prompts.append(text[:1].upper() + text[1:])
    return prompts


PHRASINGS = (
    "What does the Python function `{name}` in the `{module}` module do?",
    "Explain in simple words what this part of Python's standard library does:\n\n{signature}\n\"\"\"{doc}\"\"\"",
    "Write a short example that uses `{module}.{name}` and explain it.",
    "When would I use `{module}.{name}` in Python, and what should I watch out for?",
)


def docstring_prompts(count: int, seed: int = 0, per_file: int = 3) -> list[str]:
    """`count` questions about documented public functions of the stdlib's train split: files in a seeded
    order, at most `per_file` functions from each (read until there are enough), one phrasing each."""
    rng = random.Random(seed)
    root = stdlib_root()
    files = stdlib_files("train")
    rng.shuffle(files)
    candidates = []
    for path in files:
        if len(candidates) >= count:
            break
        source = read_source(path)
        try:
            tree = ast.parse(source) if source is not None else None
        except SyntaxError:
            tree = None
        if tree is None:
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        found = []
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                if doc and 20 <= len(doc) <= 600:
                    args = ", ".join(a.arg for a in node.args.args)
                    found.append((module, node.name, f"def {node.name}({args}):", doc.split("\n\n")[0]))
        candidates += rng.sample(found, min(per_file, len(found)))
    return [rng.choice(PHRASINGS).format(module=m, name=n, signature=s, doc=d) for m, n, s, d in candidates[:count]]


# --- cleaning ----------------------------------------------------------------------------------

def deduplicated(prompts: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(text, source) in order, whitespace-normalised, the first of each lowercase word sequence kept."""
    seen, out = set(), []
    for text, source in prompts:
        text = re.sub(r"[ \t]+", " ", text).strip()
        key = tuple(words(text))
        if key and key not in seen:
            seen.add(key)
            out.append((text, source))
    return out


def benchmark_turns(data_dir: str | Path | None = None) -> list[str]:
    """Every turn of every benchmark question: the registered benchmarks and any other question file in
    the bench directory."""
    turns = []
    directory = bench_path(data_dir)
    names = list(BENCHMARKS) + [str(p) for p in sorted(directory.glob("*.jsonl")) if p.stem not in BENCHMARKS]
    for name in names:
        try:
            questions = load_questions(name, data_dir)
        except (ValueError, KeyError, FileNotFoundError):
            continue  # not a question file (e.g. the judge's prompts)
        turns += [t for q in questions for t in q.turns]
    return turns


class Overlap:
    """The rule of the module docstring, against a fixed set of benchmark turns."""

    def __init__(self, turns: Iterable[str], n: int = OVERLAP_WORDS):
        self.n = n
        self.grams: set[tuple[str, ...]] = set()
        self.joined: list[str] = []  # every turn as " w1 w2 ... " (containment at word boundaries)
        self.short: list[str] = []  # the turns under n words, likewise
        for turn in turns:
            w = words(turn)
            if not w:
                continue
            self.grams.update(self._grams(w))
            self.joined.append(f" {' '.join(w)} ")
            if len(w) < self.n:
                self.short.append(self.joined[-1])

    def _grams(self, w: list[str]) -> Iterator[tuple[str, ...]]:
        return (tuple(w[i: i + self.n]) for i in range(len(w) - self.n + 1))

    def __call__(self, prompt: str) -> bool:
        w = words(prompt)
        if not w:
            return False
        if any(g in self.grams for g in self._grams(w)):
            return True
        inner = f" {' '.join(w)} "
        if len(w) < self.n and any(inner in turn for turn in self.joined):  # a short prompt inside a turn
            return True
        return any(turn in inner for turn in self.short)  # a short turn inside the prompt


def build(sources: dict[str, list[str]], overlap: Overlap, exclude: Iterable[str] = ()) -> tuple[list[dict], dict]:
    """The records, and counts per source: offered, kept, dropped as duplicates (of each other or of an
    `exclude` prompt: another set's, which this one must not share), dropped for overlap."""
    offered = Counter({s: len(p) for s, p in sources.items()})
    taken = {tuple(words(text)) for text in exclude}
    unique = [(t, s) for t, s in deduplicated((text, s) for s, prompts in sources.items() for text in prompts)
              if tuple(words(t)) not in taken]
    kept = [(t, s) for t, s in unique if not overlap(t)]
    stats = {s: {"offered": offered[s], "duplicates": offered[s] - sum(1 for _, x in unique if x == s),
                 "overlap": sum(1 for _, x in unique if x == s) - sum(1 for _, x in kept if x == s),
                 "kept": sum(1 for _, x in kept if x == s)} for s in sources}
    return [record(t, s) for t, s in kept], stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="the chat model's directory (writes the self prompts)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--self", dest="self_count", type=int, default=4000)
    ap.add_argument("--self-tasks", type=int, default=0, help="self prompts begun by a task opener (TASK_OPENERS)")
    ap.add_argument("--docstrings", type=int, default=1500)
    ap.add_argument("--no-chatterbot", action="store_true")
    ap.add_argument("--bench-dir", help="benchmark question files (default: $MARS_BENCH_DIR or ../shared/data/bench)")
    ap.add_argument("--heldout", type=int, default=64, help="prompts kept out of training, written to OUT's "
                    ".heldout.jsonl (the head's held-out scores, strict-equals-plain checks)")
    ap.add_argument("--dtype", default="auto", help="the target's precision for the self prompts (eagle.precision)")
    ap.add_argument("--device", default="cpu", help="where the target writes the self prompts (cpu or cuda)")
    ap.add_argument("--batch", type=int, default=64, help="rows written at once (a GPU: hundreds to thousands)")
    ap.add_argument("--seed", type=int, default=0, help="the self prompts' first batch seed (one per batch after it)")
    ap.add_argument("--exclude", nargs="*", default=[],
                    help="prompt JSONL files this set must not share a prompt with (e.g. the training set)")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    sources = {}
    if args.self_count or args.self_tasks:
        # auto: bf16 where the device multiplies it natively, else float32
        dtype = resolve_dtype(args.dtype, device=args.device).dtype
        model = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(args.device).eval()
        if args.self_count:
            sources["self"] = self_prompts(model, tokenizer, args.self_count, batch=args.batch, seed=args.seed)
        if args.self_tasks:  # seeded apart from the plain self prompts, which start at --seed
            sources["self-task"] = self_prompts(model, tokenizer, args.self_tasks, batch=args.batch,
                                                seed=args.seed + 500_000, openers=TASK_OPENERS)
    if not args.no_chatterbot:
        sources["chatterbot"] = chatterbot_prompts()
    if args.docstrings:
        sources["docstrings"] = docstring_prompts(args.docstrings, args.seed)
    # a prompt file's records ({"messages"}) or a question file's ({"turns"}: the calibration prompts)
    exclude = [r["messages"][0]["content"] if "messages" in r else r["turns"][0]
               for path in args.exclude for r in read_jsonl(path)]
    records, stats = build(sources, Overlap(benchmark_turns(args.bench_dir)), exclude)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    random.Random(args.seed).shuffle(records)  # sources mixed; the held-out prompts a sample of all of them
    heldout, records = records[: args.heldout], records[args.heldout:]
    for path, part in ((out, records), (out.with_suffix(".heldout.jsonl"), heldout)):
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part), encoding="utf-8")
    Path(str(out) + ".stats.json").write_text(json.dumps({"rule": f"dropped when sharing {OVERLAP_WORDS} consecutive "
                                                          "words with a benchmark turn, or equal to / inside one "
                                                          "when shorter", "sources": stats,
                                                          "records": len(records), "heldout": len(heldout)},
                                                         indent=2) + "\n")
    print(json.dumps(stats, indent=2))
    print(f"{len(records)} prompts -> {out}, {len(heldout)} held out -> {out.with_suffix('.heldout.jsonl')}")


if __name__ == "__main__":
    main()
