"""Static shapes live in `mars.target.static` (the cache layers in `mars.target.cache`); this name is kept
for code that imports them from here."""

from mars.target.cache import StaticTreeCache, StaticTreeLayer
from mars.target.static import DEFAULT_MAX_CACHE_LEN, StaticMasks, StaticShapes, pad_to

__all__ = ["DEFAULT_MAX_CACHE_LEN", "StaticMasks", "StaticShapes", "StaticTreeCache", "StaticTreeLayer", "pad_to"]
