"""Run untrusted, model-generated Python source in a sandboxed subprocess (used to score HumanEval).

    result = run_sandboxed(source, timeout=10.0, memory_mb=1024)
    result.status    # "passed" | "failed" | "timeout" | "killed" | "error"

Every call gets its own process and its own fresh temporary directory (deleted afterwards), and
whatever the code does (crash, loop, allocate, fork, write, connect, kill) the call returns a
`SandboxResult`. It raises for bad arguments, and `SandboxUnavailable` when no isolation layer here
can hide the caller's private files (see "Fail closed"). `sandbox_layers()` reports what is active.

Isolation levels, probed once per process (each by running a program through it); the first that
works for the harness's user is used for every call:

- ``root`` (a harness running as root): ``unshare --mount --pid --net --fork --kill-child``, then a
  new root (below), entered with ``chroot``, and ``setpriv --no-new-privs``; the bootstrap drops to
  nobody:nogroup (`sandbox_user()`; no supplementary groups, saved IDs too, so no capabilities)
  before the code runs.
- ``root-drop`` (root, where a mount namespace cannot be made, e.g. a container without
  CAP_SYS_ADMIN): the drop to nobody alone, under ``unshare --net --pid --mount-proc`` or what of it
  works. The caller's 0600 files stay unreadable, but the host's file system is visible and nobody
  may write in /tmp.
- ``bwrap`` (not root, bubblewrap installed): ``bwrap --unshare-all --as-pid-1`` with the same new
  root; the code runs as the harness's own uid inside a user namespace, every capability dropped and
  no_new_privs set (bubblewrap's defaults for an unprivileged caller).
- ``userns`` (not root, unprivileged user namespaces enabled): ``unshare --user --map-root-user
  --mount --pid --net --fork --kill-child``; inside, ``mount -a`` builds the new root, ``chroot``
  enters it and ``setpriv --no-new-privs --inh-caps=-all --bounding-set=-all`` runs the interpreter:
  it is uid 0 of its own namespace with no capability at all (an empty bounding set gives an exec as
  root nothing), so it cannot unmount what hides the host, and a chrooted process may not create
  another user namespace to regain them.

Landlock is not used: its one Python binding of some age, PyPI `landlock`, has only dev releases
(1.0.0.dev0-dev5, the last in May 2025) and reports every call after a failed one as failed, the
others are months old, and where the code gets a new root (below) Landlock would only repeat it.

The new root (levels root, bwrap, userns) is an empty directory on which only these are mounted:
/usr, /etc, the /bin, /sbin, /lib* directories (or their symlinks), and the interpreter's prefix,
base prefix and site-packages wherever they live (a pyenv or venv in the home directory included),
all read-only and nosuid; /dev/null, zero, full, random and urandom; a fresh /proc of the new PID
namespace; the run's inputs (program, bootstrap) read-only and its working directory read-write.
The rest of the host is absent: the caller's home (~/.netrc with a W&B key, hub tokens), /tmp, other
users' files, /run and /sys. The root of it is read-only, so the working directory is the only
place the code can write. The PID namespace's /proc shows the code's own processes only (the
harness and every host process have no PID there: their environments cannot be read and they
cannot be signalled), and when its first process ends the kernel kills every process left in it.
The network namespace has only a loopback interface, down, and no route: a socket opens but
reaches nothing, not even the host's 127.0.0.1; raw sockets need a capability the code lacks.

Fail closed: a harness that is not root and has neither bubblewrap nor unprivileged user
namespaces would run the code with its own permissions (able to read every file its user can).
Then `run_sandboxed` (and HumanEval scoring before running anything) raises `SandboxUnavailable`,
naming what is missing and how to allow it: ``sandbox.allow_unisolated=true`` in an ``eval.run``
config, ``--allow-unisolated`` for ``eval.score``, `allow_unisolated()` in code, or run in a
container (or as root). With that allowance the level is ``unisolated`` (the strongest namespaces
``unshare`` still gives, possibly none), and the job's summary.json, report and W&B run say
``sandbox: unisolated``.

Below the isolation, on every level:

1. Resource limits, set by the bootstrap in the child before the code is compiled: RLIMIT_AS
   (memory_mb), RLIMIT_CPU (cpu_seconds; SIGXCPU at the limit ends the run as a "timeout", SIGKILL
   one second later if that did not), RLIMIT_FSIZE (each file written, stdout included, at most
   FILE_SIZE_MB), RLIMIT_CORE 0, RLIMIT_NOFILE and RLIMIT_NPROC. Hard limits equal soft ones (CPU:
   one second more) and the `resource` module is blocked, so the code cannot raise them (and,
   without capabilities, could not anyway).
2. Sessions: the harness starts the wrapper (unshare, bwrap) in a new session (`start_new_session=True`)
   and the code leaves the wrapper's process group for a session of its own (bwrap ``--new-session``,
   elsewhere the bootstrap's setsid), so its kill(0) / killpg(0) reach only its own processes, never
   the wrapper whose exit status the harness reports. On timeout the harness looks up every process
   group below the wrapper (the code's session, and any its processes started), kills them and the
   wrapper's with SIGKILL, and waits (up to GROUP_EXIT_WAIT) until none has a live member; after
   every run the wrapper's group is killed in any case (leftover grandchildren included).
3. Python-level guards installed by the bootstrap (`sandbox_boot._guard` lists them), in the spirit
   of the HumanEval harness's "reliability guard": no process creation, signalling, identity or
   session changes, sockets (but a connected local pair) or name resolution; writing, renaming and
   deleting only inside the temporary directory (also the working directory, $HOME and $TMPDIR);
   multiprocessing, ctypes, resource and psutil cannot be imported. Modules slow to import are
   patched when the code first imports them (a meta-path hook, which also re-patches a module the
   code deletes and imports afresh). These guards stop accidents and naive misbehaviour, not a
   determined attacker: Python code can dig an original back up (`_imp.create_builtin` gives a
   fresh, unpatched `posix`), and then the isolation and (1)-(2) hold; the tests check that they do.
4. The interpreter runs with `-I -S` (isolated: no PYTHON* variables, no user site, no script
   directory; no site module: its .pth processing would cost 55 ms per run here) and gets the
   site-packages directories on sys.path as plain directories, so installed packages (numpy...)
   import as they would for the harness. The environment is minimal: PATH, HOME and TMPDIR (the
   temporary directory) and a UTF-8 locale; no proxies, no PYTHONPATH, nothing else inherited.

The sandboxed process's program is a copy of `eval/scoring/sandbox_boot.py` in the run's inputs.
Not contained: disk use by many files (each capped at FILE_SIZE_MB; all deleted after the run), CPU
time of the code's own processes until the timeout, and (levels root-drop and unisolated) what the
docstring of each says above.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eval.scoring import sandbox_boot
from eval.scoring.sandbox_boot import CPU_EXCEEDED, SETUP_FAILED

TEMP_PREFIX = "mars-sandbox-"  # every sandbox directory (and so every sandboxed command line) contains it
OUTPUT_LIMIT = 4096  # bytes of stdout+stderr kept in SandboxResult.output (head and tail)
FILE_SIZE_MB = 16  # RLIMIT_FSIZE: the largest file the code may write
OPEN_FILES = 256  # RLIMIT_NOFILE
PROCESSES = 64  # RLIMIT_NPROC
BOOT = Path(sandbox_boot.__file__)  # the sandboxed process's program (copied into each run's inputs)
SANDBOX_USER, SANDBOX_GROUP, UNPRIVILEGED_ID = "nobody", "nogroup", 65534  # what a root harness's child drops to
GROUP_EXIT_WAIT = 1.0  # seconds to wait, after the run, for the last processes of its group to be gone
PROBE_TIMEOUT = 30.0  # seconds for each one-off probe run (generous: the machine may be busy)

ROOT, ROOT_DROP, BWRAP, USERNS, UNISOLATED = "root", "root-drop", "bwrap", "userns", "unisolated"
LEVELS = (ROOT, ROOT_DROP, BWRAP, USERNS)  # strongest first; root's for a root harness, the others' otherwise
HIDES_PRIVATE_FILES = {ROOT: True, ROOT_DROP: True, BWRAP: True, USERNS: True, UNISOLATED: False}
# unshare flag sets for the levels without a new root, strongest first (the first that runs is used).
ROOT_DROP_FLAGS = (("--net", "--pid", "--mount-proc", "--fork", "--kill-child"),
                   ("--net", "--pid", "--fork", "--kill-child"), ("--net",), ())
UNISOLATED_FLAGS = (("--user", "--map-root-user", "--net", "--pid", "--mount-proc", "--fork", "--kill-child"),
                    ("--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"), ("--net",), ())
# What the new root shows of the host, read-only (besides the interpreter's directories).
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
DEVICES = ("null", "zero", "full", "random", "urandom")
# Run inside the new namespaces by `sh -c`: build the new root from the run's fstab, enter it, run the rest
# (without the PWD that sh exports: the code's environment is only what _environment gives).
NEW_ROOT_SCRIPT = ('mount=$1 fstab=$2 chroot=$3 newroot=$4; shift 4; unset PWD OLDPWD; '
                   '"$mount" -a -T "$fstab" && exec "$chroot" "$newroot" "$@"')


class SandboxUnavailable(RuntimeError):
    """No isolation level here hides the caller's private files, and running without one was not allowed."""


