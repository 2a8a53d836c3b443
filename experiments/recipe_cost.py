"""What one training step of each recipe costs, side by side on the same stored data: loss positions (draft
step 1) per CPU-second, with windows one sequence each or packed, and the TTT unroll at each depth.

The variants run interleaved, a few steps each per round, from one head and optimizer state per variant,
so that a drift in the machine's speed (another job starting) hits them alike. CPU seconds are this
process's (all its threads); wall seconds are given too. Writes JSON.

    python experiments/recipe_cost.py --target DIR --data-dir runs/smollm2/data --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from eagle.train.data import FIELDS, FeatureStore, Sequences
from eagle.train.draft import PackedEpochs, TTTObjective, batch_indices, build_head, load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--data-dir", required=True, help="an eagle.train.draft data directory (sequences + shards)")
    ap.add_argument("--draft-vocab-size", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--variants", nargs="+", default=["unpacked:5", "packed:5", "packed:2", "packed:1"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="steps per variant per round")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    target = load_target(args.target, torch.device("cpu"))
    seqs = Sequences.load(Path(args.data_dir) / "sequences.pt")
    store = FeatureStore(args.data_dir, seqs)
    if store.missing():
        raise SystemExit(f"{args.data_dir} has feature shards missing: run eagle.train.draft on it first")
    packed = PackedEpochs(seqs.lengths, seqs.seq_len, args.batch, seed=0)
    runs = {}
    for variant in args.variants:
        layout, depth = variant.split(":")
        torch.manual_seed(0)
        head = build_head("eagle3", target, args.draft_vocab_size, {})
        objective = TTTObjective(head, int(depth), 0.8, args.precision == "bf16")
        optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-4)
        runs[variant] = {"layout": layout, "depth": int(depth), "objective": objective, "optimizer": optimizer,
                         "cpu": 0.0, "wall": 0.0, "positions": 0, "steps": 0}
    step = 0
    for _ in range(args.rounds):
        for run in runs.values():
            for k in range(args.steps):
                if run["layout"] == "packed":
                    batch = store.packed(packed.batch(step + k), seqs.seq_len)
                else:
                    batch = store.batch(batch_indices(step + k, len(seqs), args.batch, 0))
                cpu, wall = time.process_time(), time.perf_counter()
                loss, stats = run["objective"](**{name: getattr(batch, name) for name in FIELDS})
                loss.backward()
                run["optimizer"].step()
                run["optimizer"].zero_grad(set_to_none=True)
                run["cpu"] += time.process_time() - cpu
                run["wall"] += time.perf_counter() - wall
                run["positions"] += stats[0].count
                run["steps"] += 1
        step += args.steps
    rows = [{"variant": v, "steps": r["steps"], "loss_positions": r["positions"], "cpu_seconds": r["cpu"],
             "wall_seconds": r["wall"], "loss_positions_per_cpu_s": r["positions"] / r["cpu"],
             "cpu_s_per_step": r["cpu"] / r["steps"]} for v, r in runs.items()]
    out = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "batch": args.batch, "seq_len": seqs.seq_len,
           "precision": args.precision, "rows": rows}
    for row in rows:
        print(json.dumps(row))
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
