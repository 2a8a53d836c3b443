"""Where a draft-head build stands and what is left, read from its run directory; runs nothing.

    python -m eagle.train.status runs/smollm2        (scripts/build_smollm2.sh --status)

The layout is `eagle.train.draft`'s: RUNS/prompts.jsonl (the prompts), RUNS/data (answers in progress
`generating.rank*.part*.pt`, then `sequences.pt`, then feature shards), and one directory per trained head
(`checkpoint.pt`, `progress.json`, `final/`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def _lines(path: Path) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def data_status(data: Path, prompts: int | None) -> list[str]:
    """The answers and features of one data directory."""
    if not (data / "meta.json").exists():
        return ["answers: not started"]
    meta = json.loads((data / "meta.json").read_text())
    out = []
    if (data / "sequences.pt").exists():
        seqs = torch.load(data / "sequences.pt", weights_only=True)
        mask = seqs["loss_mask"]
        out.append(f"answers: done, {len(mask)} sequences, {int(mask.sum()):,} answer positions")
        shard_size = 64
        needed = -(-len(mask) // shard_size)
        have = len(list(data.glob("shard_*.pt")))
        out.append(f"features: {have}/{needed} shards" + (" (done)" if have >= needed else ""))
    else:
        temperatures = meta.get("gen_temperature") or [0.0]
        for part in sorted(data.glob("generating.rank*.part*.pt")):
            saved = torch.load(part, weights_only=False)
            wanted = len(saved["prompts"]) if prompts is None else prompts
            out.append(f"answers at T = {saved['temperature']:g}: {len(saved['rows'])}/{wanted} written")
        if not out:
            out.append(f"answers: none written yet ({len(temperatures)} temperature(s) to answer)")
        out.append("features: after the answers")
    return out


def head_status(directory: Path) -> list[str]:
    """One training run: its step against its schedule, what it spent, and what followed it."""
    name = directory.name
    progress = directory / "progress.json"
    if not progress.exists():
        return [f"{name}: " + ("started, no checkpoint yet" if (directory / "train_log.jsonl").exists()
                                else "not started")]
    p = json.loads(progress.read_text())
    left = p["schedule_steps"] - p["step"]
    rate = p["wall_seconds"] / max(p["step"], 1)
    out = [f"{name}: step {p['step']}/{p['schedule_steps']}, {p['loss_positions']:,} loss positions, "
           f"{p['cpu_seconds'] / 3600:.2f} CPU-hours, {p['wall_seconds'] / 3600:.2f} h of steps"
           + (f"; ~{left * rate / 60:.0f} min left at this pace" if left > 0 else " (schedule done)")]
    final = directory / "final"
    for label, path in (("confidence temperature", final / "confidence.json"),
                        ("held-out scores, greedy", final / "eval_heldout_t0.json"),
                        ("held-out scores, T = 1", final / "eval_heldout_t1.json")):
        out.append(f"  {label}: {'done' if path.exists() else 'to do'}")
    return out


def status(runs: Path) -> str:
    if not runs.exists():
        return f"{runs}: nothing built yet (every stage to do)"
    prompts_file = runs / "prompts.jsonl"
    prompts = _lines(prompts_file) if prompts_file.exists() else None
    lines = [f"build in {runs}", f"prompts: {prompts} written" if prompts is not None else "prompts: to do"]
    for data in sorted({p.parent for p in runs.glob("**/meta.json")}):
        lines += [f"[{data}]"] + ["  " + line for line in data_status(data, prompts)]
    for directory in sorted({p.parent for p in runs.glob("**/train_log.jsonl")} |
                            {p.parent for p in runs.glob("**/progress.json")}):
        lines += head_status(directory)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path)
    print(status(ap.parse_args(argv).runs))


if __name__ == "__main__":
    main()
