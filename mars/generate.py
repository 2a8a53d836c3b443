"""The speculative decoding loop: draft a tree, verify it in one target forward, keep a path.

    prefill prompt -> first token x (plain decoding)            head.extend(prompt features, tokens)
    repeat:  tree  = grow_tree(head, root=x)                      # EAGLE-2 dynamic tree
             logits, feats = target.verify(tree)                  # one forward, tree attention mask
             verdict = verify(process(logits), tree, rule)        # strict / MARS, greedy / sampling
             emit accepted tokens + verdict.next_token; keep the path in the target's KV cache
             head.extend(feats[path], accepted tokens + next)     # the draft catches up

Counting: `num_cycles` counts draft-verify cycles (the prefill that emits the first token is not a
cycle), `accept_lengths[i]` the draft tokens cycle i accepted. Each cycle emits accept + 1 tokens,
so `tau` = mean(accept_lengths) + 1, and len(tokens) = 1 + sum(accept + 1) unless EOS or
`max_new_tokens` cut the last cycle short.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from eagle.checkpoint import check_compatible
from eagle.heads import DraftHead
from eagle.tree import DraftTree, grow_tree
from mars.sampling import SamplingConfig, next_token, process_logits
from mars.stats import VerifyStats
from mars.target import TargetModel
from mars.verify import verify


@dataclass
class GenerationOutput:
    tokens: list[int]  # new tokens only
    accept_lengths: list[int]  # draft tokens accepted per cycle (bonus not counted)
    num_cycles: int
    relaxed_tokens: int = 0  # tokens accepted only because of the MARS relaxation
    stats: VerifyStats = field(default_factory=VerifyStats)
    seconds: float = 0.0  # wall time of the whole call
    stopped_by: str = "length"  # "eos" or "length"

    @property
    def tau(self) -> float:
        """Mean tokens per cycle: accepted draft tokens + the target's own token."""
        return sum(self.accept_lengths) / len(self.accept_lengths) + 1 if self.accept_lengths else 1.0


def _eos_set(eos_token_id) -> set[int]:
    if eos_token_id is None:
        return set()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(t) for t in eos_token_id}


