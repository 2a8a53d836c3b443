"""The target's own answers to many prompts, batched as fast as a CPU allows (draft-training data).

Continuous batching: up to `batch_size` rows decode together. A row leaves the batch as soon as it
ends (an end-of-turn token, its length cap, or a loop, below), and waiting prompts take the free
places: they are prefilled together and joined to the running cache, left-padded. `model.generate`
instead keeps every row of a batch until its longest answer ends; on the SmolLM2 build's prompts
about 30% of its row-steps were spent on rows that had already finished.

Sampling is per row: each answer draws one uniform number per token from its own host generator,
seeded by (seed, prompt index), and takes the token where softmax(logits / T)'s cumulative sum passes it
(inverse-CDF sampling: one number per row, not one per word of the vocabulary, and one copy to the
device per step). So an answer does not depend on which rows shared its batch, and a resumed run writes
what an uninterrupted one would. At T = 0 a row takes the argmax. (In bf16 a product's last bits can
depend on the row count, so a greedy answer may still differ from a one-row decode where two logits
nearly tie.)

A finished row's place is not freed at once: dropping a row copies the whole KV cache, so finished rows
keep decoding (their tokens discarded) until a quarter of the batch has finished, and then leave together
while waiting prompts join. On a GPU, where a step's cost hardly depends on its row count, this trades
at most a quarter of wasted rows for one cache copy per quarter of the batch instead of one per answer.

Loops (`LoopCap`): a small model's greedy answer often repeats one block until the length cap (24 of 64
first answers of SmolLM2's held-out prompts ran to 478 tokens). A row stops once its last `span` tokens
repeat with a period of at most `max_period` tokens: the loop stays in the data (the target does loop,
and the head should predict it), but only one span of it, not hundreds of tokens of it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from eagle.config import cache_keyword
from eagle.growing_cache import GrownCache
from eagle.kernels import packed_where_chosen

ROOM = 256  # spare cache entries made at each rebuild (after rows join or leave)


@dataclass(frozen=True)
class LoopCap:
    """A row loops once its last `span` tokens equal the `span` tokens `p` earlier, for some p <= max_period."""

    max_period: int = 64
    span: int = 96

    def looping(self, tokens: list[int]) -> bool:
        n = len(tokens)
        if n <= self.span:
            return False
        tail = tokens[-self.span:]
        return any(tokens[n - self.span - p : n - p] == tail for p in range(1, min(self.max_period, n - self.span) + 1))


@dataclass
class _Row:
    index: int  # the prompt's index in the caller's list
    budget: int  # answer tokens allowed (the length cap less the prompt)
    rng: random.Random | None  # its sampling numbers (T > 0)
    answer: list[int] = field(default_factory=list)
    done: bool = False  # finished: decodes on, discarded, until the batch drops its finished rows


@dataclass
class AnswerStats:
    """What one `answer_prompts` call did (its rate is answer tokens per second of wall time)."""

    answers: int = 0
    answer_tokens: int = 0
    looped: int = 0
    capped: int = 0  # ran to the length cap without ending
    row_steps: int = 0  # rows decoded, summed over decode steps (the work done, finished rows not yet dropped too)
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.answer_tokens / max(self.seconds, 1e-9)


def _sample(logits: torch.Tensor, rows: list[_Row], temperature: float) -> list[int]:
    """One token per row from logits [A, V]: the argmax at T = 0, else an inverse-CDF sample of
    softmax(logits / T) at each row's next uniform number."""
    if temperature <= 0:
        return logits.argmax(-1).tolist()
    cdf = torch.softmax(logits.float() / temperature, dim=-1).cumsum(-1)
    u = torch.tensor([r.rng.random() for r in rows], device=cdf.device)
    tokens = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).squeeze(1)
    return tokens.clamp_max(cdf.shape[-1] - 1).tolist()


def _left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask [n, width], the prompts right-aligned."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


