"""The sandbox (eval.scoring.sandbox) and HumanEval pass@1 scoring (eval.scoring.unit_tests).

Hostile snippets are only ever run through run_sandboxed. Every hostile run checks that the call
returned in bounded time, that the harm did not happen (files outside the sandbox untouched, this
process and a sacrificial process alive, no connection reached a listener of ours) and that no
sandboxed process is left over. The HumanEval tasks come from `eval.config.paths.bench_dir()`
($MARS_BENCH_DIR in CI).
"""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eval.config.paths import REPO_ROOT
from eval.scoring import unit_tests as H
from eval.scoring.sandbox import OUTPUT_LIMIT, TEMP_PREFIX, SandboxResult, run_sandboxed, sandbox_layers, sandbox_user

try:
    import psutil
except ImportError:  # fall back to reading /proc
    psutil = None

SLACK = 5.0  # seconds a sandboxed run may take beyond its timeout (start-up, clean-up, a busy machine)
# Gets the real, unpatched posix module back (a fresh instance of the built-in module): snippets that
# use it test the kernel-level layers, which must hold when the Python-level guards are bypassed.
FRESH_POSIX = ("import _imp, importlib.machinery\n"
               "posix = _imp.create_builtin(importlib.machinery.ModuleSpec('posix', None, origin='built-in'))\n")


@pytest.fixture(scope="module")
def tasks() -> dict[int, dict]:
    return H.load_tasks()


def record(qid: int, answer: str) -> dict:
    return {"question_id": qid, "answer_id": f"a{qid}", "model_id": "m", "tstamp": 0.0,
            "choices": [{"index": 0, "turns": [answer]}]}


# --- processes and files ------------------------------------------------------------------------

def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process on the machine."""
    table = {}
    if psutil is not None:
        for proc in psutil.process_iter(["ppid", "cmdline"]):
            table[proc.pid] = (proc.info["ppid"] or 0, " ".join(proc.info["cmdline"] or []))
        return table
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:  # gone meanwhile
                continue
            table[int(entry)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmdline)
    return table


def leftover_processes(exclude: frozenset[int] = frozenset()) -> list[tuple[int, str]]:
    """Processes descending from this one, or whose command line names a sandbox directory (orphans
    re-parented away from us would show there), except `exclude`."""
    table, me = process_table(), os.getpid()

    def descends(pid: int) -> bool:
        seen = set()
        while pid > 1 and pid not in seen:
            seen.add(pid)
            pid = table.get(pid, (0, ""))[0]
            if pid == me:
                return True
        return False

    return [(pid, cmd) for pid, (_, cmd) in table.items()
            if pid != me and pid not in exclude and (descends(pid) or TEMP_PREFIX in cmd)]


def sandbox_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*")}


def tree(path: Path) -> dict[str, bytes]:
    """Every file under `path` with its contents, and every directory (b"<dir>")."""
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else b"<dir>") for p in path.rglob("*")}


def run_hostile(source: str, timeout: float = 5.0, exclude: frozenset[int] = frozenset(), **limits) -> SandboxResult:
    """run_sandboxed, checking the call is bounded and leaves no process or directory behind."""
    dirs_before = sandbox_dirs()
    start = time.monotonic()
    result = run_sandboxed(source, timeout=timeout, **limits)
    elapsed = time.monotonic() - start
    assert elapsed < timeout + SLACK, f"the sandboxed run took {elapsed:.1f}s (timeout {timeout}s)"
    assert leftover_processes(exclude) == []
    assert sandbox_dirs() <= dirs_before, "the sandbox directory was not removed"
    return result


@pytest.fixture
def sacrificial() -> Iterator[subprocess.Popen]:
    """A process of ours that hostile code tries to kill."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


# --- the sandbox: statuses, output, environment ---------------------------------------------------