class SpeculativeGenerator:
    """EAGLE-2/3 tree speculative decoding of `target_model` with `head`, verified by strict or MARS rules.

    total_tokens: drafted nodes verified per cycle; depth: draft steps per cycle; top_k: branching
    of the draft tree (not to be confused with `generate(top_k=...)`, the sampling filter).
    exact_attention: compute verification attention per query row over exactly its visible keys
    (`mars.target.exact_attention_forward`), so that in bf16 the tree forward reproduces plain
    decoding bit for bit instead of up to rounding; costs a gather of the cache per layer.
    """

    def __init__(self, target_model, head: DraftHead, total_tokens: int = 60, depth: int = 6, top_k: int = 10,
                 exact_attention: bool = False):
        for name, value in (("total_tokens", total_tokens), ("depth", depth), ("top_k", top_k)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        check_compatible(head.config, target_model)
        self.target = TargetModel(target_model, head.config.feature_layers, exact_attention)
        self.head = head
        self.total_tokens, self.depth, self.top_k = total_tokens, depth, top_k

    def _check_prompt(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dtype != torch.long:
            raise TypeError("input_ids must be a LongTensor of shape [1, T] (token ids)")
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"input_ids must have shape [1, T] (batch size 1), got {tuple(input_ids.shape)}")
        if input_ids.shape[1] == 0:
            raise ValueError("the prompt is empty: give at least one token (e.g. the BOS token)")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        limit = self.target.max_length
        if input_ids.shape[1] + max_new_tokens > limit:
            raise ValueError(
                f"prompt ({input_ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) exceeds the target's "
                f"context of {limit} tokens: shorten the prompt or lower max_new_tokens"
            )
        return input_ids[0]

    def _emit(self, out: GenerationOutput, new: list[int], eos: set[int], max_new_tokens: int) -> int:
        """Append what may be emitted of `new`; returns how many tokens were taken."""
        room = max_new_tokens - len(out.tokens)
        taken = new[:room]
        for i, token in enumerate(taken):
            if token in eos:
                taken = taken[: i + 1]
                out.stopped_by = "eos"
                break
        out.tokens.extend(taken)
        return len(taken)

    def _done(self, out: GenerationOutput, max_new_tokens: int) -> bool:
        return out.stopped_by == "eos" or len(out.tokens) >= max_new_tokens

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        eos_token_id: int | list[int] | None = None,
        top_p: float = 1.0,
        top_k: int = 0,
        rule: str = "strict",
        theta: float = 0.9,
        margin: str = "logit_ratio",
        mars_fallback: str = "strict",
        generator: torch.Generator | None = None,
    ) -> GenerationOutput:
        cfg = SamplingConfig(temperature, top_p, top_k, rule, theta, margin, mars_fallback)
        prompt = self._check_prompt(input_ids, max_new_tokens)
        start = time.perf_counter()
        eos = _eos_set(eos_token_id)
        out = GenerationOutput([], [], 0)
        if max_new_tokens == 0:
            return out
        device = self.target.device
        logits, features = self.target.prefill(prompt, capacity=len(prompt) + max_new_tokens + self.total_tokens + 1)
        root = next_token(process_logits(logits, cfg), cfg, generator)
        self._emit(out, [root], eos, max_new_tokens)
        self.head.reset()
        follow = torch.cat([prompt[1:].to(device), torch.tensor([root], device=device)])
        hidden, logprobs = self.head.extend(features, follow)
        while not self._done(out, max_new_tokens):
            remaining = max_new_tokens - len(out.tokens)
            # The last cycle drafts no deeper than the tokens still wanted (one comes from the target).
            depth = min(self.depth, remaining - 1)
            tree = grow_tree(self.head, root, hidden, logprobs, depth, self.top_k, self.total_tokens)
            prefix = self.target.length
            logits, features = self.target.verify(tree.tokens.to(device), tree.depths, tree.ancestors)
            verdict = verify(process_logits(logits, cfg), tree, cfg, generator)
            drafted = tree.tokens[verdict.path[1:]].tolist()
            emitted = self._emit(out, drafted + [verdict.next_token], eos, max_new_tokens)
            out.accept_lengths.append(min(verdict.accepted, emitted))
            out.stats.add(verdict, keep_steps=emitted)
            out.num_cycles += 1
            if self._done(out, max_new_tokens):
                break
            self.target.keep_path(prefix, verdict.path)
            root = verdict.next_token
            follow = torch.tensor(drafted + [root], device=device)
            hidden, logprobs = self.head.extend(features[verdict.path], follow)
        out.relaxed_tokens = out.stats.relaxed_tokens
        out.seconds = time.perf_counter() - start
        return out

    @torch.inference_mode()
    def vanilla(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        eos_token_id: int | list[int] | None = None,
        top_p: float = 1.0,
        top_k: int = 0,
        generator: torch.Generator | None = None,
    ) -> GenerationOutput:
        """Plain token-by-token decoding with the same adapter, cache and logits processing."""
        cfg = SamplingConfig(temperature, top_p, top_k)
        prompt = self._check_prompt(input_ids, max_new_tokens)
        start = time.perf_counter()
        eos = _eos_set(eos_token_id)
        out = GenerationOutput([], [], 0)
        if max_new_tokens == 0:
            return out
        logits, _ = self.target.prefill(prompt, capacity=len(prompt) + max_new_tokens + 1)
        self._emit(out, [next_token(process_logits(logits, cfg), cfg, generator)], eos, max_new_tokens)
        while not self._done(out, max_new_tokens):
            single = DraftTree.root_only(out.tokens[-1])
            logits, _ = self.target.verify(single.tokens.to(self.target.device), single.depths, single.ancestors)
            self._emit(out, [next_token(process_logits(logits[0], cfg), cfg, generator)], eos, max_new_tokens)
            out.accept_lengths.append(0)
            out.num_cycles += 1
        out.seconds = time.perf_counter() - start
        return out
