"""Sampling settings and logits processing, shared by every rule and by `vanilla`.

"Lossless" means: equal in distribution to sampling from `process_logits(...)` token by token,
which is exactly what `vanilla` does with the same settings.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from mars.rules import make_rule, rule_params
from mars.rules.base import Rule
from mars.rules.strict import Strict


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How the target's distribution is processed and which rule verifies drafts.

    temperature: 0 means greedy. top_p in (0, 1], top_k >= 0 (0 = off) filter the distribution as
    plain sampling does. rule: the verification rule (`mars.rules`; default strict, lossless).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    rule: Rule = field(default_factory=Strict)

    def __post_init__(self):
        t = self.temperature
        if not (isinstance(t, (int, float)) and t >= 0 and math.isfinite(t)):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.rule, Rule):
            raise TypeError(f"rule must be a mars.rules Rule (e.g. make_rule('mars', theta=0.9)), got {self.rule!r}")
        if self.greedy and not self.rule.greedy_form:
            raise ValueError(f"rule {self.rule.name!r} has no greedy form: sample (temperature > 0) or choose "
                             f"another rule")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "rule")


def resolve_sampling(sampling: SamplingConfig | None = None, **overrides) -> SamplingConfig:
    """`sampling` (default: greedy strict) with keyword `overrides` applied, as `generate()` takes them.

    Like `transformers.generate`, which takes a `GenerationConfig` and keyword arguments over it.
    `rule` may be a `Rule` or a registered rule's name, whose parameters then come as keywords too
    (`rule="mars", theta=0.8`); parameters alone adjust the current rule (`theta=0.8`).
    """
    if sampling is not None and not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a SamplingConfig or None, got {type(sampling).__name__}: pass other "
                        f"settings by keyword (max_new_tokens=..., temperature=...)")
    base = sampling or SamplingConfig()
    rule = overrides.pop("rule", None)
    params = {k: overrides.pop(k) for k in list(overrides) if k not in SAMPLING_FIELDS}
    if isinstance(rule, str):
        rule = make_rule(rule, **params)
    elif params:
        current = rule if rule is not None else base.rule
        unknown = sorted(set(params) - set(rule_params(current.name)))
        if unknown:
            raise TypeError(f"unknown sampling setting(s) {unknown}; valid: temperature, top_p, top_k, rule and "
                            f"the rule's parameters ({current.name}: {', '.join(rule_params(current.name)) or 'none'})")
        rule = dataclasses.replace(current, **params)
    if rule is not None:
        overrides["rule"] = rule
    return dataclasses.replace(base, **overrides)


def process_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p (the order transformers applies them), over the last dim.

    Greedy (temperature 0) returns the logits unchanged. Removed tokens get -inf.
    """
    logits = logits.float()
    if cfg.greedy:
        return logits
    logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = logits.topk(cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if cfg.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= 1 - cfg.top_p
        remove_sorted[..., -1] = False  # always keep the most likely token
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, -math.inf)
    return logits


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token [1] from a probability vector [V] (or [B, 1] from each row of [B, V]), left on its device."""
    return torch.multinomial(probs, 1, generator=generator)


def next_tokens(processed_logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """[B] what plain decoding emits after each row of processed logits [B, V]: the argmax, or a sample
    (left on the device)."""
    if cfg.greedy:
        return processed_logits.argmax(dim=-1)
    return draw(processed_logits.softmax(dim=-1), generator)[:, 0]
