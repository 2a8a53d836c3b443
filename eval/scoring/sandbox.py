"""Run untrusted, model-generated Python source in a sandboxed subprocess (used to score HumanEval).

    result = run_sandboxed(source, timeout=10.0, memory_mb=1024)
    result.status    # "passed" | "failed" | "timeout" | "killed" | "error"

Every call gets its own process and its own fresh temporary directory (deleted afterwards), and
whatever the code does (crash, loop, allocate, fork, write, connect, kill) the call returns a
`SandboxResult`; it raises only for bad arguments. A run costs ~40 ms on the project's 2-core machine.
Containment, from the kernel up (`sandbox_layers()` reports what is active on a machine):

1. Namespaces, where `unshare` works (probed once per process): the child runs under
   `unshare --net --pid --fork --kill-child` (as root), else the same with `--user --map-root-user`
   (unprivileged user namespaces), else `unshare --net` alone, else nothing. The new network
   namespace has only a loopback interface, down, and no route: nothing can be reached, not even the
   host's 127.0.0.1. In the new PID namespace the interpreter is PID 1: when it exits or is killed,
   the kernel kills every process it left behind (even ones that left its process group), and the
   host's processes, the harness included, have no PID there, so they cannot be signalled.
2. Resource limits, set by the bootstrap in the child before the code is compiled: RLIMIT_AS
   (memory_mb), RLIMIT_CPU (cpu_seconds; SIGXCPU at the limit ends the run as a "timeout", SIGKILL
   one second later if that did not), RLIMIT_FSIZE (each file written, stdout included, at most
   FILE_SIZE_MB), RLIMIT_CORE 0, RLIMIT_NOFILE and RLIMIT_NPROC. Hard limits equal soft ones (CPU:
   one second more) and the `resource` module is blocked, so the code cannot raise them (and, being
   unprivileged, see (6), could not anyway).
3. Process group: the child starts a new session (`start_new_session=True`); on timeout, and after
   every run in any case, the whole group is killed with SIGKILL (leftover grandchildren included),
   and the call waits (up to GROUP_EXIT_WAIT) until no member of it is alive.
4. Python-level guards installed by the bootstrap (`sandbox_boot._guard` lists them), in the spirit
   of the HumanEval harness's "reliability guard": no process creation, signalling, identity or
   session changes, sockets (but a connected local pair) or name resolution; writing, renaming and
   deleting only inside the temporary directory (also the working directory, $HOME and $TMPDIR);
   multiprocessing, ctypes, resource and psutil cannot be imported. Modules slow to import are
   patched when the code first imports them (a meta-path hook, which also re-patches a module the
   code deletes and imports afresh). These guards stop accidents and naive misbehaviour, not a
   determined attacker: Python code can dig an original back up (`_imp.create_builtin` gives a
   fresh, unpatched `posix`), and then (1)-(3) and (6) hold; the tests check that they do.
5. The interpreter runs with `-I -S` (isolated: no PYTHON* variables, no user site, no script
   directory; no site module: its .pth processing would cost 55 ms per run here) and gets the
   site-packages directories on sys.path as plain directories, so installed packages (numpy...)
   import as they would for the harness. The environment is minimal: PATH, HOME and TMPDIR (the
   temporary directory) and a UTF-8 locale; no proxies, no PYTHONPATH, nothing else inherited.
6. Privileges: a harness running as root starts the child as root (the namespaces need it), and the
   child drops to nobody:nogroup (`sandbox_user()`; no supplementary groups, saved IDs too) before
   the code runs, after loading what the code imports under the guards (`eval/scoring/sandbox_boot.py`): an
   interpreter installed where only root may enter (/root/.pyenv) cannot load modules afterwards.
   The code then reads only what any user may: not the caller's ~/.netrc (a W&B key), hub tokens or
   other private files, and the kernel refuses what a bypass of (4) would write outside its working
   directory (owned by nobody; its parent directory lets it in but not list). A harness that is not
   root runs the code as its own (unprivileged) user.

The sandboxed process's program is `eval/scoring/sandbox_boot.py`, run by path. Not contained: disk use by
many files (each capped at FILE_SIZE_MB; all deleted after the run), reading what every user may
read, and a module the code imports only at run time (e.g. inside a function) from where the
unprivileged user cannot read it: that import fails.
"""

from __future__ import annotations

import functools
import math
import os
import select
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from eval.scoring import sandbox_boot
from eval.scoring.sandbox_boot import CPU_EXCEEDED, SETUP_FAILED