@dataclass(frozen=True)
class SandboxResult:
    status: str  # "passed" (exit 0), "failed" (non-zero exit / exception), "timeout", "killed" (signal), "error"
    returncode: int | None  # the child's exit code (negative: killed by that signal); None if it never ran
    seconds: float  # wall time of the run
    output: str  # stdout+stderr, at most OUTPUT_LIMIT bytes (head and tail when longer)


# --- the isolation levels and their probe -----------------------------------------------------------

_lock = threading.RLock()
_probed: dict[str, str | None] | None = None  # level -> None (works here) or why not
_flags: dict[str, tuple[str, ...]] = {}  # root-drop / unisolated: the unshare flags that worked
_forced: str | None = None  # set by use_isolation()
_allowed_unisolated = False  # set by allow_unisolated()
NOT_PROBED = "not probed: a stronger level works here"


def _tool(name: str) -> str | None:
    # The harness's PATH may be anything; the system's directories are where these live.
    return shutil.which(name) or shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")


def _candidates() -> tuple[str, ...]:
    """The levels for this harness's user, strongest first. A root harness never uses bwrap or userns: its
    uid 0 mapped into a user namespace would still own (and so read) root's private files."""
    return (ROOT, ROOT_DROP) if os.geteuid() == 0 else (BWRAP, USERNS)