def test_statuses() -> None:
    ok = run_sandboxed("print('hello')")
    assert (ok.status, ok.returncode, ok.output) == ("passed", 0, "hello\n")
    assert 0 < ok.seconds < 10
    failed = run_sandboxed("raise ValueError('boom')")
    assert failed.status == "failed" and failed.returncode == 1 and "ValueError: boom" in failed.output
    assert run_sandboxed("def f(:\n").status == "failed"  # a syntax error is the code's failure
    assert run_sandboxed("raise SystemExit(3)").returncode == 3
    # Killed by a signal: a real fault (a PID-namespace init ignores signals it sends itself, and the
    # code's kill(0) reaches no wrapper: tests/test_sandbox_isolation.py, test_killing_its_own_group...).
    killed = run_hostile("import faulthandler\nfaulthandler._read_null()\n")
    assert killed.status == "killed" and killed.returncode == -signal.SIGSEGV
    # The sandbox itself cannot start the code: 1 MB of address space is not enough for the bootstrap.
    error = run_sandboxed("print(1)", memory_mb=1)
    assert error.status == "error" and "sandbox setup failed" in error.output
    with pytest.raises(ValueError, match="timeout > 0"):
        run_sandboxed("pass", timeout=0)


def test_wall_clock_and_cpu_limits() -> None:
    sleeper = run_hostile("import time\ntime.sleep(60)\n", timeout=1.0)
    assert sleeper.status == "timeout" and 1.0 <= sleeper.seconds < 1.0 + SLACK
    cpu = run_hostile("while True:\n    pass\n", timeout=30, cpu_seconds=1)  # RLIMIT_CPU ends it first
    assert cpu.status == "timeout" and cpu.seconds < 10 and "CPU time limit" in cpu.output


def test_output_is_truncated() -> None:
    result = run_sandboxed("print('first line')\nfor i in range(20000):\n    print(i)\nprint('last line')\n")
    assert result.status == "passed"
    assert len(result.output.encode()) <= OUTPUT_LIMIT + 100
    assert result.output.startswith("first line") and result.output.endswith("19999\nlast line\n")
    assert "bytes omitted" in result.output


def test_isolated_interpreter_minimal_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTPS_PROXY", "PYTHONPATH", "MARS_SECRET"):
        monkeypatch.setenv(name, "http://proxy.invalid:3128")
    result = run_sandboxed("import os, sys\nprint(repr(sorted(os.environ)))\nprint(os.getcwd())\n"
                           "print(os.environ['HOME'])\nprint(sys.flags.isolated)\n")
    assert result.status == "passed", result.output
    names, cwd, home, isolated = result.output.splitlines()
    assert ast.literal_eval(names) == ["HOME", "LANG", "LC_ALL", "PATH", "TMPDIR"]
    assert home == cwd and Path(cwd).name == "work" and TEMP_PREFIX in cwd
    assert isolated == "1"
    assert not Path(cwd).exists()  # removed after the run


def test_layers_on_this_machine() -> None:
    """The probe agrees with the harness's user: as root the root level (new root, namespaces, drop to
    nobody); the level in use ran a program, and its layers are reported."""
    layers = sandbox_layers()
    if os.geteuid() == 0:
        assert layers["isolation"] in ("root", "root-drop"), layers
        as_root = "the harness runs as root (level root applies)"
        assert layers["levels"]["bwrap"] == layers["levels"]["userns"] == as_root
        if shutil.which("unshare") and subprocess.run(["unshare", "--mount", "--pid", "--net", "--fork", "true"],
                                                      capture_output=True).returncode == 0:
            assert layers["isolation"] == "root" and layers["namespaces"] == ["mount", "pid", "net"]
    assert layers["levels"][layers["isolation"]] == "works" and layers["hides_private_files"]
    assert "RLIMIT_AS" in layers["rlimits"] and layers["process_group_kill"] and layers["python_guards"]
    assert layers["own_session"]
    limits = run_sandboxed("import resource\n")  # the limits cannot be raised again: resource is blocked
    assert limits.status == "failed" and "resource" in limits.output
    if "pid" in layers["namespaces"]:
        pids = run_sandboxed("import os\nprint(os.getpid(), os.getppid())\n")
        assert pids.output.split() == ["1", "0"]  # PID 1 of its own namespace; the harness has no PID in it


# --- hostile snippets -----------------------------------------------------------------------------

