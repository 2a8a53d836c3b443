"""The speculative decoding loop, over B >= 1 prompts at once: draft a tree per prompt, score them all in
one target forward, keep a path per prompt.

    prefill each prompt -> its first token x_b (plain decoding)   head.extend_rows(prompt features, tokens)
    repeat:  forest   = grow_trees(head, roots x)                   # one EAGLE-2 dynamic tree per row (eagle.tree),
                        or sample_trees(head, roots x)              #   or children sampled into a fixed shape
             logits   = target.score_rows(forest)                   # one forward, tree attention masks
             verdicts = accept_rows(process(logits), forest, ...)   # any rule, greedy / sampling, one read
             row b emits its accepted tokens + its next token;  target.keep_rows(paths)
             head.extend_rows(features[paths], tokens after them)   # each row's draft catches up
             finished rows leave the batch (their slots are not refilled: a static batch)

One prompt is a forest of one: the adapter and the head then run their single-sequence code
(`TargetModel.prefill_rows` of one prompt), which static shapes, compile and exact attention's plans
are built for, and which the adaptive tree needs (`check_batching` says what several prompts refuse).
Several prompts share one cache of ragged rows (`compute.ragged`): row b's tokens first, then a gap its
masks hide, then the block every row writes at the same place. Per cycle the host reads the verdicts
once and uploads the paths, next tokens and kept rows once, whatever B (`tests/test_batch.py` counts
it); the device work has no loop over rows; per-row Python is the bookkeeping of emitted tokens
(`GenerationOutput.emit`, `record_cycle`).

Counting: `num_cycles` counts draft-verify cycles (the prefill that emits the first token is not a
cycle); `accept_lengths[i]` the drafted tokens cycle i emitted. A cycle emits its accepted tokens
plus the target's own, unless EOS or `max_new_tokens` cuts it short, so `tau` = tokens emitted by
cycles / cycles = (len(tokens) - 1) / num_cycles.

Timing: `seconds` times the decoding alone: each row's, from the call's start to its last token (all
requests submitted at once); a batch's throughput is its tokens over the call's wall time. The
relaxation's cost accounting (`mars.accounting.cost`, measurement only) is deferred out of the loop and settled
after it (`mars.accounting.deferred.CostLedger`, one read for the batch, its time in the first output's
`phase_seconds["accounting"]`), except with static shapes, where it is computed in the cycle.

Devices: token ids enter at the target's input embeddings, logits and the RNG live on its lm_head's
device (`TargetModel.devices`), the draft head sits where it was loaded and receives the target's
features there. On one device all of these are the same.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from functools import partial

import torch

from compute.kernels import PackedLinears, choose_packing, onednn
from eagle.config import eos_token_ids
from eagle.heads import DraftHead
from eagle.sampled_trees import RANK_ACCEPTANCE
from eagle.tree import DraftTree
from mars.accounting.deferred import CostLedger
from mars.accounting.timing import PhaseClock, frozen_heap
from mars.adapter import TargetModel
from mars.decoding.adaptive import AdaptiveTree, measure_costs
from mars.decoding.call_checks import call_prompts, check_generator, checked_plain_kernels
from mars.decoding.drafting import Drafter
from mars.decoding.output import GenerationOutput
from mars.decoding.plain_loop import external_rows, plain_rows
from mars.decoding.rows import Behind, Rows, joined, paths_behind, prompts_behind
from mars.decoding.settings import Kernels, TreeShape
from mars.verification.sampling import SamplingConfig, next_tokens, process_logits, resolve_sampling
from mars.verification.verify import Verdict, accept_rows

# EAGLE-2's dynamic tree (its GPU setting); `mars.tuned` measures the fastest tree for a machine.
DEFAULT_TREE = TreeShape(60, 6, 10)

# loop(prompts, cfg, max_new_tokens, eos, generator, outputs): one call's decoding of its rows, filling `outputs`
# (`_speculate` bound to its generator, or `mars.decoding.plain_loop`'s).
Loop = Callable[[list[torch.Tensor], SamplingConfig, int, frozenset[int], torch.Generator | None,
                 list[GenerationOutput]], None]


def _while_decoding(method):
    """Run a decoding method with the generator's feature hooks on the models, taken off again after
    (between calls the models are as the caller gave them), and the heap that exists at the call frozen
    out of garbage collections (`mars.accounting.timing.frozen_heap`). The kernels are entered per loop
    (`SpeculativeGenerator.computing`)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self.target.tapped(), frozen_heap():
            return method(self, *args, **kwargs)
    return run


