"""The per-test time limit (pytest.ini, pytest-timeout): a hung test fails within its limit with the
stack of every thread in the output, and the session goes on to the next test.

Each check runs a small hanging test file in a pytest subprocess under a copy of the repo's pytest.ini
(its rootdir is tmp_path, so tests/conftest.py is not loaded), with the limits cut to seconds."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIMIT = 2  # seconds, the hung tests' timeout in the subprocess
BACKSTOP = 5  # seconds, their faulthandler_timeout
SLACK = 10  # seconds a timed-out test may take past LIMIT on a busy 2-core machine
# seconds a timed-out test's reported time may fall short of LIMIT: pytest-timeout arms its alarm when the test's
# protocol starts, before the setup phase whose start junit's time counts from (1.997 s reported for a 2 s limit
# with the suite at 4 workers on 2 cores)
EARLY = 0.5

HANGING_TESTS = '''
import threading
import time


def sleep_forever():
    time.sleep(3600)


def test_hangs_in_sleep():
    sleep_forever()


def worker_waits_forever(event):
    event.wait()


def join_forever(worker):
    worker.join()


def test_hangs_joining_a_worker():
    worker = threading.Thread(target=worker_waits_forever, args=(threading.Event(),), name="hung-worker", daemon=True)
    worker.start()
    join_forever(worker)


def test_after_the_hangs():
    pass
'''

# SIGALRM blocked: the signal method's handler never runs, as when the main thread is stuck in native code
# (a deadlocked torch kernel, a C call that retries on EINTR). Only the faulthandler backstop ends it.
UNINTERRUPTIBLE_TEST = '''
import signal
import time


def sleep_out_of_the_signals_reach():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(3600)


def test_hangs_out_of_the_signals_reach():
    sleep_out_of_the_signals_reach()


def test_after_the_hang():
    pass
'''


def repo_ini() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(REPO / "pytest.ini")
    return parser["pytest"]


def run_pytest(tmp_path: Path, source: str, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run `source` as a test file under the repo's pytest.ini with the limits cut to seconds."""
    shutil.copy(REPO / "pytest.ini", tmp_path / "pytest.ini")
    (tmp_path / "test_hang.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    command = [sys.executable, "-m", "pytest", "test_hang.py", "--rootdir", str(tmp_path), "-p", "timeout",
               "-p", "no:cacheprovider", "-o", f"timeout={LIMIT}", "-o", f"faulthandler_timeout={BACKSTOP}", *args]
    start = time.monotonic()
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return result, time.monotonic() - start


def test_the_limit_is_configured():
    """Removing the limit from pytest.ini, or the backstop behind it, fails here."""
    ini = repo_ini()
    limit, backstop = float(ini.get("timeout", "0")), float(ini.get("faulthandler_timeout", "0"))
    assert limit > 0, "pytest.ini sets no per-test timeout"
    # signal: the hung test fails with its traceback and the session goes on (thread: dumps and exits)
    assert ini.get("timeout_method") == "signal"
    # the backstop fires after the limit (else it would pre-empt pytest-timeout's report) and ends the run
    assert backstop > limit, f"faulthandler_timeout={backstop} is not above timeout={limit}"
    assert ini.getboolean("faulthandler_exit_on_timeout", False), "the backstop does not end the run"


def test_installed(pytestconfig):
    assert pytestconfig.pluginmanager.hasplugin("timeout"), "pytest-timeout is not installed: pip install -e .[test]"


def test_a_hung_test_fails_with_every_threads_stack_and_the_session_goes_on(tmp_path):
    result, _ = run_pytest(tmp_path, HANGING_TESTS, "--junitxml", str(tmp_path / "report.xml"))
    out = result.stdout + result.stderr
    assert result.returncode == 1, out

    cases = {case.get("name"): case for case in ET.parse(tmp_path / "report.xml").iter("testcase")}
    for name in ("test_hangs_in_sleep", "test_hangs_joining_a_worker"):
        failure = cases[name].find("failure")
        assert failure is not None and "Timeout" in failure.get("message"), out
        assert LIMIT - EARLY <= float(cases[name].get("time")) < LIMIT + SLACK, out
    assert len(cases["test_after_the_hangs"]) == 0, out  # ran, and passed: no failure, error or skip

    # the main thread's stack is the failure's traceback, down to the hanging call
    assert f"Timeout (>{float(LIMIT)}s) from pytest-timeout" in out
    assert "def sleep_forever():\n>       time.sleep(3600)" in out
    assert re.search(r"test_hang.py:\d+: in join_forever\n\s+worker.join\(\)", out), out
    # and every other thread's stack is dumped
    assert "Stack of hung-worker" in out
    assert re.search(r'test_hang.py", line \d+, in worker_waits_forever\n\s+event.wait\(\)', out), out
    assert "2 failed, 1 passed" in out


def test_a_hang_the_signal_cannot_break_ends_the_run_with_every_threads_stack(tmp_path):
    result, elapsed = run_pytest(tmp_path, UNINTERRUPTIBLE_TEST)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert elapsed < BACKSTOP + SLACK + 10, out  # pytest's start-up included
    # faulthandler's dump: every thread, here the one, down to the hanging call
    assert f"Timeout (0:00:{BACKSTOP:02d})!" in out, out
    assert re.search(r'test_hang.py", line \d+ in sleep_out_of_the_signals_reach', out), out
    assert "passed" not in out, out  # the run ended there: the next test did not run