@pytest.mark.parametrize("attack", [
    "import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=2)\n",
    "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\ns.connect(('127.0.0.1', PORT))\n",
    "import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', PORT))\n",
    "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:PORT/', timeout=2)\n",
    "import socket\nsocket.create_connection(('93.184.216.34', 80), timeout=2)\n",
    "import socket\nsocket.getaddrinfo('example.com', 80)\n",
], ids=["create_connection-local", "socket-local", "_socket-local", "urlopen-local", "create_connection-external",
        "getaddrinfo"])
def test_no_network(attack: str, listener: tuple[int, list]) -> None:
    port, accepted = listener
    result = run_hostile(attack.replace("PORT", str(port)))
    assert result.status == "failed" and "disabled in the sandbox" in result.output
    assert accepted == []


def test_no_network_below_the_python_guard(listener: tuple[int, list]) -> None:
    """A real socket, from the unpatched class under the guard's subclass (a fresh _socket module can no
    longer be loaded after the privilege drop): the network namespace has no way out."""
    if "net" not in sandbox_layers().get("namespaces", []):
        # Without one this connection goes through: the documented limit of the guards, nothing to test.
        pytest.skip("no network namespace here: `unshare --net` fails as this user (as root, or with "
                    "--user --map-root-user), so nothing below the Python guard stops a real socket")
    port, accepted = listener
    attack = ("import _socket\n"
              "real = _socket.socket.__mro__[1]  # the guard's refusing class subclasses the real one\n"
              f"s = real()\ns.settimeout(2)\ns.connect(('127.0.0.1', {port}))\nprint('connected')\n")
    result = run_hostile(attack)
    assert result.status == "failed" and "connected" not in result.output, result.output
    assert "OSError" in result.output  # the kernel's refusal (unreachable), not the Python guard
    assert accepted == []


@pytest.mark.parametrize("attack", [
    "import os\nwhile True:\n    os.fork()\n",
    "import os\nwhile True:\n    os.forkpty()\n",
    "import multiprocessing\nwhile True:\n    multiprocessing.Process(target=print).start()\n",
    "import subprocess, sys\nwhile True:\n    subprocess.Popen([sys.executable, '-c', 'pass'])\n",
    "import os\nos.system('sleep 60 &')\n",
    "import os, sys\nos.execv(sys.executable, [sys.executable, '-c', 'pass'])\n",
    "import _posixsubprocess\n_posixsubprocess.fork_exec()\n",
], ids=["os.fork", "os.forkpty", "multiprocessing", "subprocess", "os.system", "os.execv", "fork_exec"])
def test_no_processes(attack: str) -> None:
    result = run_hostile(attack)
    assert result.status == "failed", result.output
    assert "disabled in the sandbox" in result.output or "import of multiprocessing halted" in result.output


def test_escaped_children_are_killed() -> None:
    """Below the guard: real forks whose children leave the process group (setsid) and sleep. The PID
    namespace (or, without it, the process-group kill for children that stay in the group) ends them.
    Bounded at 16 children, not a real bomb, so that a failing layer cannot hurt the machine."""
    escape = "posix.setsid()\n" if "pid" in sandbox_layers().get("namespaces", []) else ""
    attack = (FRESH_POSIX + "import time\n"
              "for _ in range(16):\n"
              "    if posix.fork() == 0:\n"
              + textwrap.indent(escape, "        ") +
              "        time.sleep(60)\n"
              "        posix._exit(0)\n"
              "print('forked', flush=True)\n"
              "time.sleep(60)\n")
    result = run_hostile(attack, timeout=1.5)  # run_hostile checks nothing is left over
    assert result.status == "timeout" and "forked" in result.output


def test_infinite_loop() -> None:
    result = run_hostile("x = 0\nwhile True:\n    x += 1\n", timeout=1.5, cpu_seconds=60)  # the wall clock ends it
    assert result.status == "timeout" and result.returncode == -signal.SIGKILL


@pytest.mark.parametrize("attack, limits", [
    ("x = bytearray(10 * 2**30)\n", {}),
    ("x = [0] * (10 * 2**30 // 8)\n", {}),
    ("x = []\nwhile True:\n    x.append(' ' * 2**20)\n", {"memory_mb": 256}),
], ids=["bytearray-10GB", "list-10GB", "growing-list"])
def test_memory_is_capped(attack: str, limits: dict) -> None:
    result = run_hostile(attack, timeout=20.0, **limits)
    assert result.status in ("failed", "killed") and "MemoryError" in result.output


