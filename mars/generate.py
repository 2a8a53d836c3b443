"""The speculative decoding loop: draft a tree, score it in one target forward, keep a path.

    prefill prompt -> first token x (plain decoding)            head.extend(prompt features, tokens)
    repeat:  tree    = grow_tree(head, root=x)                    # EAGLE-2 dynamic tree (eagle.tree)
             logits  = target.score_tree(tree)                    # one forward, tree attention mask
             verdict = accept(process(logits), tree, sampling)    # strict / MARS, greedy / sampling
             emit the accepted tokens + verdict.next_token;  target.keep_path(verdict.path)
             head.extend(features[path], accepted tokens + next)  # the draft catches up

Counting: `num_cycles` counts draft-verify cycles (the prefill that emits the first token is not a
cycle); `accept_lengths[i]` the drafted tokens cycle i emitted. A cycle emits its accepted tokens
plus the target's own, unless EOS or `max_new_tokens` cuts it short, so `tau` = tokens emitted by
cycles / cycles = (len(tokens) - 1) / num_cycles.

Timing: `seconds` times the decoding alone. The relaxation's cost accounting (`mars.cost`, measurement
only) is deferred out of the loop and settled after it (`mars.output.CostLedger`, its time in
`phase_seconds["accounting"]`), except with static shapes, where it is computed in the cycle.

Devices: token ids enter at the target's input embeddings, logits and the RNG live on its lm_head's
device (`TargetModel.devices`), the draft head sits where it was loaded and receives the target's
features there. On one device all of these are the same.
"""

from __future__ import annotations

import functools
import time
import warnings
from contextlib import nullcontext

import torch

from eagle.config import eos_token_ids
from eagle.heads import DraftHead
from eagle.kernels import PackedLinears, choose_packing
from eagle.tree import RANK_ACCEPTANCE, Topology, best_topology, grow_tree, sample_tree, sampled_shape
from mars import batch
from mars.adapter import TargetModel
from mars.adaptive import AdaptiveTree, measure_costs
from mars.output import CostLedger, GenerationOutput, PhaseClock, frozen_heap
from mars.sampling import SamplingConfig, next_token, process_logits, resolve_sampling
from mars.settings import TreeShape
from mars.verify import accept

DRAFTING = ("auto", "topk", "sample")


def drafting_mode(drafting: str, sampled: bool, adaptive: bool) -> str:
    """What `drafting` ("auto", "topk", "sample") drafts: "sample" only when sampling, and for "auto"
    only without an adaptive tree (which sizes top-k trees from their draft scores)."""
    if not sampled:
        return "topk"
    return drafting if drafting != "auto" else "topk" if adaptive else "sample"


