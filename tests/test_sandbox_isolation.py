"""The sandbox as a boundary, attacked from every isolation level this machine offers, as root and as a
non-root user (issue #29): the harness (tests/sandbox_attacks.py, run as that user) sends each hostile
program through `run_sandboxed`; this test checks what reached the host. Levels the machine lacks skip
with the reason the probe gave. The refusal is tested by forcing the probe to find nothing.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_attacks import FRESH  # the attacker's side: a fresh, unpatched posix

from eval.config.paths import REPO_ROOT
from eval.scoring import sandbox
from eval.scoring.sandbox import TEMP_PREFIX

TEST_UID = 54321  # the non-root harness's uid (no passwd entry needed: setpriv sets it numerically)
ATTACKS = REPO_ROOT / "tests" / "sandbox_attacks.py"


def _blocking_dir(path: Path, uid: int) -> Path | None:
    """The first directory on the way to `path` that `uid` (not root, in no group of the owner) cannot enter."""
    for parent in [*reversed(path.parents)]:
        mode = parent.stat()
        if mode.st_uid != uid and not mode.st_mode & stat.S_IXOTH:
            return parent
    return None


def as_user_command(uid: int) -> list[str]:
    """A command prefix that runs this interpreter as `uid`, or pytest.skip naming why it cannot.

    When the interpreter lives under a directory that user cannot enter (/root/.pyenv here), a private
    mount namespace made for the test (root only) puts a tmpfs over that directory with the interpreter
    bound back in, so the user runs the very interpreter of the suite; nothing changes on the host."""
    if os.geteuid() != 0:
        if os.geteuid() == uid:
            return []
        pytest.skip("a non-root suite cannot start a harness as another user")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) not found: cannot start the harness as a non-root user")
    drop = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    prefix = Path(sys.prefix).resolve()
    blocking = _blocking_dir(prefix / "bin", uid)
    if blocking is None:
        return drop
    unshare = shutil.which("unshare")
    works = unshare and subprocess.run([unshare, "--mount", "true"], capture_output=True).returncode == 0
    if not works:
        pytest.skip(f"the interpreter {sys.executable} is under {blocking}, which uid {uid} cannot enter, and no "
                    "mount namespace can be made to expose it to that user")
    script = ('set -e; keep=$(mktemp -d); mount --bind "$1" "$keep"; mount -t tmpfs -o mode=0755 tmpfs "$2"; '
              'mkdir -p "$1"; mount --bind "$keep" "$1"; umount "$keep"; rmdir "$keep"; shift 2; exec "$@"')
    return [unshare, "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", str(prefix),
            str(blocking), *drop]


def run_harness(harness: str, level: str, port: int, home: Path, escape: Path, token: str) -> dict:
    secret = home / ".netrc"
    uid = os.geteuid() if harness == "root" else TEST_UID
    prefix = [] if harness == "root" else as_user_command(uid)
    if harness == "root" and os.geteuid() != 0:
        pytest.skip("the suite does not run as root: no root harness to test")
    for path in (home, escape):
        os.chown(path, uid, uid) if os.geteuid() == 0 else None
    secret.write_text(f"machine api.wandb.ai login user password {token}\n")
    secret.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(secret, uid, uid)
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(home), "PYTHONPATH": str(REPO_ROOT),
           "MARS_TEST_SECRET": token, "LANG": "C.UTF-8"}
    done = subprocess.run([*prefix, sys.executable, str(ATTACKS), level, str(secret), str(port), str(escape)],
                          capture_output=True, text=True, env=env, cwd=str(escape), timeout=600)
    assert done.returncode == 0, f"the harness died: {done.stderr[-3000:]}"
    report = json.loads(done.stdout.splitlines()[-1])
    if "unavailable" in report:
        pytest.skip(f"isolation level {level} is not available to uid {report['uid']} here: {report['unavailable']}")
    assert report["uid"] == uid
    return report


def lines(result: dict) -> dict[str, str]:
    """'name outcome ...' lines of an attack's output -> {name: outcome}."""
    return {line.split(" ", 1)[0] if not line.startswith("write ") else line.split(" ")[1]:
            line.split(" ")[2 if line.startswith("write ") else 1]
            for line in result["output"].splitlines() if line and not line.startswith(("Traceback", " "))
            and len(line.split(" ")) > 1}


LEVELS = [("root", "root"), ("root", "root-drop"), ("user", "bwrap"), ("user", "userns")]


