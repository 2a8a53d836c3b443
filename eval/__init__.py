"""Benchmarks, scoring, reports and the Hydra entry point (`python -m eval.run`)."""

# The structured configs must be in Hydra's ConfigStore before any compose (eval.run, tests, notebooks).
import eval.config  # noqa: F401
