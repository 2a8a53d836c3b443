"""The calibration's parts, one scenario each: paired timing and its interval (mars.tuning.pairs), the finals under
scripted bursts of load (mars.tuning.finals), the cost model (mars.tuning.cost_model), the typed record
(mars.tuning.record) and the verdict (mars.tuning.verdict). Timings here come from a scripted clock, never
from the machine: the decisions are the production ones, their inputs fixed."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace

import pytest

from mars.decoding.settings import Kernels, TreeShape
from mars.tuning import record as records
from mars.tuning.cost_model import Parts, Prediction, Profile, predict, row_grid, speed_bound
from mars.tuning.finals import Arm, Finals, finalists
from mars.tuning.pairs import Contender, Estimate, estimate, t_quantile, time_block
from mars.tuning.record import Calibration, PlainSpeed
from mars.tuning.verdict import speculation_of

F32 = Kernels("float32", False, False)
BF16 = Kernels("bfloat16", True, True)
CHAIN, DEEP = TreeShape(6, 6, 1, drafting="topk"), TreeShape(8, 8, 1, drafting="topk")


# --- paired timing ------------------------------------------------------------------------------------

def test_the_trimmed_estimate_drops_the_outer_fifth_and_its_interval_follows_the_winsorised_spread():
    logs = [0.50, 0.52, 0.48, 0.51, 0.49, 0.53, 0.47, 0.50, 0.51, -0.40]  # one pair hit by a burst
    e = estimate(logs)
    kept = sorted(logs)[2:8]  # 20% of 10 dropped at each end
    assert e.ratio == pytest.approx(math.exp(sum(kept) / 6))
    low, high = sorted(logs)[2], sorted(logs)[7]
    winsorised = [min(max(x, low), high) for x in logs]
    mean = sum(winsorised) / 10
    sd = math.sqrt(sum((x - mean) ** 2 for x in winsorised) / 9)
    assert e.log_sd == pytest.approx(sd) and e.log_se == pytest.approx(sd / (0.6 * math.sqrt(10)))
    assert e.low == pytest.approx(math.exp(math.log(e.ratio) - t_quantile(5) * e.log_se))
    assert e.decided and e.low > 1.5  # the burst's pair did not drag it toward 1
    assert estimate([0.1]) is None
    assert not estimate([0.3, -0.3, 0.2, -0.2]).decided  # straddles 1


def test_a_block_rotates_its_order_so_each_contender_goes_first_as_often():
    calls: list[str] = []

    def contender(label: str) -> Contender:
        return Contender(label, lambda unit, seed, tokens: calls.append(label) or (tokens, 1.0))

    group = [contender(x) for x in "abc"]
    for index in range(6):
        time_block(group, [], index, 8)
    firsts = [calls[i] for i in range(0, 18, 3)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    assert all(len(c.rates) == 6 and c.speed == 8.0 for c in group)


class ScriptedLoad:
    """`mars.accounting.timing.ForeignLoad` as a script: the calls numbered in `busy` (0-based, in timing order)
    were contended by another process; `wait_quiet` is counted, not waited."""

    def __init__(self, busy: set[int]):
        self.busy, self.calls, self.waits = busy, 0, 0

    def sample(self):
        return self.calls

    def seconds(self, before, after) -> float:
        self.calls += 1
        return 1.0 if self.calls - 1 in self.busy else 0.0

    @staticmethod
    def contended(foreign: float, wall: float) -> bool:
        return foreign > 0.0

    def wait_quiet(self) -> bool:
        self.waits += 1
        return True


def test_a_call_another_process_contended_is_timed_again_once_quiet():
    slowed = iter([4.0, 1.0, 1.0, 1.0])  # the first call ran under a burst
    plain = Contender("vanilla", lambda unit, seed, tokens: (tokens, next(slowed)))
    tree = Contender("float32 6/6/1", lambda unit, seed, tokens: (tokens, 0.5))
    load = ScriptedLoad({0})
    time_block([plain, tree], [], 0, 8, load)
    assert plain.retimed == 1 and load.waits == 1 and plain.rates == {0: 8.0}  # the quiet timing counts
    assert tree.retimed == 0 and tree.rates == {0: 16.0}
    stubborn = ScriptedLoad(set(range(10)))  # never quiet: timed RETIMES + 1 times, then kept and counted
    always = Contender("vanilla", lambda unit, seed, tokens: (tokens, 1.0))
    time_block([always], [], 0, 8, stubborn)
    assert always.retimed == 3 and always.contended == 1 and always.rates == {0: 8.0}


def test_t_quantiles_are_close_to_students():
    for df, t in ((3, 2.353), (5, 2.015), (10, 1.812), (30, 1.697)):
        assert t_quantile(df) == pytest.approx(t, rel=0.012)


# --- the finals under scripted load -----------------------------------------------------------------------

class ScriptedClock:
    """A virtual clock: each call takes tokens / speed seconds, times the prompt's own factor (shared by every
    contender: how well the head drafts that prompt), times LOAD while a burst of background work covers the
    call's start. Calls advance the clock; nothing is measured."""

    LOAD = 2.5  # a one-thread burst on 2 cores slows a 2-thread decode about this much

    def __init__(self, bursts: list[tuple[float, float]], seed: int = 0):
        self.now, self.bursts = 0.0, bursts
        rng = random.Random(seed)
        self.prompt = [math.exp(rng.gauss(0.0, 0.1)) for _ in range(64)]

    def contender(self, label: str, tokens_per_s: float, speculates: bool) -> Contender:
        def timed(unit, index: int, tokens: int) -> tuple[int, float]:
            seconds = tokens / tokens_per_s / (self.prompt[index] if speculates else 1.0)
            if any(start <= self.now < end for start, end in self.bursts):
                seconds *= self.LOAD
            self.now += seconds
            return tokens, seconds
        return Contender(label, timed)


