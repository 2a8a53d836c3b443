"""The target's arithmetic on this machine, below both the engine and the draft side.

- `compute.kernels`: linear layers multiplied on weights oneDNN packed once (row-invariant, so a tree's rows
  get plain decoding's sums);
- `compute.growing_cache`: a KV cache layer written in place with spare room;
- `compute.ragged`: B sequences of different lengths in one cache.

Why a package of its own: the decoding loop (`mars/`) needs them, and so does draft training (`eagle.train`:
its answering and feature stages multiply the target's weights over 8-128 rows and grow its caches), and
`eagle/` may not import `mars/` (imports run `eval/` -> `mars/` -> `eagle/` -> `compute/`). In `eagle/` they
sat with the draft side they do not belong to; here they import nothing of the project.
"""
