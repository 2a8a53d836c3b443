"""A calibration's result as one typed, versioned record, and where it is kept.

`Calibration` is what a run's settings, its first lines, its summary and the Python API read: fields, not
string keys. It is written as JSON under $MARS_CACHE_DIR/trees by a key of everything the choice depends on
(`cache_key`: the machine, torch, the models' configurations and weights, the candidates, the decoding with
every sampling parameter, the batch, the length and the prompts), so a machine calibrates once. A file of
another schema is never read as this one: `load` refuses it with a message and the caller calibrates again.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eagle.precision import cpu_name
from mars.decoding.settings import Kernels, TreeShape
from mars.rules.strict import Strict
from mars.tuning.cost_model import Parts, Prediction, Profile
from mars.tuning.pairs import Estimate, degrees_of_freedom, trimmed_se
from mars.tuning.plan import Plan
from mars.verification.sampling import SamplingConfig

SCHEMA = 2  # 1: the successive-halving records (an untyped dict, no "schema" field), never read again
# A prior for the prompt-to-prompt spread of the log speedup, pooled with what the finals measured as PRIOR_PAIRS
# pairs' worth: a few pairs often show less spread than there is (of 6 draws, the sample's deviation falls below
# 0.6 of the true one about a fifth of the time), and a prediction's interval must not shrink by that luck.
PRIOR_SD = 0.2
PRIOR_PAIRS = 6


class SchemaError(ValueError):
    """A cached calibration of another schema (or not a calibration)."""


@dataclass(frozen=True)
class PlainSpeed:
    """One plain decoding timed in calibration: `label` as a run names it ("vanilla float32",
    "generate@bfloat16", "generate@bfloat16+avx2"), our `kernels` (None: `model.generate`), its tokens/s over
    the race, and `relative`, its speed over the fastest's from the paired units (1.0 for the fastest)."""

    label: str
    kernels: Kernels | None
    tokens_per_s: float
    relative: float

    @property
    def ours(self) -> bool:
        return self.kernels is not None

    def to_dict(self) -> dict:
        return {"label": self.label, "kernels": None if self.kernels is None else self.kernels.__dict__,
                "tokens_per_s": round(self.tokens_per_s, 2), "relative": round(self.relative, 4)}

    @classmethod
    def from_dict(cls, d: dict) -> PlainSpeed:
        return cls(d["label"], None if d["kernels"] is None else Kernels(**d["kernels"]), d["tokens_per_s"],
                   d["relative"])


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """What one calibration found for one method (strict, or a rule at strict's kernels).

    max_new_tokens: the turns' length it timed (`mars.tuning.plan.TIMED_TOKENS` at most, whatever the run's);
    kernels, tree: what the method's trees verify with and draft; plain_kernels: our fastest plain decoding's
    kernels (vanilla's); reference: the fastest plain decoding of all (what a method that does not speculate
    decodes with, and what every speedup divides by), plains: every plain decoding raced; identical: per kernel
    label, whether strict greedy output equalled plain greedy output there (None: not checked); parts, profiles,
    predictions: the cost model's inputs and its predictions, fastest first; finals: each finalist's paired
    ratio over the reference; measured: the chosen one's; tied: finalists tied with it where the cheaper cycle
    was taken; speculate, certain: the verdict, and whether its interval lay on one side of 1."""

    method: str
    rule: dict
    sampling: dict
    batch: int
    max_new_tokens: int
    kernels: Kernels
    tree: TreeShape
    plain_kernels: Kernels
    reference: PlainSpeed
    plains: tuple[PlainSpeed, ...]
    identical: dict[str, bool | None]
    parts: tuple[Parts, ...]
    profiles: tuple[Profile, ...]
    predictions: tuple[Prediction, ...]
    finals: dict[str, Estimate]
    measured: Estimate
    tied: tuple[str, ...]
    speculate: bool
    certain: bool
    forced: bool
    seconds: float
    budget_s: float
    machine: dict
    cache: str = field(default="", compare=False)
    cached: bool = field(default=False, compare=False)

    @property
    def label(self) -> str:
        return f"{self.kernels.label} {self.tree.label}"

    @property
    def model_ratio(self) -> float | None:
        """The cost model's prediction for the chosen candidate over the reference's raced speed."""
        mine = next((p for p in self.predictions if p.kernels == self.kernels and p.tree == self.tree), None)
        return mine.tokens_per_s / self.reference.tokens_per_s if mine and self.reference.tokens_per_s else None

    def predicted_for(self, prompts: int | None) -> Estimate:
        """What a run of `prompts` prompts like the calibration's should measure (the per-prompt paired ratio's
        trimmed mean): `measured`, its spread pooled with the prior (PRIOR_SD), its interval widened by the error
        of the run's own trimmed mean over that spread (None: the mean over many prompts)."""
        m = self.measured
        if m.pairs < 2:
            return m
        sd = math.sqrt((m.pairs * m.log_sd ** 2 + PRIOR_PAIRS * PRIOR_SD ** 2) / (m.pairs + PRIOR_PAIRS))
        floor = Estimate(m.ratio, m.low, m.high, m.pairs, max(m.log_se, trimmed_se(sd, m.pairs)), sd)
        if not prompts:  # the mean over many prompts: the calibration's own error alone
            return floor.widened(0.0, 1)
        return floor.widened(trimmed_se(sd, prompts), degrees_of_freedom(prompts))

    def parts_of(self, kernels: Kernels) -> Parts | None:
        return next((p for p in self.parts if p.kernels == kernels), None)

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "method": self.method, "rule": self.rule, "sampling": self.sampling,
                "batch": self.batch, "max_new_tokens": self.max_new_tokens, "kernels": self.kernels.__dict__,
                "tree": self.tree.__dict__, "plain_kernels": self.plain_kernels.__dict__,
                "reference": self.reference.to_dict(), "plains": [p.to_dict() for p in self.plains],
                "identical": self.identical, "parts": [p.to_dict() for p in self.parts],
                "profiles": [p.to_dict() for p in self.profiles],
                "predictions": [p.to_dict() for p in self.predictions],
                "finals": {k: v.to_dict() for k, v in self.finals.items()}, "measured": self.measured.to_dict(),
                "tied": list(self.tied), "speculate": self.speculate, "certain": self.certain, "forced": self.forced,
                "seconds": round(self.seconds, 1), "budget_s": self.budget_s, "machine": self.machine,
                "cache": self.cache, "cached": self.cached}

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            found = d.get("schema", 1) if isinstance(d, dict) else "none"
            raise SchemaError(f"calibration record of schema {found}, not {SCHEMA}")
        return cls(method=d["method"], rule=d["rule"], sampling=d["sampling"], batch=d["batch"],
                   max_new_tokens=d["max_new_tokens"], kernels=Kernels(**d["kernels"]), tree=TreeShape(**d["tree"]),
                   plain_kernels=Kernels(**d["plain_kernels"]), reference=PlainSpeed.from_dict(d["reference"]),
                   plains=tuple(PlainSpeed.from_dict(p) for p in d["plains"]), identical=dict(d["identical"]),
                   parts=tuple(Parts.from_dict(p) for p in d["parts"]),
                   profiles=tuple(Profile.from_dict(p) for p in d["profiles"]),
                   predictions=tuple(Prediction.from_dict(p) for p in d["predictions"]),
                   finals={k: Estimate.from_dict(v) for k, v in d["finals"].items()},
                   measured=Estimate.from_dict(d["measured"]), tied=tuple(d["tied"]), speculate=d["speculate"],
                   certain=d["certain"], forced=d["forced"], seconds=d["seconds"], budget_s=d["budget_s"],
                   machine=d["machine"], cache=d.get("cache", ""), cached=d.get("cached", False))


