"""Sampling settings, logits processing and margin metrics, shared by every rule and by `vanilla`.

"Lossless" means: equal in distribution to sampling from `process_logits(...)` token by token,
which is exactly what `vanilla` does with the same settings.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

RULES = ("strict", "mars")
MARGINS = ("logit_ratio", "prob_ratio", "logprob_gap")
MARS_FALLBACKS = ("strict", "reference")
# The range of theta in which each margin metric means something (inclusive).
THETA_RANGES = {"logit_ratio": (0.0, 1.0), "prob_ratio": (0.0, 1.0), "logprob_gap": (0.0, math.inf)}


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How the target's distribution is processed and which acceptance rule verifies drafts.

    temperature: 0 means greedy. top_p in (0, 1], top_k >= 0 (0 = off) filter the distribution as
    plain sampling does. rule: "strict" (lossless) or "mars" (margin-aware). theta / margin: the
    MARS test (see `margin_test`). mars_fallback (sampling only): what MARS does when the test
    passes but no drafted child is the target's top-1 or top-2: "strict" lets the strict rule try
    the children; "reference" rejects them all and samples from the target, as the MARS code does.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    rule: str = "strict"
    theta: float = 0.9
    margin: str = "logit_ratio"
    mars_fallback: str = "strict"

    def __post_init__(self):
        t = self.temperature
        if not (isinstance(t, (int, float)) and t >= 0 and math.isfinite(t)):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if self.rule not in RULES:
            raise ValueError(f"unknown rule {self.rule!r}; valid rules: {', '.join(RULES)}")
        if self.margin not in MARGINS:
            raise ValueError(f"unknown margin metric {self.margin!r}; valid metrics: {', '.join(MARGINS)}")
        if self.mars_fallback not in MARS_FALLBACKS:
            raise ValueError(f"unknown mars_fallback {self.mars_fallback!r}; valid: {', '.join(MARS_FALLBACKS)}")
        lo, hi = THETA_RANGES[self.margin]
        if not (isinstance(self.theta, (int, float)) and lo <= self.theta <= hi):
            raise ValueError(
                f"theta={self.theta!r} is outside [{lo}, {hi}], the meaningful range for margin {self.margin!r} "
                f"(ranges: logit_ratio and prob_ratio in [0, 1], relax when above; logprob_gap >= 0, relax when below)"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingConfig))


def resolve_sampling(sampling: SamplingConfig | None = None, **overrides) -> SamplingConfig:
    """`sampling` (default: greedy strict) with keyword `overrides` applied, as `generate()` takes them.

    Like `transformers.generate`, which takes a `GenerationConfig` and keyword arguments over it.
    """
    if sampling is not None and not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a SamplingConfig or None, got {type(sampling).__name__}: pass other "
                        f"settings by keyword (max_new_tokens=..., temperature=...)")
    unknown = sorted(set(overrides) - set(SAMPLING_FIELDS))
    if unknown:
        raise TypeError(f"unknown sampling setting(s) {unknown}; valid: {', '.join(SAMPLING_FIELDS)}")
    return dataclasses.replace(sampling or SamplingConfig(), **overrides)


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
    """One token [1] from a probability vector [V], left on its device."""
    return torch.multinomial(probs, 1, generator=generator)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from a probability vector, read to the host."""
    return int(draw(probs, generator).item())


def next_token(processed_logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> int:
    """What plain decoding emits after `processed_logits` [V]: argmax, or a sample."""
    if cfg.greedy:
        return int(processed_logits.argmax().item())
    return sample(processed_logits.softmax(-1), generator)


@dataclass
class Margins:
    """Per-position margin information over processed logits [n, V]."""

    top1: torch.Tensor  # [n] ids
    top2: torch.Tensor  # [n] ids
    value: torch.Tensor  # [n] the metric's value
    passes: torch.Tensor  # [n] bool: target undecided here, relaxation allowed
    nonfinite: torch.Tensor  # [n] bool: z1 or z2 not finite (e.g. filtered by top-k/top-p): never relaxed
    negative: torch.Tensor  # [n] bool: z1 <= 0, where the logit ratio's meaning inverts


def margin_test(processed_logits: torch.Tensor, cfg: SamplingConfig) -> Margins:
    """The MARS test at every position, on the processed logits (z1 >= z2 their top two).

    - logit_ratio (the paper's): value z2 / (z1 + 1e-10), relax when value > theta. With z1 > 0 it
      is in [.., 1] and near 1 means undecided. When z1 <= 0 the ratio inverts (both negative:
      ratio >= 1, so it always passes; z1 near 0: it explodes). The MARS code applies it as is, and
      so do we, counting such positions in `negative` so that they can be reported.
    - prob_ratio: p2 / p1 = exp(z2 - z1) in (0, 1], relax when above theta. Scale-free, but it
      depends on the temperature (at temperature 0 it is taken at temperature 1).
    - logprob_gap: log p1 - log p2 = z1 - z2 >= 0, relax when below theta.
    A position whose z1 or z2 is not finite never passes (z2 = -inf means the filter left one token).
    """
    top = processed_logits.topk(2, dim=-1)
    z1, z2 = top.values[..., 0], top.values[..., 1]
    # top-1 is the argmax (lowest id among ties), the token plain greedy decoding emits; topk orders
    # tied values arbitrarily. top-2 is topk's other token (one with value z2 either way).
    top1 = processed_logits.argmax(dim=-1)
    top2 = torch.where(top.indices[..., 0] == top1, top.indices[..., 1], top.indices[..., 0])
    nonfinite = ~(torch.isfinite(z1) & torch.isfinite(z2))
    if cfg.margin == "logit_ratio":
        value = z2 / (z1 + 1e-10)
        passes = value > cfg.theta
    elif cfg.margin == "prob_ratio":
        value = torch.exp(z2 - z1)
        passes = value > cfg.theta
    else:
        value = z1 - z2
        passes = value < cfg.theta
    return Margins(top1, top2, value, passes & ~nonfinite, nonfinite, z1 <= 0)
