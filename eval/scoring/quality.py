"""Quality figures for completions, comparable across decoding methods.

MARS trades exactness for speed: it may accept the target's second choice. Whether that costs
anything has to be measured on the output. The embedded model writes Python function bodies, for
which two cheap, reference-free figures exist:

`parses`: does the function the model wrote compile? The function is the prompt (`def` line through
the docstring) plus the completion, cut where the function ends: at the first non-blank line
indented at or left of the `def` line (the model moved on to the next definition), else at EOS.
  - The model must have written at least one non-blank body line; an empty body fails.
  - If the function ended (that line, or EOS), the dedented function must compile (`compile(..., "exec")`).
  - If `max_new_tokens` cut it off inside the body, the last, partial line is dropped (unless it is
    the only body line) and the rest must be a valid *prefix* of Python: it compiles, or the compiler
    says only "incomplete input" (an open block, bracket or string), as the interactive interpreter
    decides (`codeop`). It fails on a syntax error in what was written.
  Blank lines and lines inside multi-line strings are judged by indentation like any other line;
  the same rule applies to every method, so rates are comparable.

`loglik`: the mean per-token log-likelihood of the generated tokens under the target (a forward of the
prompt, kept for every completion of it, then of the completion; fp32 log-softmax), pooled over tokens.
Its exponential, `token_prob`, the geometric-mean probability the target gives the tokens, is the figure
compared across methods: greedy decoding takes the target's top token every step, so relaxed acceptances
can only lower it.

quality_recovery = figure(MARS) / figure(strict), per figure (parse rate, token_prob). Strict greedy
decoding equals vanilla greedy decoding, so strict's figures are vanilla's.
"""

from __future__ import annotations

import codeop
import math
import warnings

import torch

FIGURES = ("parses", "loglik")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def function_source(prompt: str, completion: str, ended: bool) -> tuple[str, bool, int]:
    """(the function written so far, dedented to column 0; whether it is finished; body lines written).

    `ended` says the generation stopped by EOS. The function is also finished when a non-blank line
    after the prompt is indented at or left of the `def` line; that line and the rest are dropped.
    An unfinished function loses its partial last line, unless that is its only body line.
    """
    lines = (prompt + completion).split("\n")
    def_indent = _indent(prompt.split("\n")[0])
    first_body = prompt.count("\n")  # the line the completion starts on
    for i in range(first_body, len(lines)):
        if lines[i].strip() and _indent(lines[i]) <= def_indent:
            lines, ended = lines[:i], True
            break
    else:
        if not ended and any(line.strip() for line in lines[first_body:-1]):
            lines = lines[:-1]  # partial last line (or "" after a final newline)
    written = sum(1 for line in lines[first_body:] if line.strip())
    body = [line[def_indent:] if line[:def_indent].strip() == "" else line.lstrip() for line in lines]
    return "\n".join(body) + "\n", ended, written


def compile_status(source: str) -> str:
    """'complete', 'incomplete' (a valid prefix waiting for more) or 'invalid'."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            code = codeop.compile_command(source, "<completion>", "exec")
        except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError):
            return "invalid"
    return "complete" if code is not None else "incomplete"


def parses(prompt: str, completion: str, stopped_by_eos: bool) -> bool:
    """The `parses` figure for one completion (see the module docstring)."""
    source, ended, written = function_source(prompt, completion, stopped_by_eos)
    if not written:
        return False
    status = compile_status(source)
    return status == "complete" if ended else status != "invalid"


class PromptLoglik:
    """Log-likelihoods under `model` of completions of one prompt, the prompt computed once: every method
    answers the same question, and a long prompt (a CNN/DM article) costs far more than its answers.

    The prompt's KV cache is kept and cut back to the prompt after each completion; a completion's figure
    equals one forward of prompt + completion (`tests/test_eval.py`) up to float rounding."""

    @torch.inference_mode()
    def __init__(self, model, prompt_ids: list[int]):
        from transformers import DynamicCache

        from mars.adapter.cache import cache_keyword

        self.model = model
        self.device = next(model.parameters()).device
        self.cache, self.keyword = DynamicCache(), cache_keyword(model)
        out = model(input_ids=torch.tensor([prompt_ids], device=self.device), use_cache=True, logits_to_keep=1,
                    **{self.keyword: self.cache})
        self.first = torch.log_softmax(out.logits[0, -1].float(), dim=-1)  # the first completion token's

    @torch.inference_mode()
    def __call__(self, completion_ids: list[int]) -> tuple[float, int]:
        """(sum of log p(completion token | everything before it), number of tokens)."""
        if not completion_ids:
            return 0.0, 0
        total = self.first[completion_ids[0]].item()
        if len(completion_ids) > 1:
            rest = torch.tensor([completion_ids[:-1]], device=self.device)
            logits = self.model(input_ids=rest, use_cache=True, **{self.keyword: self.cache}).logits[0]
            self.cache.crop(-rest.shape[1])  # back to the prompt (a negative length drops that many tokens)
            target = torch.tensor(completion_ids[1:], device=self.device)
            total += torch.log_softmax(logits.float(), dim=-1).gather(-1, target[:, None]).sum().item()
        return total, len(completion_ids)


def completion_loglik(model, prompt_ids: list[int], completion_ids: list[int]) -> tuple[float, int]:
    """(sum of log p(completion token | everything before it), number of tokens) under `model`."""
    return PromptLoglik(model, prompt_ids)(completion_ids) if completion_ids else (0.0, 0)


def token_prob(loglik_sum: float, tokens: int) -> float:
    """Geometric-mean token probability exp(mean log-likelihood); nan with no tokens."""
    return math.exp(loglik_sum / tokens) if tokens else math.nan
