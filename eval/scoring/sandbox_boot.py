"""The sandboxed process's own program: `python -I -S sandbox_boot.py PROGRAM WORKDIR LIMITS SITE_DIRS USER`.

Run by `eval.scoring.sandbox` in a fresh interpreter for each sample (see its docstring for the layers). In
order: start a session of its own (`_own_session`); set the resource limits and move into WORKDIR
(`_setup`); read PROGRAM; install the Python-level guards (`_guard`); import what PROGRAM imports
(`_preload`); drop to USER ("uid:gid", when started as root); then compile and run PROGRAM as
__main__. After the drop the process can read only what that user may: not the caller's private
files (~/.netrc, hub tokens), and not an interpreter installed where only root can enter (e.g. under
/root), which is why the program's imports are loaded first, as root, under the guards. It runs
once per sample, so it imports nothing slow: modules that need patching but cost time to import
(subprocess, socket, shutil: ~30 ms together) are patched when, and if, the code first imports them.

Only the standard library, and nothing of this repository, is imported here: the interpreter runs
isolated (-I), without this file's directory on sys.path.
"""

import os
import sys

SETUP_FAILED = 125  # exit code of a bootstrap that could not set the sandbox up -> status "error"
CPU_EXCEEDED = 124  # exit code after SIGXCPU (RLIMIT_CPU) -> status "timeout"


def _own_session():
    """Leave the process group of the wrapper that started us (unshare, bwrap) for a new session of our
    own, so that kill(0) / killpg(0) by the code reach the code's own processes and not the wrapper: a
    dead wrapper would end the run as "killed" whatever the code did. The harness finds this group
    through the wrapper when it has to kill the run. Started directly by the harness (no wrapper: no
    fork in between), we already lead our group, setsid refuses, and nothing else is in the group."""
    try:
        os.setsid()
    except PermissionError:
        pass


def _setup(workdir, limits, site_dirs):
    import _signal
    import resource  # _signal, not signal: the latter imports enum (8 ms)
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


def _path_check(workdir):
    """`check(path, what, fd_ok=False)`: refuse `what` on a path outside `workdir` (or on a descriptor unless
    `fd_ok`). It resolves paths with os's functions as they are now, before any patch replaces them."""
    realpath, fsdecode, fspath = os.path.realpath, os.fsdecode, os.fspath

    def check(path, what, fd_ok=False):
        if isinstance(path, int):  # a file descriptor: fine to wrap (open), not to chmod or truncate
            if fd_ok:
                return
            raise PermissionError(f"{what} on a file descriptor is disabled in the sandbox")
        resolved = realpath(fsdecode(fspath(path)))
        if resolved != workdir and not resolved.startswith(workdir + os.sep):
            raise PermissionError(f"{what}: changing files outside the sandbox directory is disabled ({resolved!r})")

    return check


def _inside_only(check, real, what, paths):
    """`real` allowed on paths inside the sandbox directory only (its first `paths` arguments and path/src/dst);
    the dir_fd forms (relative to a directory we cannot see) are refused."""
    def call(*args, **kwargs):
        for key in ("dir_fd", "src_dir_fd", "dst_dir_fd"):
            if kwargs.get(key) is not None:
                raise PermissionError(f"{what} with {key} is disabled in the sandbox")
        for path in (*args[:paths], *(kwargs[k] for k in ("path", "src", "dst") if k in kwargs)):
            check(path, what)
        return real(*args, **kwargs)
    call.__name__ = real.__name__
    return call


def _writes(mode):
    return any(c in mode for c in "wax+")


def _guarded_open(check, real):
    """open (builtins, io, _io) that writes inside the sandbox directory only."""
    def open(file, mode="r", *args, **kwargs):
        if _writes(mode):
            check(file, "open", fd_ok=True)
        return real(file, mode, *args, **kwargs)
    return open


def _guarded_fileio(check, base):
    """io.FileIO that writes inside the sandbox directory only."""
    def __init__(self, file, mode="r", *args, **kwargs):
        if _writes(mode):
            check(file, "FileIO", fd_ok=True)
        base.__init__(self, file, mode, *args, **kwargs)
    return type("FileIO", (base,), {"__init__": __init__, "__module__": base.__module__, "__slots__": ()})


