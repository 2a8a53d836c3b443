"""The README's engine example runs as written (here on the CPU; the same code picks a GPU when one
is present) and does what its comments say."""

from __future__ import annotations

import re

import pytest

from eval.bench import REPO_ROOT

pytestmark = pytest.mark.usefixtures("single_thread")


def engine_example() -> str:
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("## Using the engine"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_engine_example_runs_as_written(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # it names the embedded pair by relative path
    scope: dict = {}
    exec(compile(engine_example(), "README.md", "exec"), scope)  # noqa: S102 - the project's own README
    out, base = scope["out"], scope["base"]  # the last MARS sample and plain decoding, 128 tokens each
    assert len(base.tokens) == len(out.tokens) == 128 and out.num_cycles < 128
