"""A draft head with scripted proposals, for tests and for timing the loop at a chosen acceptance.

`ScriptedHead` runs a real EAGLE-3 head (its layer, cache and masks, so their cost and correctness
are exercised) and replaces its log-probabilities: the draft at sequence position i puts all its
mass on `sequence[i + 2]` (the token that position predicts) with probability `acceptance`,
decided once per position, and otherwise on a wrong token; past the end of `sequence` it is
uniform. With `sequence` = prompt + the target's greedy continuation, greedy acceptance along the
true path is ~`acceptance` per level (every draft right at 1.0, the default).
Batched decoding (`extend_rows` / `propose_rows`): row b drafts from `sequences[b]` likewise (a batch
of one is a single sequence: `sequences[0]`).
"""

from __future__ import annotations

import zlib

import torch

from eagle.heads import Eagle3Head


class ScriptedHead(Eagle3Head):
    def __init__(self, target_config, sequence: list[int] = (), acceptance: float = 1.0,
                 sequences: list[list[int]] = ()):
        base = Eagle3Head.for_target(target_config)
        super().__init__(base.config)
        self.load_state_dict(base.state_dict())
        self.sequence, self.acceptance = list(sequence), acceptance
        self.sequences = [list(s) for s in sequences]  # per prompt of a batch
        self.live: list[int] = []  # the prompt each row of the batch decodes

    def _proposals(self, position: int, rows: int, sequence: list[int] | None = None) -> torch.Tensor:
        if sequence is None:  # one sequence: `sequence`, or the one of a batch of one
            sequence = self.sequence if self.sequence or not self.sequences else self.sequences[self.live[0]]
        vocab = self.config.draft_vocab_size
        logprobs = torch.full((rows, vocab), -30.0, device=self.device)
        index = position + 2
        if index < len(sequence):
            right = zlib.crc32(str(position).encode()) / 2**32 < self.acceptance
            logprobs[:, sequence[index] if right else (sequence[index] + 1) % vocab] = 0.0
        return torch.log_softmax(logprobs, dim=-1)

    def extend(self, features, tokens):
        hidden, _ = super().extend(features, tokens)
        return hidden, self._proposals(self.cache.length - 1, 1)[0]

    def propose(self, hidden, tokens, depth, ancestor_mask):
        out, _ = super().propose(hidden, tokens, depth, ancestor_mask)
        return out, self._proposals(self.cache.length + depth - 1, tokens.shape[0])

    def reset_rows(self, batch, device):
        super().reset_rows(batch, device)
        self.live = list(range(batch))

    def extend_rows(self, features, tokens, counts, counts_device):
        if self.cache.rows is None:  # one sequence: `extend` scripted it
            return super().extend_rows(features, tokens, counts, counts_device)
        hidden, _ = super().extend_rows(features, tokens, counts, counts_device)
        rows = zip(self.cache.rows.host, self.live, strict=True)
        return hidden, torch.cat([self._proposals(n - 1, 1, self.sequences[i]) for n, i in rows])

    def propose_rows(self, hidden, tokens, depth, ancestor_mask):
        if self.cache.rows is None:  # one sequence: `propose` scripted it
            return super().propose_rows(hidden, tokens, depth, ancestor_mask)
        out, _ = super().propose_rows(hidden, tokens, depth, ancestor_mask)
        rows = zip(self.cache.rows.host, self.live, strict=True)
        return out, torch.stack([self._proposals(n + depth - 1, tokens.shape[1], self.sequences[i]) for n, i in rows])

    def select_rows(self, rows, rows_device):
        super().select_rows(rows, rows_device)
        self.live = [self.live[r] for r in rows]
