"""Weights & Biases logging of one evaluation job: running progress while it answers, figures when it ends.

One job (one `python -m eval.run`, or one job of a Hydra multirun) is one W&B run, named
<model>-<bench>-<method>-T<temperature> unless `logging.name` says otherwise, grouped by
`logging.group` or else by the sweep, and tagged model:/bench:/method:/T: so that dashboards can
filter and plot across a sweep. Its files go under the job's run directory (<job_dir>/wandb/), and
the run's id is kept in <job_dir>/wandb_run_id so that a rerun of the job (which resumes its answers)
continues the same W&B run instead of starting another.

W&B is optional: `wandb` is imported only when logging is enabled, and nothing here may cost the
job its results. Those are on disk (answer files, summary.json) before W&B sees them, so every W&B
failure is reported in one line on stderr and the job goes on: no credentials or no network means
an offline run (uploaded later with `wandb sync <job_dir>/wandb`), a failing offline run means no
logging at all, and a failure while logging or finishing skips that part only.
"""

from __future__ import annotations

import math
import os
import secrets
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle.files import write_atomic
from eval.reporting import metrics

if TYPE_CHECKING:
    from eval.config.schema import LoggingConfig
from eval.reporting.wandb_items import acceptance_rows, artifact_name, run_name, run_tags, summary_items

RUN_ID_FILE = "wandb_run_id"
MARGIN_BINS = 64


def _warn(message: str) -> None:
    """One line on stderr, so that W&B trouble is visible but never floods the job's output."""
    print(f"W&B: {message}", file=sys.stderr, flush=True)


def _reason(error: BaseException) -> str:
    """An exception as one short line (W&B errors can span many lines)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:200]}" if lines else type(error).__name__


@dataclass
class RunningTotals:
    """Pooled figures of one method over the questions answered so far by this process, by the same
    functions as the job's summary (`eval.reporting.metrics`), so the last logged values of a run answered in
    one go equal the summary's."""

    questions: int = 0
    tokens: int = 0
    seconds: float = 0.0
    cycle_tokens: int = 0
    cycles: int = 0

    def add(self, record: dict) -> None:
        tokens, seconds = metrics.speed_counts(record)
        cycle_tokens, cycles = metrics.cycle_counts(record)
        self.questions += 1
        self.tokens += tokens
        self.seconds += seconds
        self.cycle_tokens += cycle_tokens
        self.cycles += cycles

    @property
    def tokens_per_s(self) -> float:
        return metrics.tokens_per_s(self.tokens, self.seconds)

    @property
    def tau(self) -> float:
        return metrics.tau(self.cycle_tokens, self.cycles)


class Tracker:
    """One W&B run per evaluation job; every method is a no-op when logging is disabled."""

    def __init__(self, run: Any = None, *, method: str = "", model: str = "", bench: str = "",
                 directory: Path | None = None):
        self._run = run
        self.method, self.model, self.bench = method, model, bench
        self.directory = directory
        self._totals: dict[str, RunningTotals] = {}

    @property
    def enabled(self) -> bool:
        """Whether a W&B run is open (false when disabled, after `finish`, or after a logging failure)."""
        return self._run is not None

    @property
    def run_id(self) -> str | None:
        return self._run.id if self._run is not None else None

    def log_question(self, method: str, record: dict, done: int, total: int) -> None:
        """Log `method`'s running figures after it answered a question, so a killed job still shows its progress.

        `record` is the answer record just appended (`eval.rundirs.layout.answer_record`); `done` of
        `total` questions of this process's work are under way. The totals count only what this
        process answered: a resumed job's earlier answers are in its summary, not in these curves.
        """
        if self._run is None:
            return
        totals = self._totals.setdefault(method, RunningTotals())
        totals.add(record)
        data = {f"{method}/questions_done": totals.questions, f"{method}/tokens_per_s": totals.tokens_per_s,
                f"{method}/tau": totals.tau, "progress": done / total if total else 1.0}
        if not _guarded("log progress (logging stops for this job)", lambda: self._run.log(data)):
            self._close()

    def finish(self, summary: dict, answer_files: dict[str, Path], margins: dict[str, list[float]]) -> None:
        """Write the job's figures to the run summary, log charts and answer files, and end the run.

        `summary` is the job's summary.json content, `answer_files` each method's answers JSONL,
        `margins` each method's verified-position margins. Each part fails on its own: the
        results are already on disk, so a W&B error costs at most that part of the logging.
        """
        run = self._run
        if run is None:
            return
        self._run = None
        # What to log, as plain data first (eval.reporting.wandb_items); then the W&B calls, each on its own.
        items = summary_items(summary, self.method)
        names = {method: artifact_name(self.model, self.bench, Path(path)) for method, path in answer_files.items()}
        _guarded("write the run summary", lambda: _update_summary(run, items))
        _guarded("log acceptance by depth and margin histograms", lambda: _log_charts(run, summary, margins))
        for method, path in answer_files.items():
            _guarded(f"log the answers of {method}",
                     lambda m=method, p=path: self._log_answers(run, m, Path(p), names[m]))
        _guarded("finish the run", run.finish)
        _guarded("flush the run", _flush)

    def _log_answers(self, run: Any, method: str, path: Path, name: str) -> None:
        """One `answers` artifact per answer file, `name` following its run directory (so its settings)."""
        if not path.exists():
            return
        import wandb

        records = sum(1 for line in path.read_text().splitlines() if line.strip())
        artifact = wandb.Artifact(name, type="answers",
                                  metadata={"method": method, "model": self.model, "bench": self.bench,
                                            "questions": records, "path": str(path)})
        artifact.add_file(str(path), name=path.name)
        run.log_artifact(artifact)

    def _close(self) -> None:
        """Stop logging after a failure, ending the run if W&B still can."""
        run, self._run = self._run, None
        if run is not None:
            _guarded("finish the run", run.finish)


