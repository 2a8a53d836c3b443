"""The calibration: the fastest kernels and tree for strict and each rule on this machine, and whether each
beats the fastest plain decoding, in four steps.

1. Plain race (`mars.tuning.plain_race`): every plain decoding a user has here decodes the first units in rotated
   blocks; the fastest by the paired ratios is the reference every method is judged against.
2. Parts (`mars.tuning.cost_model.measure_parts`), once per kernel set: a plain step, forwards by rows, each
   tree's drafting. Kernel sets whose strict greedy output differs from their own plain greedy output are never
   candidates (the exactness every strict run promises), though their plain decoding still races.
3. Profiles, per method: each tree decoded on the first units with the method's rule, at the kernels whose trees
   the parts make cheapest, which gives its tau. After the first MIN_PROFILES (the chains and a branching tree,
   where a relaxed rule's longer accepted paths may pay), a tree that could not catch the best so far with every
   draft accepted is skipped, and so are those left when PROFILE_SHARE of the budget is spent (the prior puts
   likely winners first). Every kernels x tree pair is then predicted (`cost_model.predict`).
4. Finals (`mars.tuning.finals`): strict's best predicted candidate and any the model cannot separate from it,
   and each rule's best at those kernels with any the model cannot separate from that (`finals.finalists`),
   decode the held-out units with the reference in rotated blocks until every verdict is decided, the units run
   out, or the budget does.
The verdict (`mars.tuning.verdict`): on where the winner's interval lies above 1, off where below; where it
straddles 1 when the budget ends, the point estimate decides and the record says the verdict is uncertain.

The held-out units chose nothing before the finals, so the finals' ratio is the prediction of the run; the
prompts that ranked the candidates would flatter the winner. A method calibrated before (its record cached)
is not timed again; a rule calibrated after strict's record was cached is timed alone at strict's kernels.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace

import torch

from compute.kernels import packed_copy_fits
from eagle.files import write_atomic
from mars.accounting.timing import ForeignLoad
from mars.decoding.generate import SpeculativeGenerator
from mars.decoding.settings import Kernels, TreeShape
from mars.rules.strict import Strict
from mars.tuning import record as records
from mars.tuning.candidates import batchable, check_kernels
from mars.tuning.cost_model import (
    Parts,
    Prediction,
    Profile,
    measure_parts,
    predict,
    profile_tree,
    speed_bound,
    typical_overhead,
)
from mars.tuning.finals import Arm, Finals, arm_contender, finalists
from mars.tuning.pairs import Contender, Unit
from mars.tuning.plain_race import RACE_VANILLAS, plain_contenders, plain_kernels, race
from mars.tuning.plan import Load, Plan, batches_of
from mars.tuning.record import Calibration, PlainSpeed
from mars.verification.sampling import SamplingConfig

STRICT = Strict.name
UNITS = 24  # units of prompts calibration times at most (at batch B, the first UNITS * B prompts)
PROFILE_UNITS = 2  # the first units: the profiles' (the race's: the first RACE_UNITS); the rest are the finals'
RACE_UNITS = 1  # plain decodings differ little from prompt to prompt: one block ranks them (the finals time the
# fastest again beside every tree, on every held-out prompt)
PROFILE_SHARE = 0.65  # of the budget, from its start, by which every method's profiles end (the finals get the rest)
MIN_PROFILES = 4  # per method whatever the budget and bound: the prior's chains and first branching tree


def calibrate(load: Load, kernels: list[Kernels], prompts: list[torch.Tensor], plan: Plan,
              methods: dict[str, SamplingConfig]) -> dict[str, Calibration]:
    """Each of `methods`' ({name: its sampling, rule included}; strict's under "strict") calibration among
    `kernels` x `plan.trees`, judged against the fastest plain decoding (see the module docstring); each cached
    under `plan.cache_dir` (default `mars.tuning.record.default_cache()`) by `cache_key`."""
    if not kernels:
        raise ValueError("no kernel candidates to calibrate")
    if not plan.trees:
        raise ValueError("give the candidate trees, or the fixed tree to time the kernels at")
    if STRICT not in methods:
        raise ValueError("a calibration starts from strict's (its kernels and reference are every rule's)")
    if plan.batch > 1:  # what batched decoding drafts (`SpeculativeGenerator.check_batching`): fixed trees
        if not any(batchable(t) for t in plan.trees):
            raise ValueError(f"tree {plan.trees[0].label} cannot decode a batch: batched decoding drafts fixed trees "
                             "(no adaptive tree); give a fixed tree or batch_size=1")
        plan = replace(plan, trees=tuple(t for t in plan.trees if batchable(t)))
    prompts = prompts[: UNITS * plan.batch]
    least = PROFILE_UNITS + 2  # the profiles' units and two held out: a paired ratio needs two pairs
    if len(prompts) < least * plan.batch:
        raise ValueError(f"calibration needs at least {least * plan.batch} prompts ({least} units of {plan.batch}), "
                         f"got {len(prompts)}: give more calibration prompts")
    started = time.perf_counter()
    held = {kernels[0].dtype: load(kernels[0].dtype)}
    paths = {name: records.cache_path(records.cache_key(held[kernels[0].dtype], kernels, prompts, plan, methods, name),
                                      plan.cache_dir or records.default_cache()) for name in methods}
    found: dict[str, Calibration] = {}
    for name, path in paths.items():
        if path.exists():
            try:
                found[name] = records.load(path)
            except (records.SchemaError, KeyError, TypeError) as error:
                plan.log(f"calibration record {path} is unreadable ({error}): calibrating again")
    todo = [name for name in methods if name not in found]
    if not todo:
        return found
    if STRICT in todo:
        for reference in plan.references:  # its start-up overlaps the loading and checks, untimed
            reference.start()
    with plan.exclusive():
        made = Search(load, held, kernels, batches_of(prompts, plan.batch), plan, methods, strict=found.get(STRICT),
                      started=started).run(todo)
    for name, record in made.items():
        record = replace(record, cache=str(paths[name]))
        paths[name].parent.mkdir(parents=True, exist_ok=True)
        write_atomic(paths[name], json.dumps(record.to_dict(), indent=1))
        found[name] = record
    return found


@contextmanager
def _generators(held: dict[str, tuple], kernels: list[Kernels], tree: TreeShape) -> Iterator[dict]:
    """One generator per kernel set on the loaded model of its precision (closed in reverse order, so each model
    gets its own attention implementation back)."""
    with ExitStack() as stack:
        yield {k: stack.enter_context(SpeculativeGenerator(*held[k.dtype], tree, exact_attention=k.exact_attention,
                                                           prepack=k.prepack, onednn=k.onednn)) for k in kernels}


class Search:
    """The four steps of the module docstring for the methods not cached, over the models in `held` (loaded per
    precision by `load`; every precision at once where their copies fit in memory, else only the first). With
    strict's record given (`strict`: cached), the rules are timed at its kernels against its reference."""

    def __init__(self, load: Load, held: dict[str, tuple], kernels: list[Kernels], units: list[Unit], plan: Plan,
                 methods: dict[str, SamplingConfig], *, strict: Calibration | None, started: float):
        self.load, self.held, self.units, self.plan, self.methods = load, held, units, plan, methods
        self.strict, self.started, self.log = strict, started, plan.log
        # A rule timed after strict's record also loads what strict's reference decodes with: our vanilla at its
        # kernels, or `model.generate` in its precision.
        extra: list[Kernels] = []
        wanted = [k.dtype for k in kernels]
        if strict is not None:
            kernels = [strict.kernels]
            extra = [strict.reference.kernels] if strict.reference.ours else []
            wanted = [strict.kernels.dtype, *(k.dtype for k in extra)]
            if not strict.reference.ours and "+" not in strict.reference.label:
                wanted.append(strict.reference.label.removeprefix("generate@"))
        dtypes = list(dict.fromkeys(wanted))
        # any precision loaded counts the parameters (strict's may not be loaded yet: calibrate loads the first
        # candidate's to read its cache)
        weights = sum(p.numel() for model in next(iter(held.values())) for p in model.parameters())
        if len(dtypes) > 1 and not packed_copy_fits(2 * weights * sum(getattr(torch, d).itemsize for d in dtypes)):
            self.log(f"calibration: the target's copies in {', '.join(dtypes)} do not fit in memory together; "
                     f"only {dtypes[0]} is calibrated")
            dtypes = dtypes[:1]
        self.dtypes = dtypes
        self.tree_kernels = [k for k in kernels if k.dtype in dtypes]  # the candidates' (a rule's: strict's)
        self.kernels = list(dict.fromkeys([*self.tree_kernels, *(k for k in extra if k.dtype in dtypes)]))
        self.tokens = plan.max_new_tokens
        # what retimes a call another process contended (a worker of ours being timed is not another process)
        self.meter = ForeignLoad(lambda: [pid for r in plan.references for pid in r.pids()])
        self.short = max(16, plan.max_new_tokens // 2)  # the race's length (tau needs the run's: self.tokens)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def say(self, what: str) -> None:
        self.log(f"calibrating ({self.elapsed():.0f} s): {what}")

    def run(self, todo: list[str]) -> dict[str, Calibration]:
        for dtype in self.dtypes:
            if dtype not in self.held:
                self.held[dtype] = self.load(dtype)
        attention = {d: self.held[d][0].config._attn_implementation for d in self.dtypes}  # before the generators'
        with _generators(self.held, self.kernels, self.plan.trees[0]) as gens:
            return self._run(gens, attention, todo)

    def _run(self, gens: dict[Kernels, SpeculativeGenerator], attention: dict[str, str],
             todo: list[str]) -> dict[str, Calibration]:
        plan, strict, first = self.plan, self.strict, self.units[:PROFILE_UNITS]
        if strict is None:
            identical = check_kernels(gens, self.units[0])
            candidates = [k for k in self.tree_kernels if identical[k.label]] or self.tree_kernels
            self.say(f"parts of {len(gens)} kernel sets x {len(plan.trees)} trees")
            parts = measure_parts(gens, plan.trees, self.units[0], self.methods[STRICT], set(candidates))
            plains, reference, contender = self._race(gens, parts, attention, self.units[:RACE_UNITS])
        else:
            identical, candidates = strict.identical, self.tree_kernels
            parts = {p.kernels: p for p in strict.parts}
            plains, reference = list(strict.plains), strict.reference
            contender = self._contender(gens, attention, reference)
        # the profiles' share of the budget, split between the methods; the finals get the rest
        ends = self.started + PROFILE_SHARE * plan.budget_s
        profiles = {}
        for i, name in enumerate(todo):
            deadline = time.perf_counter() + max(0.0, ends - time.perf_counter()) / (len(todo) - i)
            profiles[name] = self._profiles(gens, parts, candidates, first, self.methods[name], deadline)
        predictions = {name: predict({k: parts[k] for k in candidates if k in parts}, profiles[name]) for name in todo}
        arms = self._arms(gens, predictions)
        finals = Finals(contender, arms, strict.kernels if strict is not None else None, self.meter)
        held_out = self.units[PROFILE_UNITS:]
        self.say(f"timing {', '.join(f'{a.method} {a.contender.label}' for a in arms)} against the fastest plain "
                 f"decoding ({reference.label}) on up to {len(held_out)} held-out prompts, paired")
        for arm in arms:
            arm.contender.time(held_out[0], 0, 8)  # warm: its kernels' first tree shapes
        finals.run(held_out, PROFILE_UNITS, self.tokens, plan.deadline, self.say)
        kernels = finals.kernels()
        plain = strict.plain_kernels if strict is not None else plain_kernels(plains, kernels)
        found = {}
        for name in todo:
            chosen = finals.choose(name)
            mine = [a for a in finals.racing if a.method == name and a.kernels == kernels]
            measured = finals.ratio(chosen)
            model = chosen.prediction.tokens_per_s / reference.tokens_per_s
            self.say(f"{name}: {chosen.contender.label} at {measured.ratio:.2f}x [{measured.low:.2f}, "
                     f"{measured.high:.2f}] the fastest plain decoding ({reference.label}) over {measured.pairs} "
                     f"paired prompts; the cost model said {model:.2f}x")
            sampling = self.methods[name]
            forced = plan.forced and name == STRICT
            found[name] = Calibration(
                method=name, rule={"name": sampling.rule.name, **sampling.rule.params()},
                sampling={"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k},
                batch=plan.batch, max_new_tokens=plan.max_new_tokens, kernels=kernels, tree=chosen.prediction.tree,
                plain_kernels=plain, reference=reference, plains=tuple(plains), identical=identical,
                parts=tuple(parts.values()), profiles=tuple(profiles[name]), predictions=tuple(predictions[name]),
                finals={a.contender.label: finals.ratio(a) for a in arms if a.method == name}, measured=measured,
                tied=tuple(a.contender.label for a in mine if a is not chosen and finals.tied(chosen, a)),
                speculate=(measured.pairs > 0 and measured.ratio >= 1.0) or forced, certain=measured.decided,
                forced=forced,
                seconds=self.elapsed(), budget_s=plan.budget_s, machine=records.machine())
        return found

    # --- 1. the plain race (mars.tuning.plain_race) -----------------------------------------------------
    def _plain_contenders(self, gens, attention: dict[str, str], vanillas: list[Kernels]) -> dict[str, tuple]:
        targets = {d: (self.held[d][0], attention[d]) for d in self.dtypes}
        # plain decoding verifies nothing: strict's sampling is every method's
        return plain_contenders(gens, vanillas, targets, list(self.plan.references), self.methods[STRICT])

    def _contender(self, gens, attention: dict[str, str], reference: PlainSpeed) -> Contender:
        """Strict's reference, to time again beside a rule calibrated after strict's record."""
        vanillas = [reference.kernels] if reference.ours and reference.kernels in gens else []
        found = self._plain_contenders(gens, attention, vanillas)
        if reference.label not in found:
            raise ValueError(f"strict's fastest plain decoding {reference.label} cannot be timed in this calibration "
                             f"(it has {', '.join(found)}): delete strict's record to calibrate both again")
        return found[reference.label][1]

    def _race(self, gens, parts: dict[Kernels, Parts], attention: dict[str, str],
              units: list[Unit]) -> tuple[list[PlainSpeed], PlainSpeed, Contender]:
        """Every plain decoding raced, the fastest, and its contender for the finals."""
        cheapest = sorted(gens, key=lambda k: parts[k].step_s)[:RACE_VANILLAS]
        contenders = self._plain_contenders(gens, attention, cheapest)
        self.say(f"racing {len(contenders)} plain decodings on {len(units)} prompts")
        plains, fastest = race(contenders, units, self.short, self.meter)
        return plains, fastest, contenders[fastest.label][1]

    # --- 3. the profiles ---------------------------------------------------------------------------------
    def _profiles(self, gens, parts: dict[Kernels, Parts], candidates: list[Kernels], units: list[Unit],
                  sampling: SamplingConfig, deadline: float) -> list[Profile]:
        """Each tree's profile under `sampling` at the kernel set whose trees the parts make cheapest, in the order
        of the prior; after the first MIN_PROFILES, a tree whose bound (every draft accepted) cannot reach the best
        predicted speed so far is skipped, and so are those left at `deadline` (the prior puts likely winners first)."""
        fixed = [t for t in self.plan.trees if not t.adaptive]
        timed = [k for k in candidates if parts.get(k) is not None and parts[k].rows]

        def typical(k: Kernels) -> float:
            return statistics.median(parts[k].cycle_s(t) for t in fixed)
        home = min(timed, key=typical) if timed and fixed else candidates[0]
        self.say(f"profiling {len(self.plan.trees)} trees for {sampling.rule.name} at {home.label} on "
                 f"{len(units)} prompts")
        profiles: list[Profile] = []
        for n, tree in enumerate(self.plan.trees):
            if len(profiles) >= MIN_PROFILES and time.perf_counter() > deadline:
                self.say(f"budget: {len(self.plan.trees) - n} trees left unprofiled for {sampling.rule.name}")
                break
            # the bound is measured too: below MIN_PROFILES a close call under load must not skip a tree
            if len(profiles) >= MIN_PROFILES and timed:
                overhead = typical_overhead(parts[home], profiles)
                best = predict({home: parts[home]}, profiles)[0].tokens_per_s
                bounds = [b for k in timed if (b := speed_bound(parts[k], tree, overhead)) is not None]
                if bounds and max(bounds) < best:
                    continue
            profiles.append(profile_tree(gens[home], tree, units, sampling, self.tokens, home, self.meter))
        return profiles

    # --- 4. the finals ----------------------------------------------------------------------------------
    def _arms(self, gens, predictions: dict[str, list[Prediction]]) -> list[Arm]:
        """Each method's finalists (`finals.finalists`) as arms of the finals."""
        fixed = None if STRICT in predictions else self.strict.kernels
        return [Arm(name, p, arm_contender(p.kernels, p.tree, gens[p.kernels], self.methods[name]))
                for name, ps in finalists(predictions, fixed).items() for p in ps]