class SpeculativeGenerator:
    """EAGLE-2/3 tree speculative decoding of `target_model` with `head`, verified by any rule of `mars.rules`.

    tree: the draft tree's shape and drafting mode, a `mars.decoding.settings.TreeShape` (which checks them):
    `total_tokens` drafted nodes verified per cycle, `depth` draft levels, `branching` children per
    expanded node, `adaptive` sizing, `drafting` ("auto": sampled children when sampling). Default
    `DEFAULT_TREE`, EAGLE-2's 60/6/10. `rank_acceptance`: the per-rank acceptance a sampled tree's
    shape is chosen for (`eagle.sampled_trees.best_topology`).
    exact_attention: compute verification attention per query row over exactly its visible keys
    (`mars.adapter.exact_attention_forward`), so that in bf16 the tree forward reproduces plain
    decoding bit for bit instead of up to rounding. It switches the model's attention
    implementation to "mars_exact" until `close()` (or the end of a `with` block) restores it.
    "auto" (default): on for a bf16/fp16 full-attention target, off in float32, where verification
    already reproduces plain decoding (`eagle.precision.needs_exact_attention`); `gen.target.exact_attention`
    tells what was chosen.
    prepack: multiply float32 CPU linears (target and head) by oneDNN-prepacked weights inside
    `generate`/`vanilla` (`compute.kernels`): ~30% faster tree forwards on CPUs where MKL's few-row
    products are slow, and row-invariant. "auto" (default): on for float32 CPU models when the packed
    copy fits in memory; `gen.prepack` / `gen.prepack_reason` tell what was chosen.
    onednn: False multiplies with torch's own CPU kernels, oneDNN off (`compute.kernels.onednn`);
    needs prepack off.
    plain_kernels: the kernels of plain decoding (`vanilla`, and `generate` while `speculate` is False) where
    they differ from the tree's (a `mars.decoding.settings.Kernels`; None: the tree's). The fastest one-row
    products are not always the fastest few-row ones (bf16 on the AVX-512 EPYC: torch's own for one row,
    packed oneDNN for a tree; `compute.kernels`), nor in the same precision (the embedded pair there:
    float32 trees, bf16 plain decoding). plain_model: the target loaded in `plain_kernels`' precision, where
    that is not `target_model`'s (a second copy, the caller's to load). Strict greedy output equals plain
    greedy decoding at the tree's kernels, bit for bit; at other kernels the sums run in another order and
    greedy continuations part after a rounding tie (`gen.vanilla(..., tree_kernels=True)` decodes plainly at
    the tree's kernels).
    profile: time the loop's phases into `GenerationOutput.phase_seconds` (synchronising the devices
    at every phase boundary; off by default, for the loop's sake on a GPU).
    An adaptive tree (`tree.adaptive`) is sized each cycle (up to the tree's maxima, down to a plain
    decoding step) from costs measured on this machine at the first `generate` and the acceptance
    observed so far (`mars.decoding.adaptive`); the estimates carry over from call to call.
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

    def __init__(self, target_model, head: DraftHead, tree: TreeShape = DEFAULT_TREE, *,
                 exact_attention: bool | str = "auto", prepack: bool | str = "auto", onednn: bool = True,
                 plain_kernels: Kernels | None = None, plain_model=None, profile: bool = False,
                 static: bool = False, compile: str | None = None, max_cache_len: int | None = None,
                 rank_acceptance: tuple[float, ...] = RANK_ACCEPTANCE, **tree_arguments):
        if tree_arguments:
            raise TypeError(f"SpeculativeGenerator takes its tree as one argument: tree=TreeShape(total_tokens=..., "
                            f"depth=..., branching=..., adaptive=..., drafting=...) (mars.decoding.settings), not "
                            f"{', '.join(sorted(tree_arguments))}")
        if not isinstance(tree, TreeShape):
            raise TypeError(f"tree must be a mars.decoding.settings.TreeShape, got {type(tree).__name__}")
        head.config.check_target(target_model)
        self.target = TargetModel(target_model, head.config.feature_layers, exact_attention, feature_device=head.device,
                                  static=static, max_cache_len=max_cache_len, tree_rows=tree.total_tokens + 1,
                                  compile=compile)
        self.head, self.tree, self.profile = head, tree, profile
        self.rank_acceptance = tuple(rank_acceptance)
        self.prepack, self.prepack_reason = choose_packing([target_model, head], prepack, compiled=compile is not None)
        # The tree's kernels and plain decoding's, each (exact attention plans, packed, oneDNN on).
        precision = str(self.target.dtype).removeprefix("torch.")
        self.tree_kernels = Kernels(precision, self.target.exact_attention, self.prepack, onednn)
        self.plain_kernels = checked_plain_kernels(self.target, self.tree_kernels, plain_kernels, plain_model)
        # Plain decoding's adapter: the tree's, or one over the copy in plain decoding's precision.
        self.plain_target = self.target if plain_model is None else TargetModel(
            plain_model, head.config.feature_layers, self.plain_kernels.exact_attention, feature_device=head.device)
        packing = self.prepack or (self.plain_kernels.prepack and plain_model is None)
        self.packed = PackedLinears(target_model, head) if packing else None
        self.plain_packed = PackedLinears(plain_model) if plain_model is not None and self.plain_kernels.prepack \
            else self.packed
        # A prompt's forward multiplies many rows: in plain decoding on torch's own products (`onednn` off) it
        # runs with oneDNN, packed where packable (`mars.decoding.plain_loop.prompt_forward`). The copy's packed
        # weights, for that.
        self.prompt_packed = self.plain_packed if plain_model is None or self.plain_packed is not None else (
            PackedLinears(plain_model) if choose_packing([plain_model], "auto")[0] else None)
        self.policy: AdaptiveTree | None = None  # measured on first use
        # False: `generate` decodes plainly (`mars.tuned` sets it where calibration found no tree faster than the
        # fastest plain decoding: `mars.tuning.verdict`), with `plain_decoding` where that is not our vanilla
        # (`model.generate` here or in a worker: `mars.decoding.reference`), else exactly as `vanilla` does.
        self.speculate = True
        self.plain_decoding = None
        self.held: list = []  # what `close` ends with the generator (a plain decoding's worker process)

    def close(self) -> None:
        """Hand the target model (and a plain decoding copy) back as it was given (its own attention
        implementation)."""
        self.target.close()
        if self.plain_target is not self.target:
            self.plain_target.close()
        for held in self.held:
            held.close()
        self.held = []

    def hold(self, resource):
        """Keep `resource` (anything with `close`, e.g. a worker process) until this generator closes."""
        self.held.append(resource)
        return resource

    @contextmanager
    def computing(self, plain: bool):
        """Inside: plain decoding's adapter (`plain`) or the tree's, its linears multiplying as its kernels say
        (packed or not, oneDNN on or off) and its forwards making exact attention's plans or not."""
        target, kernels = (self.plain_target, self.plain_kernels) if plain else (self.target, self.tree_kernels)
        packed = self.plain_packed if plain else self.packed
        with packed.active() if kernels.prepack else nullcontext(), onednn(kernels.onednn), \
                target.exact_plans(kernels.exact_attention), \
                target.tapped() if target is not self.target else nullcontext():
            yield

    def adaptive_policy(self) -> AdaptiveTree | None:
        """The adaptive tree's policy (None for a fixed tree), its costs measured here at first use and again
        when the tree's maxima change; kept from call to call."""
        tree = self.tree
        if not tree.adaptive:
            return None
        if self.policy is None or (self.policy.max_depth, self.policy.branching, self.policy.max_tokens) != (
                tree.depth, tree.branching, tree.total_tokens):  # first use, or the tree's maxima were changed
            costs = measure_costs(self.target, self.head, tree.branching, tree.total_tokens)
            self.policy = AdaptiveTree(costs, tree.depth, tree.branching, tree.total_tokens)
        return self.policy

    def use_tree(self, tree: TreeShape) -> None:
        """Draft `tree` from the next call on (a run gives each method the tree measured for it). Static
        shapes pad every tree to the rows they were built for: a larger tree is refused."""
        if self.target.static and tree.total_tokens + 1 > self.target.tree_rows:
            raise ValueError(f"tree {tree.label} has more nodes than the static shapes were built for "
                             f"({self.target.tree_rows - 1}): build the generator with the largest tree")
        self.tree = tree

    def __enter__(self) -> SpeculativeGenerator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check_batching(self) -> None:
        """Raise a ValueError naming the setting if this generator cannot decode several prompts together
        (batched decoding runs fixed-size trees on the dynamic cache)."""
        if not self.tree.batchable:
            raise ValueError("batched decoding drafts fixed-size trees: give the generator a tree with adaptive=False")
        self.target.check_batching()

    def _decode(self, loop: Loop, input_ids, sampling: SamplingConfig | None, max_new_tokens: int, eos_token_id,
                generator: torch.Generator | None, overrides: dict, *, nodes: int, plain: bool = False):
        """Check the call, run `loop` over its prompts inside the kernels of the tree (or of plain decoding) and
        return its outputs: one, or a list, as the prompts were given. `nodes`: the room one cycle needs."""
        cfg = resolve_sampling(sampling, **overrides)
        prompts = call_prompts(self.target, input_ids, max_new_tokens, nodes)
        check_generator(self.target, generator)
        if len(prompts) > 1:
            self.check_batching()
        outputs = [GenerationOutput() for _ in prompts]
        if max_new_tokens > 0:
            try:
                with self.computing(plain):
                    loop(prompts, cfg, max_new_tokens, eos_token_ids(eos_token_id=eos_token_id), generator, outputs)
            finally:
                self.target.rows = self.plain_target.rows = None
        return outputs[0] if isinstance(input_ids, torch.Tensor) else outputs

    @_while_decoding
    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor | Sequence[torch.Tensor],
        sampling: SamplingConfig | None = None,
        *,
        max_new_tokens: int = 128,
        eos_token_id: int | list[int] | None = None,
        generator: torch.Generator | None = None,
        **overrides,
    ) -> GenerationOutput | list[GenerationOutput]:
        """Speculative decoding of one prompt, `input_ids` [1, T], or of a list of prompts (LongTensors [T]
        or [1, T] of any lengths) decoded together; returns the new tokens and how they were accepted: a
        `GenerationOutput`, or a list of them in the prompts' order.

        sampling: a `SamplingConfig` (default greedy, strict); keyword `overrides` (temperature=,
        top_p=, top_k=, rule= a `mars.rules` Rule or name, and that rule's parameters, e.g.
        rule="mars", theta=0.8) replace its fields. eos_token_id:
        the ids that stop generation (None: none stop; `eagle.config.eos_token_ids` gives a model's).
        generator: the RNG of sampling, on the device of the target's logits.
        Several prompts: one tree per prompt per cycle, all verified in one target forward, each prompt
        accepting its own number of tokens; finished prompts leave the batch (their slots are not
        refilled); each output's `seconds` is the time from the batch's start to its last token. Strict
        greedy output of every prompt equals its plain greedy decoding alone at the tree's kernels
        (`vanilla(..., tree_kernels=True)`; tested), strict sampling is lossless per prompt. Batches need a
        fixed-size tree on the dynamic cache (`check_batching`). With `speculate` False, plain decoding:
        `vanilla`'s loop and outputs at `plain_kernels` (tau 1).
        """
        if not self.speculate and self.plain_decoding is not None:
            return self._decode(partial(external_rows, decoder=self.plain_decoding), input_ids, sampling,
                                max_new_tokens, eos_token_id, generator, overrides, nodes=1, plain=True)
        if not self.speculate:
            return self._decode(self._plain_loop(self.plain_target), input_ids, sampling, max_new_tokens,
                                eos_token_id, generator, overrides, nodes=1, plain=True)
        return self._decode(partial(_speculate, self), input_ids, sampling, max_new_tokens, eos_token_id, generator,
                            overrides, nodes=self.tree.total_tokens + 1)

    @_while_decoding
    @torch.inference_mode()
    def vanilla(
        self,
        input_ids: torch.Tensor | Sequence[torch.Tensor],
        sampling: SamplingConfig | None = None,
        *,
        max_new_tokens: int = 128,
        eos_token_id: int | list[int] | None = None,
        generator: torch.Generator | None = None,
        tree_kernels: bool = False,
        **overrides,
    ) -> GenerationOutput | list[GenerationOutput]:
        """Plain token-by-token decoding with the same adapter, cache and logits processing: `generate`'s
        own baseline. Takes and returns what `generate` does (several prompts: one token per prompt per
        forward, on the ragged cache); the verification settings (rule, theta, ...) do not apply.
        Decodes at `plain_kernels`, or with `tree_kernels` at the tree's: the plain decoding strict greedy
        reproduces bit for bit.
        """
        target = self.target if tree_kernels else self.plain_target
        return self._decode(self._plain_loop(target), input_ids, sampling, max_new_tokens, eos_token_id,
                            generator, overrides, nodes=1, plain=not tree_kernels)

    def _plain_loop(self, target: TargetModel) -> Loop:
        """Plain decoding on `target`, its prompts' forward on the packed weights that go with that adapter."""
        packed = self.packed if target is self.target else self.prompt_packed
        return partial(plain_rows, target, profile=self.profile, prompt_packed=packed)


