"""A draft head with scripted proposals, for tests and for timing the loop at a chosen acceptance.

`ScriptedHead` runs a real EAGLE-3 head (its layer, cache and masks, so their cost and correctness
are exercised) and replaces its log-probabilities: the draft at sequence position i puts all its
mass on `sequence[i + 2]` (the token that position predicts) with probability `acceptance`,
decided once per position, and otherwise on a wrong token; past the end of `sequence` it is
uniform. With `sequence` = prompt + the target's greedy continuation, greedy acceptance along the
true path is ~`acceptance` per level (every draft right at 1.0, the default).
"""

from __future__ import annotations

import zlib

import torch

from eagle.heads import Eagle3Head


class ScriptedHead(Eagle3Head):
    def __init__(self, target_config, sequence: list[int] = (), acceptance: float = 1.0):
        base = Eagle3Head.for_target(target_config)
        super().__init__(base.config)
        self.load_state_dict(base.state_dict())
        self.sequence, self.acceptance = list(sequence), acceptance

    def _proposals(self, position: int, rows: int) -> torch.Tensor:
        vocab = self.config.draft_vocab_size
        logprobs = torch.full((rows, vocab), -30.0, device=self.device)
        index = position + 2
        if index < len(self.sequence):
            right = zlib.crc32(str(position).encode()) / 2**32 < self.acceptance
            logprobs[:, self.sequence[index] if right else (self.sequence[index] + 1) % vocab] = 0.0
        return torch.log_softmax(logprobs, dim=-1)

    def extend(self, features, tokens):
        hidden, _ = super().extend(features, tokens)
        return hidden, self._proposals(self.cache.length - 1, 1)[0]

    def propose(self, hidden, tokens, depth, ancestor_mask):
        out, _ = super().propose(hidden, tokens, depth, ancestor_mask)
        return out, self._proposals(self.cache.length + depth - 1, tokens.shape[0])