@pytest.mark.parametrize("harness, level", LEVELS, ids=[f"{h}-{lv}" for h, lv in LEVELS])
def test_hostile_programs_are_contained(harness: str, level: str, listener: tuple[int, list]) -> None:
    port, accepted = listener
    token = f"SECRET-{secrets.token_hex(8)}"
    base = Path(tempfile.mkdtemp(prefix="mars-attack-"))
    base.chmod(0o755)
    home, escape = base / "home", base / "escape"
    home.mkdir(mode=0o700)
    escape.mkdir(mode=0o755)
    host_tmp_target = Path("/tmp/mars-sandbox-escape.txt")
    assert not host_tmp_target.exists()
    try:
        report = run_harness(harness, level, port, home, escape, token)
        results, harness_pid = report["results"], report["harness_pid"]
        print(f"\n{harness} harness (uid {report['uid']}), level {level}: {json.dumps(report['layers'])}")
        for name, result in results.items():
            print(f"  {name}: {result['status']} {result['output'][-600:]!r}")
        assert report["layers"]["isolation"] == level
        everything = "".join(r["output"] for r in results.values())
        # No secret of the harness or its user reached the code: the 0600 file, the harness's environment.
        assert token not in everything
        assert "MARS_TEST_SECRET" not in everything
        read = lines(results["read_home_secret"])["read"]
        assert read in ("FileNotFoundError", "PermissionError"), results["read_home_secret"]
        assert lines(results["proc_harness_environ"])["read"] in ("FileNotFoundError", "PermissionError")
        pid_one = results["proc_1_environ"]["output"]
        # pid 1 is the sandboxed interpreter itself (fresh /proc), or, without one, unreadable.
        assert "read OK" not in pid_one or b"PATH=" in eval(pid_one.split("read OK ", 1)[1])  # noqa: S307 - a bytes repr
        pids = eval(results["list_proc"]["output"].split("pids ", 1)[1])  # noqa: S307 - a list of ints
        if report["layers"]["fresh_proc"]:
            assert pids == [1], pids  # only itself: the host's processes, the harness's included, are not there
        else:
            assert harness_pid in pids  # the documented limit of a level without a fresh /proc
        # Network: no raw socket (no capability), an INET socket opens but reaches nothing.
        net = lines(results["sockets"])
        assert net["raw"] == "PermissionError", results["sockets"]
        for name in ("tcp-host", "tcp-out", "udp-out"):
            assert net[name] != "OK" and net[name] in ("OSError", "TimeoutError", "ConnectionRefusedError"), net
        assert accepted == []
        # Writes: nothing outside the run's directory (the harness's directories, its home, /).
        writes = lines(results["write_outside"])
        assert not (escape / "escape.txt").exists() and not (home / "escape.txt").exists()
        assert not Path("/escape.txt").exists()
        assert writes[str(escape / "escape.txt")] != "OK" and writes[str(home / "escape.txt")] != "OK"
        if level == "root-drop":  # the documented limit of that level: the host's /tmp is writable by nobody
            assert writes[str(host_tmp_target)] == "OK" and host_tmp_target.exists()
        else:
            assert writes[str(host_tmp_target)] != "OK" and not host_tmp_target.exists()
        # The fork bomb ran until the timeout and left nothing behind; the harness carried on (it reported).
        assert results["fork_bomb"]["status"] == "timeout" and "bombing" in results["fork_bomb"]["output"]
        kills = lines(results["kill_parent"])
        assert kills["kill-harness"] in ("ProcessLookupError", "PermissionError"), kills
        assert kills["kill-victim"] in ("ProcessLookupError", "PermissionError"), kills
        assert report["victim_alive"]
        left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_has(p, TEMP_PREFIX)]
        assert left == [], "sandboxed processes were left behind"
    finally:
        host_tmp_target.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)


def _cmdline_has(proc: Path, text: str) -> bool:
    try:
        return text.encode() in (proc / "cmdline").read_bytes()
    except OSError:
        return False


# --- signalling its own process group ------------------------------------------------------------

