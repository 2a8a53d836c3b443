"""One data dir for the continued fine-tune: the s63 answers (their feature shards 0-10 linked, sequences 0-703)
then the new answers; shard 11 on are built by the training CLI (FeatureStore.missing)."""
import os
from pathlib import Path

from eagle.train.data import Sequences

old, new, out = Path("/work/s63/ft/data"), Path("/work/s66/ft/new_sequences.pt"), Path("/work/s66/ft/data")
out.mkdir(parents=True, exist_ok=False)
a, b = Sequences.load(old / "sequences.pt"), Sequences.load(new)
Sequences.concat([a, b]).save(out / "sequences.pt")
full = len(a) // 64
for i in range(full):
    os.symlink(old / f"shard_{i:05d}.pt", out / f"shard_{i:05d}.pt")
print(f"{len(a)} old + {len(b)} new sequences; shards 0..{full - 1} linked; tokens {a.num_tokens()} + {b.num_tokens()}")
