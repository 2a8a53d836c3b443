"""Before against after: one command in A B B A passes from clean clones of two commits, each pass from an empty
calibration cache, kept as one measurement record.

A 2-core machine drifts by 5-20% over the hour such a comparison takes. The order A1 B1 B2 A2 puts both commits
on both sides of the drift, and a clean clone with an empty cache makes each pass what a new user's first run is,
calibration included. Each pass runs COMMAND in its own clone with every argument `OUT` replaced by the pass's
summary path (DIR/<pass>.json); its log, wall seconds and calibration seconds (the "calibrated ... in N s" lines)
are kept in DIR/passes.json. Started again, the script skips the passes that finished and reruns an unfinished
one from a fresh clone, since a clone's run directories would let a rerun skip answers and time less. With
--kind, the record holds per pass its commit, seconds and the summary's figures (`figures_of_run`), and per method
B's mean tokens/s over A's.

    python experiments/ab_runs.py DIR --a ec811e4 --b HEAD --kind calibration-ab --what "..." -- \\
        bash scripts/bench_embedded.sh OUT num_prompts=64 max_new_tokens=128
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean

from eval.config.paths import REPO_ROOT
from eval.reporting.measurements import Measurement, commit_of, figures_of_run, this_machine, write

ORDER = ("A1", "B1", "B2", "A2")
# "calibrated strict in 31 s": a calibration of all of a run's methods together prints one such line per method,
# each with the same seconds; an older one ("calibrated in 31 s") calibrated each method on its own.
CALIBRATED = re.compile(r"calibrated( \S+)? in ([\d.]+) s")


def run_pass(directory: Path, name: str, commit: str, command: list[str], repo: Path) -> dict:
    """One pass: a fresh clone of `repo` at `commit`, COMMAND run there from an empty cache."""
    clone = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=directory / "clones"))
    subprocess.run(["git", "clone", "--quiet", str(repo), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", commit], check=True)
    summary = directory / f"{name}.json"
    argv = [str(summary) if a == "OUT" else a for a in command]
    # the clone's packages first, also for a script under experiments/ (whose own folder would lead to the
    # installed checkout's packages)
    env = {**os.environ, "MARS_CACHE_DIR": tempfile.mkdtemp(prefix=f"cache-{name}-", dir=directory),
           "PYTHONPATH": os.pathsep.join([str(clone), *filter(None, [os.environ.get("PYTHONPATH")])])}
    log = directory / f"{name}.log"
    started, start = datetime.datetime.now().strftime("%Y-%m-%dT%H:%M"), time.monotonic()
    with log.open("w") as out:
        rc = subprocess.run(argv, cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    calibration = calibration_seconds(log.read_text(errors="replace"))
    return {"commit": commit, "started": started, "rc": rc, "wall_s": round(time.monotonic() - start, 1),
            "calibration_s": calibration, "summary": str(summary), "clone": str(clone)}


def calibration_seconds(log: str) -> float:
    """The seconds a pass spent calibrating, from its log: a run of lines naming methods with the same seconds is
    one calibration of those methods together."""
    total, last = 0.0, None
    for method, seconds in CALIBRATED.findall(log):
        if not (method and last == (True, seconds)):
            total += float(seconds)
        last = (bool(method), seconds)
    return round(total, 1)


def b_over_a(runs: dict) -> dict:
    """Per method, B's mean tokens/s over A's."""
    def speeds(letter: str, method: str) -> list[float]:
        return [r["methods"][method]["tokens_per_s"] for p, r in runs.items()
                if p.startswith(letter) and method in r["methods"]]
    methods = set.intersection(*(set(r["methods"]) for r in runs.values()))
    return {m: round(mean(speeds("B", m)) / mean(speeds("A", m)), 3) for m in sorted(methods)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage="%(prog)s DIR --a A --b B "
                                     "[--kind KIND --what WHAT] -- COMMAND (its summary path written OUT)")
    parser.add_argument("dir", type=Path, help="where the passes' clones, caches, logs and summaries go")
    parser.add_argument("--a", required=True, help="the commit before")
    parser.add_argument("--b", required=True, help="the commit after")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the repository to clone (default: this one)")
    parser.add_argument("--kind", help="also write a measurement record of this kind")
    parser.add_argument("--what", default="", help="the record's sentence: what was compared")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)  # the command follows "--"
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    if "OUT" not in command:
        parser.error("the command names no OUT: write OUT where its summary JSON goes")
    if args.kind and not args.what:
        parser.error("--kind needs --what: one sentence on what the passes compare")
    commits = {"A": commit_of(args.repo, args.a), "B": commit_of(args.repo, args.b)}
    if "unknown" in commits.values():
        parser.error(f"{args.a} or {args.b} names no commit of {args.repo}")
    (args.dir / "clones").mkdir(parents=True, exist_ok=True)
    book = args.dir / "passes.json"
    passes = json.loads(book.read_text()) if book.exists() else {}
    for name in ORDER:
        if passes.get(name, {}).get("rc") == 0:
            continue  # finished in an earlier start
        passes[name] = run_pass(args.dir, name, commits[name[0]], command, args.repo)
        book.write_text(json.dumps(passes, indent=1) + "\n")
        print(f"{name} ({commits[name[0]]}): rc {passes[name]['rc']}, {passes[name]['wall_s']:.0f} s, "
              f"calibration {passes[name]['calibration_s']:.0f} s", flush=True)
    if failed := [n for n in ORDER if passes[n]["rc"] != 0]:
        sys.exit(f"passes {', '.join(failed)} failed: see their logs in {args.dir}; start again to rerun them")
    if args.kind:
        runs = {n: {k: passes[n][k] for k in ("commit", "started", "wall_s", "calibration_s")}
                | figures_of_run(json.loads(Path(passes[n]["summary"]).read_text())) for n in ORDER}
        machine, versions = this_machine()
        command_line = f"per pass, MARS_CACHE_DIR=<empty>: {shlex.join(command)} (order {' '.join(ORDER)})"
        record = Measurement(kind=args.kind, what=args.what, command=command_line, commit=commits["B"],
                             date=passes["A1"]["started"], machine=machine, versions=versions,
                             figures={"a_commit": commits["A"], "b_commit": commits["B"], "runs": runs,
                                      "b_over_a_tokens_per_s": b_over_a(runs)})
        print(write(record))


if __name__ == "__main__":
    main()
