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

from compute.growing_cache import GrownCache
from compute.kernels import packed_where_chosen
from eagle.config import cache_keyword

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


@dataclass(frozen=True)
class _Call:
    """What one `answer_prompts` call asks (its arguments after the model and the prompts), in one place."""

    max_len: int
    eos_ids: frozenset[int]
    pad_id: int
    batch_size: int
    temperature: float
    seed: int
    loop_cap: LoopCap | None
    on_answer: Callable[[int, list[int]], None] | None
    log: Callable[[str], None]
    log_every: float
    seconds: float | None


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

    `prepack`: CPU linears multiply oneDNN-prepacked weights during the call (`compute.kernels`; "auto": where
    oneDNN packs the model's precision and the copy fits). At 64 rows MKL's float32 products of SmolLM2 ran
    at 75-90 GFLOP/s and the 49,152-word output layer at 41, packed ones at 110-116 (2-core AVX2 EPYC).
    """
    call = _Call(max_len=max_len, eos_ids=eos_ids, pad_id=pad_id, batch_size=batch_size, temperature=temperature,
                 seed=seed, loop_cap=loop_cap, on_answer=on_answer, log=log, log_every=log_every, seconds=seconds)
    with packed_where_chosen(model, prepack):
        return _answer_prompts(model, prompts, call)


class _Batch:
    """The rows decoding together and their KV cache. Row r of every tensor below is `rows[r]`: rows join
    (`join`) and leave (`drop_finished`) in every one at once, which is what this class is for."""

    def __init__(self, model, call: _Call):
        self.model, self.call = model, call
        self.device = next(model.parameters()).device
        self.keyword = cache_keyword(model)
        self.rows: list[_Row] = []
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer: keys, values [rows, heads, length, dim]
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # [rows, length] int64, 0: left padding
        self.last = torch.zeros(0, dtype=torch.long, device=self.device)  # [rows] int64: each row's newest token
        self.positions = torch.zeros(0, dtype=torch.long, device=self.device)  # [rows] int64: its position id
        self.cache: GrownCache | None = None  # `kv` written in place; None: rebuilt at the next step (rows changed)

    def decoding(self) -> bool:
        """Whether a row is still decoding (finished rows wait here to leave together)."""
        return any(not row.done for row in self.rows)

    def drop_finished(self) -> None:
        """Finished rows leave together once a quarter of the batch has finished: one cache copy for all of them."""
        finished = [r for r, row in enumerate(self.rows) if row.done]
        if not (finished and len(finished) >= max(1, len(self.rows) // 4)):
            return
        index = torch.tensor([r for r, row in enumerate(self.rows) if not row.done], dtype=torch.long,
                             device=self.device)
        self.rows = [row for row in self.rows if not row.done]
        self.mask, self.last, self.positions = self.mask[index], self.last[index], self.positions[index]
        self.kv = [(k[index], v[index]) for k, v in self.kv]
        self.cache = None
        # columns that every remaining row pads are dropped, so attention does not grow with old rows
        if self.rows:
            start = int((self.mask.cumsum(1) == 0).sum(1).min())
            if start:
                self.mask = self.mask[:, start:]
                self.kv = [(k[:, :, start:], v[:, :, start:]) for k, v in self.kv]

    def join(self, group: list[int], prompts: Mapping[int, list[int]]) -> None:
        """Prefill `group`'s prompts together, each row's first token sampled, and join them to the running cache,
        left-padded."""
        call, device = self.call, self.device
        ids, new_mask = (t.to(device) for t in _left_pad([prompts[i] for i in group], call.pad_id))
        fresh = DynamicCache()
        logits = self.model(input_ids=ids, attention_mask=new_mask, position_ids=(new_mask.cumsum(1) - 1).clamp_min(0),
                            use_cache=True, **{self.keyword: fresh}, logits_to_keep=1).logits[:, -1]
        new_rows = [_Row(i, call.max_len - len(prompts[i]),
                         random.Random(call.seed * 1_000_003 + i) if call.temperature > 0 else None) for i in group]
        first = torch.tensor(_sample(logits, new_rows, call.temperature), device=device)
        self.kv, self.mask = _join(self.kv, self.mask, _kv(fresh), new_mask) if self.rows else (_kv(fresh), new_mask)
        self.cache = None
        self.rows += new_rows
        self.last = torch.cat([self.last, first])
        self.positions = torch.cat([self.positions, new_mask.sum(1)])
        for row, token in zip(new_rows, first.tolist(), strict=True):
            row.answer.append(token)

    def step(self) -> None:
        """One decoding step of every row; a finished row decodes too (its token discarded) until it leaves."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], dim=1)
        if self.cache is None:  # rebuilt only after rows joined or left (a rebuild copies the whole cache)
            # written in place from here on (a `DynamicCache` concatenated the whole cache at every step),
            # with room for what the rows may still write, up to ROOM (beyond it a layer doubles)
            room = max((row.budget - len(row.answer) for row in self.rows if not row.done), default=1)
            self.cache = GrownCache(self.kv, min(room, ROOM))
        logits = self.model(input_ids=self.last[:, None], attention_mask=self.mask,
                            position_ids=self.positions[:, None], use_cache=True, **{self.keyword: self.cache},
                            cache_position=torch.tensor([self.mask.shape[1] - 1], device=self.device)).logits[:, -1]
        self.kv = _kv(self.cache)
        tokens = _sample(logits, self.rows, self.call.temperature)
        self.last = torch.tensor(tokens, device=self.device)
        self.positions = self.positions + 1
        for row, token in zip(self.rows, tokens, strict=True):
            if not row.done:
                row.answer.append(token)


def _finish_rows(rows: list[_Row], call: _Call, answers: dict[int, list[int]], stats: AnswerStats) -> None:
    """Rows that ended (an end-of-turn token, the length cap, a loop) are done: their answers kept, counted and
    handed to `on_answer`, once."""
    for row in rows:
        if row.done:
            continue
        ended = row.answer[-1] in call.eos_ids
        capped = not ended and len(row.answer) >= row.budget
        looped = not ended and not capped and call.loop_cap is not None and len(row.answer) % 8 == 0 \
            and call.loop_cap.looping(row.answer)
        if ended or capped or looped:
            row.done = True
            answers[row.index] = row.answer
            stats.answers += 1
            stats.answer_tokens += len(row.answer)
            stats.looped += looped
            stats.capped += capped
            if call.on_answer is not None:
                call.on_answer(row.index, row.answer)


@torch.no_grad()
def _answer_prompts(model, prompts: Mapping[int, list[int]] | list[list[int]],
                    call: _Call) -> tuple[dict[int, list[int]], AnswerStats]:
    """`answer_prompts`' loop (packing aside): rows leave, waiting prompts join, every row steps."""
    batch = _Batch(model, call)
    if not isinstance(prompts, Mapping):
        prompts = dict(enumerate(prompts))
    order = sorted(prompts, key=lambda i: len(prompts[i]))  # similar lengths join together
    pending = [i for i in order if len(prompts[i]) < call.max_len]
    answers: dict[int, list[int]] = {i: [] for i in order if len(prompts[i]) >= call.max_len}
    stats = AnswerStats()
    t0 = t_log = time.perf_counter()
    while pending or batch.decoding():
        if call.seconds is not None and pending and batch.rows and time.perf_counter() - t0 > call.seconds:
            call.log(f"answers: time budget of {call.seconds:.0f} s spent, {len(pending)} prompts left unanswered")
            pending = []
        batch.drop_finished()
        free = call.batch_size - len(batch.rows)
        if pending and (not batch.rows or free >= max(1, call.batch_size // 4)):
            group, pending = pending[:free], pending[free:]
            batch.join(group, prompts)
        else:
            batch.step()
            stats.row_steps += len(batch.rows)
        _finish_rows(batch.rows, call, answers, stats)
        if time.perf_counter() - t_log > call.log_every:
            t_log = time.perf_counter()
            call.log(f"answers: {len(answers)}/{len(prompts)}, {stats.answer_tokens / (t_log - t0):.0f} answer "
                     f"tokens/s, {sum(not row.done for row in batch.rows)} rows decoding")
    stats.seconds = time.perf_counter() - t0
    return answers, stats