def _missing_tools(level: str) -> str | None:
    needed = {ROOT: ("unshare", "sh", "mount", "chroot", "setpriv"), ROOT_DROP: (), BWRAP: ("bwrap",),
              USERNS: ("unshare", "sh", "mount", "chroot", "setpriv"), UNISOLATED: ()}[level]
    missing = [name for name in needed if _tool(name) is None]
    if missing:
        return f"{', '.join(missing)} not found (util-linux / coreutils / bubblewrap)"
    setpriv = _tool("setpriv")
    if level in (ROOT, USERNS) and not _under(Path(os.path.realpath(setpriv)), _bound_system_dirs()):
        return f"setpriv ({setpriv}) is not under the system directories the new root shows ({', '.join(SYSTEM_DIRS)})"
    return None


def _probe_level(level: str) -> str | None:
    """None if a program runs and prints through `level` here, else why not (one line)."""
    missing = _missing_tools(level)
    if missing:
        return missing
    flag_sets = {ROOT_DROP: ROOT_DROP_FLAGS, UNISOLATED: UNISOLATED_FLAGS}.get(level, ((),))
    failure = "no flag set of `unshare` works"
    for flags in flag_sets:
        if flags and _tool("unshare") is None:
            continue
        _flags[level] = flags
        result = _run(level, "print('sandbox probe ok')", PROBE_TIMEOUT, 1024, math.ceil(PROBE_TIMEOUT))
        if result.status == "passed" and result.output == "sandbox probe ok\n":
            return None
        failure = " ".join(result.output.split())[:300] or f"exit status {result.returncode}"
    _flags.pop(level, None)
    return failure


def isolation_levels() -> dict[str, str | None]:
    """Every isolation level, strongest first: None where it works here, else why not. The levels for
    this harness's user are probed once per process, down to the first that works (a run through each,
    ~50 ms), then cached."""
    global _probed
    with _lock:
        if _probed is None:
            other = "the harness runs as root (level root applies)" if os.geteuid() == 0 else "the harness is not root"
            probed: dict[str, str | None] = {level: other for level in LEVELS if level not in _candidates()}
            for level in _candidates():
                if any(probed.get(stronger) is None for stronger in _candidates()[:_candidates().index(level)]):
                    probed[level] = NOT_PROBED  # a stronger level works: this one is never used
                else:
                    probed[level] = _probe_level(level)
            _probed = {level: probed[level] for level in LEVELS}
        return dict(_probed)