TEMP_PREFIX = "mars-sandbox-"  # every sandbox directory (and so every sandboxed command line) contains it
OUTPUT_LIMIT = 4096  # bytes of stdout+stderr kept in SandboxResult.output (head and tail)
FILE_SIZE_MB = 16  # RLIMIT_FSIZE: the largest file the code may write
OPEN_FILES = 256  # RLIMIT_NOFILE
PROCESSES = 64  # RLIMIT_NPROC (not enforced for root, see the module docstring)
BOOT = Path(sandbox_boot.__file__)  # the sandboxed process's program, run by path
SANDBOX_USER, SANDBOX_GROUP, UNPRIVILEGED_ID = "nobody", "nogroup", 65534  # what a root harness's child drops to
GROUP_EXIT_WAIT = 1.0  # seconds to wait, after the run, for the last processes of its group to be gone
PROBE_TIMEOUT = 30.0  # seconds for the one-off `unshare` probe (generous: the machine may be busy)
# unshare flag sets to try, strongest first; the first that runs Python is used for every call.
NAMESPACE_FLAGS = (("--net", "--pid", "--fork", "--kill-child"),
                   ("--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"),
                   ("--net",))


@dataclass(frozen=True)
class SandboxResult:
    status: str  # "passed" (exit 0), "failed" (non-zero exit / exception), "timeout", "killed" (signal), "error"
    returncode: int | None  # the child's exit code (negative: killed by that signal); None if it never ran
    seconds: float  # wall time of the run
    output: str  # stdout+stderr, at most OUTPUT_LIMIT bytes (head and tail when longer)


_probe_lock = threading.Lock()
_namespace_prefix: tuple[str, ...] | None = None


def _probe_namespaces() -> tuple[str, ...]:
    """The `unshare ... --` prefix to run children under: the first flag set that runs Python, else ()."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    for flags in NAMESPACE_FLAGS:
        prefix = (unshare, *flags, "--")
        try:
            done = subprocess.run([*prefix, sys.executable, "-I", "-S", "-c", "pass"], stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=PROBE_TIMEOUT)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return prefix
    return ()


def namespace_prefix() -> tuple[str, ...]:
    """The command prefix that puts a child in new namespaces here (probed on first use, then cached)."""
    global _namespace_prefix
    with _probe_lock:
        if _namespace_prefix is None:
            _namespace_prefix = _probe_namespaces()
        return _namespace_prefix


def sandbox_user() -> str:
    """"uid:gid" the sandboxed process drops to when the harness runs as root (nobody:nogroup, or
    65534:65534 where there is no such user), else "" (it already runs unprivileged)."""
    if os.geteuid() != 0:
        return ""
    import grp
    import pwd

    try:
        uid = pwd.getpwnam(SANDBOX_USER).pw_uid
    except KeyError:
        uid = UNPRIVILEGED_ID
    try:
        gid = grp.getgrnam(SANDBOX_GROUP).gr_gid
    except KeyError:
        gid = UNPRIVILEGED_ID
    return f"{uid}:{gid}"


def sandbox_layers() -> dict:
    """Which containment layers apply on this machine (see the module docstring)."""
    prefix = namespace_prefix()
    return {
        "network_namespace": "--net" in prefix,
        "pid_namespace": "--pid" in prefix,
        "user_namespace": "--user" in prefix,
        "command_prefix": list(prefix),
        "rlimits": ["RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NOFILE", "RLIMIT_NPROC"],
        "rlimit_nproc_enforced": True,  # the code runs unprivileged (a root harness's child drops first)
        "runs_as": sandbox_user() or f"{os.geteuid()}:{os.getegid()} (the harness's user, unprivileged)",
        "process_group_kill": True,
        "python_guards": True,
    }


def _limits(memory_mb: int, cpu_seconds: int) -> str:
    """The bootstrap's LIMITS argument: comma-separated NAME:soft:hard."""
    memory, file_size = memory_mb * 2**20, FILE_SIZE_MB * 2**20
    limits = {
        "RLIMIT_AS": (memory, memory),
        # soft < hard: SIGXCPU at the soft limit (handled: exits as "timeout"), SIGKILL one second later.
        "RLIMIT_CPU": (cpu_seconds, cpu_seconds + 1),
        "RLIMIT_FSIZE": (file_size, file_size),
        "RLIMIT_CORE": (0, 0),
        "RLIMIT_NOFILE": (OPEN_FILES, OPEN_FILES),
        "RLIMIT_NPROC": (PROCESSES, PROCESSES),
    }
    return ",".join(f"{name}:{soft}:{hard}" for name, (soft, hard) in limits.items())


@functools.cache
def _site_dirs() -> str:
    """The interpreter's site-packages directories (the child runs with -S, which leaves them out)."""
    return os.pathsep.join(d for d in site.getsitepackages() if os.path.isdir(d))


def _environment(workdir: Path) -> dict[str, str]:
    # Built from scratch: nothing of the harness's environment (proxies, PYTHONPATH, credentials) leaks in.
    return {"PATH": os.defpath, "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8"}


