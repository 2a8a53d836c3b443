"""The rows of one decoding call: which output each row of the batch feeds (`Rows`), and what each row's
draft head has not seen yet (`Behind`: features of committed tokens and the token after each).

A batch keeps one row per unfinished prompt; a row that finishes leaves, and every per-row tensor
drops it. The draft head catches up on committed tokens only before a cycle that drafts, so what it
has not seen accumulates as a list of `Behind` blocks, joined into one when it is fed (`joined`).
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch
from torch.nn.utils.rnn import pad_sequence

from eagle.tree import DraftTree
from mars.decoding.output import GenerationOutput


class Rows:
    """The rows still decoding: which output each feeds; finished rows leave."""

    def __init__(self, outputs: list[GenerationOutput], eos: frozenset[int], max_new_tokens: int):
        self.outputs, self.eos, self.max_new_tokens = outputs, eos, max_new_tokens
        self.start = time.perf_counter()
        self.live = list(range(len(outputs)))  # batch row -> output index

    def output(self, row: int) -> GenerationOutput:
        return self.outputs[self.live[row]]

    def emit(self, row: int, tokens: list[int]) -> int:
        """Emit what row `row` may of `tokens`; returns how many were taken. A row's `seconds` is taken at
        its last token."""
        out = self.output(row)
        taken = out.emit(tokens, self.eos, self.max_new_tokens)
        if out.done(self.max_new_tokens):
            out.seconds = time.perf_counter() - self.start
        return taken

    def emit_first(self, tokens: torch.Tensor) -> None:
        """Each row's first token (the prefill's), tokens [B]: one read for the batch."""
        for row, token in enumerate(tokens.tolist()):
            self.emit(row, [token])

    def unfinished(self) -> list[int]:
        return [r for r, i in enumerate(self.live) if not self.outputs[i].done(self.max_new_tokens)]

    def remaining(self) -> int:
        """The most tokens any row still wants."""
        return max(self.max_new_tokens - len(self.outputs[i].tokens) for i in self.live)

    def keep(self, rows: list[int]) -> None:
        self.live = [self.live[r] for r in rows]


class Behind(NamedTuple):
    """What each row's draft head has not seen yet: row b's first counts[b] target features and the token
    after each (the rest is padding)."""

    features: torch.Tensor  # [B, m, F]
    tokens: torch.Tensor  # [B, m]
    counts: list[int]  # [B]
    counts_device: torch.Tensor  # [B], the same on the device

    def select(self, keep: list[int], keep_device: torch.Tensor) -> Behind:
        return Behind(self.features.index_select(0, keep_device), self.tokens.index_select(0, keep_device),
                      [self.counts[r] for r in keep], self.counts_device.index_select(0, keep_device))


def prompts_behind(prompts: list[torch.Tensor], features: torch.Tensor, roots: torch.Tensor,
                   lengths: torch.Tensor | None) -> Behind:
    """Each prompt's features [B, max T, F] with the tokens after them: the prompt's rest, then its root [B].
    lengths [B]: the prompts' lengths where the target keeps them on a device (its ragged rows), else None."""
    device = roots.device
    tokens = pad_sequence([torch.cat([p[1:].to(device), roots[b : b + 1]]) for b, p in enumerate(prompts)],
                          batch_first=True)
    counts = [len(p) for p in prompts]
    # The target's own row lengths, or one length written on the device: no upload.
    counts_device = lengths.to(device) if lengths is not None else torch.full((1,), counts[0], device=device)
    return Behind(features.to(device), tokens, counts, counts_device)


def paths_behind(forest: DraftTree, features: torch.Tensor, paths: torch.Tensor, roots: torch.Tensor,
                 counts: list[int], counts_device: torch.Tensor) -> Behind:
    """Each row's kept nodes: their features (features [B n, F] over the forest) and the token after each
    (the next node of the path, then the row's new root). paths [B, m] padded by repeating the last node."""
    feats = forest.by_row(features.to(paths.device))
    feats = feats.gather(1, paths[:, :, None].expand(-1, -1, feats.shape[-1]))
    after = forest.by_row(forest.tokens).gather(1, torch.cat([paths[:, 1:], paths[:, -1:]], dim=1))
    last = torch.arange(paths.shape[1], device=paths.device)[None, :] == (counts_device - 1)[:, None]
    return Behind(feats, torch.where(last, roots[:, None], after), counts, counts_device)


def joined(blocks: list[Behind]) -> Behind:
    """Blocks one after another, each row's entries packed to the front (plain decoding steps of the
    adaptive tree leave several before the next draft)."""
    if len(blocks) == 1:
        return blocks[0]
    features, tokens = torch.cat([b.features for b in blocks], 1), torch.cat([b.tokens for b in blocks], 1)
    valid = torch.cat([torch.arange(b.tokens.shape[1], device=tokens.device)[None, :] < b.counts_device[:, None]
                       for b in blocks], dim=1)
    order = torch.sort((~valid).to(torch.uint8), dim=1, stable=True).indices  # valid entries first, in order
    counts = [sum(c) for c in zip(*(b.counts for b in blocks), strict=True)]
    return Behind(features.gather(1, order[:, :, None].expand_as(features)), tokens.gather(1, order), counts,
                  sum(b.counts_device for b in blocks))
