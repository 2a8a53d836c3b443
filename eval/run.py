"""Evaluate a decoding method on a target + draft pair: speed, acceptance, relaxation and task quality.

    python -m eval.run                                     # quickstart: embedded pair, held-out stdlib prompts
    python -m eval.run num_prompts=64 max_new_tokens=128   # the full embedded benchmark
    python -m eval.run bench=humaneval num_prompts=null    # HumanEval pass@1 (completion prompts on the code model)
    python -m eval.run bench=spec_bench                    # Spec-Bench: speedup and τ per category
    python -m eval.run method=strict sampling=t1           # strict verification at temperature 1
    python -m eval.run -m method.theta=0.84,0.88,0.92,0.96 bench=embedded,humaneval   # a sweep: one job each
    python -m eval.run model=llama31_8b bench=mt_bench max_new_tokens=1024 num_prompts=null   # on a GPU

The job is `eval.runner.job.run` (what it answers and where it writes: that module's docstring);
the settings are the Hydra config in configs/ with the schema of `eval.config`.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import hydra
from omegaconf import DictConfig

from eval.config.paths import REPO_ROOT
from eval.runner.job import run
from eval.runner.locks import SWEEP_PID  # the process that started the sweep, for its workers (set below)


def end_with_the_sweep(poll: float = 0.5) -> None:
    """In a launcher's worker process (joblib), end this job when the sweep's process is gone.

    A sweep killed outright (SIGKILL, an OOM kill) cannot tell its workers: they would go on answering
    as orphans, and loky's semaphores and memmapping folders, which its resource tracker removes once
    every worker has exited, would outlive them. Finished answers are on disk already (appended per
    question); the run directories' locks die with the process."""
    sweep = int(os.environ.get(SWEEP_PID, os.getpid()))
    if multiprocessing.parent_process() is None or sweep == os.getpid():  # a job in the sweep's own process
        return

    def watch() -> None:
        while os.getppid() == sweep:  # orphaned, a process is re-parented (to init or a subreaper)
            time.sleep(poll)
        os._exit(1)

    threading.Thread(target=watch, name="end-with-the-sweep", daemon=True).start()


@hydra.main(version_base=None, config_path=str(REPO_ROOT / "configs"), config_name="config")
def main(composed: DictConfig) -> None:
    end_with_the_sweep()
    run(composed)


if __name__ == "__main__":
    # Through the module's importable name, so that launchers running jobs in other processes
    # (joblib, submitit) pickle the task by reference rather than this __main__ module by value.
    from eval.run import main as entry_point

    os.environ[SWEEP_PID] = str(os.getpid())
    entry_point()
