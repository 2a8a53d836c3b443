"""An oracle draft head: it proposes the target's own greedy continuation, so a correct engine accepts it all."""

from __future__ import annotations

import torch

from eagle import Eagle3Head


class OracleHead(Eagle3Head):
    """Runs the real EAGLE-3 head (so caches and masks are exercised) but replaces its log-probs.

    `sequence` is prompt + the target's greedy continuation. Draft position i predicts the token
    at sequence index i + 2, so the log-probs put all mass there.
    """

    def __init__(self, target_config, sequence: list[int]):
        base = Eagle3Head.for_target(target_config)
        super().__init__(base.config)
        self.load_state_dict(base.state_dict())
        self.sequence = sequence

    def _oracle(self, position: int, rows: int) -> torch.Tensor:
        logprobs = torch.full((rows, self.config.draft_vocab_size), -30.0)
        index = position + 2
        if index < len(self.sequence):
            logprobs[:, self.sequence[index]] = 0.0
        return torch.log_softmax(logprobs, dim=-1)

    def extend(self, features, tokens):
        hidden, _ = super().extend(features, tokens)
        return hidden, self._oracle(self.cache.length - 1, 1)[0]

    def propose(self, hidden, tokens, depth, ancestor_mask):
        out, _ = super().propose(hidden, tokens, depth, ancestor_mask)
        return out, self._oracle(self.cache.length + depth - 1, tokens.shape[0])
