"""MARS: margin-aware speculative verification on top of EAGLE tree drafting."""

from mars.generate import GenerationOutput, SpeculativeGenerator
from mars.sampling import SamplingConfig, margin_test, process_logits
from mars.stats import VerifyStats
from mars.verify import Verdict, accept_greedy, accept_sampling, verify

__all__ = [
    "GenerationOutput", "SamplingConfig", "SpeculativeGenerator", "Verdict", "VerifyStats",
    "accept_greedy", "accept_sampling", "margin_test", "process_logits", "verify",
]
