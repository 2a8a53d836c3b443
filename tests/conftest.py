"""Fixtures shared by the test modules (helpers to import live in tests/helpers.py)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator

import pytest
import torch
from helpers import ARCHITECTURES

# Under pytest-xdist (scripts/test.sh: one worker per core) each worker computes on one thread, and so do the
# jobs and subprocesses its tests start: two workers of two threads each on two cores would spin against
# each other (see `single_thread`).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, os.cpu_count() or 1))
# Nothing in the suite downloads: a hub lookup (datasets, transformers) fails at once instead of waiting
# for a network that CI may not have. Subprocesses the tests start inherit it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(params=list(ARCHITECTURES))
def arch(request) -> str:
    return request.param


# The suite's longest tests (30-70 s each on 2 cores) start first: pytest-xdist's work stealing then ends the
# run with short tests on both workers, not with one worker finishing a long test while the other waits.
# Whole modules move, so that a module's fixtures (the real model's conversion) are not set up twice. test_docs.py
# holds the README example's test, which calibrates (1-2.5 min; the list named test_readme.py after it had moved).
LONG_FIRST = ("test_lossless.py", "test_real_model.py", "test_runs.py", "test_docs.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.nodeid.split("::")[0].rsplit("/", 1)[-1] not in LONG_FIRST)  # stable


@pytest.fixture(scope="module")
def single_thread() -> Iterator[None]:
    """Run a module's tests on one torch thread, then restore the setting.

    Tiny models gain nothing from a second thread, and on a busy 2-core machine two threads
    spinning against other jobs make each forward pass 50x slower.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def folder_of_its_own(variable: str, tmp_path_factory) -> Iterator[None]:
    """Point the environment `variable` at a new temporary folder for the session, then restore it."""
    previous = os.environ.get(variable)
    os.environ[variable] = str(tmp_path_factory.mktemp(variable.lower()))
    yield
    if previous is None:
        os.environ.pop(variable, None)
    else:
        os.environ[variable] = previous


@pytest.fixture(autouse=True, scope="session")
def calibration_cache(tmp_path_factory) -> Iterator[None]:
    """Calibrations (mars.tuning.search) made by tests go to a temporary directory, not ~/.cache."""
    yield from folder_of_its_own("MARS_CACHE_DIR", tmp_path_factory)


@pytest.fixture(autouse=True, scope="session")
def shared_machine() -> Iterator[None]:
    """The suite's parallel workers load the machine on purpose: no timing waits for a quiet that never comes
    (`mars.accounting.timing.FOREIGN_LOAD`); the retiming itself is tested with a scripted load."""
    previous = os.environ.get("MARS_FOREIGN_LOAD")
    os.environ["MARS_FOREIGN_LOAD"] = "off"
    yield
    if previous is None:
        os.environ.pop("MARS_FOREIGN_LOAD", None)
    else:
        os.environ["MARS_FOREIGN_LOAD"] = previous


@pytest.fixture(autouse=True, scope="session")
def job_locks(tmp_path_factory) -> Iterator[None]:
    """The timing locks and job registry of the suite's runs (eval.runner.locks) in a folder of its own:
    a test neither waits for a researcher's sweep timing on this machine nor marks its figures contended."""
    yield from folder_of_its_own("MARS_LOCK_DIR", tmp_path_factory)


@pytest.fixture
def listener() -> Iterator[tuple[int, list]]:
    """A TCP server on the host's 127.0.0.1: (port, connections it accepted). The sandbox tests point
    sandboxed code at it: an accepted connection is a route out of the sandbox's network namespace."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    accepted: list = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, addr = server.accept()
            except TimeoutError:
                continue
            accepted.append(addr)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()
