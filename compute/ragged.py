"""Ragged rows: B sequences of different lengths in one KV cache, for batched decoding.

Layout (the target's cache and the draft head's alike): row b's committed entries sit at
0 .. lengths[b] - 1; a new block (a tree, a catch-up) is written for every row at the same place,
`write_at` = max(lengths), so one forward writes [B, q] entries at once. Between lengths[b] and
`write_at` lies a gap of stale entries that row b's masks hide. After the block is judged, each row
moves the entries it keeps down to follow its own prefix (`move_rows`: one gather and one scatter
per buffer, every row at once) and its length grows by what it kept; the gap never outgrows the
longest row.

Lengths are known twice: on the host (from verdicts the loop has already read, so `write_at` costs
no device read) and on the device (positions and masks are built from them there, no upload).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowLengths:
    """Committed entries per row: `host` [B] ints and `device` [B] long, always equal."""

    host: list[int]
    device: torch.Tensor

    @classmethod
    def of(cls, lengths: list[int], device: torch.device) -> RowLengths:
        return cls(list(lengths), torch.tensor(lengths, dtype=torch.long, device=device))

    @property
    def write_at(self) -> int:
        """Where the next block starts in every row (the longest row's end)."""
        return max(self.host)

    def advance(self, counts: list[int], counts_device: torch.Tensor) -> None:
        """Row b committed counts[b] more entries (counts_device [B]: the same, on the device)."""
        self.host = [n + c for n, c in zip(self.host, counts, strict=True)]
        self.device = self.device + counts_device.to(self.device.device)

    def select(self, rows: list[int], rows_device: torch.Tensor) -> None:
        """Keep only `rows` (in that order); rows_device: the same indices on the device."""
        self.host = [self.host[r] for r in rows]
        self.device = self.device.index_select(0, rows_device.to(self.device.device))

    def prefix_visible(self, width: int) -> torch.Tensor:
        """[B, width] bool: column c holds a committed entry of row b (c < lengths[b])."""
        return torch.arange(width, device=self.device.device)[None, :] < self.device[:, None]


def move_rows(buffer: torch.Tensor, put: torch.Tensor, take: torch.Tensor) -> None:
    """buffer [B, H, S, D]: for every row b and column j, entry put[b, j] <- entry take[b, j] (put,
    take [B, m] long, on the buffer's device). All reads happen before any write, so the ranges may
    overlap. A row with fewer entries to move repeats its last (put, take) pair: the same value is
    written twice, which is harmless."""
    rows = torch.arange(buffer.shape[0], device=buffer.device)[:, None]
    buffer[rows, :, put] = buffer[rows, :, take]


def kept_columns(start: torch.Tensor, counts: torch.Tensor, width: int) -> torch.Tensor:
    """[B, width]: start[b] + min(j, counts[b] - 1), where row b's kept entries go (padded by repeats)."""
    j = torch.arange(width, device=start.device)[None, :]
    return start[:, None] + torch.minimum(j, (counts[:, None] - 1).clamp(min=0))
