"""MARS: margin-aware speculative verification on top of EAGLE tree drafting.

Modules: `mars.adapter` (the target model adapter, by role: its forward, static shapes for CUDA
graphs and torch.compile, caches, attention routing, exact attention), `mars.sampling` (settings,
logits processing), `mars.rules` (verification rules: strict, MARS and the relaxed-acceptance zoo,
one file each), `mars.verify` (acceptance under any rule), `mars.cost` (the exact distribution a
rule emits), `mars.stats` (verification statistics), `mars.generate` (the decoding loop, one prompt or
many at once), `mars.output` (what a call returns), `mars.timing` (phase timing),
`mars.accounting` (the cost accounting, settled after the loop),
`mars.calibrate` (the fastest settings here, measured) and `mars.tuning` (`tuned`: a generator with them, in one call).
"""

from mars.generate import GenerationOutput, SpeculativeGenerator
from mars.rules import RULES, Rule, make_rule, register
from mars.sampling import SamplingConfig, process_logits
from mars.settings import TreeShape
from mars.stats import VerifyStats
from mars.tuning import tuned
from mars.verify import Verdict, accept

__all__ = [
    "RULES", "GenerationOutput", "Rule", "SamplingConfig", "SpeculativeGenerator", "TreeShape", "Verdict",
    "VerifyStats", "accept", "make_rule", "process_logits", "register", "tuned",
]
