"""Helpers shared by the tests: tiny models of each architecture built from configs (no downloads),
an oracle draft head, hand-built trees, exact tree-outcome distributions, a chi-square test, and the
rounding tolerances that comparisons of two computations of one quantity derive from their arithmetic."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable

import torch
import transformers

from eagle import Eagle3Head
from eagle.tree import DraftTree
from mars import SpeculativeGenerator
from mars.accounting.stats import chi_square_pvalue  # noqa: F401  (re-exported: the tests test losslessness with it)
from mars.accounting.timing import PhaseClock
from mars.decoding.settings import TreeShape
from mars.diagnostics.scripted import ScriptedHead
from mars.diagnostics.syncs import SyncCounter

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
ARCHITECTURES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": 4096}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 16}),
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                  {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                   "decoder_sparse_step": 1, "mlp_only_layers": []}),
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM,
                {"num_local_experts": 4, "num_experts_per_tok": 2}),
}


def tiny_model(arch: str = "llama", seed: int = 0, sharpen: float = 4.0, **overrides):
    """A random fp32 causal LM. `sharpen` scales the lm_head so that greedy paths are not ties."""
    config_cls, model_cls, extra = ARCHITECTURES[arch]
    torch.manual_seed(seed)
    config = config_cls(**{**COMMON, **extra, **overrides})
    model = model_cls(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpen)
    return model


def hf_greedy(model, prompt: torch.Tensor, max_new_tokens: int, eos_token_id=None) -> list[int]:
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=eos_token_id,
                         pad_token_id=0, min_new_tokens=0 if eos_token_id is not None else max_new_tokens)
    return out[0, prompt.shape[1]:].tolist()


def random_prompt(rng: random.Random, vocab: int, length: int) -> torch.Tensor:
    return torch.tensor([[rng.randrange(vocab) for _ in range(length)]])


def make_tree(parents: list[int], tokens: list[int]) -> DraftTree:
    """A tree from parent indices (parents[0] = -1) and tokens (tokens[0] = the root's token)."""
    return DraftTree.checked(tokens, parents)


def tiny_llama(seed: int = 0, vocab_size: int = 16, sharpen: float = 1.0) -> transformers.LlamaForCausalLM:
    """A random fp32 two-layer Llama; `sharpen` scales the lm_head (sharper distributions)."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpen)
    return model


def split_tree(settings: dict) -> tuple[TreeShape, dict]:
    """Keyword settings as (the TreeShape of its tree fields, the generator's other arguments)."""
    fields = {f.name for f in dataclasses.fields(TreeShape)}
    return (TreeShape(**{k: v for k, v in settings.items() if k in fields}),
            {k: v for k, v in settings.items() if k not in fields})


def tiny_generator(model_seed: int, head_seed: int, sharpen: float, vocab_size: int = 16, **settings):
    """A SpeculativeGenerator over `tiny_llama(model_seed, ...)` with a random EAGLE-3 head (seeded by head_seed);
    `settings`: the tree's fields (`TreeShape`) and the generator's other arguments."""
    model = tiny_llama(seed=model_seed, vocab_size=vocab_size, sharpen=sharpen)
    torch.manual_seed(head_seed)
    tree, others = split_tree(settings)
    return SpeculativeGenerator(model, Eagle3Head.for_target(model.config), tree, **others)


def tree_outcome_distribution(processed: torch.Tensor, tree: DraftTree) -> dict[tuple[int, ...], float]:
    """Exact target probability of every token sequence one verification can emit.

    Emitted = the accepted drafted tokens + next_token. Following the target from the root, each
    token x sampled at node n (probability softmax(processed[n])[x]) either is a drafted child of n,
    and the walk continues there, or ends the sequence. Every such sequence has its next-token
    distributions given by tree rows, so the target's probability of it is defined and exact.
    """
    probs = processed.softmax(-1).tolist()
    tokens = tree.tokens.tolist()
    out: dict[tuple[int, ...], float] = {}

    def walk(node: int, prefix: tuple[int, ...], mass: float) -> None:
        child_of = {tokens[c]: c for c in tree.children[node]}
        for x, p in enumerate(probs[node]):
            if p <= 0:
                continue
            if x in child_of:
                walk(child_of[x], prefix + (x,), mass * p)
            else:
                out[prefix + (x,)] = mass * p

    walk(0, (), 1.0)
    return out


def emitted(verdict, tree: DraftTree) -> tuple[int, ...]:
    return tuple(tree.tokens[verdict.path[1:]].tolist()) + (verdict.next_token,)


def unit_roundoff(dtype: torch.dtype = torch.float32) -> float:
    """u = eps / 2: the largest relative error of one rounded operation in `dtype` (2^-24 in float32)."""
    return torch.finfo(dtype).eps / 2


def summation_tolerance(terms: int, magnitude, dtype: torch.dtype = torch.float32, term_error: float = 0.0):
    """How far two computations of one floating-point sum may lie apart by rounding alone.

    A sum of `terms` numbers x_i added in any order (one after another, pairwise, in vector lanes,
    blocked: whatever a kernel picks on a given CPU) with unit roundoff u (`unit_roundoff(dtype)`) is
    within (terms - 1) u sum|x_i| of the exact sum (the standard forward error bound, to first order;
    Higham, Accuracy and Stability of Numerical Algorithms, section 4.2). When each x_i already carries
    a relative error of up to `term_error` u (from the softmax, log or product that made it, or from
    kernels upstream that order their own reductions differently), that grows to
    (terms - 1 + term_error) u sum|x_i|. Two computations of the same sum each lie within this of the
    exact value, so they differ by at most twice it: what this returns, an absolute tolerance (a
    tensor of them for a tensor of magnitudes).

    `magnitude` is sum|x_i| over everything added, or an upper bound of it. For a quantity computed by
    cancellation (a TV distance, a KL divergence, a difference of log-probabilities) that is the size
    of what cancels, not of the result: a small KL computed from O(1) log-probabilities has an error
    of order u, however small it is. Sums of per-position sums: `terms` counts the terms of each
    low-precision sum when the positions are added up in float64 (their addition then adds nothing
    that matters), and `magnitude` adds up over all positions.
    """
    return 2.0 * (terms - 1 + term_error) * unit_roundoff(dtype) * magnitude


def probability_error(vocab: int) -> int:
    """The relative error, in units of u, of a float32 softmax probability over `vocab` logits: vocab - 1
    from its normalising sum, and a few u for the exp, the division and the logits' own last bits (the
    same logits from two forwards whose kernels order their reductions differently)."""
    return vocab + 4


def tv_tolerance(vocab: int, positions: float = 1.0, roundings: int = 0) -> float:
    """Rounding tolerance of a sum of TV distances (`mars.accounting.cost`) over `positions` positions.

    TV = 1/2 sum_v |pi_v - ref_v|: `vocab` float32 terms of magnitude 1/2 sum_v (pi_v + ref_v) = 1 per
    position. pi and its reference are products and ratios of at most three softmax tables (the target's
    p, the draft's q, strict's residual), so each entry is off by up to 3 `probability_error(vocab)` u
    relative, plus `roundings` u more where the caller's pi went through further operations (an average
    over draws: one rounding per draw).
    """
    return summation_tolerance(vocab, positions, term_error=3 * probability_error(vocab) + roundings)


def kl_tolerance(vocab: int, kl: float, positions: float = 1.0, roundings: int = 0) -> float:
    """Rounding tolerance of a sum `kl` of finite KL divergences (`mars.accounting.cost`) over `positions` positions.

    KL = sum_v pi_v (log pi_v - log ref_v): `vocab` float32 terms, pi and ref off as in `tv_tolerance`.
    A log's absolute error is its argument's relative error plus u times its size, so each position's
    terms have magnitude sum_v pi_v (2 + |log pi_v| + |log ref_v|) = 2 + 2 H(pi) + KL <= 2 + 2 log vocab + KL:
    the log-probabilities that cancel, whatever the (often much smaller) KL.
    """
    magnitude = positions * (2 + 2 * math.log(vocab)) + kl
    return summation_tolerance(vocab, magnitude, term_error=3 * probability_error(vocab) + roundings)


def longest_reduction(model: torch.nn.Module, *rows: int) -> int:
    """The most terms one dot product of `model` adds: the widest input of its matrices (linear layers,
    embeddings' transposes excluded: they are looked up, not multiplied), or one of `rows` (attention rows:
    the keys a query reduces over)."""
    widths = [m.weight.shape[-1] for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return max([*widths, *rows])


def forward_tolerance(layers: int, terms: int, magnitude, dtype: torch.dtype = torch.float32):
    """Tolerance between two computations of a network's values through `layers` layers whose longest
    reduction (a matmul's inner dimension, an attention row, the MLP's width) adds `terms` terms, by
    kernels that order their reductions differently (shapes, padding, batch, compiled or not, CPU).

    `layers` times `summation_tolerance(terms, magnitude, dtype)`, `magnitude` being the size of the
    values compared (their largest |value|; RMS normalisation keeps every layer's inputs at that
    scale): each layer rounds like a sum of `terms` terms of that size and hands earlier layers' errors
    on unamplified (residual connections add them, normalisation rescales them). A first-order
    estimate, not a bound: a network's rounding has no short bound; this one is the sum bound's, layer
    by layer.
    """
    return layers * summation_tolerance(terms, magnitude, dtype)


def marginal(probs: dict[tuple[int, ...], float], positions: slice) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {}
    for key, p in probs.items():
        sub = key[positions]
        out[sub] = out.get(sub, 0.0) + p
    return out


# Every draft right: `sequence` is prompt + the target's greedy continuation (mars.diagnostics.scripted).
OracleHead = ScriptedHead


STANDIN_TEXT = '''def add(a, b):
    """Return a + b."""
    return a + b


class Stack:
    """A last-in first-out stack."""

    def __init__(self):
        self.items = []

    def push(self, item):
        """Put item on top."""
        self.items.append(item)
'''


def byte_bpe_tokenizer(text: str = STANDIN_TEXT, vocab_size: int = 320) -> transformers.PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer trained on `text`, with the embedded model's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text] * 4, trainer=trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                                bos_token="<|endoftext|>", pad_token="<|pad|>")


def save_standin_pair(root, context: int = 2048):
    """A tiny fp32 Llama + tokenizer in root/target and a random EAGLE-3 head in root/draft: what
    `eval.run` loads, in the embedded pair's layout, built in a second."""
    from eagle.checkpoint import save_draft

    tok = byte_bpe_tokenizer()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                                      eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)  # sharper logits: no near-ties in greedy decoding
    model.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    save_draft(Eagle3Head.for_target(model.config, draft_vocab_size=128), root / "draft")
    return root


def count_by_cycle(decode: Callable[[], object], monkeypatch) -> tuple[list[int], dict[str, int], object]:
    """The syncs of each cycle of one decoding call `decode()`, all kinds seen, and what it returned. A
    cycle runs from the end of the prefill or of the previous cycle's cache update to the end of its own
    (the last cycle: to the end of the call); `PhaseClock.lap` marks these points, profiling or not."""
    marks: list[int] = []
    lap = PhaseClock.lap

    def marking(clock, phase):
        if phase in ("prefill", "cache_update"):
            marks.append(syncs.total)
        lap(clock, phase)

    with monkeypatch.context() as patch, SyncCounter() as syncs:
        patch.setattr(PhaseClock, "lap", marking)
        out = decode()
    return [b - a for a, b in zip(marks, [*marks[1:], syncs.total], strict=True)], dict(syncs.by_kind), out
