"""Draft-head training data: token sequences, then the target's features and next-token distributions.

    texts (stdlib corpus | JSONL)  --tokenise, join with EOS, chunk-->  Sequences [N, T]
    prompts (corpus | JSONL)       --the target continues them-->      Sequences [N, T]   (--generate)
    Sequences  --target forward, no grad-->        FeatureBatch: the feature taps concatenated [N, T, F]
                                                   and the top-k of the target's next-token distribution

Precomputed by default, online on request. On the 2-core CPU a forward of the embedded 35M-param,
20-layer target costs about as much as the draft's TTT forward + backward on the same tokens, so
computing the target once and training several epochs on stored features roughly halves the cost
of every epoch after the first. The price is disk: per token F bf16 values plus k (id, prob) pairs,
2.6 KB for the embedded target (3 x 384 features, k = 32), ~25 KB for an 8B Llama. When that is too
much, or for a single epoch on a GPU where the target forward is cheap next to the data volume,
`online=True` computes the same `FeatureBatch` each step instead; the training code is the same.

The target's distribution is kept in one of two forms (`target_dist`):
  - "topk": its top-k ids and probabilities renormalised over those k (= the softmax of the k
    largest logits; index 0 is the target's argmax). Cheap, but it drops the tail: on the embedded
    target's own T=1 text the top 32 hold well under the whole mass, and a head trained towards the
    renormalised top-k learns a distribution sharper than p.
  - "full": the target's final (post-norm) hidden state, from which its lm_head gives the exact
    logits, hence the full temperature-1 distribution, at training time. One hidden-size vector per
    token (1.5 KB for the embedded target in float32, 16 KB for an 8B Llama in bf16) instead of
    vocabulary-sized rows (16 KB per token for 4,096 fp16 probabilities, 0.5 MB for a 128k vocabulary),
    for one hidden x vocab matrix product per trained token, small next to the TTT unroll.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from compute.kernels import packed_where_chosen
from eagle.config import eos_token_ids
from eagle.files import save_atomic
from eagle.precision import HALF
from eagle.train.answering import LoopCap, answer_prompts
from eagle.train.corpus import read_source, stdlib_files

# --- token sequences ------------------------------------------------------------------------

@dataclass
class Sequences:
    """Right-padded token sequences of one length T.

    `loss_mask[n, p]` is True where the draft is trained on the target's distribution at position
    p (its prediction of token p + 1); it is False on padding (p >= length) and on prompt tokens of
    generated data, whose continuation the target did not choose.
    """

    input_ids: torch.Tensor  # [N, T] long
    lengths: torch.Tensor  # [N] long
    loss_mask: torch.Tensor  # [N, T] bool

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def seq_len(self) -> int:
        return self.input_ids.shape[1]

    def select(self, indices: torch.Tensor) -> Sequences:
        return Sequences(self.input_ids[indices], self.lengths[indices], self.loss_mask[indices])

    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def save(self, path: Path) -> None:
        save_atomic({"input_ids": self.input_ids.int(), "lengths": self.lengths, "loss_mask": self.loss_mask}, path)

    @classmethod
    def load(cls, path: Path) -> Sequences:
        d = torch.load(path, weights_only=True)
        return cls(d["input_ids"].long(), d["lengths"].long(), d["loss_mask"].bool())

    @classmethod
    def concat(cls, parts: list[Sequences]) -> Sequences:
        return cls(*(torch.cat([getattr(p, name) for p in parts]) for name in ("input_ids", "lengths", "loss_mask")))


def chunk_tokens(tokens: torch.Tensor, seq_len: int, max_sequences: int | None = None, seed: int = 0) -> Sequences:
    """Cut a token stream into non-overlapping windows of `seq_len`.

    With `max_sequences`, a seeded random subset of windows (kept in corpus order) is used, so a
    small budget still samples the whole corpus rather than its first files.
    """
    n = len(tokens) // seq_len
    if n == 0:
        raise ValueError(f"the corpus has {len(tokens)} tokens, fewer than one sequence of {seq_len}")
    chunks = tokens[: n * seq_len].view(n, seq_len).long()
    if max_sequences is not None and max_sequences < n:
        gen = torch.Generator().manual_seed(seed)
        chunks = chunks[torch.randperm(n, generator=gen)[:max_sequences].sort().values]
    return Sequences(chunks, torch.full((len(chunks),), seq_len), torch.ones(chunks.shape, dtype=torch.bool))


def read_jsonl(path: str | Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def record_messages(record: dict) -> list[dict] | None:
    """Chat turns as [{"role", "content"}] from ShareGPT ("conversations") or OpenAI ("messages") records."""
    roles = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
    if "messages" in record:
        return [{"role": m["role"], "content": m["content"]} for m in record["messages"]]
    if "conversations" in record:
        return [{"role": roles.get(m["from"], m["from"]), "content": m["value"]} for m in record["conversations"]]
    return None


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def record_text(record: dict, tokenizer) -> str:
    """The whole training text of a JSONL record: `text`, or a conversation rendered by the chat template."""
    if "text" in record:
        return record["text"]
    messages = record_messages(record)
    if messages is None:
        raise ValueError(f"JSONL record has none of 'text', 'messages', 'conversations': keys {sorted(record)}")
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return "\n\n".join(m["content"] for m in messages)


def record_prompt(record: dict, tokenizer) -> list[int]:
    """Prompt token ids of a record for --generate: `prompt`/`text`, or the conversation's first user turn."""
    if "prompt" in record or "text" in record:
        return tokenizer(record.get("prompt", record.get("text")))["input_ids"]
    messages = record_messages(record) or []
    first_user = next((m for m in messages if m["role"] == "user"), None)
    if first_user is None:
        raise ValueError("JSONL record has no 'prompt', 'text' or user turn to use as a prompt")
    if has_chat_template(tokenizer):
        return list(tokenizer.apply_chat_template([first_user], tokenize=True, add_generation_prompt=True,
                                                  return_dict=True)["input_ids"])
    return tokenizer(first_user["content"])["input_ids"]


