"""Evaluation: benchmarks, scoring, reports and the Hydra entry point.

The modules at this level are the commands (`python -m eval.<name>`), each a thin front over the
packages below it:

    run      one evaluation job (Hydra)            -> runner/    models, run directories, answering, the job
    score    score an answer file                  -> benchmarks/ one file per benchmark, its questions and scorer
    report   report.md/csv and plots over runs     -> reporting/ metrics, summaries, tables, plots, tracking (W&B)
    zoo      the rule zoo's report                 -> reporting/zoo_sweep.py, zoo_tables.py
    paper    rerun one of the paper's experiments  -> reporting/experiments.py, paper_jobs.py
    prompts  build the embedded held-out prompts;  tau  a draft head's acceptance length

Lower down: scoring/ (text metrics, HumanEval in the sandbox, the LLM judge), rundirs/ (the run
directory's layout, the JSONL reader) and config/ (the Hydra schema, the method catalog, paths).
Imports run downward only: commands -> runner -> reporting -> benchmarks -> scoring -> rundirs -> config
(tests/test_api.py checks it).
"""

# The structured configs must be in Hydra's ConfigStore before any compose (eval.run, tests, notebooks).
import eval.config.schema  # noqa: F401
