"""Every lock a job takes, and why no two jobs can wait for each other.

Two kinds of lock, both `flock`s on files, so a lock dies with the process that held it:

- **Run directories** (`directory_lock`): one job answers a run directory at a time; jobs of a sweep
  share their baselines' directories. `answer_in_turn` is the protocol: take every free directory
  without waiting, answer those, let them all go; when none is free, wait for one **while holding
  none**. A job that waits holds no directory, so no cycle of waiting jobs can form (the deadlock
  it replaces: two jobs each holding baselines the other waited for).
- **Timing** (`timed`, `busy`): on one machine (per GPU set on GPUs) timed decoding is exclusive.
  A timed answer holds the device's timing lock exclusively; heavy untimed work (loading models,
  starting worker processes, scoring) holds it shared, so jobs load in parallel with each other
  but never while another job times. A calibration holds it exclusively throughout. Nothing waits
  for a directory while holding the timing lock, so the two kinds cannot form a cycle either.

`flock` on a second open description of a file blocks against the first even in the same process,
so each lock file is opened once per process (`_Held`); taking a lock the process already holds is
a no-op.

Every timed answer also measures the CPU time the other processes of ours used while it ran (Linux
`/proc`): the registered jobs, and the other worker processes of this job's sweep (`MARS_SWEEP_PID`),
registered or not: a launcher's fresh worker imports torch and the engine before its job can take any
lock; and what any process not of this job took (`mars.accounting.timing.ForeignLoad`: background work
that no lock keeps out). With the timing lock and a quiet machine that is ~0; otherwise
(`exclusive_timing=false`, a sibling still starting, work that is not ours to lock) the answer is marked
`contended`, and so are its figures downstream. Under the timing lock a contended answer is answered again
(`run_timed`) once the others are quiet, at most `RETIMES` times; its record says how often. A load that
outlasts `QUIET_WAIT_S` (steal on a shared host, work not ours) is not waited for again: contended answers are
kept, marked, until one is timed alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

from eagle.files import write_atomic
from eval.rundirs.layout import CONTENDED_SHARE, LOCK
from mars.accounting.timing import ForeignLoad

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
SWEEP_PID = "MARS_SWEEP_PID"  # the process that started a sweep (set by eval.run), parent of its launcher's workers
RETIMES = 2  # at most this many repeats of a contended timed answer (`run_timed`)
QUIET_WAIT_S = 60.0  # how long a repeat waits for the others to go quiet before the answer is kept, marked
_LOAD_PERSISTS = False  # a wait for quiet ran out and no answer has been timed alone since (`run_timed`)
T = TypeVar("T")


def lock_dir() -> Path:
    """Where the timing locks and the registry of running jobs live: $MARS_LOCK_DIR, default a
    per-user folder in the system's temporary directory (machine-wide for that user)."""
    default = Path(tempfile.gettempdir()) / f"mars-spec-locks-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    path = Path(os.environ.get("MARS_LOCK_DIR", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