def _flush() -> None:
    """Wait until wandb's service has written (online: uploaded) everything: `run.finish` can return
    before it has, and the process may then end without the atexit hook that would wait (Hydra's
    joblib workers, a killed job). The next run of this process starts a fresh service."""
    import wandb

    wandb.teardown()


def _guarded(what: str, action: Callable[[], Any]) -> bool:
    """Run a W&B action; on failure say so in one line and report False instead of raising."""
    try:
        action()
    except Exception as e:  # any W&B failure must leave the job running
        _warn(f"could not {what}: {_reason(e)}")
        return False
    return True


def _update_summary(run: Any, items: dict[str, Any]) -> None:
    for key, value in items.items():
        run.summary[key] = value


def _log_charts(run: Any, summary: dict, margins: dict[str, list[float]]) -> None:
    """Acceptance rate by draft depth (a table and its line chart) and each method's margin histogram."""
    import wandb

    data: dict[str, Any] = {}
    rows = acceptance_rows(summary)
    if rows:
        table = wandb.Table(columns=["method", "depth", "acceptance_rate"], data=rows)
        data["acceptance_by_depth"] = table
        data["acceptance_by_depth_chart"] = wandb.plot.line(table, "depth", "acceptance_rate", stroke="method",
                                                            title="acceptance rate by draft depth")
    for name, values in margins.items():
        finite = [v for v in values if math.isfinite(v)]
        if finite:
            data[f"{name}/margins"] = wandb.Histogram(finite, num_bins=MARGIN_BINS)
    if data:
        run.log(data)


# --- starting a run -----------------------------------------------------------------------------
def _mode(logging: LoggingConfig) -> str:
    """disabled | offline | online, from the WandbMode enum (or its plain value)."""
    mode = logging.mode
    return str(getattr(mode, "value", mode))


def _run_id(directory: Path) -> str:
    """The job's W&B run id: the stored one, so a rerun continues its run, or a new one, stored at once."""
    path = directory / RUN_ID_FILE
    if path.exists() and path.read_text().strip():
        return path.read_text().strip()
    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))  # as W&B makes them
    write_atomic(path, run_id + "\n")
    return run_id


def _has_credentials() -> bool:
    """Whether an online run could authenticate: WANDB_API_KEY, or credentials `wandb login` stored.

    `wandb.login(prompt=False)` looks where wandb.init would (environment, settings files, .netrc)
    without prompting and without changing anything when nothing is found. It declines to answer
    while a run is open, so a run left open by an earlier job of this process is finished first.
    """
    if os.environ.get("WANDB_API_KEY"):
        return True
    import wandb

    if wandb.run is not None:
        wandb.run.finish()
    try:
        return bool(wandb.login(prompt=False, verify=False))
    except Exception:  # a malformed key or netrc counts as no credentials
        return False


def start_tracking(logging: LoggingConfig, directory: Path, config: dict, *, model: str, bench: str, method: str,
                   temperature: float, sweep: str | None = None) -> Tracker:
    """Open the job's W&B run (see the module docstring), or a Tracker that does nothing when disabled.

    `logging` is the job's `eval.config.schema.LoggingConfig`, `directory` its run directory (W&B's files
    go under it), `config` the resolved config as plain data (the run's config), `sweep` the Hydra
    sweep's name when the job is part of a multirun (the default group).
    """
    mode = _mode(logging)
    if mode == "disabled":
        return Tracker()
    os.environ.setdefault("WANDB_SILENT", "true")  # before wandb reads its settings: no banners, no run links
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sync = f"upload later with `wandb sync {directory / 'wandb'}`"
    try:
        run_id = _run_id(directory)  # stored at once: a rerun of the job continues this run
        import wandb

        init = {
            "project": logging.project, "entity": logging.entity, "group": logging.group or sweep or None,
            "name": run_name(logging, model, bench, method, temperature), "job_type": "eval",
            "tags": run_tags(logging, model, bench, method, temperature), "config": config, "dir": str(directory),
            "id": run_id, "resume": "allow", "reinit": "finish_previous",
            # The job's output is kept by Hydra's own log; W&B need not capture or repeat it.
            "settings": wandb.Settings(silent=True, console="off"),
        }
        if mode == "online" and not _has_credentials():
            _warn(f"no API key (WANDB_API_KEY unset and not logged in): logging offline; {sync}")
            mode = "offline"
        try:
            run = wandb.init(mode=mode, **init)
        except Exception as e:  # no network, server down, timeout: keep the run locally
            if mode != "online":
                raise
            _warn(f"could not start an online run ({_reason(e)}): logging offline; {sync}")
            wandb.teardown()  # wandb's service keeps the failed run's id reserved; a fresh one lets it go
            run = wandb.init(mode="offline", **init)
    except Exception as e:  # logging must never stop an evaluation
        _warn(f"logging disabled for this job, could not start a run: {_reason(e)}")
        return Tracker()
    return Tracker(run, method=method, model=model, bench=bench, directory=directory)
