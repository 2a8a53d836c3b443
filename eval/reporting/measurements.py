"""Measurement records: one JSON file per measurement under `benchmarks/records/<date>-<cpu class>/`, the one
place the figures the pages quote come from (`eval.reporting.pages` renders them into the pages).

A record (`Measurement`, schema 1) holds what was measured and how to measure it again: `kind` (what table it
feeds, e.g. "embedded-benchmark"), `what` (one sentence), `command`, `commit`, `date`, `machine` (the CPU's name,
`torch.backends.cpu.get_cpu_capability()`, cores, and its class: "avx2", "epyc-avx512", "xeon-amx", or a GPU's
name), `versions` (python, torch, transformers), and `figures`, whose shape the kind fixes (`figures_of_run` for
an `eval.run` summary: per method its speed, its speedups and tau).

Make one from a run's summary:

    python -m eval.reporting.measurements SUMMARY.json --kind embedded-benchmark \\
        --command "scripts/bench_embedded.sh OUT num_prompts=64 max_new_tokens=128" --what "..."

It is written to benchmarks/records/<today>-<cpu class>/<kind>_<commit>.json unless --out says otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from eval.config.paths import REPO_ROOT

SCHEMA = 1
RECORDS = REPO_ROOT / "benchmarks" / "records"
# what a run's summary keeps per method in a record (the rest stays in the run's directory)
METHOD_FIGURES = ("tokens_per_s", "speedup", "speedup_vs_fastest", "speedup_vs_fastest_paired", "tau",
                  "relaxed_frac", "speculation", "predicted_speedup_vs_fastest", "predicted_interval", "questions")


@dataclass(frozen=True, kw_only=True)
class Measurement:
    kind: str
    what: str
    command: str
    commit: str
    date: str  # ISO: the day the figures were measured, or the minute (2026-12-02T08:10), later on that day
    machine: dict  # cpu, capability, cores, class
    versions: dict  # python, torch, transformers
    figures: dict
    path: str = ""  # the file it was read from (not written)

    @property
    def cpu_class(self) -> str:
        return self.machine.get("class", "")

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, **{k: v for k, v in asdict(self).items() if k != "path"}}

    @classmethod
    def from_dict(cls, d: dict, path: str = "") -> Measurement:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"{path or 'record'}: schema {d.get('schema')!r}, not {SCHEMA}: not a measurement "
                             "record of this format (benchmarks/records/README.md)")
        missing = [k for k in ("kind", "what", "command", "commit", "date", "machine", "versions", "figures")
                   if k not in d]
        if missing:
            raise ValueError(f"{path or 'record'}: missing {', '.join(missing)} (benchmarks/records/README.md)")
        return cls(**{k: d[k] for k in ("kind", "what", "command", "commit", "date", "machine", "versions",
                                        "figures")}, path=path)


def load_all(root: Path = RECORDS) -> list[Measurement]:
    """Every record of this format under `root` (JSON files with "schema": 1; other JSON there is raw data)."""
    found = []
    for path in sorted(root.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and data.get("schema") == SCHEMA and "kind" in data:
            found.append(Measurement.from_dict(data, str(path)))
    return found


def newest(records: list[Measurement], kind: str, cpu_class: str | None = None) -> Measurement:
    """The newest record of `kind` (and CPU class): by date (a minute given sorts after its day alone, and after
    an earlier minute), then by path."""
    mine = [r for r in records if r.kind == kind and (cpu_class is None or r.cpu_class == cpu_class)]
    if not mine:
        where = f" on {cpu_class}" if cpu_class else ""
        raise LookupError(f"no measurement record of kind {kind!r}{where} under benchmarks/records/")
    return max(mine, key=lambda r: (r.date, r.path))


def cpu_class() -> str:
    """This CPU's class as records name it: "xeon-amx" (AMX tiles), "epyc-avx512" (AMD with AVX-512 BF16), "avx2"."""
    from eagle.precision import cpu_flags, cpu_name

    flags = cpu_flags()
    if "amx_tile" in flags:
        return "xeon-amx"
    if "avx512_bf16" in flags:
        return "epyc-avx512" if "AMD" in cpu_name() else "avx512-bf16"
    return "avx2" if "avx2" in flags else platform.machine()


def this_machine() -> tuple[dict, dict]:
    """(machine, versions) of this process's machine, as a record holds them."""
    import torch
    import transformers

    from eagle.precision import cores, cpu_name

    machine = {"cpu": cpu_name(), "capability": torch.backends.cpu.get_cpu_capability(),
               "cores": cores(), "class": cpu_class()}
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__}
    return machine, versions


def figures_of_run(summary: dict) -> dict:
    """An `eval.run` summary's figures for a record: per method METHOD_FIGURES, the fastest plain decoding and
    the tree each ran at."""
    methods = {}
    for name, m in summary["methods"].items():
        kept = {k: m[k] for k in METHOD_FIGURES if m.get(k) is not None}
        tree = m.get("tree")  # "6/6/1" in a summary; a dict in older ones
        if isinstance(tree, dict):
            tree = f"{tree['total_tokens']}/{tree['depth']}/{tree['branching']}"
        if isinstance(tree, str):
            kept["tree"] = tree
        methods[name] = kept
    fastest = next((m.get("fastest_plain") for m in summary["methods"].values() if m.get("fastest_plain")), None)
    return {"methods": methods, "fastest_plain": fastest, "dtype": summary.get("settings", {}).get("dtype")}


def commit_of(repo: Path = REPO_ROOT, rev: str = "HEAD") -> str:
    """`rev`'s short hash in `repo`, or "unknown" where git cannot say."""
    out = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", rev], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def write(record: Measurement, out: Path | None = None, suffixes: tuple[str, ...] = ()) -> Path:
    """Write `record` (to its default place, `<kind>_<commit>[_<suffix>...].json` in its date and CPU class's
    folder, when `out` is None); never over an existing file."""
    name = "_".join([record.kind, record.commit, *suffixes])
    out = out or RECORDS / f"{record.date[:10]}-{record.cpu_class}" / f"{name}.json"
    if out.exists():
        raise FileExistsError(f"{out} exists: records are never overwritten; pass --out for another name")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record.to_dict(), indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Make a measurement record from an eval.run summary.")
    parser.add_argument("summary", type=Path)
    parser.add_argument("--kind", required=True)
    parser.add_argument("--command", required=True, help="the command that made the summary")
    parser.add_argument("--what", required=True, help="one sentence: what was measured")
    parser.add_argument("--commit", help="default: this checkout's HEAD")
    parser.add_argument("--date", default=datetime.datetime.now().strftime("%Y-%m-%dT%H:%M"),
                        help="when the figures were measured (default: now, to the minute)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    machine, versions = this_machine()
    record = Measurement(kind=args.kind, what=args.what, command=args.command, commit=args.commit or commit_of(),
                         date=args.date, machine=machine, versions=versions,
                         figures=figures_of_run(json.loads(args.summary.read_text())))
    print(write(record, args.out))


if __name__ == "__main__":
    main()
