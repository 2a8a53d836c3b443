"""The method catalog: what `method=` and `baselines=` name, as typed Hydra schemas.

A method is plain decoding (`generate`: transformers' `model.generate`, optionally in another dtype;
`vanilla`: our own one-token-at-a-time loop) or a verification rule of `mars.rules` with its parameters
(`RuleMethod`, one schema per registered rule, generated from the rule's dataclass). `method_spec`
parses a display name (`typical@0.05[delta=0.2]`) back to the method it names; `load_plugins` imports
the modules of $MARS_PLUGINS so that the rules they register are methods too.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from dataclasses import asdict, dataclass, field, fields, is_dataclass, make_dataclass
from enum import Enum
from pathlib import Path
from typing import Any, get_type_hints

from omegaconf import MISSING

from mars.decoding.reference import ISA_LIMITS  # what `generate@<dtype>+<isa>` sets in its process's environment
from mars.rules import RULES, Rule, make_rule, rule_class
from mars.rules.strict import Strict
from mars.tuning.quality_budget import MARGIN, QualityBudget

SPEC = re.compile(r"^(\w+)(?:@([^\[\]]+))?(?:\[(.*)\])?$")  # a rule's display name: name@value[k=v,...]
GENERATE, VANILLA = "generate", "vanilla"
STRICT = Strict.name  # the lossless rule: the reference of quality recovery and tree calibration
PLAIN = (GENERATE, VANILLA)  # the methods that decode one token at a time; every other method is a rule


class Dtype(Enum):
    bfloat16 = "bfloat16"
    float16 = "float16"
    float32 = "float32"
    auto = "auto"


@dataclass
class MethodConfig:
    """The method under test. `kind`: generate (transformers' model.generate), vanilla (our plain
    decoding), or a verification rule of `mars.rules` (strict, mars, typical, ...: `RuleMethod`)."""

    kind: str = MISSING

    @property
    def name(self) -> str:
        return self.kind


@dataclass
class GenerateConfig(MethodConfig):
    """transformers' `model.generate`, in the model's precision or in `dtype` (the target loaded a second
    time in it): on a CPU without bf16 matrix instructions the run verifies in float32 but plain decoding
    is fastest in bf16, and speedups are quoted against the fastest plain decoding timed."""

    kind: str = GENERATE
    dtype: Dtype | None = None  # null: the model's (model.dtype as resolved)
    # Run in a process whose torch and oneDNN are limited to this instruction set (ISA_LIMITS), e.g. avx2:
    # on AVX-512 BF16 CPUs torch's own bf16 decoding is faster there (mars/decoding/reference.py).
    isa: str | None = None

    @property
    def name(self) -> str:
        if self.dtype is None:
            return GENERATE
        return f"{GENERATE}@{self.dtype.value}" + (f"+{self.isa}" if self.isa else "")


@dataclass
class QualityBudgetConfig:
    """`method.quality_budget`: the most the rule may cost per emitted token, its main parameter then chosen
    (`mars.tuning.quality_budget.QualityBudget`, `eval.runner.budgeted`): metric kl_per_token or tv_per_token
    when sampling, logprob_regret or argmax_mismatch when greedy ("": no budget, the parameter as given); grid:
    the values to choose among (empty: the rule's own). Always an object, never null: Hydra merges a
    `method.quality_budget={...}` override into it."""

    metric: str = ""
    per_token: float = 0.0
    margin: float = MARGIN
    grid: list[float] = field(default_factory=list)

    def budget(self) -> QualityBudget | None:
        """The budget (None where no metric is set; a ValueError where a bound is given without one)."""
        if not self.metric:
            if self.per_token or self.grid:
                raise ValueError("method.quality_budget gives a bound but no metric: set quality_budget.metric "
                                 "(logprob_regret or argmax_mismatch at T = 0, kl_per_token or tv_per_token at T > 0)")
            return None
        return QualityBudget(self.metric, self.per_token, self.margin, tuple(self.grid))


@dataclass
class RuleMethod(MethodConfig):
    """Our speculative loop verified by rule `kind`. Each registered rule gets a subclass with its
    parameters as typed fields (`rule_schema`): `method=typical method.epsilon=0.05`. quality_budget (the job's
    own method only): its main parameter is chosen within that cost instead (`QualityBudgetConfig`)."""

    quality_budget: QualityBudgetConfig = field(default_factory=QualityBudgetConfig)

    def rule(self) -> Rule:
        return make_rule(self.kind, **{f.name: plain(getattr(self, f.name)) for f in fields(self)
                                       if f.name not in ("kind", "quality_budget")})

    @property
    def name(self) -> str:
        """The rule's display name at these parameters (mars@0.9): run directories and reports use it."""
        return self.rule().display


def rule_schema(name: str) -> type[RuleMethod]:
    """The Hydra schema of `method=<name>`: `kind` plus the rule's parameters, typed and defaulted as
    the rule declares them."""
    cls = rule_class(name)
    hints = get_type_hints(cls)
    params = [(f.name, hints[f.name], field(default=f.default)) for f in fields(cls)]
    return make_dataclass(f"{cls.__name__}Method", [("kind", str, field(default=name)), *params], bases=(RuleMethod,))


def method_spec(spec: str) -> MethodConfig:
    """A method from its short form, the way tables name it: generate, generate@<dtype>, vanilla, or a
    rule's display name, <rule>[@<value of its main parameter>][[<param>=<value>,...]] (strict,
    mars@0.9, typical@0.05[delta=0.2])."""
    spec = str(spec).strip()
    if spec == GENERATE:
        return GenerateConfig()
    if spec == VANILLA:
        return MethodConfig(kind=VANILLA)
    if spec.startswith(f"{GENERATE}@"):
        dtype, _, isa = spec[len(GENERATE) + 1:].partition("+")
        try:
            if isa and isa not in ISA_LIMITS:
                raise ValueError(f"unknown instruction-set limit {isa!r}: use one of {sorted(ISA_LIMITS)}")
            return GenerateConfig(dtype=Dtype(dtype), isa=isa or None)
        except ValueError as error:
            if isa:
                raise ValueError(f"bad method {spec!r}: {error}") from error
    match = SPEC.match(spec)
    if match and match.group(1) in RULES:
        name, label, extra = match.groups()
        cls, values = rule_schema(name), {}
        try:
            if label is not None:
                if rule_class(name).label is None:
                    raise ValueError(f"rule {name!r} has no main parameter to give after '@'")
                values[rule_class(name).label] = label
            for item in filter(None, (extra or "").split(",")):
                key, _, value = item.partition("=")
                values[key.strip()] = value.strip()
            hints = get_type_hints(cls)
            typed = {k: hints[k](v) if k in hints else v for k, v in values.items()}
            method = cls(**typed)
            method.rule()  # checks the values
            return method
        except (TypeError, ValueError) as error:
            raise ValueError(f"bad method {spec!r}: {error}") from error
    raise ValueError(f"unknown method {spec!r}: use 'generate', 'generate@<dtype>' (bfloat16, float16, float32; "
                     "'generate@bfloat16+avx2' in a process limited to AVX2), "
                     f"'vanilla' or a rule ({', '.join(RULES)}), optionally with its main parameter and others: "
                     "e.g. mars@0.9, typical@0.05[delta=0.2]")



def plain(value: Any) -> Any:
    """A config dataclass (or any nesting of them) as JSON-ready Python: dicts, lists, enum values."""
    if is_dataclass(value):
        return plain(asdict(value))
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value.value if isinstance(value, Enum) else value


def load_plugins(spec: str | None = None) -> None:
    """Import the modules named by MARS_PLUGINS (paths to .py files or module names, separated by
    os.pathsep), so that the rules they register are methods: MARS_PLUGINS=my_rule.py python -m eval.run
    method=my_rule."""
    for item in filter(None, (spec if spec is not None else os.environ.get("MARS_PLUGINS", "")).split(os.pathsep)):
        if item.endswith(".py"):
            path = Path(item).resolve()
            if not path.exists():
                raise FileNotFoundError(f"MARS_PLUGINS names {item}, which does not exist")
            module_spec = importlib.util.spec_from_file_location(f"mars_plugin_{path.stem}", path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = module
            module_spec.loader.exec_module(module)
        else:
            importlib.import_module(item)


load_plugins()