def tokenize_texts(tokenizer, texts: Iterable[str]) -> torch.Tensor:
    """Texts tokenised and joined with EOS into one stream (int32)."""
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text)["input_ids"])
        if tokenizer.eos_token_id is not None:
            ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.int32)


def tokenize_split(tokenizer, split: str, cache: Path, root: Path | None = None) -> torch.Tensor:
    """All stdlib files of a split tokenised and joined with EOS (`tokenize_texts`), cached in `cache`."""
    if cache.exists():
        return torch.load(cache)
    tokens = tokenize_texts(tokenizer, filter(None, (read_source(path) for path in stdlib_files(split, root))))
    cache.parent.mkdir(parents=True, exist_ok=True)
    save_atomic(tokens, cache)  # whole or absent: the next run loads it without checking
    return tokens


def corpus_tokens(tokenizer, records: Iterable[dict] | None, split: str, cache_dir: Path) -> torch.Tensor:
    """The token stream of the stdlib corpus split (cached), or of `records`' texts (`record_text`)."""
    if records is None:
        return tokenize_split(tokenizer, split, cache_dir / f"stdlib_{split}.pt")
    return tokenize_texts(tokenizer, (record_text(r, tokenizer) for r in records))


def hub_records(spec: str, split: str = "train") -> Iterator[dict]:
    """The rows of a Hugging Face dataset of conversations or texts, read with `datasets` (which caches
    it): ShareGPT's `conversations` [{from, value}], UltraChat's / OpenAI's `messages` [{role, content}]
    or `text`, as `record_text` reads them. spec: "ID[:CONFIG][@REVISION]" (ID may be a local dataset
    directory). UltraChat-200k's split is "train_sft"."""
    try:
        import datasets
    except ImportError as e:
        raise ImportError(f"--data-hub needs the `datasets` package ({e}): pip install datasets") from None
    spec, _, revision = spec.partition("@")
    name, _, config = spec.partition(":")
    try:
        rows = datasets.load_dataset(name, config or None, split=split, revision=revision or None)
    except Exception as e:  # offline, a missing dataset or split: one line naming what to do
        raise FileNotFoundError(f"could not load the dataset {name!r} (config {config or None}, split {split!r}) "
                                f"from the Hugging Face hub ({type(e).__name__}: {' '.join(str(e).split())[:300]}): "
                                "check the id and --data-split, connect to the hub, or pass --data-jsonl") from None
    for row in rows:
        yield dict(row)