def _live_members(pgid: int) -> bool:
    """Has process group `pgid` a member that is not a zombie? (Killed members re-parented away from us,
    such as a PID-namespace init whose `unshare` died with it, stay zombies until PID 1 reaps them.)"""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    state, _, group = f.read().rsplit(b")", 1)[1].split()[:3]
            except (OSError, ValueError):  # gone meanwhile
                continue
            if int(group) == pgid and state not in (b"Z", b"X"):
                return True
    return False


def _kill_group(pgid: int, wait: float = 0.0) -> None:
    """SIGKILL every process of group `pgid`; with `wait`, keep at it for up to that many seconds until no
    member is alive."""
    deadline = time.monotonic() + wait
    while True:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # the group is gone
            return
        if time.monotonic() >= deadline or not (os.path.isdir("/proc") and _live_members(pgid)):
            return
        time.sleep(0.005)


def _wait_for_exit(proc: subprocess.Popen, timeout: float) -> bool:
    """Has `proc` exited within `timeout` seconds? Does not reap it.

    Popen.wait(timeout) polls with sleeps of up to 50 ms, which would more than double the time of a
    typical 50 ms run; a pidfd wakes us the moment the process exits."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (old kernel, not Linux): the polling wait
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    finally:
        os.close(pidfd)


def _read_output(path: Path) -> str:
    """The first and last bytes of the output file, OUTPUT_LIMIT in all."""
    size = path.stat().st_size
    with path.open("rb") as f:
        if size <= OUTPUT_LIMIT:
            data = f.read()
        else:
            head = f.read(OUTPUT_LIMIT // 4)
            f.seek(size - (OUTPUT_LIMIT - len(head)))
            data = head + f"\n[... {size - OUTPUT_LIMIT} bytes omitted ...]\n".encode() + f.read()
    return data.decode("utf-8", errors="replace")


def _status(returncode: int, timed_out: bool) -> str:
    if timed_out or returncode == CPU_EXCEEDED or returncode == -signal.SIGXCPU:
        return "timeout"
    if returncode == 0:
        return "passed"
    if returncode == SETUP_FAILED:
        return "error"
    return "killed" if returncode < 0 else "failed"


def _run_in(root: Path, source: str, timeout: float, memory_mb: int, cpu_seconds: int) -> SandboxResult:
    workdir = root / "work"
    workdir.mkdir()
    program = root / "program.py"  # outside the working directory: the code cannot overwrite it
    program.write_text(source, encoding="utf-8", errors="replace")  # 0600: read before the privilege drop
    user = sandbox_user()
    if user:  # the dropped process may enter its directory (not list it) and write in its working directory
        uid, gid = (int(x) for x in user.split(":"))
        root.chmod(0o711)
        os.chown(workdir, uid, gid)
    command = [*namespace_prefix(), sys.executable, "-I", "-S", str(BOOT),
               str(program), str(workdir), _limits(memory_mb, cpu_seconds), _site_dirs(), user]
    output = root / "output"
    start = time.monotonic()
    with output.open("wb") as out:
        # stdout goes to a file, not a pipe: no reader thread, and a flood of output only hits RLIMIT_FSIZE.
        proc = subprocess.Popen(command, cwd=workdir, env=_environment(workdir), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        try:
            timed_out = not _wait_for_exit(proc, timeout)
        finally:
            _kill_group(proc.pid)  # the child is the group leader (new session): pgid == pid
            proc.wait()
            _kill_group(proc.pid, wait=GROUP_EXIT_WAIT)  # leftovers: grandchildren, a dying namespace init
    seconds = time.monotonic() - start
    returncode = proc.returncode
    return SandboxResult(_status(returncode, timed_out), returncode, seconds, _read_output(output))


def run_sandboxed(source: str, timeout: float = 10.0, memory_mb: int = 1024,
                  cpu_seconds: int | None = None) -> SandboxResult:
    """Run `source` as a Python program in a fresh sandboxed process; never raises for what the code does.

    `timeout`: wall-clock seconds before the process group is killed (status "timeout").
    `memory_mb`: address-space limit. `cpu_seconds`: CPU-time limit, default ceil(timeout).
    """
    if not timeout > 0 or memory_mb <= 0 or (cpu_seconds is not None and cpu_seconds <= 0):
        raise ValueError(f"run_sandboxed needs timeout > 0, memory_mb > 0 and cpu_seconds > 0 or None; got "
                         f"timeout={timeout}, memory_mb={memory_mb}, cpu_seconds={cpu_seconds}")
    cpu = cpu_seconds if cpu_seconds is not None else max(1, math.ceil(timeout))
    start = time.monotonic()
    try:
        root = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    except OSError as e:
        return SandboxResult("error", None, 0.0, f"sandbox: cannot create a temporary directory: {e}")
    try:
        return _run_in(root, source, timeout, memory_mb, cpu)
    except Exception as e:  # the sandbox itself failed (e.g. cannot start Python), not the code
        return SandboxResult("error", None, time.monotonic() - start, f"sandbox error: {e!r}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
