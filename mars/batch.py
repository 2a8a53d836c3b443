"""Batched speculative decoding: B prompts decoded together, each accepting a different number of tokens.

    prefill B prompts (one forward, right-padded) -> each row's first token
    repeat:  forest  = grow_trees(head, roots)            # one EAGLE-2 tree per row, same size (eagle.tree),
                       or sample_trees(head, roots)       #   or sampled children in one fixed shape (T > 0)
             logits  = target.score_rows(forest)          # one forward: row b's tree after row b's prefix
             verdicts = accept_rows(process(logits), ...)  # per row, any rule, one read for the batch
             row b emits its accepted tokens + its next token; target.keep_rows(paths)
             head.extend_rows(path features, tokens)        # every row's draft catches up
             finished rows leave the batch (their slots are not refilled: a static batch)

The cache keeps ragged rows (`eagle.rows`): row b's tokens first, then a gap its masks hide, then the
block every row writes at the same place. Per cycle the host reads the verdicts once and uploads the
paths, next tokens and kept rows once, whatever B (`tests/test_batch.py` counts it); the device work
has no loop over rows. Per-row Python is the bookkeeping of emitted tokens.

Latency: each row's `GenerationOutput.seconds` is the time from the batch's start to its last token
(all requests submitted at once); the batch's throughput is its tokens over the call's wall time.
The cost accounting is settled after the last row's (`mars.output.CostLedger`, one read for the
batch; its time in the first output's `phase_seconds["accounting"]`, with the batch's phases).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

from eagle.tree import DraftTree, grow_trees, sample_trees, sampled_shape
from mars.output import CostLedger, PhaseClock
from mars.sampling import SamplingConfig, process_logits
from mars.verify import accept_rows


def prompts_of(gen, input_ids: Sequence[torch.Tensor], max_new_tokens: int, tree: int) -> list[torch.Tensor]:
    """The prompts as 1-D tensors, each checked as `generate` checks one ([1, T] or [T])."""
    if isinstance(input_ids, torch.Tensor) or not len(input_ids):
        raise TypeError("give the batch's prompts as a non-empty list of LongTensors, each [T] or [1, T]")
    return [gen._check_prompt(p if p.dim() == 2 else p[None], max_new_tokens, tree) for p in input_ids]


def next_tokens(processed: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """[B] what plain decoding emits after each row of processed logits [B, V] (left on the device)."""
    if cfg.greedy:
        return processed.argmax(dim=-1)
    return torch.multinomial(processed.softmax(dim=-1), 1, generator=generator)[:, 0]


class Batch:
    """The rows still decoding: which output each feeds, and dropping the finished ones."""

    def __init__(self, gen, outputs: list, eos: frozenset[int], max_new_tokens: int, start: float):
        self.gen, self.outputs, self.eos, self.max_new_tokens, self.start = gen, outputs, eos, max_new_tokens, start
        self.live = list(range(len(outputs)))  # batch row -> output index

    def emit(self, row: int, tokens: list[int]) -> int:
        """Emit what row `row` may of `tokens`; returns how many were taken."""
        out = self.outputs[self.live[row]]
        taken = self.gen._emit(out, tokens, self.eos, self.max_new_tokens)
        if self.gen._done(out, self.max_new_tokens):
            out.seconds = time.perf_counter() - self.start
        return taken

    def keep(self) -> list[int]:
        """The rows (batch indices) not finished yet."""
        return [r for r, i in enumerate(self.live) if not self.gen._done(self.outputs[i], self.max_new_tokens)]

    def drop_finished(self, keep: list[int]) -> None:
        self.live = [self.live[r] for r in keep]


def generate_batch(gen, input_ids: Sequence[torch.Tensor], cfg: SamplingConfig, max_new_tokens: int,
                   eos: frozenset[int], generator: torch.Generator | None, outputs: list) -> None:
    """The loop of `SpeculativeGenerator.generate_batch` (see the module docstring); fills `outputs`."""
    target, head = gen.target, gen.head
    prompts = prompts_of(gen, input_ids, max_new_tokens, gen.total_tokens + 1)
    start = time.perf_counter()
    batch = Batch(gen, outputs, eos, max_new_tokens, start)
    if max_new_tokens == 0:
        return
    clock = PhaseClock(outputs[0].phase_seconds, target.all_devices | {head.device}, gen.profile)  # the batch's
    ledger = CostLedger([out.stats for out in outputs], clock, target.static)
    sampled = gen.samples_drafts(cfg)
    # As `SpeculativeGenerator.generate`: each depth's sampled shape laid out once, the caller's RNG drafts
    # where it lives on the head's device.
    shapes = {d: sampled_shape(gen.topology(d), head.device) for d in range(gen.depth + 1)} if sampled else {}
    process = functools.partial(process_logits, cfg=cfg)
    draft_rng = generator if generator is not None and torch.device(generator.device).type == head.device.type \
        else None
    logits, features = target.prefill_rows(prompts, max(map(len, prompts)) + max_new_tokens + gen.total_tokens + 1)
    roots = next_tokens(process_logits(logits, cfg), cfg, generator).to(head.device)
    for row, token in enumerate(roots.tolist()):
        batch.emit(row, [token])
    # The head's first block: row b's prompt features with the tokens after them (its prompt's rest, its root).
    lengths = [len(p) for p in prompts]
    rest = pad_sequence([p[1:].to(head.device) for p in prompts], batch_first=True)
    tokens = torch.cat([rest, rest.new_zeros(len(prompts), max(lengths) - rest.shape[1])], dim=1)
    counts_device = target.rows.device.to(head.device)
    tokens[torch.arange(len(prompts), device=head.device), counts_device - 1] = roots
    head.reset_rows(len(prompts), head.device)
    pending = (features.to(head.device), tokens, lengths, counts_device)
    keep = batch.keep()
    if len(keep) < len(batch.live):
        pending, roots = _drop(gen, batch, keep, torch.tensor(keep, device=head.device), pending, roots)
    clock.lap("prefill")
    while batch.live:
        remaining = max(max_new_tokens - len(outputs[i].tokens) for i in batch.live)
        depth = min(gen.depth, remaining - 1)  # the last cycle drafts no deeper than the tokens still wanted
        hidden = logprobs = None
        if depth > 0:
            hidden, logprobs = head.extend_rows(*pending)
            clock.lap("catch_up")
        if sampled:
            forest = sample_trees(head, roots, hidden, logprobs, shapes[depth], process, draft_rng)
        else:
            forest = grow_trees(head, roots, hidden, logprobs, depth, gen.branching, gen.total_tokens)
        clock.lap("draft")
        logits, features = target.score_rows(forest)
        clock.lap("tree_forward")
        verdicts = accept_rows(process_logits(logits, cfg), forest, cfg, generator, defer_cost=ledger.defer)
        for row, verdict in enumerate(verdicts):
            out = outputs[batch.live[row]]
            emitted = batch.emit(row, verdict.tokens + [verdict.next_token])
            out.accept_lengths.append(min(verdict.accepted, emitted))
            out.draft_depths.append(forest.levels)
            out.stats.add(verdict, keep_steps=emitted, sampled=not cfg.greedy)
            out.num_cycles += 1
        clock.lap("accept")
        ledger.record(verdicts)
        keep = batch.keep()
        if not keep:
            break
        # The cycle's one upload: each row's path (padded by repeating its last node), next token and
        # length, and which rows stay.
        width = forest.levels + 1
        packed = [v.path + v.path[-1:] * (width - len(v.path)) + [v.next_token, len(v.path)] for v in verdicts]
        for row, r in enumerate(keep):
            packed[row].append(r)
        for row in range(len(keep), len(verdicts)):
            packed[row].append(0)
        uploaded = torch.tensor(packed, device=head.device)
        paths, roots, counts_device = uploaded[:, :width], uploaded[:, width], uploaded[:, width + 1]
        counts = [len(v.path) for v in verdicts]
        target.keep_rows(paths, counts, counts_device)
        clock.lap("cache_update")
        # Each row's draft catches up on its kept nodes: their features, and the token after each.
        feats = forest.by_row(features.to(head.device))
        feats = feats.gather(1, paths[:, :, None].expand(-1, -1, feats.shape[-1]))
        after = forest.by_row(forest.tokens).gather(1, torch.cat([paths[:, 1:], paths[:, -1:]], dim=1))
        last = torch.arange(width, device=head.device)[None, :] == (counts_device - 1)[:, None]
        pending = (feats, torch.where(last, roots[:, None], after), counts, counts_device)
        if len(keep) < len(verdicts):
            pending, roots = _drop(gen, batch, keep, uploaded[: len(keep), width + 2], pending, roots)
    ledger.settle()  # every row's `seconds` was taken at its last token: the accounting is outside them


def _drop(gen, batch: Batch, keep: list[int], keep_device: torch.Tensor, pending: tuple, roots: torch.Tensor):
    """Finished rows leave the batch: the caches and the pending catch-up keep only `keep`."""
    gen.target.select_rows(keep, keep_device.to(gen.target.devices.inputs))
    gen.head.select_rows(keep, keep_device)
    batch.drop_finished(keep)
    features, tokens, counts, counts_device = pending
    pending = (features.index_select(0, keep_device), tokens.index_select(0, keep_device),
               [counts[r] for r in keep], counts_device.index_select(0, keep_device))
    return pending, roots.index_select(0, keep_device)


def vanilla_batch(gen, input_ids: Sequence[torch.Tensor], cfg: SamplingConfig, max_new_tokens: int,
                  eos: frozenset[int], generator: torch.Generator | None, outputs: list) -> None:
    """Plain decoding of B prompts together (one token per row per forward), through the same adapter,
    ragged cache and logits processing: the batched baseline of `generate_batch`; fills `outputs`."""
    target = gen.target
    prompts = prompts_of(gen, input_ids, max_new_tokens, 1)
    batch = Batch(gen, outputs, eos, max_new_tokens, time.perf_counter())
    if max_new_tokens == 0:
        return
    device = target.devices.inputs
    logits, _ = target.prefill_rows(prompts, max(map(len, prompts)) + max_new_tokens + 1)
    tokens = next_tokens(process_logits(logits, cfg), cfg, generator).to(device)
    ones = torch.ones(len(prompts), dtype=torch.long, device=device)
    prefilled = True  # the prefill's token is in no cycle
    while True:
        for row, token in enumerate(tokens.tolist()):
            if not prefilled:
                outputs[batch.live[row]].accept_lengths.append(0)
                outputs[batch.live[row]].num_cycles += 1
            batch.emit(row, [token])
        prefilled = False
        keep = batch.keep()
        if not keep:
            break
        if len(keep) < len(batch.live):
            keep_device = torch.tensor(keep, device=device)
            target.select_rows(keep, keep_device)
            batch.drop_finished(keep)
            tokens, ones = tokens.index_select(0, keep_device), ones[: len(keep)]
        zero = torch.zeros_like(tokens)[:, None]
        forest = DraftTree.forest(tokens[:, None], zero - 1, zero, zero.float(), 0)
        logits, _ = target.score_rows(forest)
        target.keep_rows(zero, [1] * len(keep), ones)
        tokens = next_tokens(process_logits(logits, cfg), cfg, generator)
