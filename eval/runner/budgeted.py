"""A run whose method sets `method.quality_budget`: its main parameter (MARS's theta) chosen before anything else.

    python -m eval.run model=smollm2 bench=alpaca method=mars \\
        'method.quality_budget={metric: logprob_regret, per_token: 0.05}'

The choice (`mars.tuning.quality_budget`) is made on the run's calibration prompts at strict's calibrated kernels
and tree (the calibration `resolve_settings` makes for strict, cached, so the run then reads it again): the value
of the grid that accepts the most while its exact cost per token there is within the budget's margin. The run then
goes on with that value as if it had been given, so its run directory, summary and report name it
(mars@0.8), and its own cost per token, measured on its questions, checks the budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from eval.benchmarks.prompting import PromptFormat
from eval.config.methods import STRICT, RuleMethod, method_spec
from eval.config.schema import RunConfig, sampling_of
from eval.runner.job_settings import calibration_prompts, load_pair, resolve_settings
from eval.runner.models import make_generator
from mars.tuning.plan import TIMED_TOKENS
from mars.tuning.quality_budget import BUDGET_PROMPTS, Choice, choose_value


def budgeted(run: RunConfig, fmt: PromptFormat, log: Callable[[str], None] = print) -> tuple[RunConfig, Choice | None]:
    """`run` with its method's main parameter chosen by `method.quality_budget`, and the choice; `run` and None
    where the method sets no budget."""
    method = run.method
    budget = method.quality_budget.budget() if isinstance(method, RuleMethod) else None
    if budget is None:
        return run, None
    sampling = sampling_of(method_spec(STRICT), run.sampling)
    budget.check(method.kind, sampling)  # before any model loads
    strict_run = replace(run, method=method_spec(STRICT), baselines=[])
    settings = resolve_settings(strict_run, fmt, log)
    prompts = calibration_prompts(strict_run, fmt, settings.dtype.value)[:BUDGET_PROMPTS]
    target, head = load_pair(strict_run, settings.head, settings.dtype.value)
    trees_only = replace(settings, plain_kernels=None)  # no plain decoding here: nothing in another precision
    with torch.inference_mode(), make_generator(target, head, trees_only, strict_run) as gen:
        choice = choose_value(gen, [p.to(target.device) for p in prompts], method.kind, method.rule().params(),
                              sampling, budget, min(run.max_new_tokens, TIMED_TOKENS))
    log(choice.describe(method.kind))
    return replace(run, method=replace(method, **choice.params)), choice
