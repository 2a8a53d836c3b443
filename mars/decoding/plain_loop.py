"""Plain decoding over B >= 1 prompts: the loop of `SpeculativeGenerator.vanilla` (and of `generate` while
`speculate` is False), one token per row per forward on the tree's adapter or plain decoding's, each row a
lone root; and a plain decoding handed to another decoder (`model.generate` in this process or in a worker,
`mars.decoding.reference`). The generator picks the loop and binds what it needs (`SpeculativeGenerator._decode`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch

from compute.kernels import PackedLinears, onednn
from eagle.tree import DraftTree
from mars.accounting.timing import PhaseClock
from mars.adapter import TargetModel
from mars.decoding.output import GenerationOutput
from mars.decoding.rows import Rows
from mars.verification.sampling import SamplingConfig, next_tokens, process_logits


@contextmanager
def prompt_forward(packed: PackedLinears | None) -> Iterator[None]:
    """Inside: the prompts' forward of plain decoding. At kernels with oneDNN off it multiplies with oneDNN, on
    `packed` weights where the generator has them: torch's own bf16 products cost nearly per row (a 40-token
    SmolLM2 prompt ~300 ms against ~55 ms packed, on the AVX-512 EPYC), the one-row steps after it are where
    they are fastest. Elsewhere (oneDNN on: `SpeculativeGenerator.computing` set it from the loop's kernels)
    unchanged."""
    if torch.backends.mkldnn.enabled:
        yield
        return
    with packed.active() if packed is not None else nullcontext(), onednn(True):
        yield


def plain_rows(target: TargetModel, prompts: list[torch.Tensor], cfg: SamplingConfig, max_new_tokens: int,
               eos: frozenset[int], generator: torch.Generator | None, outputs: list[GenerationOutput], *,
               profile: bool, prompt_packed: PackedLinears | None) -> None:
    """The loop of `vanilla` on `target` (the tree's adapter, or plain decoding's): one token per row per forward
    (each a lone root), the prompts' forward on `prompt_packed` (`prompt_forward`); fills `outputs`."""
    rows = Rows(outputs, eos, max_new_tokens)
    clock = PhaseClock(outputs[0].phase_seconds, target.all_devices, profile)
    device = target.devices.inputs
    with prompt_forward(prompt_packed):
        logits, _ = target.prefill_rows(prompts, max(map(len, prompts)) + max_new_tokens + 1)
    tokens = next_tokens(process_logits(logits, cfg), cfg, generator).to(device)
    rows.emit_first(tokens)
    clock.lap("prefill")
    while keep := rows.unfinished():
        if len(keep) < len(rows.live):
            keep_device = torch.tensor(keep, dtype=torch.long, device=device)
            target.select_rows(keep, keep_device)
            rows.keep(keep)
            tokens = tokens.index_select(0, keep_device)
        logits, _ = target.score_rows(DraftTree.roots_only(tokens))
        zero = torch.zeros_like(tokens)
        target.keep_rows([[0]] * len(keep), zero[:, None], zero + 1)
        tokens = next_tokens(process_logits(logits, cfg), cfg, generator)
        for row, token in enumerate(tokens.tolist()):
            rows.output(row).record_cycle(None, rows.emit(row, [token]), 0, sampled=not cfg.greedy)
    clock.lap("decode")


def external_rows(prompts: list[torch.Tensor], cfg: SamplingConfig, max_new_tokens: int, eos: frozenset[int],
                  generator: torch.Generator | None, outputs: list[GenerationOutput], *, decoder) -> None:
    """Plain decoding by `decoder` (`model.generate`, `mars.decoding.reference`), seeded from `generator`."""
    seed = generator.initial_seed() if generator is not None else 0
    done = decoder.decode([p.tolist() for p in prompts], cfg, max_new_tokens, sorted(eos), seed)
    for out, got in zip(outputs, done, strict=True):
        out.__dict__.update(got.__dict__)
