"""mars.adapter by role: each module has one job and imports only the modules below it, so that a
reader finds static shapes, caches, attention routing, exact attention, taps and devices each in
one place, and no module reaches back up into the adapter."""

from __future__ import annotations

import ast
from pathlib import Path

import mars.adapter

PACKAGE = Path(mars.adapter.__file__).parent
# Each module of the package, and the modules of the package it may import (the rest of the project
# is covered by tests/test_api.py: mars imports mars and eagle only).
MAY_IMPORT = {
    "model": {"static", "cache", "routing", "exact", "taps", "devices"},
    "static": {"cache", "routing"},
    "routing": {"exact"},
    "cache": set(),
    "exact": set(),
    "taps": set(),
    "devices": set(),
    "sources": set(),
}


def package_imports(source: str) -> set[str]:
    """The modules of mars.adapter that `source` imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import: name the module in full"
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name == "mars.adapter" or name.startswith("mars.adapter."):
                part = name.split(".")[2] if name.count(".") >= 2 else ""
                # `from mars.adapter import X` runs the package's __init__ (the model module): counted as importing it
                found.add(part if part in MAY_IMPORT else "model")
    return found


def test_every_module_has_a_place_and_imports_only_those_below_it():
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == set(MAY_IMPORT)  # a new module gets a place here
    upward = {m: package_imports((PACKAGE / f"{m}.py").read_text()) - MAY_IMPORT[m] for m in modules}
    assert {m: found for m, found in upward.items() if found} == {}


def test_the_check_would_catch_a_module_reaching_up():
    assert package_imports("from mars.adapter.model import TargetModel\nimport mars.adapter.static\n") == {
        "model", "static"}
    assert package_imports("from mars.adapter import TargetModel\n") == {"model"}
    assert package_imports("from eagle.tree import DraftTree\nimport torch\n") == set()