# The harness's side for the test below, run as that harness's user (`python -c`): each program through
# `run_sandboxed` at one level, and, right after each run, the sandboxed processes still alive.
GROUP_DRIVER = """
import json, os, sys
from eval.scoring import sandbox

def alive_in_sandbox():
    left = []
    for entry in os.listdir('/proc'):
        try:
            with open(f'/proc/{entry}/cmdline', 'rb') as f:
                if sandbox.TEMP_PREFIX.encode() in f.read():
                    left.append(int(entry))
        except (OSError, ValueError):
            pass
    return left

level, programs = sys.argv[1], json.loads(sys.argv[2])
forced = sandbox.use_isolation(level)  # kept: a collected generator would undo the forcing
try:
    forced.__enter__()
except sandbox.SandboxUnavailable as e:
    print(json.dumps({'unavailable': str(e), 'uid': os.geteuid()}))
    raise SystemExit(0)
results = {}
for name, (source, timeout) in programs.items():
    r = sandbox.run_sandboxed(source, timeout=timeout)
    results[name] = {'status': r.status, 'returncode': r.returncode, 'output': r.output, 'left': alive_in_sandbox()}
print(json.dumps({'uid': os.geteuid(), 'layers': sandbox.sandbox_layers(), 'results': results}))
"""
# Below the Python guards (a fresh posix): the code ignores SIGTERM and sends it to its own process group,
# which would end a wrapper (unshare, bwrap) in that group and so the run ("killed", -SIGTERM); then SIGKILL
# by kill(0) and killpg(0), which a PID namespace's init ignores from inside (anywhere else it ends the code
# itself, its own doing); then it exits with its own status, 3.
KILL_OWN_GROUP = FRESH + (
    "import signal\n"
    "print('session leader', posix.getsid(0) == posix.getpid(), flush=True)\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "posix.kill(0, signal.SIGTERM)\n"
    "print('after SIGTERM', flush=True)\n"
    "posix.kill(0, signal.SIGKILL)\n"
    "posix.killpg(0, signal.SIGKILL)\n"
    "print('after SIGKILL', flush=True)\n"
    "raise SystemExit(3)\n")
# The code in a session of its own, with children in further sessions, all asleep past the timeout: the
# harness must still kill every one of them.
OUTLIVE_TIMEOUT = FRESH + (
    "import time\n"
    "for _ in range(4):\n"
    "    if posix.fork() == 0:\n"
    "        posix.setsid()\n"
    "        time.sleep(60)\n"
    "        posix._exit(0)\n"
    "print('forked', flush=True)\n"
    "time.sleep(60)\n")


