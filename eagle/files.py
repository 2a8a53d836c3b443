"""Files written whole: a reader (another process, or this one after a crash) sees the old file or the new one,
never half of one. The records rewritten in place while other processes may read them (calibration records, the
settings' reference answers, the job registry, run identities and summaries, the converted-model index, a head's
confidence temperature) are written through here, and so are the resumable stages' torch files (answers being
written, feature shards, training checkpoints, token caches: `save_atomic`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def _temporary(path: Path) -> Path:
    """The temporary file beside `path` that this process writes before the rename."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` by `text` through a temporary file beside it and a rename. The temporary name carries the
    process id, so two processes writing the same file at once each rename a whole file of their own."""
    tmp = _temporary(path)
    tmp.write_text(text)
    os.replace(tmp, path)


def save_atomic(obj: Any, path: Path) -> None:
    """`torch.save` of `obj` to `path` the same way (a temporary file with the process id, then a rename): a run
    killed while saving leaves the last whole file, which the resumed run loads."""
    import torch  # here, not at the top: the text records above are written by modules that need no torch

    tmp = _temporary(path)
    torch.save(obj, tmp)
    os.replace(tmp, path)
