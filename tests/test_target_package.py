"""mars.target by role: each module has one job and imports only the modules below it, so that a
reader finds static shapes, caches, attention routing, exact attention, taps and devices each in
one place, and no module reaches back up into the adapter."""

from __future__ import annotations

import ast
from pathlib import Path

import mars.target

PACKAGE = Path(mars.target.__file__).parent
# Each module of the package, and the modules of the package it may import (the rest of the project
# is covered by tests/test_api.py: mars imports mars and eagle only).
MAY_IMPORT = {
    "adapter": {"static", "cache", "routing", "exact", "taps", "devices"},
    "static": {"cache", "routing"},
    "routing": {"exact"},
    "cache": set(),
    "exact": set(),
    "taps": set(),
    "devices": set(),
}


def package_imports(source: str) -> set[str]:
    """The modules of mars.target that `source` imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import: name the module in full"
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name == "mars.target" or name.startswith("mars.target."):
                part = name.split(".")[2] if name.count(".") >= 2 else ""
                # `from mars.target import X` runs the package's __init__, i.e. the adapter: counted as importing it
                found.add(part if part in MAY_IMPORT else "adapter")
    return found


def test_every_module_has_a_place_and_imports_only_those_below_it():
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == set(MAY_IMPORT)  # a new module gets a place here
    upward = {m: package_imports((PACKAGE / f"{m}.py").read_text()) - MAY_IMPORT[m] for m in modules}
    assert {m: found for m, found in upward.items() if found} == {}


def test_the_check_would_catch_a_module_reaching_up():
    assert package_imports("from mars.target.adapter import TargetModel\nimport mars.target.static\n") == {
        "adapter", "static"}
    assert package_imports("from mars.target import TargetModel\n") == {"adapter"}
    assert package_imports("from eagle.tree import DraftTree\nimport torch\n") == set()
