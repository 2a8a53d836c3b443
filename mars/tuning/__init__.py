"""Measured settings: the fastest kernels and tree on this machine, timed and cached (`calibrate`), and the
Python API's one call for a generator with them (`tuned`)."""
