"""The embedded default's corpus and tokenizer: the Python standard library's own source.

Every machine that runs this project has a CPython standard library, so a code model trained on
it needs no download. Files are split into train / held-out by a hash of their path relative to
the stdlib root, so the split is the same on every machine and Python version that has the file.
`site-packages` (third-party code) is excluded.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

HELDOUT_PERCENT = 5  # files whose path hash falls in the lowest 5 buckets of 100 are held out
EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [EOS_TOKEN, "<|pad|>"]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relative_path: str) -> str:
    """'train' or 'heldout', decided only by the file's path relative to the stdlib root."""
    bucket = int(hashlib.sha1(relative_path.encode()).hexdigest(), 16) % 100
    return "heldout" if bucket < HELDOUT_PERCENT else "train"


def stdlib_files(split: str, root: Path | None = None) -> list[Path]:
    """Sorted `.py` files of the standard library in one split ('train', 'heldout' or 'all')."""
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split must be 'train', 'heldout' or 'all', got {split!r}")
    root = root or stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "site-packages" in rel.split("/") or not path.is_file():
            continue
        if split == "all" or split_of(rel) == split:
            files.append(path)
    return files


def read_source(path: Path) -> str | None:
    """A file's text, or None when it is not valid UTF-8 (a few stdlib test files are not)."""
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def train_tokenizer(out_dir: str | Path, vocab_size: int = 4096, root: Path | None = None) -> None:
    """Byte-level BPE on the train split (of `root`, default the stdlib), saved as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = (t for t in (read_source(p) for p in stdlib_files("train", root)) if t)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, pad_token="<|pad|>"
    )
    fast.save_pretrained(str(out_dir))
