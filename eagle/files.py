"""Files written whole: a reader (another process, or this one after a crash) sees the old file or the new one,
never half of one. The records rewritten in place while other processes may read them (calibration records, the
settings' reference answers, the job registry, run identities and summaries, the converted-model index, a head's
confidence temperature) are written through here."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` by `text` through a temporary file beside it and a rename. The temporary name carries the
    process id, so two processes writing the same file at once each rename a whole file of their own."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
