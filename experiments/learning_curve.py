"""The draft head's learning curve: held-out agreement and offline tau of finished heads against the loss
positions (and CPU time) each was trained on, with a fit that says where more training stops paying.

Each point is a finished model (its own schedule, cooled down at its end): a directory that
`eagle.train.draft` wrote (`final/` and `progress.json`), or an exported head with its
`training_summary.json` (what `scripts/gpu_bundle_smollm2.sh` brings back from a GPU). Points already
evaluated (an earlier curve's JSON, same held-out prompts and tree) join with --include, so the fit spans
every run. Per point, on the 64 held-out chat prompts:
  - top-1 agreement and sum min(p, q) at draft steps 1-5 on the target's greedy and T = 1 answers
    (`eagle.train.evaluate.evaluate_head`, teacher-forced along the head's own unroll);
  - the offline tau of strict greedy decoding at one fixed tree (`offline_tau`), the same for every point;
  - with --online N, strict greedy decoding itself on the first N prompts at that tree (tau, against the
    offline figure: the stored features are bf16 in training, float32 here, and decoding computes the
    target in pieces).
The fit: agreement(N) = A - B * N^-alpha over loss positions N (least squares, alpha on a grid); it names
the N where one more doubling adds less than 0.01 and what it predicts beyond the last point.

    python experiments/learning_curve.py --target DIR --runs R1 R2 ... --out data/models/smollm2/learning_curve.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eagle import load_draft
from eagle.train.data import Sequences
from eagle.train.evaluate import continuation_data, evaluate_head, offline_tau

HELDOUT = "data/prompts/smollm2_heldout.jsonl"


def heldout_answers(target, tokenizer, prompts: str, cache: Path, temperature: float, count: int,
                    seq_len: int) -> Sequences:
    if cache.exists():
        return Sequences.load(cache)
    seqs = continuation_data(target, tokenizer, prompts, seq_len, count, temperature)
    cache.parent.mkdir(parents=True, exist_ok=True)
    seqs.save(cache)
    return seqs


def online_tau(target, head, tokenizer, seqs: Sequences, count: int, tree: tuple[int, int, int]) -> dict:
    """Strict greedy speculative decoding of the first `count` held-out prompts at the fixed tree, as long as
    their greedy answers: tau per cycle, and whether it emitted the answers."""
    from mars import SpeculativeGenerator
    from mars.decoding.settings import TreeShape

    depth, branching, total = tree
    generator = SpeculativeGenerator(target, head, TreeShape(total, depth, branching))
    accepted, identical = [], 0
    for n in range(min(count, len(seqs))):
        length = int(seqs.lengths[n])
        start = int(seqs.loss_mask[n].nonzero()[0]) + 1
        out = generator.generate(seqs.input_ids[n : n + 1, :start], max_new_tokens=length - start)
        identical += out.tokens == seqs.input_ids[n, start:length].tolist()
        accepted += out.accept_lengths
    return {"tau": (len(accepted) + sum(accepted)) / max(len(accepted), 1), "cycles": len(accepted),
            "identical": identical, "prompts": min(count, len(seqs))}


def fit(points: list[tuple[float, float]]) -> dict:
    """agreement = A - B * N^-alpha, least squares over (N, agreement), alpha on a grid."""
    best = None
    for alpha in [0.05 * k for k in range(1, 41)]:
        xs = torch.tensor([n ** -alpha for n, _ in points], dtype=torch.float64)
        ys = torch.tensor([a for _, a in points], dtype=torch.float64)
        design = torch.stack([torch.ones_like(xs), -xs], dim=1)
        solution = torch.linalg.lstsq(design, ys[:, None]).solution[:, 0]
        error = float(((design @ solution - ys) ** 2).sum())
        if best is None or error < best[0]:
            best = (error, alpha, float(solution[0]), float(solution[1]))
    _, alpha, a, b = best

    def predict(n: float) -> float:
        return a - b * n ** -alpha

    # one more doubling adds b * N^-alpha * (1 - 2^-alpha); below 0.01 from N_stop on
    gain = b * (1 - 2 ** -alpha)
    n_stop = (gain / 0.01) ** (1 / alpha) if gain > 0 else 0.0
    last = max(n for n, _ in points)
    return {"form": "A - B * N^-alpha", "A": a, "B": b, "alpha": alpha, "residual_sq": best[0],
            "doubling_gain_below_0.01_from_loss_positions": n_stop,
            "predicted": {f"{k}x_last": predict(k * last) for k in (2, 4, 16)}}


def measure_point(run: Path, target, tokenizer, answers: dict[int, Sequences], tree: tuple[int, ...],
                  online: int) -> dict:
    """One point of the curve: a finished run's progress and summary, its head's held-out agreement at T = 0
    and 1, its offline tau at the fixed tree, and with `online` > 0 decoding itself on that many prompts."""
    final = run / "final" if (run / "final").is_dir() else run  # a run directory, or an exported head
    summary = json.loads((final / "training_summary.json").read_text())
    progress = json.loads((run / "progress.json").read_text()) if (run / "progress.json").exists() else \
        {k: summary[k] for k in ("step", "schedule_steps", "loss_positions", "cpu_seconds", "wall_seconds")}
    if progress["step"] < progress["schedule_steps"]:
        raise SystemExit(f"{run} stopped at step {progress['step']} of {progress['schedule_steps']}: a point of "
                         "the curve must be a finished model (its learning rate cooled down)")
    head = load_draft(final, target).float()
    point = {"run": str(run), **progress, "summary": summary}
    for t, seqs in answers.items():
        report = evaluate_head(head, target, seqs, steps=5)
        point[f"t{t}"] = {"top1": [s["acc"] for s in report["steps"]],
                          "sum_min_pq": [s["sample_accept"] for s in report["steps"]],
                          "positions": report["steps"][0]["positions"]}
    point["offline_tau"] = {k: v for k, v in offline_tau(head, target, answers[0], *tree).items()
                            if k != "accept_lengths"}
    if online:  # decoding itself, and the replay on the same prompts (the gap between the two)
        point["online_tau"] = online_tau(target, head, tokenizer, answers[0], online, tree)
        first = answers[0].select(torch.arange(min(online, len(answers[0]))))
        point["offline_tau_first_n"] = {k: v for k, v in offline_tau(head, target, first, *tree).items()
                                        if k != "accept_lengths"}
    return point


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--runs", nargs="*", default=[], help="training run directories (final/ and progress.json, "
                    "or an exported head with training_summary.json)")
    ap.add_argument("--include", nargs="*", default=[], help="earlier curves' JSON whose points join this one")
    ap.add_argument("--tree", default="5:4:16", help="DEPTH:BRANCHING:TOTAL of the offline tau's fixed tree")
    ap.add_argument("--prompts", default=HELDOUT, help="the held-out prompts (JSONL)")
    ap.add_argument("--count", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--online", type=int, default=0, help="also decode this many prompts online at the tree")
    ap.add_argument("--cache-dir", default="runs/smollm2/heldout", help="the held-out answers, made once")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    cache = Path(args.cache_dir)
    answers = {t: heldout_answers(target, tokenizer, args.prompts, cache / f"heldout_t{t}.pt", t, args.count,
                                  args.seq_len)
               for t in (0, 1)}
    tree = tuple(int(x) for x in args.tree.split(":"))
    points = []
    for run in args.runs:
        point = measure_point(Path(run), target, tokenizer, answers, tree, args.online)
        print(json.dumps({k: point[k] for k in ("run", "step", "loss_positions", "t0", "offline_tau")}), flush=True)
        points.append(point)
    for earlier in args.include:
        found = json.loads(Path(earlier).read_text())
        if found["heldout"] != args.prompts or list(found["tree"].values()) != list(tree):
            raise SystemExit(f"{earlier} was measured on {found['heldout']} at tree {found['tree']}, not on "
                             f"{args.prompts} at {tree}: its points are not comparable")
        points += found["points"]
    points.sort(key=lambda p: p["loss_positions"])
    curve = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
             "heldout": args.prompts, "tree": dict(zip(("depth", "branching", "total_tokens"), tree, strict=True)),
             "points": points}
    if len(points) >= 3:
        curve["fit_top1_step1_greedy"] = fit([(p["loss_positions"], p["t0"]["top1"][0]) for p in points])
    Path(args.out).write_text(json.dumps(curve, indent=2) + "\n")
    plot(curve, Path(args.out).with_suffix(".png"))


def plot(curve: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = curve["points"]
    xs = [p["loss_positions"] for p in points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for step in range(5):
        left.plot(xs, [p["t0"]["top1"][step] for p in points], "o-", label=f"top-1, draft step {step + 1}")
    left.plot(xs, [p["t1"]["sum_min_pq"][0] for p in points], "s--", label="sum min(p, q), step 1, T = 1")
    if "fit_top1_step1_greedy" in curve:
        f = curve["fit_top1_step1_greedy"]
        grid = [xs[0] * (16 * xs[-1] / xs[0]) ** (k / 50) for k in range(51)]
        left.plot(grid, [f["A"] - f["B"] * n ** -f["alpha"] for n in grid], ":", color="gray", label="fit, step 1")
    left.set(xscale="log", xlabel="loss positions (draft step 1)", ylabel="held-out agreement")
    left.legend(fontsize=7)
    right.plot(xs, [p["offline_tau"]["tau"] for p in points], "o-", label="offline tau, strict greedy")
    right.set(xscale="log", xlabel="loss positions (draft step 1)", ylabel="tau at the fixed tree")
    right.legend(fontsize=7)
    fig.suptitle(f"SmolLM2-135M-Instruct head, 64 held-out prompts ({curve['cpu_capability']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