# --- the speculative loop: B >= 1 rows, each a prompt; one prompt is a forest of one ----------------

def _leave(gen: SpeculativeGenerator, rows: Rows, keep: list[int], keep_device: torch.Tensor, behind: list[Behind],
           roots: torch.Tensor) -> tuple[list[Behind], torch.Tensor]:
    """Finished rows leave the batch: the target's and the head's caches, the head's pending catch-up and
    the roots keep only `keep`."""
    gen.target.select_rows(keep, keep_device.to(gen.target.devices.inputs))
    gen.head.select_rows(keep, keep_device)
    rows.keep(keep)
    return [b.select(keep, keep_device) for b in behind], roots.index_select(0, keep_device)


def _start(gen: SpeculativeGenerator, prompts: list[torch.Tensor], cfg: SamplingConfig, rows: Rows,
           generator: torch.Generator | None, capacity: int) -> tuple[list[Behind], torch.Tensor]:
    """The prefill: each row's first token emitted, the head's caches reset, rows done at their first token
    gone. Returns what the head has not seen (the prompts) and the roots of the first trees."""
    target, head = gen.target, gen.head
    logits, features = target.prefill_rows(prompts, capacity)
    roots = next_tokens(process_logits(logits, cfg), cfg, generator).to(head.device)
    rows.emit_first(roots)
    head.reset_rows(len(prompts), head.device)
    # The draft head catches up on committed tokens (their target features and the tokens that follow
    # them) only before a cycle that drafts: a run of plain decoding steps (adaptive tree) then costs one
    # head forward at its end instead of one per step.
    behind = [prompts_behind(prompts, features, roots, target.rows.device if target.rows is not None else None)]
    keep = rows.unfinished()
    if keep and len(keep) < len(rows.live):  # some rows done at their first token
        keep_device = torch.tensor(keep, dtype=torch.long, device=head.device)
        behind, roots = _leave(gen, rows, keep, keep_device, behind, roots)
    return behind, roots


