"""Diagnostics of the decoding loop, used by the tests and the GPU check (scripts/gpu_check.py): where a
loop would wait for a GPU (`syncs`), and a draft head with scripted proposals at a chosen acceptance
(`scripted`)."""