def allow_unisolated(allowed: bool = True) -> None:
    """Allow (or forbid again) running the code with the harness's own permissions where no isolation level
    works (`eval.run`'s sandbox.allow_unisolated, `eval.score --allow-unisolated`); process-wide."""
    global _allowed_unisolated
    _allowed_unisolated = bool(allowed)


def refusal() -> str:
    """Why the sandbox refuses here, and how to allow it (the message of `SandboxUnavailable`)."""
    levels = isolation_levels()
    uid = os.geteuid()
    tried = "; ".join(f"{level}: {levels[level]}" for level in _candidates())
    return (f"the HumanEval sandbox cannot hide your private files here (uid {uid}): no isolation level works "
            f"({tried}). Without one, model-written code would run with your permissions and could read "
            "~/.netrc (a W&B key), hub tokens and every file you can. Fix: install bubblewrap (`apt install "
            "bubblewrap`), or enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 "
            "and user.max_user_namespaces > 0; on Ubuntu also kernel.apparmor_restrict_unprivileged_userns=0), "
            "or run in a container or as root; or accept the risk: sandbox.allow_unisolated=true (eval.run) / "
            "--allow-unisolated (eval.score), and the results record sandbox: unisolated")


def isolation(allow_unisolated: bool | None = None) -> str:
    """The isolation level scoring uses here (`LEVELS`, or "unisolated" when allowed and none works).

    Raises `SandboxUnavailable` when no level hides the caller's private files and `allow_unisolated`
    (default: the process-wide `allow_unisolated()` setting) is false."""
    with _lock:
        if _forced is not None:
            return _forced
        levels = isolation_levels()
        for level in _candidates():
            if levels[level] is None:
                return level
        allowed = _allowed_unisolated if allow_unisolated is None else allow_unisolated
        if not allowed:
            raise SandboxUnavailable(refusal())
        if UNISOLATED not in _flags:
            problem = _probe_level(UNISOLATED)
            if problem is not None:  # not even plain Python runs: every sample would be an "error"
                raise SandboxUnavailable(f"the sandbox cannot run Python here at all: {problem}")
        return UNISOLATED


@contextlib.contextmanager
def use_isolation(level: str) -> Iterator[None]:
    """Run every sandboxed call in the block through `level` (tests: one level at a time). Raises
    SandboxUnavailable naming the reason when `level` does not work here."""
    global _forced
    if level not in (*LEVELS, UNISOLATED):
        raise ValueError(f"unknown isolation level {level!r}; levels: {', '.join((*LEVELS, UNISOLATED))}")
    global _probed
    with _lock:
        if level == UNISOLATED:
            if UNISOLATED not in _flags and (problem := _probe_level(UNISOLATED)) is not None:
                raise SandboxUnavailable(f"level unisolated does not work here: {problem}")
        else:
            reason = isolation_levels()[level]
            if reason == NOT_PROBED:
                reason = _probe_level(level)
                _probed = {**(_probed or {}), level: reason}
            if reason is not None:
                raise SandboxUnavailable(f"level {level} does not work here: {reason}")
        before, _forced = _forced, level
    try:
        yield
    finally:
        with _lock:
            _forced = before


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


def _runs_as(level: str) -> str:
    me = f"{os.geteuid()}:{os.getegid()}"
    return {
        ROOT: f"{sandbox_user()} (nobody), no capabilities, no_new_privs",
        ROOT_DROP: f"{sandbox_user()} (nobody), no capabilities",
        BWRAP: f"{me} (the harness's uid, in its own user namespace), no capabilities, no_new_privs",
        USERNS: f"uid 0 of its own user namespace ({me} outside), no capabilities (empty bounding set), "
                "no_new_privs",
        UNISOLATED: f"{me}: the harness's own user and permissions",
    }[level]


