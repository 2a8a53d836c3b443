"""EAGLE draft heads, dynamic draft trees, checkpoint I/O and draft training."""

from eagle.checkpoint import load_draft
from eagle.config import DraftConfig
from eagle.heads import DraftHead, Eagle1Head, Eagle3Head
from eagle.tree import DraftTree, grow_tree

__all__ = ["DraftConfig", "DraftHead", "DraftTree", "Eagle1Head", "Eagle3Head", "grow_tree", "load_draft"]