def _kv(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _join(old: list[tuple[torch.Tensor, torch.Tensor]], old_mask: torch.Tensor,
          new: list[tuple[torch.Tensor, torch.Tensor]], new_mask: torch.Tensor):
    """Two caches (tensors [rows, heads, length, dim] per layer) and masks [rows, length] as one, each
    left-padded to the longer length."""
    length = max(old_mask.shape[1], new_mask.shape[1])

    def pad(x: torch.Tensor, dim: int) -> torch.Tensor:
        missing = length - x.shape[dim]
        if missing == 0:
            return x
        shape = list(x.shape)
        shape[dim] = missing
        return torch.cat([x.new_zeros(shape), x], dim=dim)

    kv = [(torch.cat([pad(k0, 2), pad(k1, 2)]), torch.cat([pad(v0, 2), pad(v1, 2)]))
          for (k0, v0), (k1, v1) in zip(old, new, strict=True)]
    return kv, torch.cat([pad(old_mask, 1), pad(new_mask, 1)])


def answer_prompts(
    model, prompts: Mapping[int, list[int]] | list[list[int]], max_len: int, eos_ids: frozenset[int], pad_id: int, *,
    batch_size: int = 64, temperature: float = 0.0, seed: int = 0, loop_cap: LoopCap | None = LoopCap(),
    on_answer: Callable[[int, list[int]], None] | None = None, log: Callable[[str], None] = print,
    log_every: float = 60.0, seconds: float | None = None, prepack: bool | str = "auto",
) -> tuple[dict[int, list[int]], AnswerStats]:
    """The target's answer to each prompt (token ids after the prompt, the ending token included), in its
    own precision, with its KV cache; `max_len` caps prompt + answer. Returns ({prompt key: answer}, stats).

    `prompts`: {key: token ids}, or a list (keys 0, 1, ...). A sampled answer's generator is seeded by
    (`seed`, its key), so the same key answers the same whatever else is in the call.

    `on_answer(index, answer)` is called as each answer finishes (the caller saves progress there).
    Waiting prompts join when at least a quarter of the batch is free (a join copies the whole cache once).
    With `seconds`, no prompt joins after that much wall time (the first batch always does): the rows decoding
    finish, the rest stay unanswered (absent from the result), so a run on a lent machine ends in time with
    whole answers.

    `prepack`: CPU linears multiply oneDNN-prepacked weights during the call (`eagle.kernels`; "auto": where
    oneDNN packs the model's precision and the copy fits). At 64 rows MKL's float32 products of SmolLM2 ran
    at 75-90 GFLOP/s and the 49,152-word output layer at 41, packed ones at 110-116 (2-core AVX2 EPYC).
    """
    with packed_where_chosen(model, prepack):
        return _answer_prompts(model, prompts, max_len, eos_ids, pad_id, batch_size, temperature, seed, loop_cap,
                               on_answer, log, log_every, seconds)


@torch.no_grad()
def _answer_prompts(model, prompts, max_len, eos_ids, pad_id, batch_size, temperature, seed, loop_cap, on_answer,
                    log, log_every, seconds) -> tuple[dict[int, list[int]], AnswerStats]:
    device = next(model.parameters()).device
    if not isinstance(prompts, Mapping):
        prompts = dict(enumerate(prompts))
    order = sorted(prompts, key=lambda i: len(prompts[i]))  # similar lengths join together
    pending = [i for i in order if len(prompts[i]) < max_len]
    answers: dict[int, list[int]] = {i: [] for i in order if len(prompts[i]) >= max_len}
    stats = AnswerStats()
    rows: list[_Row] = []
    kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    mask = torch.zeros(0, 0, dtype=torch.long, device=device)
    last = torch.zeros(0, dtype=torch.long, device=device)  # each row's newest token, fed next
    positions = torch.zeros(0, dtype=torch.long, device=device)  # its position id
    keyword = cache_keyword(model)
    cache: DynamicCache | None = None
    t0 = t_log = time.perf_counter()
    while pending or any(not row.done for row in rows):
        if seconds is not None and pending and rows and time.perf_counter() - t0 > seconds:
            log(f"answers: time budget of {seconds:.0f} s spent, {len(pending)} prompts left unanswered")
            pending = []
        finished = [r for r, row in enumerate(rows) if row.done]
        if finished and len(finished) >= max(1, len(rows) // 4):  # finished rows leave together (one copy)
            index = torch.tensor([r for r, row in enumerate(rows) if not row.done], dtype=torch.long, device=device)
            rows = [row for row in rows if not row.done]
            mask, last, positions = mask[index], last[index], positions[index]
            kv = [(k[index], v[index]) for k, v in kv]
            cache = None
            # columns that every remaining row pads are dropped, so attention does not grow with old rows
            if rows:
                start = int((mask.cumsum(1) == 0).sum(1).min())
                if start:
                    mask = mask[:, start:]
                    kv = [(k[:, :, start:], v[:, :, start:]) for k, v in kv]
        free = batch_size - len(rows)
        if pending and (not rows or free >= max(1, batch_size // 4)):
            group, pending = pending[:free], pending[free:]
            ids, new_mask = (t.to(device) for t in _left_pad([prompts[i] for i in group], pad_id))
            fresh = DynamicCache()
            logits = model(input_ids=ids, attention_mask=new_mask, position_ids=(new_mask.cumsum(1) - 1).clamp_min(0),
                           use_cache=True, **{keyword: fresh}, logits_to_keep=1).logits[:, -1]
            new_rows = [_Row(i, max_len - len(prompts[i]),
                             random.Random(seed * 1_000_003 + i) if temperature > 0 else None) for i in group]
            first = torch.tensor(_sample(logits, new_rows, temperature), device=device)
            kv, mask = _join(kv, mask, _kv(fresh), new_mask) if rows else (_kv(fresh), new_mask)
            cache = None
            rows += new_rows
            last = torch.cat([last, first])
            positions = torch.cat([positions, new_mask.sum(1)])
            for row, token in zip(new_rows, first.tolist(), strict=True):
                row.answer.append(token)
        else:
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
            if cache is None:  # rebuilt only after rows joined or left (a rebuild copies the whole cache)
                # written in place from here on (a `DynamicCache` concatenated the whole cache at every step),
                # with room for what the rows may still write, up to ROOM (beyond it a layer doubles)
                room = max((row.budget - len(row.answer) for row in rows if not row.done), default=1)
                cache = GrownCache(kv, min(room, ROOM))
            logits = model(input_ids=last[:, None], attention_mask=mask, position_ids=positions[:, None],
                           use_cache=True, **{keyword: cache},
                           cache_position=torch.tensor([mask.shape[1] - 1], device=device)).logits[:, -1]
            kv = _kv(cache)
            stats.row_steps += len(rows)
            tokens = _sample(logits, rows, temperature)
            last = torch.tensor(tokens, device=device)
            positions = positions + 1
            for row, token in zip(rows, tokens, strict=True):
                if not row.done:
                    row.answer.append(token)
        for row in rows:
            if row.done:
                continue
            ended = row.answer[-1] in eos_ids
            capped = not ended and len(row.answer) >= row.budget
            looped = not ended and not capped and loop_cap is not None and len(row.answer) % 8 == 0 \
                and loop_cap.looping(row.answer)
            if ended or capped or looped:
                row.done = True
                answers[row.index] = row.answer
                stats.answers += 1
                stats.answer_tokens += len(row.answer)
                stats.looped += looped
                stats.capped += capped
                if on_answer is not None:
                    on_answer(row.index, row.answer)
        if time.perf_counter() - t_log > log_every:
            t_log = time.perf_counter()
            log(f"answers: {len(answers)}/{len(prompts)}, {stats.answer_tokens / (t_log - t0):.0f} answer tokens/s, "
                f"{sum(not row.done for row in rows)} rows decoding")
    stats.seconds = time.perf_counter() - t0
    return answers, stats
