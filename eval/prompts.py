"""The embedded benchmark: write-the-body prompts from the held-out split of the stdlib corpus.

Every top-level function and every method of a top-level class in a held-out file that has a
docstring and some code after it becomes a candidate. Its prompt is the source from the `def` line
through the end of the docstring, then a newline and the body's indentation, so the model has to
write the body:

    def ratio(a, b):
        \"\"\"a / b, or 0 when b is 0.\"\"\"
        <- the model continues here

Selection is deterministic: files sorted by path, functions in source order, at most `per_file`
from each file (evenly spaced), prompts longer than `max_chars` skipped, then `count` taken evenly
spaced from the candidates. The set depends only on the standard library's source, so it is the
same on every machine with the same Python version; the committed file was written with 3.11.

    python -m eval.prompts --out data/prompts/stdlib_heldout.jsonl
    python -m eval.prompts --split train --count 6000 --per-file 100 --out runs/draft_prompts.jsonl   # draft training
"""

from __future__ import annotations

import argparse
import ast
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from eagle.train.corpus import read_source, stdlib_files, stdlib_root

DEFAULT_OUT = "data/prompts/stdlib_heldout.jsonl"


@dataclass
class Prompt:
    question_id: int
    file: str  # path relative to the stdlib root
    name: str  # "func" or "Class.method"
    line: int  # 1-based line of the `def`
    prompt: str


def _functions(tree: ast.Module):
    """(qualified name, node) of top-level functions and methods of top-level classes, in source order."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


def _docstring_prompt(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """`def` line .. end of docstring + newline + body indentation, or None if the function does not qualify."""
    if ast.get_docstring(node) is None or len(node.body) < 2:  # no docstring, or nothing to write after it
        return None
    doc = node.body[0]
    last = lines[doc.end_lineno - 1]
    if last[doc.end_col_offset :].strip():  # something follows the docstring on its line
        return None
    head = lines[node.lineno - 1 : doc.end_lineno]
    if any("\t" in line for line in head):
        return None
    indent = " " * doc.col_offset
    if node.body[1].col_offset != doc.col_offset:
        return None
    return "\n".join(line.rstrip() for line in head) + "\n" + indent


def extract_prompts(source: str, file: str = "<string>") -> list[tuple[str, int, str]]:
    """(name, def line, prompt) for every qualifying function of one source file; [] if it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    found = []
    for name, node in _functions(tree):
        prompt = _docstring_prompt(lines, node)
        if prompt is not None:
            found.append((name, node.lineno, prompt))
    return found


def _evenly(items: list, count: int) -> list:
    """`count` items spread evenly over `items` (all of them if there are no more than `count`)."""
    if len(items) <= count:
        return list(items)
    return [items[(i * len(items)) // count] for i in range(count)]


def build_prompts(
    files: list[Path], root: Path, count: int = 64, per_file: int = 3, max_chars: int = 1000, first: int | None = None
) -> list[Prompt]:
    """`count` prompts spread evenly over the files' candidates; `first`: those `count=first` would choose come
    first (in their order), so a prefix of the set is spread evenly too (the calibration prompts: a batch
    size of B times the first 24 * B)."""
    if first is not None and (first <= 0 or count % first):
        raise ValueError(f"--first {first} must divide --count {count} (only then are the prompts --count {first} "
                         f"chooses among those --count {count} chooses): give a count that is a multiple of it")
    candidates = []
    for path in files:
        source = read_source(path)
        if not source:
            continue
        rel = path.relative_to(root).as_posix()
        found = [f for f in extract_prompts(source, rel) if len(f[2]) <= max_chars]
        candidates.extend((rel, *f) for f in _evenly(found, per_file))
    chosen = _evenly(candidates, count)
    if first:  # `--count first`'s prompts lead (among `count`'s whenever `first` divides it), then the others
        lead = _evenly(candidates, first)
        led = set(lead)
        chosen = lead + [c for c in chosen if c not in led]
    return [Prompt(i, rel, name, line, prompt) for i, (rel, name, line, prompt) in enumerate(chosen)]


def write_jsonl(prompts: list[Prompt], out: str | Path) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for p in prompts:
            f.write(json.dumps(asdict(p)) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--split", choices=("heldout", "train"), default="heldout",
                    help="train: prompts for draft training (eagle.train.draft --generate); never the benchmark's")
    ap.add_argument("--count", type=int, default=64)
    ap.add_argument("--per-file", type=int, default=3)
    ap.add_argument("--max-chars", type=int, default=1000, help="skip longer prompts (all kept are < 200 tokens)")
    ap.add_argument("--first", type=int, help="put first the prompts `--count FIRST` would write (a divisor of "
                    "--count): any batch size's calibration prompts then begin with batch 1's")
    ap.add_argument("--tokenizer", help="optional: print the prompts' token lengths under this tokenizer")
    args = ap.parse_args(argv)
    prompts = build_prompts(stdlib_files(args.split), stdlib_root(), args.count, args.per_file, args.max_chars,
                            args.first)
    write_jsonl(prompts, args.out)
    print(f"wrote {len(prompts)} prompts from {len({p.file for p in prompts})} files to {args.out}")
    if args.tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.tokenizer)
        lengths = [len(tok(p.prompt, add_special_tokens=False)["input_ids"]) for p in prompts]
        print(f"prompt tokens: min {min(lengths)}, mean {sum(lengths) / len(lengths):.0f}, max {max(lengths)}")


if __name__ == "__main__":
    main()