def _while_decoding(method):
    """Run a decoding method with the generator's packed kernels and feature hooks on the models,
    taken off again after (between calls the models are as the caller gave them), and the heap that
    exists at the call frozen out of garbage collections (`mars.output.frozen_heap`)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self.kernels.active() if self.kernels is not None else nullcontext(), self.target.tapped(), \
                frozen_heap():
            return method(self, *args, **kwargs)
    return run


class SpeculativeGenerator:
    """EAGLE-2/3 tree speculative decoding of `target_model` with `head`, verified by any rule of `mars.rules`.

    Tree: `total_tokens` drafted nodes verified per cycle, `depth` draft steps per cycle, `branching`
    children per expanded node (EAGLE's "top_k"; `top_k=` is accepted as a deprecated alias).
    exact_attention: compute verification attention per query row over exactly its visible keys
    (`mars.adapter.exact_attention_forward`), so that in bf16 the tree forward reproduces plain
    decoding bit for bit instead of up to rounding. It switches the model's attention
    implementation to "mars_exact" until `close()` (or the end of a `with` block) restores it.
    "auto" (default): on for a bf16/fp16 full-attention target, off in float32, where verification
    already reproduces plain decoding (`eagle.precision.needs_exact_attention`); `gen.target.exact_attention`
    tells what was chosen.
    prepack: multiply float32 CPU linears (target and head) by oneDNN-prepacked weights inside
    `generate`/`vanilla` (`eagle.kernels`): ~30% faster tree forwards on CPUs where MKL's few-row
    products are slow, and row-invariant. "auto" (default): on for float32 CPU models when the packed
    copy fits in memory; `gen.prepack` / `gen.prepack_reason` tell what was chosen.
    profile: time the loop's phases into `GenerationOutput.phase_seconds` (synchronising the devices
    at every phase boundary; off by default, for the loop's sake on a GPU).
    adaptive: size each cycle's tree (up to these maxima, down to a plain decoding step) from costs
    measured on this machine at the first `generate` and the acceptance observed so far
    (`mars.adaptive`); the estimates carry over from call to call.
    drafting: how a cycle's children are drafted when sampling (temperature > 0). "topk": the head's
    most likely tokens, EAGLE-2's dynamic tree (`eagle.tree.grow_tree`); strict verification then
    accepts a child of a node with the target's probability of it, so tau stays near
    1 / (1 - the target's mass on k tokens). "sample": children drawn from the head's processed
    distribution without replacement into a fixed shape (`eagle.tree.sample_tree`, verified by
    recursive rejection sampling, `mars.rejection`): a child is accepted with probability
    sum_x min(p, q) and more. "auto" (default): "sample" when sampling. Greedy decoding always
    drafts top-k. `rank_acceptance`: the per-rank acceptance the sampled tree's shape is chosen for
    (`eagle.tree.best_topology`).
    static: fixed shapes for the target (`mars.adapter.static`): a KV cache of `max_cache_len` entries
    allocated once and reused by every call (default: 2048, or the model's context plus one tree if
    shorter; a call that would not fit raises a ValueError naming it), every tree forward padded to
    `total_tokens + 1` queries, plain decoding steps of one query, masks as wide as the cache. What
    CUDA graphs need; on its own it changes results only by rounding (attention reduces over the whole
    cache, masked). Full-attention targets only; exact attention off ("auto" resolves to off).
    compile: a `torch.compile` mode ("default", "reduce-overhead" for CUDA graphs, "max-autotune",
    ...) for the static tree forward and decoding step (needs static=True): one graph per shape,
    compiled at its first use (seconds to minutes) and reused by every later prompt, and by later
    generators of the same architecture and tree size in the process. The prefill stays eager;
    `prepack="auto"` is off with it.
    """

    def __init__(self, target_model, head: DraftHead, total_tokens: int = 60, depth: int = 6,
                 branching: int | None = None, exact_attention: bool | str = "auto", adaptive: bool = False, *,
                 prepack: bool | str = "auto", profile: bool = False, static: bool = False, compile: str | None = None,
                 max_cache_len: int | None = None, drafting: str = "auto",
                 rank_acceptance: tuple[float, ...] = RANK_ACCEPTANCE, top_k: int | None = None):
        if top_k is not None:
            if branching is not None:
                raise TypeError("give the tree's branching factor once: branching= (top_k= is its deprecated alias)")
            warnings.warn("SpeculativeGenerator(top_k=...) is deprecated: the tree's branching factor is now "
                          "`branching` (top_k is the sampling filter of generate())", FutureWarning, stacklevel=2)
            branching = top_k
        branching = 10 if branching is None else branching
        for name, value in (("total_tokens", total_tokens), ("depth", depth), ("branching", branching)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if drafting not in DRAFTING:
            raise ValueError(f"drafting must be one of {', '.join(DRAFTING)}, got {drafting!r}")
        if adaptive and drafting == "sample":
            raise ValueError("adaptive=True sizes EAGLE-2 top-k trees from their draft scores; a sampled tree's shape "
                             "must not depend on its draws: use drafting='topk' with adaptive=True, or adaptive=False")
        if compile is not None and not static:
            raise ValueError(f"compile={compile!r} compiles the static-shape forwards: pass static=True as well")
        if max_cache_len is not None and not static:
            raise ValueError("max_cache_len sizes the static cache: pass static=True as well")
        head.config.check_target(target_model)
        self.target = TargetModel(target_model, head.config.feature_layers, exact_attention, feature_device=head.device,
                                  static=static, max_cache_len=max_cache_len, tree_rows=total_tokens + 1,
                                  compile=compile)
        self.head = head
        self.total_tokens, self.depth, self.branching = total_tokens, depth, branching
        self.adaptive, self.profile = adaptive, profile
        self.drafting, self.rank_acceptance = drafting, tuple(rank_acceptance)
        self.prepack, self.prepack_reason = choose_packing([target_model, head], prepack, compiled=compile is not None)
        self.kernels = PackedLinears(target_model, head) if self.prepack else None
        self.policy: AdaptiveTree | None = None  # measured on first use

    def _policy(self) -> AdaptiveTree | None:
        if not self.adaptive:
            return None
        if self.policy is None or (self.policy.max_depth, self.policy.branching, self.policy.max_tokens) != (
                self.depth, self.branching, self.total_tokens):  # first use, or the tree's maxima were changed
            costs = measure_costs(self.target, self.head, self.branching, self.total_tokens)
            self.policy = AdaptiveTree(costs, self.depth, self.branching, self.total_tokens)
        return self.policy

    def use_tree(self, tree: TreeShape) -> None:
        """Draft `tree` from the next call on (a run gives each method the tree measured for it). Static
        shapes pad every tree to the rows they were built for: a larger tree is refused."""
        if self.target.static and tree.total_tokens + 1 > self.target.tree_rows:
            raise ValueError(f"tree {tree.label} has more nodes than the static shapes were built for "
                             f"({self.target.tree_rows - 1}): build the generator with the largest tree")
        self.total_tokens, self.depth, self.branching = tree.total_tokens, tree.depth, tree.branching
        self.adaptive, self.drafting = tree.adaptive, tree.drafting

    def samples_drafts(self, cfg: SamplingConfig) -> bool:
        """Whether a call with these sampling settings drafts sampled children (see `drafting`)."""
        return drafting_mode(self.drafting, not cfg.greedy, self.adaptive) == "sample"

    def topology(self, depth: int) -> Topology:
        """The sampled tree's shape for a cycle drafting `depth` levels (follows changes to the tree's sizes)."""
        return best_topology(self.total_tokens, self.depth, self.branching, self.rank_acceptance).truncated(depth)

    def close(self) -> None:
        """Hand the target model back as it was given (its own attention implementation)."""
        self.target.close()

    def __enter__(self) -> SpeculativeGenerator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_prompt(self, input_ids: torch.Tensor, max_new_tokens: int, tree: int) -> torch.Tensor:
        """The prompt [T], after checking the call's arguments and that the sequence fits (with room
        for one `tree` of that many nodes after it)."""
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
        needed = input_ids.shape[1] + max_new_tokens + tree
        if self.target.static and needed > self.target.max_cache_len:
            raise ValueError(
                f"prompt ({input_ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) + one tree ({tree} nodes) "
                f"need {needed} cache entries, more than max_cache_len={self.target.max_cache_len}: pass "
                f"SpeculativeGenerator(..., max_cache_len={needed}) or more, or a shorter prompt / fewer new tokens"
            )
        return input_ids[0]

    def _check_generator(self, generator: torch.Generator | None) -> None:
        device = self.target.devices.logits
        if generator is not None and torch.device(generator.device).type != device.type:
            raise ValueError(f"the random generator is on {generator.device} but sampling runs where the target's "
                             f"logits are, {device}: pass torch.Generator(device='{device}')")

    def _emit(self, out: GenerationOutput, new: list[int], eos: frozenset[int], max_new_tokens: int) -> int:
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

    @_while_decoding
    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor,
        sampling: SamplingConfig | None = None,
        *,
        max_new_tokens: int = 128,
        eos_token_id: int | list[int] | None = None,
        generator: torch.Generator | None = None,
        **overrides,
    ) -> GenerationOutput:
        """Speculative decoding of `input_ids` [1, T]; returns the new tokens and how they were accepted.

        sampling: a `SamplingConfig` (default greedy, strict); keyword `overrides` (temperature=,
        top_p=, top_k=, rule= a `mars.rules` Rule or name, and that rule's parameters, e.g.
        rule="mars", theta=0.8) replace its fields. eos_token_id:
        the ids that stop generation (None: none stop; `eagle.config.eos_token_ids` gives a model's).
        generator: the RNG of sampling, on the device of the target's logits.
        """
        cfg = resolve_sampling(sampling, **overrides)
        prompt = self._check_prompt(input_ids, max_new_tokens, self.total_tokens + 1)
        self._check_generator(generator)
        start = time.perf_counter()
        eos = eos_token_ids(eos_token_id=eos_token_id)
        out = GenerationOutput()
        if max_new_tokens == 0:
            return out
        target, head = self.target, self.head
        target.tree_rows = self.total_tokens + 1  # static shapes: every tree padded to the largest (follows changes)
        sampled = self.samples_drafts(cfg)
        policy = None if sampled else self._policy()
        # Draft draws use the caller's generator where it lives on the head's device (one stream, reproducible).
        draft_rng = generator if generator is not None and torch.device(generator.device).type == head.device.type \
            else None
        process = functools.partial(process_logits, cfg=cfg)
        # Laid out on the device before the loop (each depth the last cycles may need): no upload per tree.
        shapes = {d: sampled_shape(self.topology(d), head.device) for d in range(self.depth + 1)} if sampled else {}
        clock = PhaseClock(out.phase_seconds, target.all_devices | {head.device}, self.profile)
        ledger = CostLedger([out.stats], clock, target.static)
        logits, features = target.prefill(prompt, capacity=len(prompt) + max_new_tokens + self.total_tokens + 1)
        root = next_token(process_logits(logits, cfg), cfg, generator)
        self._emit(out, [root], eos, max_new_tokens)
        head.reset()
        # Steady state: one read of each verdict (`accept`) and one upload of its path and next token;
        # trees, masks, features and cache commits stay on the devices.
        root_on_device = torch.tensor([root], device=head.device)
        # The draft head catches up on committed tokens (their target features and the tokens that
        # follow them) only before a cycle that drafts: a run of plain decoding steps (adaptive
        # tree) then costs one head forward at its end instead of one per step.
        behind = [(features, torch.cat([prompt[1:].to(head.device), root_on_device]))]
        hidden = logprobs = None
        clock.lap("prefill")
        while not self._done(out, max_new_tokens):
            remaining = max_new_tokens - len(out.tokens)
            # The last cycle drafts no deeper than the tokens still wanted (one comes from the target).
            depth, total, grow = min(self.depth, remaining - 1), self.total_tokens, None
            if policy is not None:  # adaptive: growth decided on the device, read once per tree (eagle.tree.expand)
                depth, total = policy.plan(remaining - 1)
                grow = lambda level, scores, d=depth: policy.grow_level(level, scores, d)  # noqa: E731
            if depth > 0 and behind:
                hidden, logprobs = head.extend(torch.cat([f for f, _ in behind]), torch.cat([t for _, t in behind]))
                behind.clear()
                clock.lap("catch_up")
            if sampled:
                tree = sample_tree(head, root_on_device, hidden, logprobs, shapes[depth], process, draft_rng)
            else:
                tree = grow_tree(head, root_on_device, hidden, logprobs, depth, self.branching, total, grow)
            clock.lap("draft")
            logits, features = target.score_tree(tree)
            clock.lap("tree_forward")
            verdict = accept(process_logits(logits, cfg), tree, cfg, generator, defer_cost=ledger.defer)
            emitted = self._emit(out, verdict.tokens + [verdict.next_token], eos, max_new_tokens)
            out.accept_lengths.append(min(verdict.accepted, emitted))
            out.draft_depths.append(tree.levels)
            out.stats.add(verdict, keep_steps=emitted, sampled=not cfg.greedy)
            out.num_cycles += 1
            if policy is not None:
                policy.observe(tree.levels, verdict.accepted, tree.scores[1:].exp().sum())  # on the device, unread
            clock.lap("accept")
            ledger.record([verdict])
            if self._done(out, max_new_tokens):
                break
            uploaded = torch.tensor(verdict.path + [verdict.next_token], device=head.device)
            path, root_on_device = uploaded[:-1], uploaded[-1:]
            target.keep_path(verdict.path, path)
            clock.lap("cache_update")
            behind.append((features[path.to(features.device)], torch.cat([tree.tokens[path[1:]], root_on_device])))
        out.seconds = time.perf_counter() - start
        ledger.settle()  # after `seconds`: the method is timed without its cost accounting
        return out

    @_while_decoding
    @torch.inference_mode()
    def vanilla(
        self,
        input_ids: torch.Tensor,
        sampling: SamplingConfig | None = None,
        *,
        max_new_tokens: int = 128,
        eos_token_id: int | list[int] | None = None,
        generator: torch.Generator | None = None,
        **overrides,
    ) -> GenerationOutput:
        """Plain token-by-token decoding with the same adapter, cache and logits processing.

        Takes the arguments of `generate`; the verification settings (rule, theta, ...) do not apply.
        """
        cfg = resolve_sampling(sampling, **overrides)
        prompt = self._check_prompt(input_ids, max_new_tokens, 1)
        self._check_generator(generator)
        start = time.perf_counter()
        eos = eos_token_ids(eos_token_id=eos_token_id)
        out = GenerationOutput()
        if max_new_tokens == 0:
            return out
        clock = PhaseClock(out.phase_seconds, self.target.all_devices, self.profile)
        logits, _ = self.target.prefill(prompt, capacity=len(prompt) + max_new_tokens + 1)
        self._emit(out, [next_token(process_logits(logits, cfg), cfg, generator)], eos, max_new_tokens)
        clock.lap("prefill")
        while not self._done(out, max_new_tokens):
            logits = self.target.decode(out.tokens[-1])
            self._emit(out, [next_token(process_logits(logits, cfg), cfg, generator)], eos, max_new_tokens)
            out.accept_lengths.append(0)
            out.num_cycles += 1
        clock.lap("decode")
        out.seconds = time.perf_counter() - start
        return out

    # --- batched decoding (`mars.batch`) --------------------------------------------------------

    def _batched(self, loop, input_ids, sampling, max_new_tokens, eos_token_id, generator,
                 overrides) -> list[GenerationOutput]:
        cfg = resolve_sampling(sampling, **overrides)
        self._check_generator(generator)
        if self.adaptive:
            raise ValueError("batched decoding drafts fixed-size trees: create the generator with adaptive=False")
        self.target.check_batching()
        outputs = [GenerationOutput() for _ in input_ids]
        start = time.perf_counter()
        try:
            loop(self, input_ids, cfg, max_new_tokens, eos_token_ids(eos_token_id=eos_token_id), generator, outputs)
        finally:
            self.target.rows = None
        for out in outputs:
            out.seconds = out.seconds or time.perf_counter() - start
        return outputs

    @_while_decoding
    @torch.inference_mode()
    def generate_batch(
        self,
        input_ids: list[torch.Tensor],
        sampling: SamplingConfig | None = None,
        *,
        max_new_tokens: int = 128,
        eos_token_id: int | list[int] | None = None,
        generator: torch.Generator | None = None,
        **overrides,
    ) -> list[GenerationOutput]:
        """Speculative decoding of several prompts together (`mars.batch`): one tree per prompt per
        cycle, all verified in one target forward, each prompt accepting its own number of tokens.

        input_ids: the prompts, LongTensors [T] or [1, T] of any lengths. Takes the other arguments of
        `generate`. Returns one `GenerationOutput` per prompt, in order; its `seconds` is the time from
        the batch's start to that prompt's last token. Finished prompts leave the batch (their slots are
        not refilled). Drafting as `generate` does it (`drafting`: sampled children at temperature > 0
        by default), one tree per prompt; strict greedy output of every prompt equals its plain greedy
        decoding alone (float32; tested), strict sampling is lossless per prompt.
        """
        return self._batched(batch.generate_batch, input_ids, sampling, max_new_tokens, eos_token_id, generator,
                             overrides)

    @_while_decoding
    @torch.inference_mode()
    def vanilla_batch(
        self,
        input_ids: list[torch.Tensor],
        sampling: SamplingConfig | None = None,
        *,
        max_new_tokens: int = 128,
        eos_token_id: int | list[int] | None = None,
        generator: torch.Generator | None = None,
        **overrides,
    ) -> list[GenerationOutput]:
        """Plain decoding of several prompts together (one token per prompt per forward) with the same
        adapter, ragged cache and logits processing: `generate_batch`'s own baseline. Arguments and
        outputs as `generate_batch`."""
        return self._batched(batch.vanilla_batch, input_ids, sampling, max_new_tokens, eos_token_id, generator,
                             overrides)