def corpus_prompts(tokens: torch.Tensor, count: int, prompt_len: int, seed: int) -> list[list[int]]:
    """`count` prompts of `prompt_len` tokens cut from random places of a token stream."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(tokens) - prompt_len, (count,), generator=gen)
    return [tokens[s : s + prompt_len].tolist() for s in starts.tolist()]


# --- target-generated sequences ---------------------------------------------------------------

def _autocast(model) -> torch.autocast:
    """Autocast in the model's own half precision (as it decodes); off for a float32 model."""
    dtype = next(model.parameters()).dtype
    return torch.autocast(next(model.parameters()).device.type, dtype=dtype, enabled=dtype in HALF)


SAVE_SECONDS = 60.0  # how often generate_sequences saves its finished answers (what a kill may lose)


@torch.no_grad()
def generate_sequences(
    model, tokenizer, prompts: list[list[int]], seq_len: int, *, batch_size: int = 16,
    temperature: float = 0.0, seed: int = 0, log: Callable[[str], None] = print,
    progress: Path | None = None, limit: int | None = None, loop_cap: LoopCap | None = None,
    seconds: float | None = None,
) -> Sequences:
    """The target continues each prompt (greedy at temperature 0, else sampled) up to `seq_len` tokens.

    This is how EAGLE-3 builds its data: responses written by the target itself, so the draft
    learns the distribution it will be asked to predict. The loss mask covers the response only.
    Prompts are truncated to seq_len // 2 tokens and answered by continuous batching
    (`eagle.train.answering`: a finished row leaves its batch, a waiting prompt takes its place; each
    sampled answer seeded by its prompt's index), `loop_cap` ending answers that repeat a block. With
    `progress`, the finished answers are saved there about every minute and kept when rerun, so an
    interrupted run loses at most a minute and writes what an uninterrupted one would. With `limit`, only
    the `limit` shortest prompts are answered, so a limit can be set or raised on a run in progress. With
    `seconds`, answering stops taking prompts after that much wall time; the sequences hold the answered ones
    (shortest first), and a rerun continues where it stopped.
    """
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_ids = eos_token_ids(model, tokenizer)
    prompts = [p[: seq_len // 2] for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    if limit is not None:
        if limit < 1:
            raise ValueError(f"limit must be a positive number of prompts, got {limit}")
        order = order[:limit]
    rows: dict[int, list[int]] = {}  # prompt index -> answer
    spec = {"prompts": prompts, "temperature": temperature, "seed": seed, "loop_cap": loop_cap,
            "answering": "continuous, inverse-CDF samples"}  # another sampler writes other answers
    if progress is not None and progress.exists():
        saved = torch.load(progress, weights_only=False)
        if all(saved.get(k) == v for k, v in spec.items()):
            rows = saved["rows"]
            log(f"resuming generation: {sum(i in rows for i in order)}/{len(order)} responses already written")
    saved_at = [time.monotonic()]

    def keep(index: int, answer: list[int]) -> None:
        rows[index] = answer
        if progress is not None and time.monotonic() - saved_at[0] >= SAVE_SECONDS:
            save_atomic({**spec, "rows": rows}, progress)
            saved_at[0] = time.monotonic()

    todo = {i: prompts[i] for i in order if i not in rows}
    if todo:
        with _autocast(model):
            _, stats = answer_prompts(model, todo, seq_len, eos_ids, pad_id, batch_size=batch_size,
                                      temperature=temperature, seed=seed, loop_cap=loop_cap, on_answer=keep, log=log,
                                      seconds=seconds)
        log(f"generated {stats.answers} responses: {stats.answer_tokens} tokens at {stats.tokens_per_s:.0f}/s, "
            f"{stats.looped} cut as loops, {stats.capped} at the length cap")
        if progress is not None:
            save_atomic({**spec, "rows": rows}, progress)
    answered = sorted(i for i in order if i in rows)
    return _pad_sequences([prompts[i] + rows[i] for i in answered], [len(prompts[i]) for i in answered], seq_len,
                          pad_id)


def _pad_sequences(rows: list[list[int]], response_starts: list[int], seq_len: int, pad_id: int) -> Sequences:
    ids = torch.full((len(rows), seq_len), pad_id, dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows])
    mask = torch.zeros(len(rows), seq_len, dtype=torch.bool)
    for n, (row, start) in enumerate(zip(rows, response_starts, strict=True)):
        ids[n, : len(row)] = torch.tensor(row)
        # From the last prompt position (it predicts the first response token) to the one predicting the last.
        mask[n, max(start - 1, 0) : len(row) - 1] = True
    return Sequences(ids, lengths, mask)


# --- draft vocabulary ------------------------------------------------------------------------

def token_counts(seqs: Sequences, vocab_size: int) -> torch.Tensor:
    """How often each token id is the next token at a trained position (what the draft must predict)."""
    trained = seqs.loss_mask[:, :-1] & (torch.arange(1, seqs.seq_len) < seqs.lengths[:, None])
    return torch.bincount(seqs.input_ids[:, 1:][trained], minlength=vocab_size)[:vocab_size]


def most_frequent_ids(counts: torch.Tensor, n: int) -> torch.Tensor:
    """The n most frequent ids (ties: lower id first), ascending. Unseen ids fill up from id 0."""
    if n > counts.numel():
        raise ValueError(f"draft vocabulary of {n} exceeds the target vocabulary of {counts.numel()}")
    order = torch.sort(counts, descending=True, stable=True).indices
    return order[:n].sort().values


# --- packing -----------------------------------------------------------------------------------

def pack_windows(order: list[int], lengths: torch.Tensor, width: int, group: int = 256) -> list[list[int]]:
    """Sequences (indices, in `order`) laid end to end into windows of at most `width` tokens: first fit,
    longest first, within consecutive groups of `group` sequences (so an epoch's shuffle still decides
    which sequences train together). Every sequence lands in exactly one window."""
    windows: list[list[int]] = []
    for start in range(0, len(order), group):
        chunk = sorted(order[start : start + group], key=lambda i: -int(lengths[i]))
        bins: list[list[int]] = []
        room: list[int] = []
        for i in chunk:
            n = int(lengths[i])
            if n > width:
                raise ValueError(f"sequence {i} has {n} tokens, more than the packed width {width}")
            at = next((b for b, r in enumerate(room) if r >= n), None)
            if at is None:
                bins.append([i])
                room.append(width - n)
            else:
                bins[at].append(i)
                room[at] -= n
        windows += bins
    return windows


# --- target features --------------------------------------------------------------------------

@dataclass
class FeatureBatch:
    """What one training step needs: tokens, the target's feature taps and its next-token distribution."""

    input_ids: torch.Tensor  # [B, T] long
    loss_mask: torch.Tensor  # [B, T] bool
    features: torch.Tensor  # [B, T, F] (bf16 when stored)
    topk_ids: torch.Tensor | None = None  # "topk": [B, T, k] long, by decreasing probability
    topk_probs: torch.Tensor | None = None  # "topk": [B, T, k] float32, renormalised over the k
    last_hidden: torch.Tensor | None = None  # "full": [B, T, H] the target's final post-norm state (its precision)
    # Packed windows (`pack_windows`): [B, T] long, the sequence each position belongs to (1, 2, ... within a
    # row; 0 on padding). None: one sequence per row. Attention and the loss stay within a sequence.
    doc_ids: torch.Tensor | None = None

    def __post_init__(self) -> None:
        has_topk, has_full = self.topk_ids is not None, self.last_hidden is not None
        if has_topk != (self.topk_probs is not None) or has_topk == has_full:
            raise ValueError("a FeatureBatch carries the target's distribution once: topk_ids and topk_probs, "
                             "or last_hidden")

    @property
    def target_dist(self) -> str:
        return "full" if self.last_hidden is not None else "topk"

    def to(self, device: torch.device | str) -> FeatureBatch:
        return FeatureBatch(*(None if getattr(self, n) is None else getattr(self, n).to(device) for n in FIELDS))


FIELDS = ("input_ids", "loss_mask", "features", "topk_ids", "topk_probs", "last_hidden", "doc_ids")
TARGET_DISTS = ("topk", "full")
STORED = {"topk": ("features", "topk_ids", "topk_probs"), "full": ("features", "last_hidden")}  # a shard's tensors


@torch.no_grad()  # not inference_mode: the draft's backward must be able to save these tensors
def collect_features(model, seqs: Sequences, feature_layers: list[int], top_k: int = 32,
                     target_dist: str = "topk") -> FeatureBatch:
    """Run the target once over `seqs` (in its own precision) and keep the feature taps and its
    next-token distribution: the top-k (`target_dist="topk"`) or, for the full distribution, the
    final hidden state its lm_head turns into logits (`"full"`, see the module doc).

    `hidden_states[i]` is the input of decoder layer i; the last one is the final post-norm state.

    The forward covers the batch's longest sequence only (the sequences are right-padded to `seq_len`,
    and attention is causal, so the padding changes no earlier position); the outputs are padded back with
    zeros, a distribution of zero mass where no token is (no loss reads them).
    """
    if target_dist not in TARGET_DISTS:
        raise ValueError(f"target_dist must be one of {TARGET_DISTS}, not {target_dist!r}")
    device = next(model.parameters()).device
    width = max(1, int(seqs.lengths.max())) if len(seqs) else seqs.seq_len
    ids = seqs.input_ids.to(device)
    attention = (torch.arange(width) < seqs.lengths[:, None]).long().to(device)
    with _autocast(model):
        out = model(input_ids=ids[:, :width], attention_mask=attention, output_hidden_states=True, use_cache=False)

    def full(x: torch.Tensor) -> torch.Tensor:  # [B, width, ...] -> [B, seq_len, ...], zeros after width
        return torch.cat([x, x.new_zeros(x.shape[0], seqs.seq_len - width, *x.shape[2:])], dim=1)

    features = full(torch.cat([out.hidden_states[i] for i in feature_layers], dim=-1).to(torch.bfloat16))
    mask = seqs.loss_mask.to(device)
    if target_dist == "full":
        return FeatureBatch(ids, mask, features, last_hidden=full(out.hidden_states[-1]))
    values, topk_ids = out.logits.topk(top_k, dim=-1)
    return FeatureBatch(ids, mask, features, full(topk_ids), full(torch.softmax(values.float(), dim=-1)))


@torch.no_grad()
def target_logprobs(lm_head: torch.nn.Module, last_hidden: torch.Tensor) -> torch.Tensor:
    """The target's full next-token log-distribution at temperature 1 [..., V] (float32) from its final
    hidden state: its own lm_head in its own precision (so these are its logits), outside any autocast."""
    weight = lm_head.weight
    with torch.autocast(weight.device.type, enabled=False):
        logits = lm_head(last_hidden.to(device=weight.device, dtype=weight.dtype))
    return torch.log_softmax(logits.float(), dim=-1)


class FeatureStore:
    """Precomputed target features in `directory`: `shard_00000.pt`, ... of `shard_size` sequences each.

    Shards are written atomically and skipped when present, so an interrupted collection resumes.
    With several processes, process r writes the shards i with i % world == r. Reading memory-maps
    the shards, so the store may be larger than RAM.
    """

    def __init__(self, directory: str | Path, sequences: Sequences, shard_size: int = 64):
        self.directory = Path(directory)
        self.sequences = sequences
        self.shard_size = shard_size
        self._open: dict[int, dict[str, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def num_shards(self) -> int:
        return -(-len(self.sequences) // self.shard_size)

    def shard_path(self, i: int) -> Path:
        return self.directory / f"shard_{i:05d}.pt"

    def missing(self) -> list[int]:
        return [i for i in range(self.num_shards) if not self.shard_path(i).exists()]

    def build(self, model, feature_layers: list[int], top_k: int, batch_size: int, *, rank: int = 0, world: int = 1,
              log: Callable[[str], None] = print, target_dist: str = "topk") -> None:
        """Compute and write the missing shards assigned to this process."""
        import time

        todo = [i for i in self.missing() if i % world == rank]
        vocab = model.get_output_embeddings().weight.shape[0]
        id_dtype = torch.int16 if vocab <= torch.iinfo(torch.int16).max else torch.int32
        t0, done_tokens = time.time(), 0
        # CPU linears on oneDNN-prepacked weights where oneDNN packs the target's precision (`compute.kernels`): in
        # float32 at 64+ rows 1.4x MKL's products, 2.7x for SmolLM2's 49,152-word output layer (2-core AVX2 EPYC)
        with packed_where_chosen(model):
            for n, i in enumerate(todo):
                rows = torch.arange(i * self.shard_size, min((i + 1) * self.shard_size, len(self.sequences)))
                # batched by length, so that each forward's width (its longest sequence) wastes little on padding
                order = rows[self.sequences.lengths[rows].argsort(stable=True)]
                parts = [collect_features(model, self.sequences.select(order[b : b + batch_size]), feature_layers,
                                          top_k, target_dist)
                         for b in range(0, len(order), batch_size)]
                back = (order - rows[0]).argsort().to(parts[0].features.device)  # the shard's own order again
                # "full": the final hidden state kept in the target's precision (its lm_head gives its own logits)
                shard = {name: torch.cat([getattr(p, name) for p in parts])[back].cpu() for name in STORED[target_dist]}
                if target_dist != "full":
                    shard["topk_ids"], shard["topk_probs"] = shard["topk_ids"].to(id_dtype), shard["topk_probs"].half()
                save_atomic(shard, self.shard_path(i))
                done_tokens += int(self.sequences.lengths[rows].sum())
                log(f"features: shard {n + 1}/{len(todo)}  {done_tokens / (time.time() - t0):.0f} target tokens/s")

    def nbytes(self) -> int:
        """The stored shards' size on disk (about what `preload` puts in memory)."""
        return sum(self.shard_path(i).stat().st_size for i in range(self.num_shards))

    def preload(self, device: torch.device | str) -> None:
        """Read every shard into memory on `device` once. On a GPU, batches are then gathered there: copied window
        by window from memory-mapped files on the host, a batch of 32 packed windows cost a GPU step more than the
        step itself (an H200 trained no faster per position at 32 windows a step than an H100 at 16)."""
        for i in range(self.num_shards):
            shard = torch.load(self.shard_path(i), weights_only=True)
            self._open[i] = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in shard.items()}

    def _shard(self, i: int) -> dict[str, torch.Tensor]:
        if i not in self._open:
            self._open[i] = torch.load(self.shard_path(i), mmap=True, weights_only=True)
        return self._open[i]

    def packed(self, windows: list[list[int]], width: int) -> FeatureBatch:
        """The stored features of the sequences of each window laid end to end (each cut to its length), one
        window a row of `width` positions, right-padded; `doc_ids` tells the sequences apart."""
        if any(sum(int(self.sequences.lengths[i]) for i in w) > width for w in windows):
            raise ValueError(f"a packed window holds more than {width} tokens")
        full = "last_hidden" in self._shard(0)
        names = STORED["full" if full else "topk"]
        first = self._shard(0)
        out = {name: first[name].new_zeros((len(windows), width, *first[name].shape[2:])) for name in names}
        ids = torch.zeros(len(windows), width, dtype=torch.long)
        mask = torch.zeros(len(windows), width, dtype=torch.bool)
        docs = torch.zeros(len(windows), width, dtype=torch.long)
        for row, window in enumerate(windows):
            at = 0
            for doc, index in enumerate(window, start=1):
                n = int(self.sequences.lengths[index])
                shard = self._shard(index // self.shard_size)
                for name in names:
                    out[name][row, at : at + n] = shard[name][index % self.shard_size, :n]
                ids[row, at : at + n] = self.sequences.input_ids[index, :n]
                mask[row, at : at + n] = self.sequences.loss_mask[index, :n]
                docs[row, at : at + n] = doc
                at += n
        if full:
            return FeatureBatch(ids, mask, out["features"], last_hidden=out["last_hidden"], doc_ids=docs)
        return FeatureBatch(ids, mask, out["features"], out["topk_ids"].long(), out["topk_probs"].float(),
                            doc_ids=docs)

    def batch(self, indices: torch.Tensor) -> FeatureBatch:
        """The stored features of sequences `indices`, in that order."""
        full = "last_hidden" in self._shard(0)
        names = STORED["full" if full else "topk"]
        parts = {name: [] for name in names}
        for index in indices.tolist():
            shard = self._shard(index // self.shard_size)
            for name in parts:
                parts[name].append(shard[name][index % self.shard_size])
        seqs = self.sequences.select(indices)
        stacked = {name: torch.stack(values) for name, values in parts.items()}
        if "last_hidden" in stacked:
            return FeatureBatch(seqs.input_ids, seqs.loss_mask, stacked["features"], last_hidden=stacked["last_hidden"])
        return FeatureBatch(seqs.input_ids, seqs.loss_mask, stacked["features"], stacked["topk_ids"].long(),
                            stacked["topk_probs"].float())