def arms_of(clock: ScriptedClock, speeds: dict[TreeShape, float]) -> list[Arm]:
    return [Arm("strict", Prediction(F32, tree, speed, 0.03, 4.0),
                clock.contender(f"float32 {tree.label}", speed, True)) for tree, speed in speeds.items()]


def new_design(bursts, reference_speed: float, speeds: dict[TreeShape, float]) -> tuple[TreeShape, Estimate]:
    """The finals as calibration runs them: rotated blocks, paired ratios, a trimmed mean."""
    clock = ScriptedClock(bursts)
    finals = Finals(clock.contender("vanilla", reference_speed, False), arms_of(clock, speeds))
    finals.run([[]] * 20, 0, 64, deadline=math.inf)
    chosen = finals.choose("strict")
    return chosen.prediction.tree, finals.ratio(chosen)


def old_design(bursts, reference_speed: float, speeds: dict[TreeShape, float]) -> tuple[TreeShape, float]:
    """How calibration timed before (a round timed every plain configuration on each unit, then every arm,
    `Halving._round`, and compared totals): the control that shows the scenario can mislead a verdict."""
    clock = ScriptedClock(bursts)
    reference = clock.contender("vanilla", reference_speed, False)
    arms = arms_of(clock, speeds)
    for c in [reference, *(a.contender for a in arms)]:
        for index in range(20):
            tokens, seconds = c.time([], index, 64)
            c.tokens, c.seconds = c.tokens + tokens, c.seconds + seconds
    best = max(arms, key=lambda a: a.contender.speed)
    return best.prediction.tree, best.contender.speed / reference.speed


def test_a_burst_on_one_arm_leaves_the_tree_and_the_verdict_of_the_quiet_clock():
    """A chain 1.35x the plain decoding, a deeper chain 1.2x: quiet, both designs speculate at the first. A burst that
    lands on the first arm's stretch of the old design's round (its 16th to 28th second) makes it pick the slower
    tree; in rotated blocks the same burst covers whole blocks (reference and arms alike), and its edges make a
    pair or two outliers, which the trimmed mean drops."""
    speeds = {CHAIN: 80.0 * 1.35, DEEP: 80.0 * 1.2}
    quiet_tree, quiet = new_design([], 80.0, speeds)
    assert quiet_tree == CHAIN and quiet.decided and quiet.low > 1.0
    assert old_design([], 80.0, speeds)[0] == CHAIN
    burst = [(16.0, 28.0)]
    tree, loaded = new_design(burst, 80.0, speeds)
    assert tree == quiet_tree and loaded.decided and loaded.low > 1.0
    assert loaded.ratio == pytest.approx(quiet.ratio, rel=0.08)
    assert old_design(burst, 80.0, speeds)[0] == DEEP  # the old design's tree followed the burst