def sandbox_layers(allow_unisolated: bool | None = None) -> dict:
    """What contains the code here: the isolation level in use and its layers (see the module docstring),
    every level's state ("works" or why not), and the layers below the isolation. When scoring would
    refuse, "isolation" is None and "refusal" says why."""
    levels = isolation_levels()
    try:
        level: str | None = isolation(allow_unisolated)
        refused = None
    except SandboxUnavailable as e:
        level, refused = None, str(e)
    layers: dict = {"isolation": level, "levels": {k: v or "works" for k, v in levels.items()}}
    if refused is not None:
        layers["refusal"] = refused
    if level is not None:
        flags = _flags.get(level, ())
        new_root = level in (ROOT, BWRAP, USERNS)
        namespaces = {ROOT: ["mount", "pid", "net"], BWRAP: ["user", "mount", "pid", "net", "ipc", "uts", "cgroup"],
                      USERNS: ["user", "mount", "pid", "net"]}.get(level)
        if namespaces is None:
            namespaces = [name for name, flag in (("user", "--user"), ("mount", "--mount-proc"), ("pid", "--pid"),
                                                  ("net", "--net")) if flag in flags]
        layers.update({
            "hides_private_files": HIDES_PRIVATE_FILES[level],
            "namespaces": namespaces,
            "filesystem": ("new root: system directories and the interpreter read-only, the run's directory "
                           "read-write, nothing else of the host" if new_root else
                           "the host's" + (", read as nobody" if level == ROOT_DROP else ", with the harness's "
                                           "permissions")),
            "fresh_proc": new_root or "--mount-proc" in flags,
            "runs_as": _runs_as(level),
            "command_prefix": _prefix_description(level),
        })
    layers.update({
        "rlimits": ["RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NOFILE", "RLIMIT_NPROC"],
        "process_group_kill": True,
        "own_session": True,
        "python_guards": True,
    })
    return layers


def _prefix_description(level: str) -> list[str]:
    if level == BWRAP:
        return [str(_tool("bwrap")), "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1", "..."]
    if level in (ROOT, USERNS):
        user = ["--user", "--map-root-user"] if level == USERNS else []
        setpriv = ["--inh-caps=-all", "--bounding-set=-all"] if level == USERNS else []
        return [str(_tool("unshare")), *user, "--mount", "--pid", "--net", "--fork", "--kill-child", "--", "sh",
                "-c", "mount -a -T FSTAB && exec chroot NEWROOT ...", str(_tool("setpriv")), "--no-new-privs",
                *setpriv, "--"]
    flags = _flags.get(level, ())
    return [str(_tool("unshare")), *flags, "--"] if flags else []


# --- the new root ---------------------------------------------------------------------------------

def _under(path: Path, dirs: list[Path]) -> bool:
    return any(path == d or d in path.parents for d in dirs)


@functools.cache
def _bound_system_dirs() -> list[Path]:
    """The system directories the new root shows (real directories; symlinks such as /bin -> usr/bin are
    recreated as symlinks), resolved."""
    return [Path(os.path.realpath(d)) for d in SYSTEM_DIRS if os.path.isdir(d)]


@functools.cache
def _interpreter_dirs() -> tuple[str, ...]:
    """The interpreter's directories to show read-only (prefixes, the executable's, site-packages), as the
    interpreter names them and resolved, outside the system directories, none inside another."""
    names = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable),
             *(d for d in _site_dirs().split(os.pathsep) if d)}
    paths = {Path(p) for n in names if n and os.path.isdir(n) for p in (os.path.abspath(n), os.path.realpath(n))}
    system = _bound_system_dirs()
    paths = {p for p in paths if not _under(Path(os.path.realpath(p)), system) and not _under(p, system)}
    kept = [p for p in paths if not any(q != p and q in p.parents for q in paths)]
    return tuple(str(p) for p in sorted(kept))


def _fstab_field(text: str) -> str:
    # fstab fields are separated by blanks: octal escapes as in /proc/mounts.
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in text)


