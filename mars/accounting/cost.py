"""The exact distribution a rule emits at a verified position, and what it costs against the target.

At node i with target distribution p and children c_1..c_k tried in draft order (a rule's
`Relaxation`): child j is accepted with probability a_j = 1 if the rule accepts it outright, else
a_j = min(1, ratio_j + tolerance), ratio_j being strict's trial of it
(`mars.rules.rejection`: r_j(c_j) / q_j(c_j); for deterministic drafts q_j(c_j) = 1 and r_j is p with the
earlier children zeroed, renormalised), and after every rejection the rule's fallback distribution f
is drawn (strict's: the last residual). So, given the drafted children, the emitted token's distribution is

    pi(x) = sum_j [prod_{l<j} (1 - a_l)] a_j 1[x = c_j] + [prod_l (1 - a_l)] f(x)

(the derivation and the edge cases: ../shared/notes/exact-relaxation-cost.md). For strict pi = p
exactly (sampled drafts: on average over the draws, see `sampling_cost`); where a rule does not
relax (`Relaxation.active`), its cost is 0 by that identity, without computing pi. Costs per
emitted token: TV(pi, p) and KL(pi || p) when sampling (their mean over sampled outputs estimates
the per-token KL between the rule's and the target's output distributions, by the chain rule);
greedy: whether the token is not the argmax, and the regret log p_1 - log p(x) under the temperature-1 distribution.

This is measurement, not decision: verification never reads it, and a deployment of a rule would not
compute it. The decoding loops therefore defer it out of their timed loop (`mars.verification.verify`'s
`defer_cost`, settled by `mars.accounting.deferred` after the call's `seconds` is taken).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mars.rules.base import ARGMAX, RESIDUAL, Relaxation, TargetView


def fallback_distribution(view: TargetView, relax: Relaxation, nodes: torch.Tensor) -> torch.Tensor:
    """[L, V]: what is drawn at `nodes` [L] once every child was rejected (p at a node without children)."""
    probs = view.probs[nodes]
    has_kids = view.kids[nodes].any(dim=1, keepdim=True)
    if relax.fallback is None:  # strict's everywhere (the common case: one table op instead of three)
        return torch.where(has_kids, view.trial.residual[nodes], probs)
    kind = relax.fallback[nodes]
    dist = torch.where(has_kids & (kind[:, None] == RESIDUAL), view.trial.residual[nodes], probs)
    argmax = torch.zeros_like(probs).scatter_(1, view.top1[nodes][:, None], 1.0)
    return torch.where(has_kids & (kind[:, None] == ARGMAX), argmax, dist)


def acceptance_probabilities(view: TargetView, relax: Relaxation, nodes: torch.Tensor | None = None) -> torch.Tensor:
    """a [L, n] at `nodes` (default all): child j's acceptance probability when it is tried (0 for
    non-children and untested nodes): 1 where the rule accepts it outright, else min(1, the strict
    trial's ratio + the rule's tolerance)."""
    nodes = nodes if nodes is not None else torch.arange(view.tokens.shape[0], device=view.tokens.device)
    trial = view.trial
    tested = trial.testable[nodes]
    if relax.tested is not None:
        tested &= relax.tested[nodes][:, None]
    ratio = trial.ratio[nodes]
    if relax.tolerance is not None:
        ratio = ratio + relax.tolerance[nodes][:, None]
    a = torch.where(tested, ratio.clamp(max=1.0), 0.0)
    return torch.where(relax.outright[nodes] & view.kids[nodes], 1.0, a)


def emitted_distribution(view: TargetView, relax: Relaxation, nodes: torch.Tensor,
                         fallback: torch.Tensor | None = None) -> torch.Tensor:
    """pi [L, V]: the exact distribution of the token emitted at each of `nodes` [L] (sampling), given
    the drafted children. `fallback` [L, V]: `fallback_distribution(view, relax, nodes)` if the caller has it."""
    a = acceptance_probabilities(view, relax, nodes)
    survive = (1.0 - a).cumprod(dim=1)  # [L, n] no child up to j accepted
    reach = torch.cat([torch.ones_like(survive[:, :1]), survive[:, :-1]], dim=1)
    if fallback is None:
        fallback = fallback_distribution(view, relax, nodes)
    pi = fallback * survive[:, -1:]
    return pi.scatter_add(1, view.tokens[None].expand_as(a), reach * a)


@dataclass
class Cost:
    """Per emitted token (one per verified position), on the device."""

    tv: torch.Tensor  # [L] TV(pi, p) (sampling; 0 when greedy)
    kl: torch.Tensor  # [L] KL(pi || p) (sampling; inf where pi puts mass on a token p excludes)
    mismatch: torch.Tensor  # [L] 1.0 where a greedy token is not the argmax
    regret: torch.Tensor  # [L] log p_1 - log p(x), temperature 1 (greedy)
    bound: bool = False  # tv and kl may bound the cost from above (sampled drafts; see `sampling_cost`)


def one_child_marginal(view: TargetView, relax: Relaxation, nodes: torch.Tensor,
                       accepts: torch.Tensor | None = None, fallback: torch.Tensor | None = None) -> torch.Tensor:
    """[L, V]: the emitted distribution at `nodes` [L], each with one child sampled from q, averaged
    over that draw: sum_x q(x) pi_x = q * a + (1 - sum_x q(x) a(x)) f, where a(x) is the chance a
    drafted x is accepted (1 where the rule accepts x outright, else min(1, p(x) / q(x) + tolerance)
    where tested) and f the fallback, the same for every x (strict's residual norm(max(0, p - q))).
    Needs `relax.accepts`; `accepts` [L, V] = `relax.accepts(nodes)` and `fallback` [L, V] =
    `fallback_distribution(view, relax, nodes)` if the caller has them."""
    p, q = view.probs[nodes], view.draft[nodes]
    ratio = p / q.clamp(min=torch.finfo(q.dtype).tiny)  # finite; where q = 0 the product q * a below is 0
    if relax.tolerance is not None:
        ratio = ratio + relax.tolerance[nodes][:, None]
    a = ratio.clamp(max=1.0)
    if relax.tested is not None:
        a = torch.where(relax.tested[nodes][:, None], a, 0.0)
    a = torch.where(relax.accepts(nodes) if accepts is None else accepts, 1.0, a)
    accepted = q * a
    rest = (1.0 - accepted.sum(dim=-1, keepdim=True)).clamp(min=0.0)
    if fallback is None:
        fallback = fallback_distribution(view, relax, nodes)
    return accepted + rest * fallback.nan_to_num(0.0)  # p == q: no residual, rest = 0


def exact_chain(view: TargetView, relax: Relaxation) -> bool:
    """Sampled drafts in a chain (width 1, known on the host) judged by a rule that gives `accepts`:
    the one-child marginal (`one_child_marginal`) is then the exact emitted distribution everywhere."""
    return view.draft is not None and relax.accepts is not None and (view.width or 1) == 1


def cost_bound(view: TargetView, relax: Relaxation, lossless: bool = False) -> bool:
    """Whether `sampling_cost`'s tv and kl bound the cost from above rather than give it (`Cost.bound`),
    known on the host without computing the cost: sampled drafts, except an exact chain."""
    return not lossless and view.draft is not None and not exact_chain(view, relax)


def sampling_cost(view: TargetView, relax: Relaxation, nodes: torch.Tensor, lossless: bool = False) -> Cost:
    """TV and KL of each of `nodes`' emitted distribution against p; 0 where the rule is inactive,
    and without computing anything for an exact rule (strict).

    Deterministic drafts: exact, TV(pi, p) and KL(pi || p). Sampled drafts (`view.draft`): what the
    output pays is the distance of pi's *average over the draws* from p.
    - One child per node: the average has a closed form (`one_child_marginal`), and each position
      reports its exact TV and KL from p, wherever the rule could relax whatever was drawn.
    - Several children: it sums over every ordered draw and has no closed form. Strict's pi_strict,
      for the same draws, averages to p exactly; TV and KL are jointly convex, so
      TV(E[pi], p) = TV(E[pi], E[pi_strict]) <= E[TV(pi, pi_strict)], and likewise for KL. Such a
      position reports TV(pi, pi_strict) and KL(pi || pi_strict) for its own draws: an unbiased
      estimate of an upper bound on the cost, 0 wherever the rule acts as strict.
    `Cost.bound` (known on the host, no sync): the tree has a node with several children, or the rule
    gives no `accepts` (then every sampled position reports the bound).

    Every verified position of a relaxing rule is accounted (strict's costs nothing), so it computes
    each [L, V] table once: the fallback is shared with strict's where the rule keeps strict's, and
    a chain (width 1, known on the host) needs neither given-the-draw distribution.
    """
    zero = torch.zeros(nodes.shape[0], device=nodes.device)
    if lossless:
        return Cost(zero, zero, zero, zero)
    sampled = view.draft is not None
    fallback = fallback_distribution(view, relax, nodes)
    exact_one = sampled and relax.accepts is not None
    chain = exact_chain(view, relax)
    if exact_one:
        accepts = relax.accepts(nodes)
        marginal = one_child_marginal(view, relax, nodes, accepts, fallback)
        could = relax.active(nodes, accepts.any(dim=-1))  # for some draw of the child
    if chain:  # every node has one child or none; a node without children emits p (fallback there is p)
        pi, reference = marginal, view.probs[nodes]
        active = could & view.kids[nodes].any(dim=1)
        log_reference = view.logits[nodes].log_softmax(dim=-1)
    else:
        pi = emitted_distribution(view, relax, nodes, fallback)
        if not sampled:
            reference = view.probs[nodes]
        else:
            strict = Relaxation.none(view)
            same_fallback = relax.fallback is None  # strict's residual, the same table
            reference = emitted_distribution(view, strict, nodes,
                                             fallback if same_fallback else fallback_distribution(view, strict, nodes))
        active = relax.active(nodes)
        if exact_one:
            one = view.kids[nodes].sum(dim=1) == 1
            pi = torch.where(one[:, None], marginal, pi)
            reference = torch.where(one[:, None], view.probs[nodes], reference)
            active = torch.where(one, could, active)
        log_reference = reference.log()
    tv = 0.5 * (pi - reference).abs().sum(dim=-1)
    kl = torch.where(pi > 0, pi * (pi.log() - log_reference), 0.0).sum(dim=-1)
    return Cost(torch.where(active, tv, 0.0), torch.where(active, kl, 0.0), zero, zero, cost_bound(view, relax))


def greedy_cost(view: TargetView, nodes: torch.Tensor, emitted: torch.Tensor, lossless: bool = False) -> Cost:
    """Whether each emitted token [L] (after `nodes` [L]) is not the argmax, and its regret (nothing
    computed for an exact rule: it always emits the argmax)."""
    if lossless:
        zero = torch.zeros(nodes.shape[0], device=nodes.device)
        return Cost(zero, zero, zero, zero)
    logp = view.logits[nodes].log_softmax(dim=-1)
    regret = logp.max(dim=-1).values - logp.gather(1, emitted[:, None])[:, 0]
    mismatch = (emitted != view.top1[nodes]).float()
    zero = torch.zeros_like(regret)
    return Cost(zero, zero, mismatch, torch.where(mismatch > 0, regret, 0.0))