def test_a_burst_on_the_arms_leaves_speculation_on():
    """The same pair of trees, a burst over both arms' stretch of the old design (from its 16th second on, while
    the arms decode): the old design's verdict turns off, the blocks' stays on at the same tree."""
    speeds = {CHAIN: 80.0 * 1.35, DEEP: 80.0 * 1.2}
    burst = [(16.0, 80.0)]
    tree, loaded = new_design(burst, 80.0, speeds)
    assert tree == CHAIN and loaded.decided and loaded.low > 1.0
    assert old_design(burst, 80.0, speeds)[1] < 1.0


def test_a_burst_on_the_plain_decoding_leaves_a_slower_tree_off():
    """A tree truly 0.9x plain decoding: a burst on the reference's stretch of the old design makes it look faster
    (on, and wrong); rotated blocks keep it off."""
    speeds = {CHAIN: 80.0 * 0.9}
    _, quiet = new_design([], 80.0, speeds)
    assert quiet.decided and quiet.high < 1.0
    _, loaded = new_design([(2.0, 12.0)], 80.0, speeds)
    assert loaded.decided and loaded.high < 1.0
    assert old_design([(2.0, 12.0)], 80.0, speeds)[1] > 1.0


def test_a_rules_close_second_goes_to_the_finals_where_stricts_finalists_share_their_kernels():
    """Where strict's finalists share one kernel set, a rule whose two best trees there the model cannot separate
    (within 10%) times both, as strict does; a third within the margin, a tree predicted clearly slower, and one
    at kernels strict does not take stay out. Where strict's finalists span two kernel sets, each method keeps
    two arms: a rule's best at each."""
    SHALLOW, WIDE = TreeShape(4, 4, 1, drafting="topk"), TreeShape(20, 6, 5, drafting="topk")

    def at(kernels, tree, speed):
        return Prediction(kernels, tree, speed, 0.03, 4.0)

    rules = {"mars@0.9": [at(BF16, CHAIN, 270.2), at(BF16, DEEP, 268.8), at(F32, DEEP, 268.0),
                          at(BF16, SHALLOW, 250.0), at(F32, CHAIN, 245.0)],
             "mars@0.8": [at(BF16, DEEP, 322.6), at(BF16, WIDE, 280.0), at(BF16, CHAIN, 270.0), at(F32, DEEP, 260.0)]}
    chosen = finalists({"strict": [at(BF16, CHAIN, 270.0), at(BF16, DEEP, 254.0), at(F32, CHAIN, 240.0)], **rules})
    assert [p.tree for p in chosen["strict"]] == [CHAIN, DEEP]
    assert [(p.kernels, p.tree) for p in chosen["mars@0.9"]] == [(BF16, CHAIN), (BF16, DEEP)]
    assert [p.tree for p in chosen["mars@0.8"]] == [DEEP]  # 280 is 13% under 322.6: the model separates them
    spanning = finalists({"strict": [at(BF16, CHAIN, 270.0), at(F32, CHAIN, 250.0)], **rules})
    assert [(p.kernels, p.tree) for p in spanning["mars@0.9"]] == [(BF16, CHAIN), (F32, DEEP)]
    # strict's record decided the kernels: a rule timed alone takes its close ones there
    alone = finalists({"mars@0.9": rules["mars@0.9"]}, F32)
    assert [(p.kernels, p.tree) for p in alone["mars@0.9"]] == [(F32, DEEP), (F32, CHAIN)]