@pytest.mark.parametrize("harness, level", LEVELS, ids=[f"{h}-{lv}" for h, lv in LEVELS])
def test_killing_its_own_group_is_the_codes_own_failure(harness: str, level: str) -> None:
    """kill(0) / killpg(0) from the sandboxed code reach only the code's processes (it leads a session of
    its own, out of its wrapper's group): the harness reports the program's own exit, not a killed
    wrapper; and the timeout still kills the whole sandboxed tree."""
    if harness == "root" and os.geteuid() != 0:
        pytest.skip("the suite does not run as root: no root harness to test")
    uid = os.geteuid() if harness == "root" else TEST_UID
    prefix = [] if harness == "root" else as_user_command(uid)
    programs = {"kill_own_group": (KILL_OWN_GROUP, 10.0), "outlive_timeout": (OUTLIVE_TIMEOUT, 1.5)}
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": "/", "PYTHONPATH": str(REPO_ROOT), "LANG": "C.UTF-8"}
    done = subprocess.run([*prefix, sys.executable, "-c", GROUP_DRIVER, level, json.dumps(programs)],
                          capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert done.returncode == 0, f"the harness died: {done.stderr[-3000:]}"
    report = json.loads(done.stdout.splitlines()[-1])
    if "unavailable" in report:
        pytest.skip(f"isolation level {level} is not available to uid {report['uid']} here: {report['unavailable']}")
    assert report["uid"] == uid and report["layers"]["isolation"] == level
    killer, outliver = report["results"]["kill_own_group"], report["results"]["outlive_timeout"]
    print(f"\n{harness} harness, level {level}: kill(0) -> {killer}; timeout -> {outliver}")
    # SIGTERM to its group reached no wrapper: a dead wrapper would be the run's end, by SIGTERM.
    assert killer["returncode"] != -signal.SIGTERM and "after SIGTERM" in killer["output"], killer
    assert "session leader True" in killer["output"]  # a session, and so a process group, of its own
    if "pid" in report["layers"]["namespaces"]:
        # The code is its PID namespace's init: its own SIGKILLs pass it by, and it exits as it chose.
        assert (killer["status"], killer["returncode"]) == ("failed", 3), killer
        assert "after SIGKILL" in killer["output"]
    else:  # no wrapper between harness and code (no --fork): the code killed itself, nothing else
        assert (killer["status"], killer["returncode"]) == ("killed", -signal.SIGKILL), killer
    assert killer["left"] == []
    # The timeout still ended the code in its session and its children in theirs.
    assert outliver["status"] == "timeout" and "forked" in outliver["output"], outliver
    assert outliver["left"] == [], "sandboxed processes outlived the timeout"


# --- fail closed ----------------------------------------------------------------------------------

@pytest.fixture
def nothing_isolates(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The probe finds no isolation level (as on a host without root, bubblewrap or user namespaces); the
    unisolated fallback is probed for real."""
    real = sandbox._probe_level
    monkeypatch.setattr(sandbox, "_probe_level",
                        lambda level: real(level) if level == sandbox.UNISOLATED else f"{level} forced off by the test")
    monkeypatch.setattr(sandbox, "_probed", None)
    monkeypatch.setattr(sandbox, "_forced", None)
    monkeypatch.setattr(sandbox, "_allowed_unisolated", False)
    yield
    sandbox._probed = None  # the next test probes this machine again


def test_refuses_without_isolation(nothing_isolates: None) -> None:
    with pytest.raises(sandbox.SandboxUnavailable) as refused:
        sandbox.run_sandboxed("print('never runs')")
    message = str(refused.value)
    for expected in ("cannot hide your private files", "forced off by the test", "sandbox.allow_unisolated=true",
                     "--allow-unisolated", "bubblewrap", "user namespaces", "sandbox: unisolated"):
        assert expected in message, message
    layers = sandbox.sandbox_layers()
    assert layers["isolation"] is None and "allow_unisolated" in layers["refusal"]
    # HumanEval scoring refuses before running anything.
    from eval.scoring import unit_tests

    task = {"task_id": "HumanEval/0", "entry_point": "f", "prompt": "def f():\n",
            "canonical_solution": "    return 1\n", "test": "def check(c):\n    assert c() == 1\n"}
    record = {"question_id": 0, "choices": [{"index": 0, "turns": ["    return 1\n"]}]}
    with pytest.raises(sandbox.SandboxUnavailable):
        unit_tests.score_humaneval([record], tasks={0: task})
    # Allowed: it runs, and says so.
    result = unit_tests.score_humaneval([record], tasks={0: task}, allow_unisolated=True)
    assert result["pass@1"] == 1.0 and result["sandbox"] == "unisolated"
    assert sandbox.run_sandboxed("print(1)", allow_unisolated=True).output == "1\n"
    sandbox.allow_unisolated(True)
    assert sandbox.isolation() == "unisolated" and sandbox.sandbox_layers()["hides_private_files"] is False


def test_score_cli_refuses_and_allows(nothing_isolates: None, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from eval import score
    from eval.scoring import unit_tests

    tasks = unit_tests.load_tasks()
    answers = tmp_path / "answers.jsonl"
    answer = {"question_id": 0, "choices": [{"index": 0, "turns": [tasks[0]["canonical_solution"]]}]}
    answers.write_text(json.dumps(answer) + "\n")
    assert score.main(["humaneval", str(answers)]) == 2
    err = capsys.readouterr().err
    assert "cannot hide your private files" in err and "--allow-unisolated" in err
    assert score.main(["humaneval", str(answers), "--allow-unisolated"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.splitlines()[-1])
    assert result["sandbox"] == "unisolated" and result["pass@1"] == 1.0
    assert "sandbox: unisolated" in out


def test_a_job_refuses_before_answering_and_records_unisolated(nothing_isolates: None) -> None:
    """eval.run's job: the refusal comes before any model loads; allowed, the level is what the summary's
    settings, the report and the W&B config record."""
    from types import SimpleNamespace

    from eval.reporting.summaries import SETTING_KEYS
    from eval.runner.job import sandbox_level

    def config(bench: str, allow: bool) -> SimpleNamespace:
        return SimpleNamespace(bench=SimpleNamespace(name=bench), sandbox=SimpleNamespace(allow_unisolated=allow))

    assert sandbox_level(config("gsm8k", False)) is None  # no programs to run: no sandbox, no refusal
    with pytest.raises(sandbox.SandboxUnavailable, match="sandbox.allow_unisolated=true"):
        sandbox_level(config("humaneval", False))
    assert sandbox_level(config("humaneval", True)) == "unisolated"
    assert "sandbox" in SETTING_KEYS  # report.md lists the settings' sandbox level
