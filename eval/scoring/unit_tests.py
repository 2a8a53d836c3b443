"""HumanEval pass@1 of answer files: each answer is turned into a program and run against the task's unit tests.

The tasks (prompt, entry point, canonical solution, tests) come from OpenAI's `HumanEval.jsonl.gz` in
the benchmark directory (`eval.config.paths.bench_dir`); task "HumanEval/<n>" is question_id n of
`humaneval.jsonl`. One sample per question, so pass@1 is the fraction of questions whose program
exits cleanly after running all of its unit tests. Every program runs in its own sandboxed process
(`eval.scoring.sandbox.run_sandboxed`), a few at a time from a small thread pool.

How an answer becomes a solution (`assemble_solution`):

- an answer that starts as an indented function body (base models continuing the prompt): the body;
  it continues the prompt and is cut at its first line that starts a new top-level statement (`def`,
  `class`, `if`, `print(`, a comment, a decorator, a closing fence...), i.e. the first non-empty line
  without indentation once the body began;
- fenced code (chat models: ```python ... ``` or ``` ... ```): the block that defines the entry point
  (else the first block). A block that defines it is a whole solution and follows the part of the
  prompt before the entry point's `def` (the imports and, for four tasks, helper functions the tests
  call); any other block is the function body and continues the prompt;
- no fence, but a top-level `def <entry_point>(`: a whole solution, as above;
- anything else: a function body, as in the first case.

A whole solution loses its `if __name__ == "__main__":` block (demo code, never part of the answer;
the official harness does not run it either). A program passes only if it exits with status 0 after
printing a random marker that follows `check(...)`: an answer that exits early with status 0
(`sys.exit(0)`, `os._exit(0)`) before the tests have run fails. Per-question results are keyed by
str(question_id), as everywhere in `eval.score`.
"""

from __future__ import annotations

import re
import secrets
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eval.config.paths import BENCH_DIR_ENV, bench_dir
from eval.rundirs.jsonl import read_jsonl
from eval.scoring.sandbox import SandboxResult, isolation, run_sandboxed