def _mkdirs(path: Path) -> None:
    """mkdir -p with mode 0755 whatever the umask: the dropped user (root level) must traverse the new root."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir()
        directory.chmod(0o755)


def _new_root(root: Path, inputs: Path, workdir: Path) -> tuple[Path, Path]:
    """Make the new root's mount points under `root` and the fstab that mounts it: (fstab, new root)."""
    newroot = root / "newroot"
    _mkdirs(newroot)
    lines = [(newroot, newroot, "none", "bind,ro,nosuid,nodev")]  # its own skeleton, read-only
    for name in SYSTEM_DIRS:
        if os.path.islink(name):
            (newroot / name.lstrip("/")).symlink_to(os.readlink(name))
        elif os.path.isdir(name):
            _mkdirs(newroot / name.lstrip("/"))
            lines.append((Path(name), newroot / name.lstrip("/"), "none", "bind,ro,nosuid,nodev"))
    _mkdirs(newroot / "dev")
    for device in DEVICES:
        if os.path.exists(f"/dev/{device}"):
            (newroot / "dev" / device).touch()
            lines.append((Path(f"/dev/{device}"), newroot / "dev" / device, "none", "bind,nosuid"))
    for directory in _interpreter_dirs():
        _mkdirs(newroot / directory.lstrip("/"))
        lines.append((Path(directory), newroot / directory.lstrip("/"), "none", "bind,ro,nosuid,nodev"))
    for path, options in ((inputs, "bind,ro,nosuid,nodev"), (workdir, "bind,nosuid,nodev")):
        _mkdirs(newroot / str(path).lstrip("/"))
        lines.append((path, newroot / str(path).lstrip("/"), "none", options))
    _mkdirs(newroot / "proc")
    lines.append((Path("proc"), newroot / "proc", "proc", "nosuid,nodev,noexec"))
    fstab = root / "fstab"
    fstab.write_text("".join(f"{_fstab_field(str(a))} {_fstab_field(str(b))} {kind} {options} 0 0\n"
                             for a, b, kind, options in lines))
    return fstab, newroot


def _bwrap_arguments(inputs: Path, workdir: Path) -> list[str]:
    # --new-session: the code leads a session of its own, out of bwrap's process group (as the bootstrap
    # arranges on the other levels), so its kill(0) cannot end bwrap.
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1", "--cap-drop", "ALL"]
    for name in SYSTEM_DIRS:
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    args += ["--dev", "/dev", "--proc", "/proc"]
    for directory in _interpreter_dirs():
        args += ["--ro-bind", directory, directory]
    args += ["--ro-bind", str(inputs), str(inputs), "--bind", str(workdir), str(workdir), "--chdir", str(workdir),
             "--unsetenv", "PWD", "--remount-ro", "/"]  # --chdir would export PWD: the environment stays minimal
    return args


def _command(level: str, root: Path, inputs: Path, workdir: Path, boot_args: list[str]) -> list[str]:
    python = [sys.executable, "-I", "-S", str(inputs / BOOT.name), *boot_args]
    if level == BWRAP:
        return [str(_tool("bwrap")), *_bwrap_arguments(inputs, workdir), "--", *python]
    if level in (ROOT, USERNS):
        fstab, newroot = _new_root(root, inputs, workdir)
        user = ["--user", "--map-root-user"] if level == USERNS else []
        # Root keeps its capabilities until the bootstrap drops to nobody (which clears them); the userns
        # level stays uid 0, so its bounding and inheritable sets are emptied: its exec gets no capability.
        caps = ["--inh-caps=-all", "--bounding-set=-all"] if level == USERNS else []
        return [str(_tool("unshare")), *user, "--mount", "--pid", "--net", "--fork", "--kill-child", "--",
                str(_tool("sh")), "-c", NEW_ROOT_SCRIPT, "sh", str(_tool("mount")), str(fstab), str(_tool("chroot")),
                str(newroot), str(_tool("setpriv")), "--no-new-privs", *caps, "--", *python]
    flags = _flags.get(level, ())
    return [*([str(_tool("unshare")), *flags, "--"] if flags else []), *python]


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


