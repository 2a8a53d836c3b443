"""Whether a method speculates, read off its calibration, and the line the run prints to say so.

The promise is never to be slower than plain decoding. So a method speculates where its chosen tree ran faster
than the fastest plain decoding on the held-out prompts, paired prompt by prompt (`mars.tuning.search`), and
decodes with that plain decoding otherwise: a method that is off is plain decoding, its output that decoding's
by construction. Where the interval of the paired ratio straddles 1 when the budget ends, the point estimate
decides, and the line says the verdict is uncertain and by how much. A tree set explicitly always speculates.

Why not the adaptive tree as the way to stop speculating: it can choose a plain step, but it still runs the
speculative loop (a verification forward of the root and its bookkeeping per token), measures its costs at
its first call and probes at full depth now and then; it is a candidate like any tree. Speculation off costs
nothing per token.
"""

from __future__ import annotations

from mars.decoding.settings import Speculation
from mars.tuning.record import Calibration


def speculation_of(method: str, record: Calibration, *, forced: bool = False, prompts: int | None = None,
                   why_forced: str = "a tree set explicitly always speculates") -> Speculation:
    """`method`'s verdict from its calibration `record`; `prompts`: the run's count, which widens the predicted
    interval by the run's own prompt-to-prompt spread (None: the calibration's interval as it is)."""
    measured, reference = record.measured, record.reference
    predicted = record.predicted_for(prompts)
    against = (f"{measured.ratio:.2f}x [{measured.low:.2f}, {measured.high:.2f}] the fastest plain decoding "
               f"({reference.label}) over {measured.pairs} held-out {'prompts' if record.batch == 1 else 'batches'},"
               f" paired")
    run = "" if prompts is None else (f"; predicted for this run's {prompts} prompts: {predicted.ratio:.2f}x "
                                      f"[{predicted.low:.2f}, {predicted.high:.2f}]")
    # what a method that is off decodes with: the reference, or where that is our vanilla, ours at the run's plain
    # kernels (within a tie of the reference's, and the plain decoding strict reproduces)
    plain = reference.label if not reference.ours else f"vanilla {record.plain_kernels.label}"
    shared = {"reference": {"label": reference.label, "tokens_per_s": round(reference.tokens_per_s, 2)},
              "plain": plain, "certain": record.certain}
    if forced:
        slower = ", slower than plain decoding" if measured.ratio < 1 else ""
        return Speculation(True, f"speculation forced for {method} ({why_forced}): {record.tree.label} ran at "
                                 f"{against}{slower}{run}", round(predicted.ratio, 3), True,
                           interval=(round(predicted.low, 3), round(predicted.high, 3)), **shared)
    doubt = "" if record.certain else \
        " (UNCERTAIN: the interval straddles 1 and the budget ran out; the point estimate decided)"
    if record.speculate:
        return Speculation(True, f"speculation on for {method}{doubt}: {record.tree.label} at {record.kernels.label} "
                                 f"ran at {against}{run}", round(predicted.ratio, 3),
                           interval=(round(predicted.low, 3), round(predicted.high, 3)), **shared)
    return Speculation(False, f"speculation off for {method}{doubt}: the best tree ({record.tree.label}) ran at "
                              f"{against}; {method} decodes with {plain}, the fastest plain decoding",
                       1.0, interval=(1.0, 1.0), **shared)