def test_a_kernel_set_stops_where_a_method_runs_clearly_slower_there_and_arms_stop_within_their_method():
    clock = ScriptedClock([])
    reference = clock.contender("vanilla", 80.0, False)

    def arm(method: str, kernels: Kernels, tree: TreeShape, speed: float) -> Arm:
        return Arm(method, Prediction(kernels, tree, speed, 0.03, 4.0),
                   clock.contender(f"{method} {kernels.label} {tree.label}", speed, True))

    arms = [arm("strict", F32, CHAIN, 150.0), arm("strict", BF16, CHAIN, 148.0),  # strict: a tie between kernels
            arm("mars", F32, DEEP, 200.0), arm("mars", BF16, DEEP, 170.0)]  # MARS: clearly faster at float32
    finals = Finals(reference, arms)
    finals.run([[]] * 20, 0, 64, deadline=math.inf)
    assert finals.kernels() == F32
    assert {a.kernels for a in finals.racing} == {F32}  # bfloat16 stopped: MARS clearly slower there
    assert finals.choose("mars").prediction.tree == DEEP and finals.choose("strict").kernels == F32
    assert finals.blocks < 20  # settled before the units ran out
    # a tie within a method and kernel set goes to the cheaper cycle
    clock = ScriptedClock([])
    tied = Finals(clock.contender("vanilla", 80.0, False), [arm("strict", F32, DEEP, 150.0),
                                                            arm("strict", F32, CHAIN, 149.0)])
    tied.run([[]] * 8, 0, 64, deadline=math.inf)
    assert tied.choose("strict").prediction.tree == CHAIN


def test_the_finals_stop_at_the_deadline_after_their_floor_of_blocks():
    from mars.tuning.finals import FLOOR

    clock = ScriptedClock([])
    finals = Finals(clock.contender("vanilla", 80.0, False), arms_of(clock, {CHAIN: 81.0}))  # undecidable: ~1.0x
    said: list[str] = []
    finals.run([[]] * 20, 0, 64, deadline=-math.inf, say=said.append)
    assert finals.blocks == FLOOR and said == [f"budget spent after {FLOOR} paired prompts"]


# --- the cost model ------------------------------------------------------------------------------------

def test_a_prediction_is_the_measured_cycle_where_the_profile_ran_and_the_parts_plus_its_overhead_elsewhere():
    home = Parts(F32, 0.010, {CHAIN.label: 0.5, DEEP.label: 0.7}, (7, 9), (1.4, 1.6))
    other = Parts(BF16, 0.012, {CHAIN.label: 0.4, DEEP.label: 0.6}, (7, 9), (1.1, 1.2))
    profiles = [Profile(CHAIN, 4.0, 30, (4.0,), {}, {}, 0.025, F32), Profile(DEEP, 5.0, 24, (5.0,), {}, {}, 0.030, F32)]
    found = {(p.kernels, p.tree): p for p in predict({F32: home, BF16: other}, profiles)}
    assert found[F32, CHAIN].tokens_per_s == pytest.approx(4.0 / 0.025)  # as measured
    overhead = 0.025 - 0.010 * (0.5 + 1.4)
    assert found[BF16, CHAIN].cycle_s == pytest.approx(0.012 * (0.4 + 1.1) + overhead)
    ranked = predict({F32: home, BF16: other}, profiles)
    assert [p.tokens_per_s for p in ranked] == sorted((p.tokens_per_s for p in ranked), reverse=True)
    # forwards between the rows timed are linear; a bound assumes every draft accepted
    assert home.forward_steps(8) == pytest.approx(1.5) and home.forward_steps(1) == pytest.approx(1.0)
    assert speed_bound(home, DEEP, 0.005) == pytest.approx(9 / (0.010 * (0.7 + 1.6) + 0.005))
    assert row_grid([CHAIN, TreeShape(60, 6, 10)]) == (7, 9, 17, 33, 61)


# --- the record and the verdict ------------------------------------------------------------------------

