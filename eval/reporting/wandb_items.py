"""What a job logs to W&B, as plain data: the run's name, tags and answer artifacts' names, the run
summary's keys (every method's figures, the job's own headline figures unprefixed) and the
acceptance-by-depth rows. No `wandb` here: `eval.reporting.tracking` sends them.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eval.rundirs.layout import run_directory_of

if TYPE_CHECKING:
    from eval.config.schema import LoggingConfig

TAG_LIMIT = 64  # W&B rejects longer tags
ARTIFACT_NAME_LIMIT = 128
# Summary figures of the job's own method also written without the method prefix: one key per
# figure across every run of a sweep, which is what W&B's run table and parallel plots compare.
HEADLINE = ("speedup", "speedup_vs_generate", "speedup_vs_fastest", "tau", "tokens_per_s", "latency_p90",
            "relaxed_frac", "quality",
            "quality_recovery", "quality_recovery_vs_vanilla",
            "tv_per_token", "kl_per_token", "argmax_mismatch", "logprob_regret")  # the relaxation's exact cost


def _number(value: Any) -> bool:
    """A figure W&B can plot: a finite int or float (booleans and None are not figures)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_name(logging: LoggingConfig, model: str, bench: str, method: str, temperature: float) -> str:
    return logging.name or f"{model}-{bench}-{method}-T{temperature:g}"


def run_tags(logging: LoggingConfig, model: str, bench: str, method: str, temperature: float) -> list[str]:
    """model:/bench:/method:/T: tags, then the configured ones; cut to W&B's length limit, without repeats."""
    tags = [f"model:{model}", f"bench:{bench}", f"method:{method}", f"T:{temperature:g}", *logging.tags]
    return list(dict.fromkeys(str(t)[:TAG_LIMIT] for t in tags if str(t)))


def artifact_name(model: str, bench: str, path: Path) -> str:
    """answers-<model>-<bench>-<run directory>: the same settings give the same artifact (a new version
    only when the answers changed), as W&B allows only letters, digits, '-', '_' and '.' in names."""
    directory = run_directory_of(path)
    source = directory.name if directory is not None else path.stem
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"answers-{model}-{bench}-{source}")
    return name[:ARTIFACT_NAME_LIMIT]


def _flat_numbers(prefix: str, values: dict) -> dict[str, float]:
    """Nested dicts of figures as flat `prefix/key` entries (dict keys such as depths become strings)."""
    items: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            items.update(_flat_numbers(f"{prefix}/{key}", value))
        elif _number(value):
            items[f"{prefix}/{key}"] = value
    return items


def summary_items(summary: dict, method: str) -> dict[str, Any]:
    """The run summary: `<method>/<figure>` for every numeric figure of every method (dicts flattened,
    `<method>/quality` the headline quality metric's value), and the job's own method's headline
    figures again without prefix, so that one key holds them across all runs of a sweep."""
    metric = summary.get("quality_metric")
    items: dict[str, Any] = {}
    for name, figures in summary.get("methods", {}).items():
        for key, value in figures.items():
            if key == "margin_histogram":  # logged as a W&B histogram of the margins themselves
                continue
            if isinstance(value, dict):
                if key == "quality" and _number(value.get(metric)):
                    items[f"{name}/quality"] = value[metric]
                items.update(_flat_numbers(f"{name}/{key}", value))
            elif _number(value):
                items[f"{name}/{key}"] = value
    for key in HEADLINE:
        if f"{method}/{key}" in items:
            items[key] = items[f"{method}/{key}"]
    if metric:
        items["quality_metric"] = metric
    return items


def acceptance_rows(summary: dict) -> list[list]:
    """[method, depth, acceptance rate] rows of every method (depth keys are ints, or strings after JSON)."""
    rows = []
    for name, figures in summary.get("methods", {}).items():
        rates = figures.get("acceptance_rate_by_depth") or {}
        rows += [[name, depth, rate] for depth, rate in sorted((int(d), r) for d, r in rates.items()) if _number(rate)]
    return rows
