"""Measured settings: the fastest kernels and tree for each method on this machine, predicted from measured
costs and acceptance, decided by paired timing against the fastest plain decoding, cached as a typed record
(`measure`, `search`, `record`), and the Python API's one call for a generator with them (`tuned`)."""
