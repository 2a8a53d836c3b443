"""The attacker's side of tests/test_sandbox_isolation.py: run as the harness (root, or a non-root user),
it sends each hostile program through `run_sandboxed` at one isolation level and prints the outcomes as
JSON. Hostile programs only ever run through the sandbox.

    python tests/sandbox_attacks.py LEVEL SECRET_FILE PORT ESCAPE_DIR

SECRET_FILE: a 0600 file in the harness user's home; PORT: a TCP listener of the test on 127.0.0.1;
ESCAPE_DIR: a directory the harness user may write in (the attacks try to create files in it). The
harness's environment holds MARS_TEST_SECRET, which no sandboxed program may read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from eval.scoring import sandbox

# A fresh, unpatched posix module and the real socket class under the guard's refusing subclass: the
# Python guards are out of the way, so only the isolation below them stands.
FRESH = ("import _imp, importlib.machinery, _socket, sys\n"
         "posix = _imp.create_builtin(importlib.machinery.ModuleSpec('posix', None, origin='built-in'))\n"
         "_imp.exec_builtin(posix)  # its constants (O_WRONLY...)\n"
         "RealSocket = _socket.socket.__mro__[1]\n"
         "def attempt(name, action):\n"
         "    try:\n"
         "        print(name, 'OK', repr(action())[:300], flush=True)\n"
         "    except BaseException as e:\n"
         "        print(name, type(e).__name__, str(e)[:200], flush=True)\n")


def attacks(secret: str, port: int, escape_dir: str, harness_pid: int, victim_pid: int) -> dict[str, str]:
    targets = [os.path.join(escape_dir, "escape.txt"), os.path.join(os.path.dirname(secret), "escape.txt"),
               "/tmp/mars-sandbox-escape.txt", "/escape.txt"]
    writes = "".join(
        f"attempt('write {t}', lambda: posix.write(posix.open({t!r}, posix.O_WRONLY | posix.O_CREAT, 0o644), b'x'))\n"
        for t in targets)
    return {
        "read_home_secret": FRESH + f"attempt('read', lambda: open({secret!r}).read())\n",
        "proc_harness_environ": FRESH + f"attempt('read', lambda: open('/proc/{harness_pid}/environ', 'rb').read())\n",
        "proc_1_environ": FRESH + "attempt('read', lambda: open('/proc/1/environ', 'rb').read())\n",
        "list_proc": FRESH + "print('pids', sorted(int(p) for p in posix.listdir('/proc') if p.isdigit()))\n",
        "sockets": FRESH + (
            "import socket\n"
            "attempt('raw', lambda: RealSocket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))\n"
            "attempt('inet', lambda: RealSocket(socket.AF_INET, socket.SOCK_STREAM))\n"
            "def connect(address):\n"
            "    s = RealSocket(socket.AF_INET, socket.SOCK_STREAM)\n"
            "    s.settimeout(2)\n"
            "    s.connect(address)\n"
            "    return 'connected'\n"
            f"attempt('tcp-host', lambda: connect(('127.0.0.1', {port})))\n"
            "attempt('tcp-out', lambda: connect(('1.1.1.1', 80)))\n"
            "udp = RealSocket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "attempt('udp-out', lambda: udp.sendto(b'x', ('8.8.8.8', 53)))\n"),
        "write_outside": FRESH + writes,
        "fork_bomb": FRESH + (
            "import time\n"
            "print('bombing', flush=True)\n"
            "while True:\n"
            "    try:\n"
            "        posix.fork()\n"
            "    except OSError:\n"
            "        time.sleep(0.01)\n"),
        "kill_parent": FRESH + (
            "import signal\n"
            f"attempt('kill-harness', lambda: posix.kill({harness_pid}, signal.SIGKILL))\n"
            f"attempt('kill-victim', lambda: posix.kill({victim_pid}, signal.SIGKILL))\n"
            "attempt('kill-all', lambda: posix.kill(-1, signal.SIGKILL))\n"
            # Last: getppid() is 0 in a PID namespace, and kill(0) signals the code's own process group,
            # which may end its own run (its `unshare` / `bwrap` is in that group), nothing else.
            "attempt('kill-ppid', lambda: posix.kill(posix.getppid(), signal.SIGKILL))\n"
            "print('still here', flush=True)\n"),
    }


def main(level: str, secret: str, port: int, escape_dir: str) -> dict:
    try:
        context = sandbox.use_isolation(level)
        context.__enter__()
    except sandbox.SandboxUnavailable as e:
        return {"unavailable": str(e), "uid": os.geteuid()}
    victim = subprocess.Popen(["sleep", "120"])  # a process of the harness's user that the code must not kill
    try:
        results = {}
        for name, source in attacks(secret, port, escape_dir, os.getpid(), victim.pid).items():
            start = time.monotonic()
            result = sandbox.run_sandboxed(source, timeout=3.0 if name == "fork_bomb" else 10.0)
            results[name] = {"status": result.status, "returncode": result.returncode, "output": result.output,
                             "seconds": round(time.monotonic() - start, 3)}
        return {"uid": os.geteuid(), "harness_pid": os.getpid(), "victim_alive": victim.poll() is None,
                "layers": sandbox.sandbox_layers(), "results": results}
    finally:
        victim.kill()
        victim.wait()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])))
