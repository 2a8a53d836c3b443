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
   one second more) and the `resource` module is blocked, so the code cannot raise them. RLIMIT_NPROC
   is not enforced for root, which we are on the project's machines: forks are contained by (1),
   (3) and (4) instead.
3. Process group: the child starts a new session (`start_new_session=True`); on timeout, and after
   every run in any case, the whole group is killed with SIGKILL (leftover grandchildren included),
   and the call waits (up to GROUP_EXIT_WAIT) until no member of it is alive.
4. Python-level guards installed by the bootstrap, in the spirit of the HumanEval harness's
   "reliability guard":
   - refused: process creation (os.fork/forkpty/system/popen/exec*/spawn*/posix_spawn*,
     subprocess.Popen, _posixsubprocess.fork_exec; multiprocessing, ctypes, resource and psutil
     cannot be imported), signalling (os.kill/killpg/pidfd_open, signal.pidfd_send_signal),
     os.chown/fchown/lchown/fchmod/lchmod/chflags/link/symlink/mkfifo/mknod/chroot/chdir/fchdir,
     identity and session changes (os.setuid... setsid/setpgid/setpgrp), shutil.rmtree/move/chown,
     builtins.exit/quit/help (faulthandler is disabled too);
   - allowed inside the temporary directory only: writing (open, io.FileIO, os.open), os.mkdir,
     remove/unlink/rmdir/rename/replace/truncate/chmod/utime (so tempfile works there), never in
     their dir_fd or file-descriptor forms;
   - network: creating a socket and name resolution (getaddrinfo, gethostbyname...) raise;
     socket.socketpair() (a connected local pair: asyncio's self-pipe) is allowed.
   os.putenv stays: it only affects this process (which cannot start another), and numpy's import
   needs it. Modules that are slow to import (subprocess, socket, shutil) are patched when the code
   first imports them, by a meta-path hook that also re-patches a module the code deletes from
   sys.modules and imports afresh. The temporary directory is also the working directory, $HOME and
   $TMPDIR. These guards stop accidents and naive misbehaviour, not a determined attacker: Python
   code can dig an original back up (`_imp.create_builtin` gives a fresh, unpatched `posix`), and
   then only (1)-(3) hold; the tests check that they do.
5. The interpreter runs with `-I -S` (isolated: no PYTHON* variables, no user site, no script
   directory; no site module: its .pth processing would cost 55 ms per run here) and gets the
   site-packages directories on sys.path as plain directories, so installed packages (numpy...)
   import as they would for the harness. The environment is minimal: PATH, HOME and TMPDIR (the
   temporary directory) and a UTF-8 locale; no proxies, no PYTHONPATH, nothing else inherited.

Not contained: disk use by many files (each capped at FILE_SIZE_MB; all deleted after the run), and
reading or, through a bypass of (4), writing what the harness's user may (the code runs as that
user: with the interpreter under /root, dropping to an unprivileged user would leave it unable to
import the standard library).
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

TEMP_PREFIX = "mars-sandbox-"  # every sandbox directory (and so every sandboxed command line) contains it
OUTPUT_LIMIT = 4096  # bytes of stdout+stderr kept in SandboxResult.output (head and tail)
FILE_SIZE_MB = 16  # RLIMIT_FSIZE: the largest file the code may write
OPEN_FILES = 256  # RLIMIT_NOFILE
PROCESSES = 64  # RLIMIT_NPROC (not enforced for root, see the module docstring)
SETUP_FAILED = 125  # exit code of a bootstrap that could not set the sandbox up -> status "error"
CPU_EXCEEDED = 124  # exit code after SIGXCPU (RLIMIT_CPU) -> status "timeout"
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