def load(path: Path) -> Calibration:
    """The record at `path`, marked cached; a SchemaError for a file of another schema (the caller calibrates
    again and overwrites it)."""
    record = Calibration.from_dict(json.loads(Path(path).read_text()))
    return Calibration(**{**record.__dict__, "cache": str(path), "cached": True})


# --- the cache key -----------------------------------------------------------------------------------

def default_cache() -> Path:
    """Where calibrations are kept: $MARS_CACHE_DIR/trees, default ~/.cache/mars-spec/trees."""
    from mars.adapter.sources import cache_root  # not at the top: see mars.adapter.sources' runpy note

    return cache_root() / "trees"


def machine() -> dict:
    """The machine a record was measured on (what every figure is quoted with)."""
    return {"cpu": cpu_name(), "capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "torch": torch.__version__}


def fingerprint(target: torch.nn.Module, head: torch.nn.Module) -> dict:
    """What the fastest settings depend on besides the candidates: the machine, torch and the models, by their
    configurations and weights (`weights_digest`), never by the path they were loaded from: one model reached by
    two paths is one record, a retrained layer under the same path another."""
    device = next(target.parameters()).device
    return {**machine(), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "target_config": json.dumps(without_paths(target.config.to_dict()), sort_keys=True, default=str),
            "draft_config": head.config.to_json(), "weights": [weights_digest(target), weights_digest(head)]}


def without_paths(config: dict) -> dict:
    """A configuration's dict without the path it was loaded from (`_name_or_path`), at any depth: a composite
    model's sub-configurations carry their own."""
    return {k: without_paths(v) if isinstance(v, dict) else v for k, v in config.items() if k != "_name_or_path"}


def weights_digest(model: torch.nn.Module, samples: int = 4096) -> str:
    """Every parameter's name, shape and the sum of at most `samples` evenly spaced entries, hashed: a checksum
    that any retrained tensor moves, cheap at any size. Meta parameters (offloaded) count by name and shape."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.named_parameters():
            digest.update(f"{name}{tuple(p.shape)}".encode())
            if not p.is_meta and p.numel():
                flat = p.detach().reshape(-1)
                digest.update(f"{float(flat[:: max(1, flat.numel() // samples)].float().sum()):.6g}".encode())
    return digest.hexdigest()[:16]


def prompt_digest(prompts: list[torch.Tensor]) -> str:
    """The calibration prompts' token ids, hashed: a calibration on other prompts is another record."""
    digest = hashlib.sha256()
    for ids in prompts:
        digest.update(ids.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
        digest.update(b"|")
    return digest.hexdigest()[:16]


def cache_path(key: dict, cache_dir: Path) -> Path:
    text = json.dumps(key, sort_keys=True, default=str)
    return Path(cache_dir) / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"


def cache_key(first: tuple, kernels: list[Kernels], prompts: list[torch.Tensor], plan: Plan,
              methods: dict[str, SamplingConfig], method: str) -> dict:
    """Everything one method's calibration depends on (what a record is cached by): the machine and models, the
    candidates, the prompts, the length and batch, strict's decoding (a rule's kernels and reference are strict's)
    and the method's own, every sampling parameter; not the method's name (`eval.run`'s "mars@0.9" and
    `mars.tuned`'s "mars" at θ = 0.9 are one record)."""
    def decoding(s: SamplingConfig) -> dict:
        return {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k,
                "rule": {"name": s.rule.name, **s.rule.params()}}
    return {**fingerprint(*first), "schema": SCHEMA,
            "kernels": [k.label for k in kernels], "trees": [t.label for t in plan.trees], "forced": plan.forced,
            "strict": decoding(methods[Strict.name]), "decoding": decoding(methods[method]), "drafting": plan.drafting,
            "batch": plan.batch, "max_new_tokens": plan.max_new_tokens, "prompts": len(prompts),
            "prompt_ids": prompt_digest(prompts),
            "references": ["generate", *(r.label for r in plan.references)]}
