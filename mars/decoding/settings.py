"""How a run decodes, resolved once: precision, exact attention, kernels, tree and placement, each
with the reason it was chosen.

A job resolves its `DecodeSettings` before anything else (`eval.runner.job_settings.resolve_settings`): from the
run's explicit settings, from a measurement on this machine (`mars.tuning.search`), or from a rule where
nothing was measured. Everything downstream reads that one object: the generator
(its tree, kernels and exact attention), the run directories' names, the summary (`record`), the report, W&B, and the
run's first lines (`describe`). Nothing re-derives a setting.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from eagle.precision import DTYPES

# How a tree's children are drafted: "topk" (the head's most likely tokens, EAGLE-2's dynamic tree) or
# "sample" (drawn from the head into a fixed shape); "auto" resolves per call (`TreeShape.drafts`).
DRAFTING = ("auto", "topk", "sample")


@dataclass(frozen=True)
class TreeShape:
    """A draft tree: `total_tokens` nodes verified per cycle, `depth` draft levels, `branching`
    children per expanded node (EAGLE's "top_k"); `adaptive` sizes each cycle's tree up to these caps
    from costs measured here (`mars.decoding.adaptive`).

    drafting, when sampling (temperature > 0; greedy decoding always drafts top-k): "topk", the
    head's most likely tokens (EAGLE-2's dynamic tree, `eagle.tree.grow_trees`), where strict
    verification accepts a child with the target's probability of it, so tau stays near
    1 / (1 - the target's mass on k tokens); "sample", children drawn from the head's processed
    distribution without replacement into a fixed shape (`eagle.sampled_trees.sample_trees`, verified by
    recursive rejection sampling), accepted with probability sum_x min(p, q) and more; "auto"
    (default): "sample", except for an adaptive tree, which sizes top-k trees from their draft scores.

    Every rule about a tree's settings is checked here, once: the generator (`SpeculativeGenerator(tree=)`)
    and a run's config (`tree.*`) both build one.
    """

    total_tokens: int
    depth: int
    branching: int
    adaptive: bool = False
    drafting: str = "auto"

    def __post_init__(self):
        for name in ("total_tokens", "depth", "branching"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"tree.{name} must be an integer >= 1, got {value!r}")
        if self.drafting not in DRAFTING:
            raise ValueError(f"tree.drafting must be one of {', '.join(DRAFTING)}, got {self.drafting!r}")
        if self.adaptive and self.drafting == "sample":
            raise ValueError("an adaptive tree sizes top-k trees from their draft scores, and a sampled tree's shape "
                             "must not depend on its draws: draft top-k (tree.drafting topk or auto) with an adaptive "
                             "tree, or make it fixed (tree.adaptive false)")

    def drafts(self, sampled: bool) -> str:
        """What this tree drafts in a call that samples (`sampled`) or decodes greedily: "topk" or "sample"."""
        if not sampled:
            return "topk"
        return self.drafting if self.drafting != "auto" else "topk" if self.adaptive else "sample"

    def resolved(self, sampled: bool) -> TreeShape:
        """This tree with its drafting mode decided for such calls (what a run records)."""
        return replace(self, drafting=self.drafts(sampled))

    @property
    def batchable(self) -> bool:
        """Whether several prompts can draft it together (batched decoding runs fixed-size trees)."""
        return not self.adaptive

    @property
    def label(self) -> str:
        return (f"{self.total_tokens}/{self.depth}/{self.branching}" + (" adaptive" if self.adaptive else "")
                + (" sampled" if self.drafting == "sample" else ""))

    def sampled(self) -> TreeShape:
        """This shape with sampled children."""
        return TreeShape(self.total_tokens, self.depth, self.branching, False, "sample")


# Fixed trees by name (eval.run's `tree=` presets, `mars.tuned(..., tree=...)`).
NAMED_TREES = {
    "cpu": TreeShape(20, 4, 5, drafting="topk"),  # the embedded pair on 2 cores, before trees were measured
    "paper": TreeShape(49, 7, 10, drafting="topk"),  # MARS / EAGLE-3: depth K=7, top-k 10, total_token 50 with the root
    "eagle": TreeShape(60, 6, 10, drafting="topk"),  # EAGLE-2's default dynamic tree
    "adaptive": TreeShape(20, 6, 5, adaptive=True, drafting="topk"),  # sized per cycle, at most 20 nodes / 6 levels
}


@dataclass(frozen=True)
class Kernels:
    """How the target computes: its precision, whether verification attention is exact
    (`mars.adapter.exact`), whether linears multiply prepacked weights (`compute.kernels`), and whether
    torch may hand CPU products to oneDNN at all (`onednn` False: torch's own kernels, label "aten"; on the
    AVX-512 EPYC its one-row bf16 products stream SmolLM2's weights faster than packed oneDNN, though several
    rows cost nearly that many times one, so it is a plain decoding's kernels, `compute.kernels`)."""

    dtype: str  # a key of DTYPES
    exact_attention: bool
    prepack: bool
    onednn: bool = True

    def __post_init__(self) -> None:
        if self.prepack and not self.onednn:
            raise ValueError("prepacked weights are multiplied by oneDNN: prepack=True needs onednn=True")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def label(self) -> str:
        return "+".join([self.dtype, *(["exact"] if self.exact_attention else []),
                         *(["packed"] if self.prepack else []), *([] if self.onednn else ["aten"])])

    @classmethod
    def from_label(cls, label: str) -> Kernels:
        """The kernels a `label` names ("bfloat16+aten", "float32+exact+packed"): its inverse."""
        dtype, *flags = label.split("+")
        unknown = sorted(set(flags) - {"exact", "packed", "aten"})
        if dtype not in DTYPES or unknown or len(set(flags)) != len(flags):
            raise ValueError(f"kernels {label!r}: write a precision ({', '.join(DTYPES)}) followed by any of "
                             f"+exact, +packed, +aten, each once, e.g. bfloat16+aten (a run's log names its own)")
        return cls(dtype, "exact" in flags, "packed" in flags, "aten" not in flags)


@dataclass(frozen=True)
class Setting:
    """One resolved value and why: "set explicitly", "measured: ...", or "auto: <rule>"."""

    value: Any
    reason: str
    calibration: Any = None  # the measurement it came from (a `mars.tuning.record.Calibration`), if one


@dataclass(frozen=True)
class Speculation:
    """Whether a method speculates, and why (`mars.tuning.verdict.speculation_of` decides it from the method's
    calibration).

    Off where its best tree was not faster than the fastest plain decoding timed in calibration, paired prompt by
    prompt: the method then decodes with that plain decoding, `plain` (e.g. "vanilla bfloat16+aten",
    "generate@bfloat16+avx2"), so its output is that decoding's by construction. `forced`: the tree was set
    explicitly, which always speculates (the reason says when calibration found it slower). `predicted`: the
    calibration's paired ratio of what the method will run (its tree, or 1.0 when off) over the fastest plain
    decoding, the figure the run's measured paired speedup is set beside, and `interval` its 90% interval for a
    run of that many prompts; `certain`: the verdict's interval lay on one side of 1 (False: the budget ended
    first and the point estimate decided). `reference`: that fastest plain decoding, {"label", "tokens_per_s"}."""

    speculate: bool
    reason: str  # one of the run's first lines: "speculation on for strict: 6/6/1 ran at ..."
    predicted: float | None = None
    forced: bool = False
    reference: dict | None = None
    plain: str | None = None
    interval: tuple[float, float] | None = None
    certain: bool = True

    @property
    def state(self) -> str:
        """"on", "off", or "forced" (a tree set explicitly, speculating whatever calibration found)."""
        return "off" if not self.speculate else "forced" if self.forced else "on"

    def record(self) -> dict:
        return {"speculate": self.speculate, "state": self.state, "reason": self.reason,
                "predicted_speedup_vs_fastest": self.predicted,
                "predicted_interval": list(self.interval) if self.interval else None, "certain": self.certain,
                "reference": self.reference, "plain": self.plain}


@dataclass(frozen=True)
class DecodeSettings:
    """Everything a run decided about how it decodes (see the module docstring).

    calibration: the measurement the choices came from (`mars.tuning.record.Calibration`: every plain decoding
    raced, the cost model's parts, profiles and predictions, the paired finals), None where nothing was measured.
    """

    dtype: Setting  # str, a key of DTYPES
    exact_attention: Setting  # bool
    prepack: Setting  # bool
    tree: Setting  # TreeShape, its drafting resolved ("topk" / "sample")
    drafting_reason: str  # why the tree drafts as it does
    placement: Setting  # str: "cpu", "cuda:0", "device_map=auto over GPUs [0, 1]", ...
    head: Setting  # str: the draft head's directory or hub id (at temperature > 0 the model's sampling head, if any)
    calibration: Any = None  # mars.tuning.record.Calibration (typed there: the engine's settings sit below tuning)
    # {method name: Setting(TreeShape)}: a tree measured for that method's rule (a relaxed rule lengthens
    # deep chains more than wide trees); every other method drafts `tree`.
    method_trees: dict[str, Setting] = field(default_factory=dict)
    # {method name: Speculation}: whether strict and each rule method speculate, where calibration decided it
    # (or a forced tree was timed); a method not in it speculates.
    speculation: dict[str, Speculation] = field(default_factory=dict)
    onednn: Setting = Setting(True, "default: torch hands CPU products to oneDNN where it can")  # bool
    # Kernels: plain decoding's (vanilla, and methods whose speculation is off) where not the trees'; None: the same
    plain_kernels: Setting | None = None

    def tree_for(self, method: str) -> TreeShape:
        """The tree `method` drafts: its own measured tree, else the run's."""
        return self.method_trees[method].value if method in self.method_trees else self.tree.value

    def speculates(self, method: str) -> bool:
        """Whether `method` decodes speculatively (False: plain decoding, `SpeculativeGenerator.vanilla`)."""
        return self.speculation[method].speculate if method in self.speculation else True

    @property
    def kernels(self) -> Kernels:
        """The kernels the run's trees verify with (the generator's)."""
        return Kernels(self.dtype.value, self.exact_attention.value, self.prepack.value, self.onednn.value)

    @property
    def plain(self) -> Kernels:
        """The kernels of the run's plain decoding."""
        return self.plain_kernels.value if self.plain_kernels is not None else self.kernels

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype.value]

    def describe(self) -> list[str]:
        """The run's first lines: what it chose for this machine, and why."""
        on = {True: "on", False: "off"}
        return [f"precision: {self.dtype.value} ({self.dtype.reason}); exact attention "
                f"{on[self.exact_attention.value]} ({self.exact_attention.reason}); prepacked linears "
                f"{on[self.prepack.value]} ({self.prepack.reason})"
                + ("" if self.onednn.value else f"; oneDNN off ({self.onednn.reason})"),
                *([f"plain decoding (vanilla, speculation off): {self.plain.label} ({self.plain_kernels.reason})"]
                  if self.plain != self.kernels else []),
                f"tree: {self.tree.value.label} ({self.tree.reason}); drafting: {self.tree.value.drafting} "
                f"({self.drafting_reason}); placement: {self.placement.value} ({self.placement.reason})",
                f"draft head: {self.head.value} ({self.head.reason})",
                *(f"tree of {name}: {t.value.label} ({t.reason})" for name, t in self.method_trees.items()),
                *(s.reason for s in self.speculation.values())]

    def record(self) -> dict:
        """The summary's (and W&B's) record of the settings: each value with its reason."""
        return {"dtype": self.dtype.value, "dtype_reason": self.dtype.reason,
                "exact_attention": self.exact_attention.value, "exact_attention_reason": self.exact_attention.reason,
                "prepack": self.prepack.value, "prepack_reason": self.prepack.reason,
                "onednn": self.onednn.value, "onednn_reason": self.onednn.reason,
                "plain_kernels": asdict(self.plain),
                "plain_kernels_reason": self.plain_kernels.reason if self.plain_kernels else "the trees' kernels",
                "tree": asdict(self.tree.value), "tree_reason": self.tree.reason,
                "drafting": self.tree.value.drafting, "drafting_reason": self.drafting_reason,
                "placement": self.placement.value, "placement_reason": self.placement.reason,
                "draft": self.head.value, "draft_reason": self.head.reason, "calibration": _dumped(self.calibration),
                "method_trees": {name: {"tree": asdict(t.value), "reason": t.reason,
                                        "calibration": _dumped(t.calibration)}
                                 for name, t in self.method_trees.items()},
                "speculation": {name: s.record() for name, s in self.speculation.items()}}


def _dumped(calibration: Any) -> dict | None:
    """A calibration record as JSON data (None where nothing was measured)."""
    return None if calibration is None else calibration.to_dict()