def _commit(gen: SpeculativeGenerator, rows: Rows, forest: DraftTree, features: torch.Tensor,
            verdicts: list[Verdict], keep: list[int], behind: list[Behind]) -> tuple[list[Behind], torch.Tensor]:
    """Keep each row's accepted path in the target's cache and queue it for the head; rows not in `keep`
    leave. The cycle's one upload: each row's path (padded by repeating its last node), next token and
    length, and which rows stay. Returns what the head has not seen and the next roots."""
    width = forest.levels + 1
    packed = [v.path + v.path[-1:] * (width - len(v.path)) + [v.next_token, len(v.path)] for v in verdicts]
    for row in range(len(verdicts)):
        packed[row].append(keep[row] if row < len(keep) else 0)
    uploaded = torch.tensor(packed, device=gen.head.device)
    paths, roots, counts_device = uploaded[:, :width], uploaded[:, width], uploaded[:, width + 1]
    gen.target.keep_rows([v.path for v in verdicts], paths, counts_device)
    behind = [*behind, paths_behind(forest, features, paths, roots, [len(v.path) for v in verdicts], counts_device)]
    if len(keep) < len(verdicts):
        behind, roots = _leave(gen, rows, keep, uploaded[: len(keep), width + 2], behind, roots)
    return behind, roots


