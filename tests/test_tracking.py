"""W&B logging of an evaluation job (eval/reporting/tracking.py), against the real wandb package in offline mode.

Every W&B file goes under the test's tmp_path (home, cache, config, data and temp directories, and
a .netrc that does not exist, so no real credentials are found). Offline runs keep no summary file:
what a run logged is read back from its transaction log, <job dir>/wandb/offline-run-*/run-<id>.wandb.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
import tempfile
from pathlib import Path

import pytest

from eval.config.schema import LoggingConfig, WandbMode
from eval.reporting import tracking, wandb_items
from eval.reporting.metrics import method_figures
from eval.rundirs.layout import AnswerFile, answer_record
from mars.accounting.stats import VerifyStats

MODEL, BENCH, METHOD = "tiny", "embedded", "mars@0.9"
SUMMARY = {
    "quality_metric": "parse_rate",
    "methods": {
        "vanilla": {"tokens_per_s": 40.0, "tau": 1.0, "quality": {"parse_rate": 0.5, "token_prob": 0.2},
                    "acceptance_rate_by_depth": {}, "run_dir": "/somewhere/vanilla"},
        METHOD: {"tokens_per_s": 80.0, "speedup": 2.0, "speedup_vs_generate": None, "tau": 3.25, "relaxed_frac": 0.05,
                 "quality": {"parse_rate": 0.45, "token_prob": 0.21}, "quality_recovery": 0.9,
                 "acceptance_rate_by_depth": {0: 0.9, 1: 0.7, "2": 0.5}, "phase_seconds": {"draft": 1.5},
                 "margin_histogram": {"metric": "logit_ratio", "theta": 0.9, "edges": [0.0, 1.0], "counts": [3]},
                 "quality_error": "judge unreachable"},
    },
}


def record(question_id: int, new_tokens: list[int], cycles: list[int], seconds: list[float]) -> dict:
    """An answer record as eval.run writes it, with the `eval` fields eval.reporting.metrics needs."""
    turns = len(new_tokens)
    extra = {"method": METHOD, "token_ids": [[1] * n for n in new_tokens], "max_new_tokens": [64] * turns,
             "parses": [None] * turns, "loglik": [None] * turns, "loglik_tokens": [0] * turns,
             "accepted": [n - 1 for n in new_tokens], "relaxed": [0] * turns, "stopped_by": ["length"] * turns,
             "verify": VerifyStats().to_json(), "phase_seconds": {}}
    return answer_record(question_id, f"{MODEL}-{METHOD}", ["x"] * turns, cycles, new_tokens, seconds, extra)


RECORDS = [record(0, [17], [5], [0.5]), record(1, [9, 13], [3, 4], [0.25, 0.5]), record(2, [1], [0], [0.1])]


def logging_config(mode: WandbMode, **overrides) -> LoggingConfig:
    return LoggingConfig(mode=mode, project="mars-spec-test", **overrides)


def start(directory: Path, mode: WandbMode = WandbMode.offline, **overrides) -> tracking.Tracker:
    return tracking.start_tracking(logging_config(mode, **overrides), directory, {"max_new_tokens": 64, "seed": 0},
                                   model=MODEL, bench=BENCH, method=METHOD, temperature=0.0, sweep="sweep-1")


@pytest.fixture
def wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Point every place wandb writes to or reads credentials from into tmp_path; fresh wandb state after."""
    for name in ("HOME", "WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "TMPDIR"):
        path = tmp_path / "env" / name.lower()
        path.mkdir(parents=True)
        monkeypatch.setenv(name, str(path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "env" / "tmpdir"))
    monkeypatch.setenv("NETRC", str(tmp_path / "env" / "netrc"))  # absent: no stored credentials
    monkeypatch.setenv("WANDB_SILENT", "true")  # restored afterwards (start_tracking sets it when unset)
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_PROJECT",
                 "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_RUN_GROUP", "WANDB_TAGS", "WANDB_NAME"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path
    import wandb

    wandb.teardown()  # wandb caches its settings per process: the next test starts from its own environment


# --- reading an offline run back --------------------------------------------------------------

def transaction_log(run_dir: Path) -> list:
    """The records of an offline run's .wandb file: a 7-byte W&B header (":W&B", magic, version), then the
    LevelDB log format, 32 KiB blocks of chunks with a 7-byte header (crc32, length, type 1 full / 2 first /
    3 middle / 4 last) that carry serialized `wandb_internal_pb2.Record` messages."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            message = wandb_internal_pb2.Record()
            message.ParseFromString(pending)
            records.append(message)
            pending = b""
    return records


def of_type(records: list, kind: str) -> list:
    return [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]


def folded(items) -> dict:
    """Summary or history items (key, or nested_key path, and a JSON value) as a dict."""
    out: dict = {}
    for item in items:
        keys = [item.key] if item.key else list(item.nested_key)
        target = out
        for key in keys[:-1]:
            target = target.setdefault(key, {})
        target[keys[-1]] = json.loads(item.value_json)
    return out


def run_summary(records: list) -> dict:
    return folded(item for summary in of_type(records, "summary") for item in summary.update)


def offline_runs(directory: Path) -> list[Path]:
    return sorted((directory / "wandb").glob("offline-run-*"))


# --- no wandb needed --------------------------------------------------------------------------

def test_running_totals_match_the_summary_definitions():
    totals = tracking.RunningTotals()
    for r in RECORDS:
        totals.add(r)
    figures = method_figures(RECORDS)
    assert totals.questions == 3
    assert totals.tokens_per_s == pytest.approx(figures["tokens_per_s"])
    assert totals.tau == pytest.approx(figures["tau"]) == pytest.approx((16 + 8 + 12) / 12)
    assert tracking.RunningTotals().tau == 1.0 and tracking.RunningTotals().tokens_per_s == 0.0
    # per turn: the first turns of all three (16 + 8 + 0 tokens over 5 + 3 + 0 cycles), the one second turn
    assert figures["tau_by_turn"] == pytest.approx([(16 + 8) / 8, 12 / 4])


def test_summary_items_flat_numeric_and_headline():
    items = wandb_items.summary_items(SUMMARY, METHOD)
    assert items["speedup"] == items[f"{METHOD}/speedup"] == 2.0
    assert items["tau"] == 3.25 and items["tokens_per_s"] == 80.0 and items["relaxed_frac"] == 0.05
    assert items["quality"] == items[f"{METHOD}/quality"] == 0.45  # the headline metric's value
    assert items[f"{METHOD}/quality/token_prob"] == 0.21 and items["quality_recovery"] == 0.9
    assert items[f"{METHOD}/acceptance_rate_by_depth/0"] == 0.9 and items[f"{METHOD}/phase_seconds/draft"] == 1.5
    assert items["vanilla/quality"] == 0.5 and items["quality_metric"] == "parse_rate"
    assert "speedup_vs_generate" not in items  # None is no figure
    assert not any(k.startswith(f"{METHOD}/margin_histogram") or k.endswith(("run_dir", "quality_error"))
                   for k in items)
    assert wandb_items.acceptance_rows(SUMMARY) == [[METHOD, 0, 0.9], [METHOD, 1, 0.7], [METHOD, 2, 0.5]]


def test_names_tags_and_artifact_names():
    cfg = logging_config(WandbMode.offline, tags=["ablation", "y" * 100, "ablation"])
    tags = wandb_items.run_tags(cfg, MODEL, BENCH, METHOD, 0.2)
    assert tags == [f"model:{MODEL}", f"bench:{BENCH}", f"method:{METHOD}", "T:0.2", "ablation", "y" * 64]
    assert wandb_items.run_name(cfg, MODEL, BENCH, METHOD, 1.0) == f"{MODEL}-{BENCH}-{METHOD}-T1"
    assert wandb_items.run_name(logging_config(WandbMode.offline, name="mine"), MODEL, BENCH, METHOD, 1.0) == "mine"
    name = wandb_items.artifact_name("org/model 8B", BENCH, Path("/out/mars@0.9-T0-0123456789/answers/mars@0.9.jsonl"))
    assert name == "answers-org_model_8B-embedded-mars_0.9-T0-0123456789"


def test_disabled_never_imports_wandb_nor_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # any `import wandb` now raises ImportError
    with pytest.raises(ImportError):
        import wandb  # noqa: F401
    spec = importlib.util.spec_from_file_location("tracking_without_wandb", Path(tracking.__file__))
    fresh = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, fresh)
    spec.loader.exec_module(fresh)  # importing the module needs no wandb either
    job = tmp_path / "job"
    tracker = fresh.start_tracking(logging_config(WandbMode.disabled), job, {}, model=MODEL, bench=BENCH,
                                   method=METHOD, temperature=0.0)
    assert not tracker.enabled
    tracker.log_question(METHOD, RECORDS[0], 1, 1)
    tracker.finish(SUMMARY, {METHOD: job / "answers.jsonl"}, {METHOD: [0.5]})
    assert not job.exists() and list(tmp_path.iterdir()) == []


# --- offline runs -----------------------------------------------------------------------------

def test_offline_run_logs_progress_summary_tags_and_answers(wandb_env: Path, capfd: pytest.CaptureFixture):
    job = wandb_env / "runs" / "mars@0.9-T0-0123456789"
    tracker = start(job, tags=["ablation"])
    assert tracker.enabled
    files = {m: AnswerFile(wandb_env / "runs" / f"{m}-T0-abcdef0123" / "answers" / f"{m}.jsonl")
             for m in ("vanilla", METHOD)}
    files[METHOD] = AnswerFile(job / "answers" / f"{METHOD}.jsonl")
    for n, r in enumerate(RECORDS, 1):
        for method, file in files.items():
            file.append(r)
            tracker.log_question(method, r, n, len(RECORDS))
    tracker.finish(SUMMARY, {m: f.path for m, f in files.items()}, {METHOD: [0.1, 0.95, float("inf")], "vanilla": []})
    assert not tracker.enabled
    assert capfd.readouterr().err == ""  # W&B kept quiet

    (run_dir,) = offline_runs(job)
    run_id = (job / "wandb_run_id").read_text().strip()
    assert run_dir.name.endswith(f"-{run_id}")
    records = transaction_log(run_dir)
    (run,) = of_type(records, "run")
    assert run.run_id == run_id and run.project == "mars-spec-test" and run.run_group == "sweep-1"
    assert run.display_name == f"{MODEL}-{BENCH}-{METHOD}-T0"
    assert {f"model:{MODEL}", f"bench:{BENCH}", f"method:{METHOD}", "T:0", "ablation"} <= set(run.tags)
    assert folded(run.config.update)["seed"] == 0

    summary = run_summary(records)
    assert summary["speedup"] == 2.0 and summary["tau"] == 3.25 and summary["quality"] == 0.45
    assert summary[f"{METHOD}/quality/token_prob"] == 0.21 and summary["vanilla/tokens_per_s"] == 40.0
    assert summary[f"{METHOD}/questions_done"] == 3 and summary["progress"] == 1.0
    assert summary[f"{METHOD}/margins"]["_type"] == "histogram"
    assert summary["acceptance_by_depth"]["_type"] == "table-file"
    assert "vanilla/margins" not in summary

    history = [folded(h.item) for h in of_type(records, "history")]
    taus = [h[f"{METHOD}/tau"] for h in history if f"{METHOD}/tau" in h]
    assert taus == pytest.approx([16 / 5, 36 / 12, 36 / 12])  # running, as eval.reporting.metrics defines tau

    answers = {a.name: a for a in of_type(records, "artifact") if a.type == "answers"}
    own = "answers-tiny-embedded-mars_0.9-T0-0123456789"
    assert set(answers) == {"answers-tiny-embedded-vanilla-T0-abcdef0123", own}
    contents = answers[own].manifest.contents
    assert [c.path for c in contents] == [f"{METHOD}.jsonl"]


def test_online_without_credentials_goes_offline_with_one_line(wandb_env: Path, capfd: pytest.CaptureFixture):
    job = wandb_env / "job"
    tracker = start(job, WandbMode.online)
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and "offline" in err[0] and f"wandb sync {job / 'wandb'}" in err[0]
    assert tracker.enabled
    tracker.finish(SUMMARY, {}, {})
    assert len(offline_runs(job)) == 1 and capfd.readouterr().err == ""


def test_online_without_network_goes_offline_with_one_line(wandb_env: Path, capfd: pytest.CaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # the discard port: connection refused
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "2")
    job = wandb_env / "job"
    tracker = start(job, WandbMode.online)
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and "could not start an online run" in err[0] and "wandb sync" in err[0]
    tracker.finish(SUMMARY, {}, {})
    (run_dir,) = offline_runs(job)  # under the id kept for the job, so a later sync continues the same run
    assert of_type(transaction_log(run_dir), "run")[0].run_id == (job / "wandb_run_id").read_text().strip()


def test_rerun_continues_the_run_and_finish_survives_failures(wandb_env: Path, capfd: pytest.CaptureFixture):
    job = wandb_env / "job"
    first = start(job)
    run_id = first.run_id
    first.finish(SUMMARY, {}, {})
    second = start(job)
    assert second.run_id == run_id == (job / "wandb_run_id").read_text().strip()
    bad = job / "answers" / "broken.jsonl"
    bad.mkdir(parents=True)  # a directory where a file should be: logging it fails
    capfd.readouterr()
    second.finish(SUMMARY, {METHOD: bad}, {})
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and f"could not log the answers of {METHOD}" in err[0]
    logs = [transaction_log(r) for r in offline_runs(job)]  # offline-run-<time>-<id>, then -<id>-1 within a second
    assert len(logs) == 2 and [of_type(records, "run")[0].run_id for records in logs] == [run_id, run_id]
    assert run_summary(logs[1])["speedup"] == 2.0  # the rest was still logged
    other = start(wandb_env / "other")
    assert other.run_id != run_id
    other.finish({}, {}, {})
