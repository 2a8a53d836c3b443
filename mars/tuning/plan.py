"""What a calibration is asked to do (`Plan`), carried inward from its doors (`mars.tuning.measure`) to the search
(`mars.tuning.search`), and its default budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Protocol

import torch

from mars.decoding.settings import TreeShape
from mars.tuning.pairs import Unit
from mars.verification.sampling import SamplingConfig

Load = Callable[[str], tuple[torch.nn.Module, torch.nn.Module]]  # dtype name -> (target, draft head) in it
DEFAULT_BUDGET = 57.0  # seconds for a run's calibrations together on 2 cores
# Calibration decodes turns of at most this many tokens, whatever the run's length: a ratio's prompt-to-prompt
# spread, not its length, sets how many turns a verdict needs, and longer turns only buy fewer of them in the
# budget (a longer run's own turns then check the prediction).
TIMED_TOKENS = 64


class Reference(Protocol):
    """A plain decoding out of this process that calibration races (`mars.decoding.reference.LimitedGenerate`):
    `label` names it in the record and the cache key; `start` begins its start-up without waiting; `pids` are its
    processes (their CPU time is ours, not foreign load); `time` decodes a unit: (tokens, seconds)."""

    label: str

    def start(self) -> None: ...

    def pids(self) -> list[int]: ...

    def time(self, unit: list[torch.Tensor], sampling: SamplingConfig, max_new_tokens: int,
             seed: int) -> tuple[int, float]: ...


@dataclass(frozen=True)
class Plan:
    """How a calibration runs: what the door (`mars.tuning.measure`) carries inward.

    trees: the candidates (a fixed tree: its drafting modes, `forced`); deadline: `time.perf_counter()` by which
    the finals stop (after `mars.tuning.finals.FLOOR` blocks); budget_s: the budget it came from (recorded);
    max_new_tokens: the turns' length (the run's, at most TIMED_TOKENS); batch: prompts per unit; references:
    plain decodings out of this process; exclusive: held while timing (a machine-wide lock)."""

    trees: tuple[TreeShape, ...]
    deadline: float
    budget_s: float
    _: KW_ONLY
    forced: bool = False
    max_new_tokens: int = 64
    batch: int = 1
    references: Sequence[Reference] = ()
    drafting: str = "auto"
    cache_dir: Path | None = None
    log: Callable[[str], None] = print
    exclusive: Callable[[], AbstractContextManager] = nullcontext


def batches_of(prompts: list[torch.Tensor], batch: int) -> list[Unit]:
    """The prompts in groups of `batch` (1: one each); too few prompts for a whole group are cycled."""
    if batch == 1:
        return [[p] for p in prompts]
    count = max(len(prompts), batch)
    cycled = [prompts[i % len(prompts)] for i in range(count - count % batch)]
    return [cycled[i: i + batch] for i in range(0, len(cycled), batch)]
