"""A bursty background load on one thread: busy periods (pure-Python arithmetic spinning one core) and idle
periods (sleep), alternating, each of a duration drawn uniformly at random.

What it is for: reproducing how the calibration and a run's timings behave under light background load, the
way a shared 2-core machine loads them (a burst lands on one method's answer and not on another's). Run it
beside a command and stop it after:

    python scripts/bursty_load.py --seconds 600 & python -m eval.run; kill %1

It runs until killed or until --seconds have elapsed (the last period cut short at that deadline). With --log,
it appends one JSON line per period, written when the period starts (so a kill leaves the running period in
the log): {"start": Unix time, "kind": "busy" or "idle", "duration": seconds, "cut": whether the deadline cut
it short of the duration drawn}. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import TextIO

BUSY, IDLE = "busy", "idle"
CHECK_EVERY = 10_000  # spin iterations between clock reads: a clock read per iteration would be most of the work


def spin(seconds: float) -> int:
    """Pure-Python integer arithmetic on this thread for `seconds` (holding the GIL, so one core); returns
    the value computed, so that the work is not optimised away by any interpreter."""
    end = time.monotonic() + seconds
    x = 1
    while True:
        for i in range(CHECK_EVERY):
            x = (x * 1_103_515_245 + i) % 2_147_483_648
        if time.monotonic() >= end:
            return x


def periods(rng: random.Random, busy: tuple[float, float], idle: tuple[float, float]):
    """(kind, drawn duration) forever, busy first, then idle, then busy..."""
    while True:
        yield BUSY, rng.uniform(*busy)
        yield IDLE, rng.uniform(*idle)


def run(busy: tuple[float, float], idle: tuple[float, float], seconds: float | None, seed: int | None,
        log: TextIO | None) -> None:
    """Alternate busy and idle periods until `seconds` have elapsed (None: forever), logging each to `log`."""
    deadline = None if seconds is None else time.monotonic() + seconds
    for kind, drawn in periods(random.Random(seed), busy, idle):
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return
        duration = drawn if left is None else min(drawn, left)
        if log is not None:
            record = {"start": round(time.time(), 6), "kind": kind, "duration": round(duration, 6),
                      "cut": duration < drawn}
            log.write(json.dumps(record) + "\n")
            log.flush()  # a kill must not lose the lines already due
        if kind == BUSY:
            spin(duration)
        else:
            time.sleep(duration)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for kind in (BUSY, IDLE):
        parser.add_argument(f"--{kind}-min", type=float, default=0.5, metavar="S",
                            help=f"shortest {kind} period, seconds (default 0.5)")
        parser.add_argument(f"--{kind}-max", type=float, default=3.0, metavar="S",
                            help=f"longest {kind} period, seconds (default 3.0)")
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long (default: run until killed)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the durations (default: unseeded)")
    parser.add_argument("--log", type=Path, default=None, help="append one JSON line per period to this file")
    args = parser.parse_args(argv)
    for kind in (BUSY, IDLE):
        low, high = getattr(args, f"{kind}_min"), getattr(args, f"{kind}_max")
        if not 0 <= low <= high:
            parser.error(f"--{kind}-min and --{kind}-max must satisfy 0 <= min <= max, got {low} and {high}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    busy, idle = (args.busy_min, args.busy_max), (args.idle_min, args.idle_max)
    log = args.log.open("a") if args.log else None
    try:
        run(busy, idle, args.seconds, args.seed, log)
    except KeyboardInterrupt:  # Ctrl-C is the ordinary way to stop it when run in the foreground
        pass
    finally:
        if log is not None:
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