# The bootstrap runs in the child as `python -I -S -c BOOTSTRAP PROGRAM WORKDIR LIMITS SITE_DIRS`: it
# sets the limits, installs the guards, then compiles and runs the program file as __main__. It runs
# once per sample, so it imports nothing slow: modules that need patching but cost time to import
# (subprocess, socket, shutil: ~30 ms together) are patched when, and if, the code first imports them.
BOOTSTRAP = r"""
import os, sys
SETUP_FAILED, CPU_EXCEEDED = {SETUP_FAILED}, {CPU_EXCEEDED}


def _setup(workdir, limits, site_dirs):
    import _signal, resource  # _signal, not signal: the latter imports enum (8 ms)
    for item in limits.split(","):
        name, soft, hard = item.split(":")
        resource.setrlimit(getattr(resource, name), (int(soft), int(hard)))

    def cpu_exceeded(signum, frame):
        sys.stderr.write("sandbox: CPU time limit exceeded\n")
        sys.stderr.flush()
        os._exit(CPU_EXCEEDED)

    # A handler (not the default action) so that RLIMIT_CPU also ends a PID-namespace init, which
    # ignores default-action signals; the hard limit's SIGKILL backs it up.
    _signal.signal(_signal.SIGXCPU, cpu_exceeded)
    os.chdir(workdir)
    # -S skips site (55 ms of .pth processing here); the site-packages directories are added back as is.
    sys.path.extend(d for d in site_dirs.split(os.pathsep) if d)


def _refuse(what):
    def refused(*args, **kwargs):
        raise PermissionError(f"{what} is disabled in the sandbox")
    refused.__name__ = what.rsplit(".", 1)[-1]
    return refused


def _refuse_class(cls, what):
    # A subclass that cannot be instantiated, rather than a function: other modules may subclass it.
    # Empty __slots__: adds no __dict__/__weakref__, so a subclass may still declare them (socket.py does).
    def __init__(self, *args, **kwargs):
        raise PermissionError(f"{what} is disabled in the sandbox")
    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__, "__slots__": ()})


class _PatchedLoader:
    def __init__(self, loader, patch):
        self.loader, self.patch = loader, patch

    def __getattr__(self, name):  # get_source, get_filename... for tracebacks and inspect
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)


class _PatchOnImport:
    # A meta-path finder that patches some modules right after they are imported: on first import
    # for the slow ones, and again if the code deletes a patched module and imports it afresh.
    def __init__(self, patches):
        self.patches = patches

    def find_spec(self, name, path=None, target=None):
        patch = self.patches.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None:
                    spec.loader = _PatchedLoader(spec.loader, patch)
                    return spec
        return None


def _patch_subprocess(module):
    module.Popen = _refuse_class(module.Popen, "subprocess.Popen")


def _patch_posixsubprocess(module):
    module.fork_exec = _refuse("_posixsubprocess.fork_exec")


def _patch_shutil(module):
    for name in ("rmtree", "move", "chown"):
        setattr(module, name, _refuse(f"shutil.{name}"))


def _patch__socket(module):
    # Patched before socket.py subclasses it, so socket.socket inherits the refusal.
    base = module.socket

    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        # Wrapping an existing descriptor is allowed: socket.socketpair() (asyncio's self-pipe) does it,
        # and its connected pair reaches nothing else. Creating a socket is not.
        if fileno is None:
            raise PermissionError("creating a socket is disabled in the sandbox")
        base.__init__(self, family, type, proto, fileno)

    module.socket = module.SocketType = type(
        "socket", (base,), {"__init__": __init__, "__module__": base.__module__, "__slots__": ()})
    # Name lookups go through libc's resolver, which would send DNS queries without a Python socket.
    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo"):
        setattr(module, name, _refuse(f"socket.{name}"))


def _patch_socket(module):
    for name in ("fromfd", "create_connection", "create_server"):
        setattr(module, name, _refuse(f"socket.{name}"))


def _patch_signal(module):  # signal, or _signal
    if hasattr(module, "pidfd_send_signal"):
        module.pidfd_send_signal = _refuse("signal.pidfd_send_signal")


def _file_guards(workdir):
    # Patches for os/posix and io/_io: writes and destructive calls only inside `workdir`.
    realpath, fsdecode, fspath = os.path.realpath, os.fsdecode, os.fspath

    def check(path, what, fd_ok=False):
        if isinstance(path, int):  # a file descriptor: fine to wrap (open), not to chmod or truncate
            if fd_ok:
                return
            raise PermissionError(f"{what} on a file descriptor is disabled in the sandbox")
        resolved = realpath(fsdecode(fspath(path)))
        if resolved != workdir and not resolved.startswith(workdir + os.sep):
            raise PermissionError(f"{what}: changing files outside the sandbox directory is disabled ({resolved!r})")

    def inside_only(real, what, paths):
        # Allowed on paths inside the sandbox directory only; the dir_fd forms (relative to a directory
        # we cannot see) are refused.
        def call(*args, **kwargs):
            for key in ("dir_fd", "src_dir_fd", "dst_dir_fd"):
                if kwargs.get(key) is not None:
                    raise PermissionError(f"{what} with {key} is disabled in the sandbox")
            for path in (*args[:paths], *(kwargs[k] for k in ("path", "src", "dst") if k in kwargs)):
                check(path, what)
            return real(*args, **kwargs)
        call.__name__ = real.__name__
        return call

    def writes(mode):
        return any(c in mode for c in "wax+")

    def guarded_open(real):
        def open(file, mode="r", *args, **kwargs):
            if writes(mode):
                check(file, "open", fd_ok=True)
            return real(file, mode, *args, **kwargs)
        return open

    def guarded_fileio(base):
        def __init__(self, file, mode="r", *args, **kwargs):
            if writes(mode):
                check(file, "FileIO", fd_ok=True)
            base.__init__(self, file, mode, *args, **kwargs)
        return type("FileIO", (base,), {"__init__": __init__, "__module__": base.__module__, "__slots__": ()})

    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def guarded_os_open(real):
        def open(path, flags, mode=0o777, *, dir_fd=None):
            if flags & write_flags:
                if dir_fd is not None:
                    raise PermissionError("os.open for writing with dir_fd is disabled in the sandbox")
                check(path, "os.open")
            return real(path, flags, mode, dir_fd=dir_fd)
        return open

    def patch_os(module):  # os, or posix (where os's functions come from; a fresh import is patched too)
        module.open = guarded_os_open(module.open)
        for name, paths in (("mkdir", 1), ("remove", 1), ("unlink", 1), ("rmdir", 1), ("rename", 2),
                            ("replace", 2), ("truncate", 1), ("chmod", 1), ("utime", 1)):
            setattr(module, name, inside_only(getattr(module, name), f"os.{name}", paths))
        for name in (
            "fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp",
            "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
            "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
            "kill", "killpg", "pidfd_open",
            "fchmod", "lchmod", "chown", "fchown", "lchown", "chflags", "lchflags",
            "link", "symlink", "mkfifo", "mknod", "chroot", "chdir", "fchdir",
            "setuid", "seteuid", "setreuid", "setresuid", "setgid", "setegid", "setregid", "setresgid",
            "setgroups", "setsid", "setpgid", "setpgrp",
        ):
            if hasattr(module, name):
                setattr(module, name, _refuse(f"os.{name}"))

    def patch_io(module):  # io, or _io
        module.open = guarded_open(module.open)
        module.FileIO = guarded_fileio(module.FileIO)

    return patch_os, patch_io


def _guard(workdir):
    import builtins, faulthandler

    patch_os, patch_io = _file_guards(workdir)
    patches = {"os": patch_os, "posix": patch_os, "io": patch_io, "_io": patch_io, "signal": _patch_signal,
               "_signal": _patch_signal, "subprocess": _patch_subprocess, "_posixsubprocess": _patch_posixsubprocess,
               "shutil": _patch_shutil, "_socket": _patch__socket, "socket": _patch_socket}
    # Modules already imported are patched now, the others when (if) the code imports them.
    for name in ("posix", "os", "_io", "io", "_signal", "_posixsubprocess"):
        __import__(name)
    for name, patch in patches.items():
        if name in sys.modules:
            patch(sys.modules[name])
    builtins.open = sys.modules["io"].open
    for name in ("exit", "quit", "help"):
        setattr(builtins, name, _refuse(name))
    faulthandler.disable()
    sys.meta_path.insert(0, _PatchOnImport(patches))
    # None in sys.modules makes `import x` raise ImportError.
    for name in ("multiprocessing", "_multiprocessing", "ctypes", "_ctypes", "resource", "psutil"):
        sys.modules[name] = None


def _main(program, workdir, limits, site_dirs):
    try:
        _setup(workdir, limits, site_dirs)
        with open(program, encoding="utf-8") as f:
            source = f.read()
        _guard(workdir)
    except BaseException as e:
        sys.stderr.write(f"sandbox setup failed: {e!r}\n")
        sys.stderr.flush()
        os._exit(SETUP_FAILED)
    main = type(sys)("__main__")
    main.__file__ = program
    sys.modules["__main__"] = main
    sys.argv = [program]
    code = compile(source, program, "exec")  # a SyntaxError is the code's failure: exit code 1
    exec(code, main.__dict__)


_main(*sys.argv[1:5])
""".replace("{SETUP_FAILED}", str(SETUP_FAILED)).replace("{CPU_EXCEEDED}", str(CPU_EXCEEDED))

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


def sandbox_layers() -> dict:
    """Which containment layers apply on this machine (see the module docstring)."""
    prefix = namespace_prefix()
    return {
        "network_namespace": "--net" in prefix,
        "pid_namespace": "--pid" in prefix,
        "user_namespace": "--user" in prefix,
        "command_prefix": list(prefix),
        "rlimits": ["RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NOFILE", "RLIMIT_NPROC"],
        "rlimit_nproc_enforced": os.geteuid() != 0,  # the kernel exempts root
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
    program.write_text(source, encoding="utf-8", errors="replace")
    command = [*namespace_prefix(), sys.executable, "-I", "-S", "-c", BOOTSTRAP,
               str(program), str(workdir), _limits(memory_mb, cpu_seconds), _site_dirs()]
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