def _processes() -> dict[int, tuple[int, int, bool]]:
    """pid -> (parent pid, process group, alive: not a zombie) of every process, from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    state, ppid, group = f.read().rsplit(b")", 1)[1].split()[:3]
            except (OSError, ValueError):  # gone meanwhile
                continue
            table[int(entry)] = (int(ppid), int(group), state not in (b"Z", b"X"))
    return table


def _run_groups(pid: int) -> set[int]:
    """The process groups of the run started as `pid` (a new session: its group is `pid`): that group and
    those of its descendants. The bootstrap leaves the wrapper's group for a session of its own (so that
    the code's kill(0) cannot reach unshare / bwrap), and the code's processes may start more: only the
    process tree leads to them."""
    if not os.path.isdir("/proc"):
        return {pid}
    table = _processes()
    groups, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, group, _) in table.items():
            if ppid == parent:
                groups.add(group)
                frontier.append(child)
    return groups


def _kill_groups(pgids: set[int], wait: float = 0.0) -> None:
    """SIGKILL every process of the groups `pgids`; with `wait`, keep at it for up to that many seconds
    until none of them has a live member (killed members re-parented away from us, such as a
    PID-namespace init whose wrapper died first, stay zombies until PID 1 reaps them; a namespace init
    becomes one only once every process of its namespace is gone)."""
    deadline = time.monotonic() + wait
    while True:
        remaining = set()
        for pgid in pgids:
            try:
                os.killpg(pgid, signal.SIGKILL)
                remaining.add(pgid)
            except (ProcessLookupError, PermissionError):  # the group is gone
                pass
        pgids = remaining
        if not pgids or time.monotonic() >= deadline or not os.path.isdir("/proc"):
            return
        if not any(alive and group in pgids for _, group, alive in _processes().values()):
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


def _boot_source() -> bytes:
    return BOOT.read_bytes()


def _run_in(root: Path, level: str, source: str, timeout: float, memory_mb: int, cpu_seconds: int) -> SandboxResult:
    inputs, workdir = root / "in", root / "work"
    inputs.mkdir()
    workdir.mkdir()
    program = inputs / "program.py"  # outside the working directory: the code cannot overwrite it
    program.write_text(source, encoding="utf-8", errors="replace")  # 0600: read before the privilege drop
    (inputs / BOOT.name).write_bytes(_boot_source())
    user = sandbox_user() if level in (ROOT, ROOT_DROP) else ""
    if user:  # the dropped process may enter its directory (not list it) and write in its working directory
        uid, gid = (int(x) for x in user.split(":"))
        root.chmod(0o711)
        os.chown(workdir, uid, gid)
    boot_args = [str(program), str(workdir), _limits(memory_mb, cpu_seconds), _site_dirs(), user]
    command = _command(level, root, inputs, workdir, boot_args)
    output = root / "output"
    start = time.monotonic()
    with output.open("wb") as out:
        # stdout goes to a file, not a pipe: no reader thread, and a flood of output only hits RLIMIT_FSIZE.
        proc = subprocess.Popen(command, cwd=workdir, env=_environment(workdir), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        try:
            timed_out = not _wait_for_exit(proc, timeout)
        finally:
            # The child leads a new session (pgid == pid). A wrapper that has exited by itself waited for
            # the code (unshare --fork, bwrap): only its own group can be left. One still running (a
            # timeout) has the code below it in groups of the code's own: look them up before killing
            # the wrapper, which would detach them from the tree.
            groups = _run_groups(proc.pid) if proc.poll() is None else {proc.pid}
            _kill_groups(groups)
            proc.wait()
            _kill_groups(groups, wait=GROUP_EXIT_WAIT)  # leftovers: grandchildren, a dying namespace init
    seconds = time.monotonic() - start
    returncode = proc.returncode
    return SandboxResult(_status(returncode, timed_out), returncode, seconds, _read_output(output))


def _run(level: str, source: str, timeout: float, memory_mb: int, cpu_seconds: int) -> SandboxResult:
    start = time.monotonic()
    try:
        root = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    except OSError as e:
        return SandboxResult("error", None, 0.0, f"sandbox: cannot create a temporary directory: {e}")
    try:
        return _run_in(root, level, source, timeout, memory_mb, cpu_seconds)
    except Exception as e:  # the sandbox itself failed (e.g. cannot start Python), not the code
        return SandboxResult("error", None, time.monotonic() - start, f"sandbox error: {e!r}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_sandboxed(source: str, timeout: float = 10.0, memory_mb: int = 1024,
                  cpu_seconds: int | None = None, allow_unisolated: bool | None = None) -> SandboxResult:
    """Run `source` as a Python program in a fresh sandboxed process; never raises for what the code does.

    `timeout`: wall-clock seconds before the process group is killed (status "timeout").
    `memory_mb`: address-space limit. `cpu_seconds`: CPU-time limit, default ceil(timeout).
    `allow_unisolated`: run even where no isolation level works (default: the `allow_unisolated()`
    setting); otherwise that raises `SandboxUnavailable` (see the module docstring).
    """
    if not timeout > 0 or memory_mb <= 0 or (cpu_seconds is not None and cpu_seconds <= 0):
        raise ValueError(f"run_sandboxed needs timeout > 0, memory_mb > 0 and cpu_seconds > 0 or None; got "
                         f"timeout={timeout}, memory_mb={memory_mb}, cpu_seconds={cpu_seconds}")
    cpu = cpu_seconds if cpu_seconds is not None else max(1, math.ceil(timeout))
    return _run(isolation(allow_unisolated), source, timeout, memory_mb, cpu)