class _Held:
    """This process's open lock files: one description per file, with the mode held and a depth."""

    files: dict[Path, list] = {}  # path -> [handle, mode, depth]

    @classmethod
    @contextlib.contextmanager
    def lock(cls, path: Path, mode: int, wait: bool) -> Iterator[bool]:
        """flock `path` in `mode` (LOCK_EX / LOCK_SH); yields False if not waiting and it is taken."""
        path = Path(os.path.abspath(path))
        entry = cls.files.get(path)
        if entry is not None:  # held by this process already
            if entry[1] == fcntl.LOCK_SH and mode == fcntl.LOCK_EX:
                raise RuntimeError(f"{path}: an exclusive lock inside a shared one of the same process")
            entry[2] += 1
            try:
                yield True
            finally:
                entry[2] -= 1
            return
        handle = open(path, "a")
        try:
            fcntl.flock(handle, mode | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            handle.close()
            yield False
            return
        cls.files[path] = [handle, mode, 1]
        try:
            yield True
        finally:
            del cls.files[path]
            handle.close()  # closing the only description releases the flock

    @classmethod
    def forget(cls) -> None:
        """In a forked child: the parent's locks are the parent's (the child closes its copies)."""
        for handle, _, _ in cls.files.values():
            handle.close()
        cls.files = {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_Held.forget)


# --- run directories ---------------------------------------------------------------------------

def directory_lock(directory: Path, wait: bool) -> contextlib.AbstractContextManager[bool]:
    """An exclusive lock on a run directory (held until exit); yields False if not waiting and it is taken."""
    return _Held.lock(Path(directory) / LOCK, fcntl.LOCK_EX, wait)


def answer_in_turn(directories: dict[str, Path], answer: Callable[[list[str]], object],
                   log: Callable[[str], None] = print) -> None:
    """Call `answer(names)` for every name of `directories` ({name: run directory}), each while holding
    its directory's lock, never waiting for a lock while holding one (see the module docstring).
    Names free together are answered together (interleaved); the rest as their holders let go."""
    remaining = list(directories)
    while remaining:
        with contextlib.ExitStack() as stack:
            held = [n for n in remaining if stack.enter_context(directory_lock(directories[n], wait=False))]
            if not held:
                first = remaining[0]
                log(f"waiting for {directories[first]}: another job is answering {first}")
                stack.enter_context(directory_lock(directories[first], wait=True))
                held = [first, *(n for n in remaining[1:]
                                 if stack.enter_context(directory_lock(directories[n], wait=False)))]
            answer(held)
        remaining = [n for n in remaining if n not in held]


# --- timing ------------------------------------------------------------------------------------

def _timing_file(device: str) -> Path:
    return lock_dir() / f"timing-{device.replace(':', '')}.lock"


@contextlib.contextmanager
def busy(device: str, enabled: bool = True) -> Iterator[None]:
    """Heavy untimed work on `device` ("cpu", or the GPUs a job holds): waits while another job times."""
    if not enabled:
        yield
        return
    with _Held.lock(_timing_file(device), fcntl.LOCK_SH, wait=True):
        yield


def exclusive(device: str, enabled: bool = True) -> contextlib.AbstractContextManager[bool]:
    """`device`'s timing lock, held exclusively until exit (a calibration holds it throughout)."""
    return _Held.lock(_timing_file(device), fcntl.LOCK_EX, wait=True) if enabled else contextlib.nullcontext(False)


@dataclass
class Timing:
    """How one timed section ran: seconds waited for the lock, whether it held it (`exclusive`), the CPU
    seconds other registered processes of ours used during it (None where /proc is missing), and the
    verdict `contended` (None: unknown), and how many contended attempts were discarded (`retimed`)."""

    waited_s: float = 0.0
    exclusive: bool = False
    wall_s: float = 0.0
    others_cpu_s: float | None = None
    foreign_cpu_s: float | None = None  # CPU seconds any process not of this job took (background work included)
    contended: bool | None = None
    retimed: int = 0  # contended attempts answered again before this one (`run_timed`)

    def record(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


@contextlib.contextmanager
def timed(device: str, enabled: bool = True) -> Iterator[Timing]:
    """One timed section on `device`: holds its timing lock exclusively (`enabled`) and checks that no
    other process of ours computed meanwhile; the yielded `Timing` is filled in on exit."""
    timing = Timing()
    start = time.perf_counter()
    load = ForeignLoad(own_pids)
    with exclusive(device, enabled) as got:
        timing.exclusive, timing.waited_s = bool(got), time.perf_counter() - start
        before, start, outside = others_cpu(device), time.perf_counter(), load.sample()
        yield timing
        timing.wall_s = time.perf_counter() - start
        after, timing.foreign_cpu_s = others_cpu(device), load.seconds(outside, load.sample())
    if before is not None and after is not None:
        # A process registered meanwhile counts with all its CPU time so far (it may have started computing
        # just before registering: conservatively, contended); one that ended meanwhile drops out of `after`.
        timing.others_cpu_s = sum(after[p] - before.get(p, 0) for p in after) / TICK
        timing.contended = _busy_share(max(timing.others_cpu_s, timing.foreign_cpu_s or 0.0), timing.wall_s)


def _busy_share(cpu_s: float, wall_s: float) -> bool:
    # Slack of two clock ticks: the kernel charges CPU time a tick at a time (an idle job waiting for a
    # lock uses ~0, but a few milliseconds of bookkeeping can be charged a whole tick).
    return cpu_s > CONTENDED_SHARE * wall_s + 2 / TICK


def run_timed(device: str, work: Callable[[], T], enabled: bool = True, retimes: int = RETIMES,
              log: Callable[[str], None] = print) -> tuple[T, Timing]:
    """`work()` as one timed section (`timed`). With the timing lock (`enabled`), a contended attempt is
    discarded and `work()` runs again once the others are quiet (`wait_quiet`), at most `retimes` times,
    all under the one lock (a job that keeps the protocol cannot start meanwhile; what still computes is
    a sibling worker starting up, or a process that is not ours to lock). `work` must give the same
    result when repeated (the answers are seeded). Returns the last attempt's result and timing."""
    global _LOAD_PERSISTS
    start = time.perf_counter()
    with exclusive(device, enabled):
        waited = time.perf_counter() - start
        for attempt in range(retimes + 1):
            with timed(device, enabled) as timing:  # the lock is held already: no wait
                result = work()
            if not (enabled and timing.contended):
                _LOAD_PERSISTS = False
                break
            if attempt == retimes or _LOAD_PERSISTS:
                break
            log(f"timing: another process used {max(timing.others_cpu_s, timing.foreign_cpu_s or 0.0):.2f} s of CPU "
                f"in {timing.wall_s:.2f} s; answering again once it is quiet")
            if not wait_quiet(device, limit=QUIET_WAIT_S):
                # A load we cannot wait out (a hypervisor's steal, someone else's job): answering again would be
                # contended too, so this answer is kept, marked, and so is every contended one after it without
                # a wait, until one is timed alone.
                _LOAD_PERSISTS = True
                log(f"timing: the load outlasted {QUIET_WAIT_S:.0f} s; keeping contended answers, marked, "
                    "without waiting, until one is timed alone")
                break
    timing.waited_s, timing.retimed = waited, attempt
    return result, timing


def wait_quiet(device: str, window: float = 0.25, limit: float = QUIET_WAIT_S) -> bool:
    """Wait until the other processes of ours (`others_cpu`) use less than CONTENDED_SHARE of a CPU over
    `window` seconds; False if they did not within `limit` seconds (or /proc is missing)."""
    end, load = time.monotonic() + limit, ForeignLoad(own_pids)
    while time.monotonic() < end:
        before, outside = others_cpu(device), load.sample()
        time.sleep(window)
        after, foreign = others_cpu(device), load.seconds(outside, load.sample())
        if before is None or after is None:
            return False
        if not _busy_share(max(sum(after[p] - before.get(p, 0) for p in after) / TICK, foreign or 0.0), window):
            return True
    return False


def own_pids() -> list[int]:
    """This job's processes: itself and the workers it registered (`registered`); their CPU time is its own."""
    try:
        return json.loads((_registry() / f"{os.getpid()}.json").read_text())["pids"]
    except (OSError, ValueError, KeyError):
        return [os.getpid()]


# --- the registry of running jobs ---------------------------------------------------------------

def _registry() -> Path:
    path = lock_dir() / "jobs"
    path.mkdir(exist_ok=True)
    return path


KEEP_ENDED = 3600.0  # seconds an ended job's final CPU time stays readable (longer than any timed answer)


@contextlib.contextmanager
def registered(device: str) -> Iterator[Callable[[int], None]]:
    """Register this process as a job on `device` until exit (so that other jobs' timed sections count
    its CPU time); yields `add(pid)` for its child processes that compute (worker processes). On exit
    the entry keeps the job's final CPU time for a while: a section during which it ended counts it."""
    path = _registry() / f"{os.getpid()}.json"
    pids = [os.getpid()]

    def write(**extra) -> None:
        write_atomic(path, json.dumps({"device": device, "pids": pids, **extra}))

    def add(pid: int) -> None:
        pids.append(pid)
        write()

    write()
    try:
        yield add
    finally:
        final = {pid: ticks for pid in pids if (ticks := _cpu_ticks(pid)) is not None}
        write(final=final, ended=time.time())


def _cpu_ticks(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15 of proc(5))


def sweep_siblings() -> list[int]:
    """The other worker processes of this process's sweep: children of $MARS_SWEEP_PID (a launcher's
    workers, idle or answering) other than this one; [] outside a sweep or without /proc."""
    sweep = os.environ.get(SWEEP_PID)
    if not sweep or int(sweep) == os.getpid():
        return []
    try:  # the kernel's list of children (CONFIG_PROC_CHILDREN), thread by thread
        tasks = Path(f"/proc/{sweep}/task").iterdir()
        children = {int(pid) for t in tasks for pid in (t / "children").read_text().split()}
    except OSError:
        children = set()
        for entry in Path("/proc").iterdir():  # fallback: every process's parent
            try:
                if entry.name.isdigit() and (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == sweep:
                    children.add(int(entry.name))
            except (OSError, IndexError):
                continue
    return sorted(children - {os.getpid()})


def others_cpu(device: str) -> dict[int, int] | None:
    """CPU ticks so far of every process registered by another job on `device` (an ended job's final
    ticks), and of this sweep's other workers that no job registered for a device (starting up, or
    between jobs); None without /proc."""
    if not Path("/proc/self/stat").exists():
        return None
    ticks = {}
    elsewhere = set()  # registered for another device: theirs to count
    for entry in _registry().glob("*.json"):
        if entry.stem == str(os.getpid()):
            continue
        try:
            job = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue  # being rewritten or removed
        if "ended" in job:
            if time.time() - job["ended"] > KEEP_ENDED:
                entry.unlink(missing_ok=True)
            elif job["device"] == device:
                # Its final ticks once gone; a process still alive (a launcher's worker between jobs) counts on.
                for pid, final in job["final"].items():
                    now = _cpu_ticks(int(pid))
                    ticks[int(pid)] = now if now is not None and now >= final else final
            else:
                elsewhere.update(int(pid) for pid in job["final"])
            continue
        if _cpu_ticks(int(entry.stem)) is None:  # a job killed before it could unregister
            entry.unlink(missing_ok=True)
            continue
        if job.get("device") == device:
            ticks.update({pid: value for pid in job["pids"] if (value := _cpu_ticks(pid)) is not None})
        else:
            elsewhere.update(job.get("pids", []))
    for pid in sweep_siblings():
        if pid not in ticks and pid not in elsewhere and (value := _cpu_ticks(pid)) is not None:
            ticks[pid] = value
    return ticks