def calibration(measured: Estimate, **changes) -> Calibration:
    reference = PlainSpeed("generate@bfloat16+avx2", None, 80.0, 1.0)
    record = Calibration(
        method="strict", rule={"name": "strict"}, sampling={"temperature": 0.0, "top_p": 1.0, "top_k": 0}, batch=1,
        max_new_tokens=64, kernels=F32, tree=CHAIN, plain_kernels=F32, reference=reference,
        plains=(reference, PlainSpeed("vanilla float32", F32, 76.0, 0.95)), identical={F32.label: True},
        parts=(Parts(F32, 0.01, {CHAIN.label: 0.5}, (7,), (1.4,)),),
        profiles=(Profile(CHAIN, 4.0, 30, (4.0,), {1: 0.9}, {0: 1.0}, 0.025, F32),),
        predictions=(Prediction(F32, CHAIN, 160.0, 0.025, 4.0),), finals={"float32 6/6/1": measured},
        measured=measured, tied=(), speculate=measured.ratio >= 1.0, certain=measured.decided, forced=False,
        seconds=40.0, budget_s=57.0, machine=records.machine())
    return replace(record, **changes)


def test_the_record_round_trips_through_json_and_an_old_record_is_refused(tmp_path):
    record = calibration(Estimate(1.8, 1.6, 2.0, 16, 0.06, 0.2))
    assert Calibration.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"kernels": vars(F32), "tree": vars(CHAIN), "speedup_over_reference": 1.2}))
    with pytest.raises(records.SchemaError, match="schema 1, not 2"):
        records.load(path)
    path.write_text(json.dumps(record.to_dict()))
    assert records.load(path).cached and records.load(path).cache == str(path)


def test_the_prediction_for_a_run_widens_the_interval_by_the_runs_own_spread_and_the_prior():
    record = calibration(Estimate(1.8, 1.7, 1.9, 16, 0.03, 0.12))
    alone = record.predicted_for(None)
    run = record.predicted_for(12)
    assert alone.ratio == run.ratio == 1.8
    assert run.low < alone.low <= 1.7 and run.high > alone.high >= 1.9  # the run's 12 prompts vary too
    sd = math.sqrt((16 * 0.12 ** 2 + records.PRIOR_PAIRS * records.PRIOR_SD ** 2) / (16 + records.PRIOR_PAIRS))
    # each a trimmed mean (16 pairs keep 10, 12 prompts keep 8): its error is the winsorised spread over 0.625 sqrt(16)
    # and 0.667 sqrt(12), not over sqrt(n) (which made a run's interval ~1.5x too narrow)
    assert run.log_se == pytest.approx(math.hypot(sd / (0.625 * 4), sd / (8 / 12 * math.sqrt(12))))
    # its t quantile has the two errors' Welch-Satterthwaite degrees of freedom (of 9 and 7): 15, not 9 alone
    assert math.log(run.high / run.ratio) / run.log_se == pytest.approx(t_quantile(15))


def test_the_verdict_says_on_off_uncertain_or_forced_and_names_what_an_off_method_decodes_with():
    on = speculation_of("strict", calibration(Estimate(1.8, 1.6, 2.0, 16, 0.06, 0.2)), prompts=12)
    assert on.speculate and on.certain and on.state == "on" and on.plain == "generate@bfloat16+avx2"
    assert on.reason.startswith("speculation on for strict: 6/6/1 at float32 ran at 1.80x [1.60, 2.00]")
    assert "predicted for this run's 12 prompts" in on.reason and on.interval[0] < 1.6
    off = speculation_of("strict", calibration(Estimate(0.9, 0.85, 0.95, 16, 0.03, 0.1)))
    assert not off.speculate and off.predicted == 1.0
    assert off.reason.endswith("strict decodes with generate@bfloat16+avx2, the fastest plain decoding")
    unsure = speculation_of("mars", calibration(Estimate(1.05, 0.95, 1.16, 6, 0.05, 0.12)))
    assert unsure.speculate and not unsure.certain and "UNCERTAIN" in unsure.reason
    forced = speculation_of("strict", calibration(Estimate(0.9, 0.85, 0.95, 16, 0.03, 0.1)), forced=True)
    assert forced.speculate and forced.state == "forced" and "slower than plain decoding" in forced.reason
