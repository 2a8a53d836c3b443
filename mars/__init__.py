"""MARS: margin-aware speculative verification on top of EAGLE tree drafting.

Rooms, each importing only those below it (tests/test_api.py):
- `mars.tuning`: the fastest settings on this machine, measured (`calibrate`), a relaxed rule's parameter
  chosen by a quality budget (`QualityBudget`), and a generator with them in one call (`tuned`);
- `mars.decoding`: the decoding loop over one prompt or many (`generate`), the per-call drafting and the
  batch's rows it drives, the adaptive tree, what a call returns (`output`) and how a run decodes (`settings`);
- `mars.verification`: acceptance under any rule (`verify`) and the sampling settings it shares with plain
  decoding (`sampling`);
- `mars.accounting`: what a relaxation costs (`cost`), settled after the loop (`deferred`), verification's
  statistics (`stats`) and phase timing (`timing`);
- `mars.rules`: the verification rules, one file each, and the strict trial they build on (`rejection`);
- `mars.adapter`: the target model (its forward, caches, static shapes, attention, its kernels and where
  its weights come from);
- `mars.diagnostics`: host-sync counting and a scripted draft head, for tests and the GPU check.
"""

from mars.accounting.stats import VerifyStats
from mars.decoding.generate import GenerationOutput, SpeculativeGenerator
from mars.decoding.settings import TreeShape
from mars.rules import RULES, Rule, make_rule, register
from mars.tuning.quality_budget import QualityBudget
from mars.tuning.tuned import tuned
from mars.verification.sampling import SamplingConfig, process_logits
from mars.verification.verify import Verdict, accept

__all__ = [
    "RULES", "GenerationOutput", "QualityBudget", "Rule", "SamplingConfig", "SpeculativeGenerator", "TreeShape",
    "Verdict", "VerifyStats", "accept", "make_rule", "process_logits", "register", "tuned",
]