def _guarded_os_open(check, real):
    """os.open that opens for writing inside the sandbox directory only, never relative to a dir_fd."""
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & write_flags:
            if dir_fd is not None:
                raise PermissionError("os.open for writing with dir_fd is disabled in the sandbox")
            check(path, "os.open")
        return real(path, flags, mode, dir_fd=dir_fd)
    return open


# os's functions that change files, each with the number of leading path arguments (allowed inside workdir only)
_OS_INSIDE_ONLY = (("mkdir", 1), ("remove", 1), ("unlink", 1), ("rmdir", 1), ("rename", 2), ("replace", 2),
                   ("truncate", 1), ("chmod", 1), ("utime", 1))
# os's functions refused outright: processes, signals, identity and session, ownership, links, root and directory
_OS_REFUSED = (
    "fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp",
    "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
    "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
    "kill", "killpg", "pidfd_open",
    "fchmod", "lchmod", "chown", "fchown", "lchown", "chflags", "lchflags",
    "link", "symlink", "mkfifo", "mknod", "chroot", "chdir", "fchdir",
    "setuid", "seteuid", "setreuid", "setresuid", "setgid", "setegid", "setregid", "setresgid",
    "setgroups", "setsid", "setpgid", "setpgrp",
)


def _file_guards(workdir):
    # Patches for os/posix and io/_io: writes and destructive calls only inside `workdir`.
    check = _path_check(workdir)

    def patch_os(module):  # os, or posix (where os's functions come from; a fresh import is patched too)
        module.open = _guarded_os_open(check, module.open)
        for name, paths in _OS_INSIDE_ONLY:
            setattr(module, name, _inside_only(check, getattr(module, name), f"os.{name}", paths))
        for name in _OS_REFUSED:
            if hasattr(module, name):
                setattr(module, name, _refuse(f"os.{name}"))

    def patch_io(module):  # io, or _io
        module.open = _guarded_open(check, module.open)
        module.FileIO = _guarded_fileio(check, module.FileIO)

    return patch_os, patch_io


def _guard(workdir):
    """Refuse process creation (os.fork/forkpty/system/popen/exec*/spawn*/posix_spawn*, subprocess.Popen,
    _posixsubprocess.fork_exec), signalling (os.kill/killpg/pidfd_open, signal.pidfd_send_signal), identity
    and session changes (os.setuid... setsid/setpgid/setpgrp), os.chown/fchown/lchown/fchmod/lchmod/chflags/
    link/symlink/mkfifo/mknod/chroot/chdir/fchdir, shutil.rmtree/move/chown, sockets and name resolution
    (socket.socketpair stays: asyncio's self-pipe), builtins.exit/quit/help and faulthandler; allow writing
    (open, io.FileIO, os.open), mkdir, remove/unlink/rmdir/rename/replace/truncate/chmod/utime inside
    `workdir` only, never in their dir_fd or descriptor forms. os.putenv stays (numpy's import needs it)."""
    import builtins
    import faulthandler

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


def _preload(source, program):
    """Import the modules `source` imports (anywhere in it), so that they are loaded before the
    privilege drop; a module that fails to import is left for the program to fail on."""
    import ast

    try:
        tree = compile(source, program, "exec", ast.PyCF_ONLY_AST)
    except (SyntaxError, ValueError):  # the program's own failure, reported when it is compiled to run
        return
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            try:
                __import__(name)
            except BaseException:  # noqa: S110 - ImportError, or a module that fails in its own code
                pass


def _dropper(user):
    """A function that drops to user "uid:gid" (no supplementary groups), made before the guards
    refuse identity changes; a no-op for an empty `user` (not started as root)."""
    if not user:
        return lambda: None
    uid, gid = (int(x) for x in user.split(":"))
    setgroups, setresgid, setresuid = os.setgroups, os.setresgid, os.setresuid

    def drop():
        setgroups([])
        setresgid(gid, gid, gid)
        setresuid(uid, uid, uid)
        if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid:
            raise PermissionError(f"could not drop to {user}")
    return drop


def _main(program, workdir, limits, site_dirs, user):
    try:
        _own_session()
        _setup(workdir, limits, site_dirs)
        with open(program, encoding="utf-8") as f:
            source = f.read()
        drop = _dropper(user)
        _guard(workdir)
        _preload(source, program)
        drop()
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


if __name__ == "__main__":
    _main(*sys.argv[1:6])