def _speculate(gen: SpeculativeGenerator, prompts: list[torch.Tensor], cfg: SamplingConfig, max_new_tokens: int,
               eos: frozenset[int], generator: torch.Generator | None, outputs: list[GenerationOutput]) -> None:
    """The loop of `generate` (see the module docstring); fills `outputs`."""
    target, head = gen.target, gen.head
    rows = Rows(outputs, eos, max_new_tokens)
    target.tree_rows = gen.tree.total_tokens + 1  # static shapes: every tree padded to the largest (follows changes)
    drafter = Drafter(head, gen.tree, cfg, generator, gen.adaptive_policy, gen.rank_acceptance)
    clock = PhaseClock(outputs[0].phase_seconds, target.all_devices | {head.device}, gen.profile)  # the batch's
    ledger = CostLedger([out.stats for out in outputs], clock, target.static)
    capacity = max(map(len, prompts)) + max_new_tokens + gen.tree.total_tokens + 1
    behind, roots = _start(gen, prompts, cfg, rows, generator, capacity)
    if not rows.unfinished():  # every row done at its first token
        return
    hidden = logprobs = None
    clock.lap("prefill")
    while rows.live:
        if drafter.plan(rows.remaining()) > 0 and behind:
            hidden, logprobs = head.extend_rows(*joined(behind))
            behind = []
            clock.lap("catch_up")
        forest = drafter.draft(roots, hidden, logprobs)
        clock.lap("draft")
        logits, features = target.score_rows(forest)
        clock.lap("tree_forward")
        verdicts = accept_rows(process_logits(logits, cfg), forest, cfg, generator, defer_cost=ledger.defer)
        for row, verdict in enumerate(verdicts):
            emitted = rows.emit(row, verdict.tokens + [verdict.next_token])
            rows.output(row).record_cycle(verdict, emitted, forest.levels, sampled=not cfg.greedy)
        drafter.observe(forest, verdicts)
        clock.lap("accept")
        ledger.record(verdicts)
        if not (keep := rows.unfinished()):
            break
        behind, roots = _commit(gen, rows, forest, features, verdicts, keep, behind)
        clock.lap("cache_update")
    ledger.settle()  # every row's `seconds` was taken at its last token: the accounting is outside them
