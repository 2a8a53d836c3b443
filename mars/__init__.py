"""MARS: margin-aware speculative verification on top of EAGLE tree drafting.

Modules: `mars.target` (the target model adapter), `mars.static` (its static shapes, for CUDA
graphs and torch.compile), `mars.sampling` (settings, logits processing, margins), `mars.verify`
(acceptance rules), `mars.stats` (verification statistics), `mars.generate` (the decoding loop).
"""

from mars.generate import GenerationOutput, SpeculativeGenerator
from mars.sampling import SamplingConfig, margin_test, process_logits
from mars.stats import VerifyStats
from mars.verify import Verdict, accept, accept_greedy, accept_sampling

__all__ = [
    "GenerationOutput", "SamplingConfig", "SpeculativeGenerator", "Verdict", "VerifyStats",
    "accept", "accept_greedy", "accept_sampling", "margin_test", "process_logits",
]
