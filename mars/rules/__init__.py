"""Verification rules: a registry, and one file per rule.

A rule is a frozen dataclass of its parameters whose `relax(view)` says where and how it departs
from strict verification (`mars.rules.base`); `mars.verification.verify` applies any rule, greedy or sampling,
and `mars.accounting.cost` computes the exact distribution it emits. Adding one (in any module, e.g. a test):

    @register
    @dataclass(frozen=True)
    class Confident(Rule):
        name: ClassVar[str] = "confident"
        never_relaxes: ClassVar[dict] = {"gap": 0.0}  # what its tests run (`mars.rules.base.Rule`)
        relaxing: ClassVar[tuple[dict, ...]] = ({"gap": 0.8},)
        gap: float = 0.5

        def relax(self, view: TargetView) -> Relaxation:
            ...

after which `make_rule("confident", gap=0.3)`, `generate(..., rule="confident", gap=0.3)` and
`python -m eval.run method=confident method.gap=0.3` find it.
"""

from __future__ import annotations

import dataclasses

from mars.rules.base import ARGMAX, RESIDUAL, TARGET, Relaxation, Rule, TargetView

RULES: dict[str, type[Rule]] = {}


def register(cls: type[Rule]) -> type[Rule]:
    """Class decorator: make a rule available by its `name`."""
    if not cls.name or not cls.name.isidentifier():
        raise ValueError(f"a rule's name must be an identifier, got {cls.name!r} ({cls.__qualname__})")
    if cls.name in RULES and RULES[cls.name].__qualname__ != cls.__qualname__:
        raise ValueError(f"rule {cls.name!r} is already registered by {RULES[cls.name].__qualname__}")
    if cls.name in ("generate", "vanilla"):
        raise ValueError(f"{cls.name!r} names a plain-decoding method, not a rule")
    RULES[cls.name] = cls
    return cls


def rule_class(name: str) -> type[Rule]:
    if name not in RULES:
        raise ValueError(f"unknown rule {name!r}; registered rules: {', '.join(RULES)}")
    return RULES[name]


def rule_params(name: str) -> tuple[str, ...]:
    """The parameter names of rule `name`."""
    return tuple(f.name for f in dataclasses.fields(rule_class(name)))


def make_rule(name: str, **params) -> Rule:
    """Rule `name` with these parameters (the rest at their defaults); errors name the valid ones."""
    cls = rule_class(name)
    unknown = sorted(set(params) - set(rule_params(name)))
    if unknown:
        raise TypeError(f"rule {name!r} has no parameter(s) {unknown}; its parameters: "
                        f"{', '.join(rule_params(name)) or 'none'}")
    return cls(**params)


# The built-in rules register themselves on import.
from mars.rules import ears, entropy, margin, strict, topm, typical  # noqa: E402, F401

# The rules this package ships, in registration order: the registry holds only them at this point
# (a plugin or a test registers after importing this package). Tests derive their per-rule lists here.
BUILT_IN: tuple[str, ...] = tuple(RULES)

__all__ = ["ARGMAX", "BUILT_IN", "RESIDUAL", "RULES", "TARGET", "Relaxation", "Rule", "TargetView", "make_rule",
           "register", "rule_class", "rule_params"]