TASKS_FILE = "HumanEval.jsonl.gz"
CODE_LANGUAGES = ("", "python", "py", "python3")  # fence info strings taken as Python code
_MAIN_GUARD = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""")


def load_tasks(data_dir: str | Path | None = None) -> dict[int, dict]:
    """HumanEval's tasks keyed by number (= question_id of humaneval.jsonl), each with prompt, entry_point,
    canonical_solution, test and task_id."""
    path = bench_dir(data_dir) / TASKS_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"no {TASKS_FILE} in {path.parent}: HumanEval's unit tests come from OpenAI's {TASKS_FILE} "
            f"(github.com/openai/human-eval, data/{TASKS_FILE}); put it next to humaneval.jsonl in the benchmark "
            f"directory, or point --data-dir / ${BENCH_DIR_ENV} at a directory that has it")
    return {int(task["task_id"].split("/")[1]): task for task in read_jsonl(path).values()}


# --- from answer to program -----------------------------------------------------------------------

def code_blocks(text: str) -> list[str]:
    """The contents of the fenced Python (or untagged) code blocks of `text`, in order; an unclosed last
    fence (generation cut off) runs to the end of the text."""
    blocks, current, language = [], None, ""
    for line in text.splitlines(keepends=True):
        fence = line.strip().startswith("```")
        if current is None:
            if fence:
                current, language = [], line.strip()[3:].strip().lower()
        elif fence:
            if language in CODE_LANGUAGES:
                blocks.append("".join(current))
            current = None
        else:
            current.append(line)
    if current is not None and language in CODE_LANGUAGES:
        blocks.append("".join(current))
    return blocks


def defines(code: str, entry_point: str) -> bool:
    """Does `code` define `entry_point` at top level?"""
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None


def prompt_preamble(prompt: str, entry_point: str) -> str:
    """The part of the prompt before the entry point's `def`: imports, and helper functions that some
    tasks' tests call (HumanEval/38's encode_cyclic...). Just the import lines if the def is not found."""
    match = re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", prompt, re.MULTILINE)
    if match:
        return prompt[:match.start()]
    return "".join(line for line in prompt.splitlines(keepends=True) if line.startswith(("import ", "from ")))


def truncate_completion(body: str) -> str:
    """A function body continuing the prompt, up to (excluding) the first non-empty unindented line after
    the body began: that line starts a new top-level statement (def, class, if, print(, #, @, ```...)."""
    kept, began = [], False
    for line in body.splitlines(keepends=True):
        if line.strip():
            if not line[0].isspace():
                if began:
                    break
            else:
                began = True
        kept.append(line)
    return "".join(kept)


def drop_main_guard(code: str) -> str:
    """`code` without its top-level `if __name__ == "__main__":` block."""
    lines, kept, skipping = code.splitlines(keepends=True), [], False
    for line in lines:
        unindented = bool(line.strip()) and not line[0].isspace()
        if unindented:
            skipping = bool(_MAIN_GUARD.match(line))
        if not skipping:
            kept.append(line)
    return "".join(kept)


def _as_body(block: str) -> str:
    """A code block meant as the function body; indented if the model wrote it flush left."""
    if any(line.strip() and not line[0].isspace() for line in block.splitlines()):
        block = textwrap.indent(block, "    ")
    return block


def _continues_body(answer: str) -> bool:
    """Does the answer start as an indented function body (rather than prose, a fence or a definition)?"""
    first = next((line for line in answer.splitlines() if line.strip()), "")
    return first[:1].isspace() and not first.lstrip().startswith("```")


def assemble_solution(task: dict, answer: str) -> str:
    """The solution source for `answer` to `task` (see the module docstring for the rules)."""
    prompt, entry_point = task["prompt"], task["entry_point"]
    if _continues_body(answer):  # a body first: completion style, even if a fence or prose follows
        return prompt + truncate_completion(answer)
    blocks = code_blocks(answer)
    if blocks:
        block = next((b for b in blocks if defines(textwrap.dedent(b), entry_point)), blocks[0])
        if defines(textwrap.dedent(block), entry_point):
            return prompt_preamble(prompt, entry_point) + drop_main_guard(textwrap.dedent(block))
        return prompt + truncate_completion(_as_body(block))
    if defines(answer, entry_point):
        return prompt_preamble(prompt, entry_point) + drop_main_guard(answer)
    return prompt + truncate_completion(answer)


def build_program(task: dict, answer: str) -> str:
    """The program that tests `answer`: the assembled solution, the task's tests, and the call to check()."""
    return assemble_solution(task, answer) + "\n" + task["test"] + f"\ncheck({task['entry_point']})\n"


# --- scoring ----------------------------------------------------------------------------------------

def _answers(records: list[dict]) -> dict[int, str]:
    """question_id -> first-turn answer; a later record for a question replaces an earlier one."""
    answers = {}
    for i, record in enumerate(records):
        try:
            qid, answer = int(record["question_id"]), record["choices"][0]["turns"][0]
        except (KeyError, IndexError, TypeError, ValueError):
            raise ValueError(f"answer {i} is not an answer record with an integer question_id and "
                             'choices[0]["turns"][0] (the EAGLE / MARS answer layout)') from None
        if not isinstance(answer, str):
            raise ValueError(f"answer {i} (question {qid}): the answer turn is a {type(answer).__name__}, not text")
        answers[qid] = answer
    return answers


def _run(task: dict, answer: str, timeout: float, allow_unisolated: bool | None) -> tuple[bool, SandboxResult]:
    # A marker printed after check() has returned: a program that exits early with status 0 (sys.exit(0),
    # os._exit(0) in the answer) has not passed its tests. The answer cannot know the marker in advance.
    marker = f"mars-humaneval-done-{secrets.token_hex(16)}"
    result = run_sandboxed(build_program(task, answer) + f"print({marker!r})\n", timeout=timeout,
                           allow_unisolated=allow_unisolated)
    return result.status == "passed" and marker in result.output, result


def score_humaneval(records: list[dict], data_dir: str | Path | None = None, timeout: float = 10.0,
                    workers: int = 2, tasks: dict[int, dict] | None = None,
                    allow_unisolated: bool | None = None) -> dict:
    """pass@1 of answer `records` (EAGLE / MARS layout; the answer is choices[0]["turns"][0]).

    Returns {"n", "pass@1", "sandbox", "per_question": {str(question_id): {"passed", "status"}}}; status is
    the sandbox's ("passed", "failed", "timeout", "killed", "error"), or "failed" for a program that exited
    0 without finishing its tests; "sandbox" is the isolation level the programs ran under
    (`eval.scoring.sandbox.isolation`, "unisolated" when allowed without one). `timeout`: seconds per
    program; `workers`: programs run at once. `tasks`: HumanEval's tasks by number (default: the side file
    in the benchmark directory). `allow_unisolated`: see `run_sandboxed`; without it, where nothing can
    hide the caller's private files, this raises `SandboxUnavailable` before running any program.
    """
    answers = _answers(records)
    if not answers:
        raise ValueError("no answers to score")
    tasks = tasks if tasks is not None else load_tasks(data_dir)
    unknown = sorted(qid for qid in answers if qid not in tasks)
    if unknown:
        shown = ", ".join(map(str, unknown[:5])) + (", ..." if len(unknown) > 5 else "")
        raise ValueError(f"{len(unknown)} of {len(answers)} answers are for question ids not in HumanEval "
                         f"(0-{max(tasks)}): {shown}; the answer file is probably for another benchmark")
    level = isolation(allow_unisolated)  # refuses before any program runs, not once per program
    qids = sorted(answers)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(lambda qid: _run(tasks[qid], answers[qid], timeout, allow_unisolated), qids))
    per_question = {}
    for qid, (passed, result) in zip(qids, results, strict=True):
        status = result.status if passed or result.status != "passed" else "failed"
        per_question[str(qid)] = {"passed": passed, "status": status}
    n_passed = sum(passed for passed, _ in results)
    return {"n": len(qids), "pass@1": n_passed / len(qids), "sandbox": level, "per_question": per_question}