def test_no_writes_outside(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("original")
    before = tree(tmp_path)
    repo_target = REPO_ROOT / f"sandbox-escape-{os.getpid()}.txt"
    targets = [tmp_path / "escape.txt", tmp_path / "keep.txt", repo_target, tmp_path / "newdir" / "x"]
    attacks = []
    for target in targets:
        attacks += [
            f"open({str(target)!r}, 'w').write('pwned')\n",
            f"open({str(target)!r}, 'a').write('pwned')\n",
            f"import pathlib\npathlib.Path({str(target)!r}).write_text('pwned')\n",
            f"import io\nio.FileIO({str(target)!r}, 'w').write(b'pwned')\n",
            f"import os\nfd = os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)\nos.write(fd, b'pwned')\n",
            f"import os\nos.makedirs({str(target.parent / 'sub')!r})\n",
            f"import os\nos.chdir('/')\nopen({os.path.relpath(target, '/')!r}, 'w').write('pwned')\n",
            f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w').write('pwned')\n",
            f"import shutil\nopen('local', 'w').write('pwned')\nshutil.copy('local', {str(target)!r})\n",
        ]
    for attack in attacks:
        result = run_hostile(attack)
        assert result.status == "failed", attack
        assert "is disabled" in result.output, (attack, result.output)
    assert tree(tmp_path) == before
    assert not repo_target.exists()


def test_writes_inside_the_sandbox_work() -> None:
    result = run_sandboxed("import os, tempfile\nopen('a.txt', 'w').write('x')\nos.rename('a.txt', 'b.txt')\n"
                           "with tempfile.NamedTemporaryFile() as f:\n    f.write(b'y')\n"
                           "os.mkdir('d')\nos.rmdir('d')\nos.remove('b.txt')\nprint(os.listdir('.'))\n")
    assert result.status == "passed" and result.output == "[]\n", result.output


def test_file_size_is_capped() -> None:
    result = run_hostile("with open('big', 'wb') as f:\n    for _ in range(64):\n        f.write(b'x' * 2**20)\n")
    assert result.status == "failed" and "File too large" in result.output


@pytest.mark.parametrize("attack", [
    "import shutil\nshutil.rmtree(VICTIM)\n",
    "import shutil\nshutil.move(VICTIM, VICTIM + '-moved')\n",
    "import os\nos.remove(VICTIM + '/data.txt')\n",
    "import os\nos.unlink(VICTIM + '/data.txt')\n",
    "import os\nos.rename(VICTIM + '/data.txt', VICTIM + '/renamed.txt')\n",
    "import os\nos.replace(VICTIM + '/data.txt', 'stolen.txt')\n",
    "import os\nos.truncate(VICTIM + '/data.txt', 0)\n",
    "import os\nos.chmod(VICTIM + '/data.txt', 0)\n",
    "import os\nos.removedirs(VICTIM + '/empty')\n",
    "import os\nos.rmdir(VICTIM + '/empty')\n",
    "import os\nos.unlink('data.txt', dir_fd=os.open(VICTIM, os.O_RDONLY))\n",
    "import os\nfd = os.open(VICTIM + '/data.txt', os.O_RDONLY)\nos.truncate(fd, 0)\n",
], ids=["shutil.rmtree", "shutil.move", "os.remove", "os.unlink", "os.rename", "os.replace", "os.truncate", "os.chmod",
        "os.removedirs", "os.rmdir", "unlink-dir_fd", "truncate-fd"])
def test_no_deleting(attack: str, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    (victim / "empty").mkdir(parents=True)
    (victim / "data.txt").write_text("precious")
    before, mode = tree(tmp_path), (victim / "data.txt").stat().st_mode
    result = run_hostile(attack.replace("VICTIM", repr(str(victim))))
    # Refused by the Python guard, or by the kernel: pytest's temporary directory is not in the sandbox's
    # new root (FileNotFoundError), or the unprivileged process cannot enter it (root-drop).
    assert result.status == "failed" and any(s in result.output for s in ("is disabled", "PermissionError",
                                                                          "FileNotFoundError"))
    assert tree(tmp_path) == before and (victim / "data.txt").stat().st_mode == mode


@pytest.mark.skipif(os.geteuid() != 0, reason="the privilege drop applies to a harness running as root")
def test_a_root_harness_runs_the_code_unprivileged_and_it_cannot_read_private_files(tmp_path: Path) -> None:
    secret = tmp_path / "netrc"  # like a W&B key in ~/.netrc: 0600, owned by the harness's user
    secret.write_text("machine api.wandb.ai password SECRET-KEY\n")
    secret.chmod(0o600)
    tmp_path.chmod(0o755)  # even where the directory is open to everyone, the file is not
    result = run_hostile(f"print(open({str(secret)!r}).read())\n")
    # Not in the new root at all (FileNotFoundError), or (root-drop) not readable by nobody.
    assert result.status == "failed" and "SECRET-KEY" not in result.output
    assert "FileNotFoundError" in result.output or "PermissionError" in result.output
    who = run_hostile("import os\nprint(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())\n")
    uid, gid = (int(x) for x in sandbox_user().split(":"))
    assert who.status == "passed" and who.output.split() == [str(uid), str(uid), str(gid), "[]"]
    # Getting root back: the saved IDs were dropped too (setresuid), so even a real setuid fails.
    back = run_hostile(FRESH_POSIX + "posix.setuid(0)\n")
    assert back.status == "failed" and "PermissionError" in back.output
    # What the tests import still works after the drop (loaded first, as root, under the guards).
    ok = run_hostile("import math, collections, itertools, heapq, re\nfrom fractions import Fraction\n"
                     "print(math.gcd(12, 18), Fraction(1, 3), re.sub('a', 'b', 'aa'))\n")
    assert ok.status == "passed" and ok.output == "6 1/3 bb\n", ok.output


@pytest.mark.parametrize("attack", [
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "import os, signal\nos.kill(TEST_PID, signal.SIGKILL)\n",
    "import os, signal\nos.kill(VICTIM_PID, signal.SIGKILL)\n",
    "import os, signal\nos.killpg(VICTIM_PID, signal.SIGKILL)\n",
    "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(VICTIM_PID), signal.SIGKILL)\n",
], ids=["os.kill-parent", "os.kill-harness", "os.kill-victim", "os.killpg", "pidfd_send_signal"])
def test_no_killing(attack: str, sacrificial: subprocess.Popen) -> None:
    source = attack.replace("TEST_PID", str(os.getpid())).replace("VICTIM_PID", str(sacrificial.pid))
    result = run_hostile(source, exclude=frozenset({sacrificial.pid}))
    assert result.status == "failed" and "disabled in the sandbox" in result.output, result.output
    assert sacrificial.poll() is None  # this process is alive too, or we would not be here


def test_no_killing_below_the_python_guard(sacrificial: subprocess.Popen) -> None:
    """The real kill(2), from a fresh posix module: in the PID namespace the harness's processes have no PID."""
    if "pid" not in sandbox_layers().get("namespaces", []):
        # Without one a process running as the same user could be killed: a documented limit, nothing to test.
        pytest.skip("no PID namespace here: `unshare --pid --fork` fails as this user (as root, or with "
                    "--user --map-root-user), so the harness's processes are visible to the sandboxed code")
    attack = FRESH_POSIX + f"import signal\nposix.kill({sacrificial.pid}, signal.SIGKILL)\n"
    result = run_hostile(attack, exclude=frozenset({sacrificial.pid}))
    assert result.status == "failed" and "ProcessLookupError" in result.output, result.output
    assert sacrificial.poll() is None


def test_exit_functions_are_disabled() -> None:
    for call in ("exit(0)", "quit(0)", "help()"):
        result = run_sandboxed(call)
        assert result.status == "failed" and "disabled in the sandbox" in result.output


# --- HumanEval: assembling programs -----------------------------------------------------------------

TASK = {"task_id": "HumanEval/999", "entry_point": "add",
        "prompt": "import math\nfrom typing import List\n\n\ndef helper(x):\n    return x\n\n\n"
                  "def add(a: int, b: int) -> int:\n    \"\"\"Add.\"\"\"\n",
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"}


def test_completion_is_cut_at_the_first_top_level_statement() -> None:
    body = "    return a + b\n"
    for tail in ("def other():\n    pass\n", "class X:\n    pass\n", "if __name__ == '__main__':\n    add(1, 2)\n",
                 "print(add(1, 2))\n", "# tests\nassert add(1, 2) == 4\n", "@decorator\ndef f(): pass\n",
                 "```\n\nDone.\n", "assert add(1, 1) == 3\n"):
        assert H.assemble_solution(TASK, body + "\n\n" + tail) == TASK["prompt"] + body + "\n\n"
    # Blank lines and deeper indentation inside the body are kept.
    nested = "    if a:\n\n        return a + b\n    return b\n"
    assert H.assemble_solution(TASK, nested) == TASK["prompt"] + nested


def test_chat_answers() -> None:
    full = "def add(a: int, b: int) -> int:\n    return a + b\n"
    preamble = "import math\nfrom typing import List\n\n\ndef helper(x):\n    return x\n\n\n"
    chat = f"Sure! Here it is:\n\n```python\n{full}```\n\nExample:\n\n```python\nprint(add(1, 2))\n```\n"
    assert H.assemble_solution(TASK, chat) == preamble + full
    # The block that defines the entry point wins over an earlier example block.
    examples_first = f"Usage:\n```\nadd(1, 2)\n```\nCode:\n```py\n{full}```"
    assert H.assemble_solution(TASK, examples_first) == preamble + full
    # An unclosed fence (the generation was cut off) runs to the end.
    assert H.assemble_solution(TASK, f"```python\n{full}") == preamble + full
    # Blocks in other languages are not code to run.
    assert H.code_blocks("```bash\nrm -rf /\n```\n```python\nx = 1\n```") == ["x = 1\n"]
    # A block without the entry point is the body; flush-left code is indented to become one.
    assert H.assemble_solution(TASK, "```python\n    return a + b\n```") == TASK["prompt"] + "    return a + b\n"
    assert H.assemble_solution(TASK, "```python\nreturn a + b\n```") == TASK["prompt"] + "    return a + b\n"
    # Unfenced, but a whole function: imports and helpers of the prompt first.
    assert H.assemble_solution(TASK, full) == preamble + full
    # The demo block is dropped from whole solutions.
    demo = full + "\n\nif __name__ == \"__main__\":\n    import sys\n    sys.exit(1)\n\nCONSTANT = 1\n"
    assert H.assemble_solution(TASK, f"```python\n{demo}```") == preamble + full + "\n\nCONSTANT = 1\n"


def test_build_program() -> None:
    program = H.build_program(TASK, "    return a + b\n")
    assert program == TASK["prompt"] + "    return a + b\n" + "\n" + TASK["test"] + "\ncheck(add)\n"
    assert run_sandboxed(program).status == "passed"


def test_load_tasks(tasks: dict[int, dict], tmp_path: Path) -> None:
    assert sorted(tasks) == list(range(164))
    assert {"task_id", "prompt", "entry_point", "canonical_solution", "test"} <= set(tasks[0])
    # Same numbering as humaneval.jsonl: each chat question quotes its task's prompt.
    from eval.benchmarks import load_questions
    for question in load_questions("humaneval"):
        assert tasks[question.question_id]["prompt"].strip() in question.turns[0]
    with pytest.raises(FileNotFoundError, match=r"no HumanEval\.jsonl\.gz in .*MARS_BENCH_DIR"):
        H.load_tasks(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        H.load_tasks(tmp_path / "missing")


def test_bad_answer_files(tasks: dict[int, dict]) -> None:
    with pytest.raises(ValueError, match=r"2 of 3 answers are for question ids not in HumanEval \(0-163\): "
                                         r"164, 999; the answer file is probably for another benchmark"):
        H.score_humaneval([record(0, "x"), record(164, "x"), record(999, "x")])
    with pytest.raises(ValueError, match="answer 0 is not an answer record"):
        H.score_humaneval([{"question_id": 0, "turns": ["x"]}])
    with pytest.raises(ValueError, match="no answers"):
        H.score_humaneval([])


# --- HumanEval: scoring -------------------------------------------------------------------------------

def timed_score(records: list[dict], **kwargs) -> dict:
    start = time.monotonic()
    result = H.score_humaneval(records, workers=2, **kwargs)
    print(f"scored {len(records)} HumanEval answers in {time.monotonic() - start:.1f}s")  # shown with -s
    return result


def test_canonical_solutions_pass_completion_style(tasks: dict[int, dict]) -> None:
    # A base model's continuation: the body, then whatever it went on to write.
    records = [record(q, t["canonical_solution"] + "\n\ndef unrelated():\n    raise SystemExit(1)\n")
               for q, t in tasks.items()]
    result = timed_score(records)
    failures = {q: v for q, v in result["per_question"].items() if not v["passed"]}
    assert failures == {} and result["n"] == 164 and result["pass@1"] == 1.0
    assert result["per_question"]["0"] == {"passed": True, "status": "passed"}


def test_canonical_solutions_pass_chat_style(tasks: dict[int, dict]) -> None:
    def chat(task: dict) -> str:
        # The whole function (signature and docstring from the prompt, the canonical body), fenced, with
        # prose around it and a demo block that would fail if it ran.
        definition = task["prompt"][task["prompt"].index(f"def {task['entry_point']}("):]
        return (f"Here is the completed function:\n\n```python\n{definition}{task['canonical_solution']}\n\n"
                "if __name__ == '__main__':\n    raise SystemExit(1)\n```\n\nIt runs in linear time.")

    result = timed_score([record(q, chat(t)) for q, t in tasks.items()])
    failures = {q: v for q, v in result["per_question"].items() if not v["passed"]}
    assert failures == {} and result["n"] == 164 and result["pass@1"] == 1.0


def test_broken_solutions_fail(tasks: dict[int, dict]) -> None:
    """Every task, its body replaced: `return None` for even task numbers, `raise ValueError` for odd ones
    (one pass over the 164 tasks keeps the runtime down; each kind alone also fails all 164, as measured
    when this test was written)."""
    broken = {q: "    return None\n" if q % 2 == 0 else "    raise ValueError\n" for q in tasks}
    result = timed_score([record(q, body) for q, body in broken.items()])
    assert result["n"] == 164 and result["pass@1"] == 0.0
    assert {v["status"] for v in result["per_question"].values()} == {"failed"}


def test_harness_survives_hostile_answers(tasks: dict[int, dict], tmp_path: Path, listener: tuple[int, list],
                                          sacrificial: subprocess.Popen) -> None:
    port, accepted = listener
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "data.txt").write_text("precious")
    before = tree(tmp_path)
    hostile = {
        1: "    import os\n    while True:\n        os.fork()\n",
        2: "    while True:\n        pass\n",
        3: f"    import socket\n    socket.create_connection(('127.0.0.1', {port}))\n",
        4: "    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n",
        5: f"    import os, signal\n    os.kill({sacrificial.pid}, signal.SIGKILL)\n",
        6: "    import sys\n    sys.exit(0)\n",  # exits cleanly before the tests are done
        7: "```python\nimport os\nos._exit(0)\n```",  # the same, from a chat answer's top level
        8: "    x = bytearray(10 * 2**30)\n",
        9: f"    open({str(tmp_path / 'escape.txt')!r}, 'w').write('x')\n",
        10: f"    import shutil\n    shutil.rmtree({str(victim)!r})\n",
        11: "    import multiprocessing\n    multiprocessing.Pool(4)\n",
    }
    good = [0, 12, 13, 14]
    records = [record(q, answer) for q, answer in hostile.items()] + [record(q, tasks[q]["canonical_solution"])
                                                                     for q in good]
    start = time.monotonic()
    result = H.score_humaneval(records, timeout=2.0, workers=2)
    assert time.monotonic() - start < 2.0 * 2 + 2 * SLACK
    assert {q for q, v in result["per_question"].items() if v["passed"]} == {str(q) for q in good}
    assert result["n"] == 15 and result["pass@1"] == pytest.approx(4 / 15)
    assert result["per_question"]["2"]["status"] == "timeout"
    assert result["per_question"]["6"]["status"] == result["per_question"]["7"]["status"] == "failed"
    assert leftover_processes(frozenset({sacrificial.pid})) == []
    assert sacrificial.poll() is None and accepted == [] and tree(tmp_path) == before
