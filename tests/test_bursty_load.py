"""scripts/bursty_load.py, the bursty background load, run as written for a second and a half with short
periods: it alternates busy and idle periods of drawn durations and logs each one."""

from __future__ import annotations

import json
import subprocess
import sys

from eval.config.paths import REPO_ROOT

LOW, HIGH, SECONDS = 0.1, 0.2, 1.5


def test_bursty_load_alternates_busy_and_idle_periods_within_their_bounds(tmp_path):
    log = tmp_path / "load.jsonl"
    bounds = ["--busy-min", str(LOW), "--busy-max", str(HIGH), "--idle-min", str(LOW), "--idle-max", str(HIGH)]
    subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "bursty_load.py"), *bounds, "--seconds", str(SECONDS),
                    "--seed", "0", "--log", str(log)], check=True, timeout=60)
    periods = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = [p["kind"] for p in periods]
    assert kinds == ["busy", "idle"] * (len(kinds) // 2) + ["busy"] * (len(kinds) % 2)  # alternating, busy first
    assert {"busy", "idle"} <= set(kinds) and len(periods) >= 4  # 7 or 8 on a calm machine; a busy one overshoots
    drawn = [p for p in periods if not p["cut"]]  # the last period may be cut short by --seconds
    assert drawn and all(LOW <= p["duration"] <= HIGH for p in drawn)
    assert all(0 < p["duration"] <= HIGH for p in periods) and sum(p["cut"] for p in periods) <= 1
    assert sum(p["duration"] for p in periods) <= SECONDS + 0.01
    starts = [p["start"] for p in periods]
    assert starts == sorted(starts)
