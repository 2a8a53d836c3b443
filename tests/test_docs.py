"""The README and docs/ hold what is true of the tree: the architecture page names every module and only
modules that exist, every link resolves, every `python -m` command names a module, and the examples
marked runnable (a fenced block whose info string says `runnable`) run as written and do what their
comments say (here on the CPU; the same code picks a GPU when one is present)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import torch

from eval.config.paths import REPO_ROOT

pytestmark = pytest.mark.usefixtures("single_thread")

README = REPO_ROOT / "README.md"
DOCS = sorted((REPO_ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
PACKAGES = ("mars", "eagle", "eval", "compute")
MODULE_PATH = re.compile(r"\b(?:mars|eagle|eval|compute)/[\w/]*\w\.py\b")
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks(page: Path, language: str, runnable: bool = True) -> list[str]:
    """The page's fenced blocks in `language` (those marked runnable, or those not)."""
    return [code for lang, info, code in BLOCK.findall(page.read_text())
            if lang == language and ("runnable" in info.split()) == runnable]


def text(page: Path) -> str:
    return page.read_text()


# --- the tree, as the docs describe it ---------------------------------------------------------

def test_the_readme_is_a_front_door_to_at_least_six_pages():
    lines = text(README).splitlines()
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", text(README)))
    assert len(lines) < 200
    assert len(DOCS) >= 6 and linked == {page.name for page in DOCS}  # every page linked, none missing


def test_every_module_is_named_in_the_docs_and_every_module_named_exists():
    modules = {str(p.relative_to(REPO_ROOT)) for package in PACKAGES for p in (REPO_ROOT / package).rglob("*.py")
               if p.name != "__init__.py"}
    named = {m for page in PAGES for m in MODULE_PATH.findall(text(page))}
    assert sorted(modules - named) == []  # a module the docs do not name (docs/architecture.md gets a line)
    assert sorted(m for m in named if not (REPO_ROOT / m).is_file()) == []  # a path that no longer exists
    layout = text(REPO_ROOT / "docs" / "architecture.md")
    assert sorted(m for m in modules if f"`{m}`" not in layout) == []  # each one has its line on the page


def test_no_module_name_repeats_across_the_packages():
    # A file name says one thing (docs/architecture.md): `rows.py` is the decoding call's rows, so the
    # cache's ragged rows are `compute/ragged.py`; only a package's `__init__.py` may repeat.
    paths: dict[str, list[str]] = {}
    for package in PACKAGES:
        for p in sorted((REPO_ROOT / package).rglob("*.py")):
            if p.name != "__init__.py":
                paths.setdefault(p.name, []).append(str(p.relative_to(REPO_ROOT)))
    assert len(paths) > 50
    assert {name: where for name, where in paths.items() if len(where) > 1} == {}


def test_the_check_would_catch_a_missing_or_stale_module():
    assert MODULE_PATH.findall("`mars/decoding/generate.py` and eval/runner/job.py:run") == [
        "mars/decoding/generate.py", "eval/runner/job.py"]
    assert MODULE_PATH.findall("mars/ holds eagle/tree (no file) and tests/test_x.py") == []


def missing_imports(source: str) -> list[str]:
    """The project names that `source` imports and that do not exist (a module moved or renamed)."""
    missing = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            wanted = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            wanted = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in wanted:
            if module.split(".")[0] not in PACKAGES:
                continue
            if not module_exists(module):
                missing.append(module)
            elif name is not None and not hasattr(importlib.import_module(module), name) \
                    and not module_exists(f"{module}.{name}"):
                missing.append(f"{module}.{name}")
    return missing


def module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent that is a module, not a package
        return False


def test_every_script_imports_only_what_the_tree_holds():
    # Scripts and measurement files are never imported by the suite, so a moved module breaks them silently.
    scripts = [*(REPO_ROOT / "scripts").rglob("*.py"), *(REPO_ROOT / "docs").rglob("*.py"),
               *(REPO_ROOT / "experiments").rglob("*.py")]
    assert len(scripts) > 10
    found = {str(p.relative_to(REPO_ROOT)): missing_imports(p.read_text()) for p in scripts}
    assert {path: missing for path, missing in found.items() if missing} == {}


def test_the_import_check_would_catch_a_moved_module():
    assert missing_imports("from mars.adapter.kernels import onednn\nimport eagle.nowhere\n"
                           "from compute.kernels import onednn, nothing_here\nimport torch") == [
        "mars.adapter.kernels", "eagle.nowhere", "compute.kernels.nothing_here"]


def test_every_python_m_command_names_a_module():
    commands = {m for page in PAGES for m in re.findall(r"python -m ([\w.]+)", text(page))}
    assert {"eval.run", "eval.report", "mars.adapter.sources", "eagle.train.draft"} <= commands
    assert sorted(m for m in commands if importlib.util.find_spec(m) is None) == []


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_pages_resolves_to_a_page_and_heading():
    assert slug("The paper's main table on a real model") == "the-papers-main-table-on-a-real-model"
    broken = []
    for page in PAGES:
        for target, anchor in re.findall(r"\]\((?!https?:)([^)#\s]*)(?:#([^)\s]+))?\)", text(page)):
            path = (page.parent / target).resolve() if target else page
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M) if path.is_file() else []
            if not path.is_file() or (anchor and anchor not in {slug(h) for h in headings}):
                broken.append(f"{page.name}: {target}#{anchor}")
    assert broken == []


# --- the runnable examples ---------------------------------------------------------------------

def run_python(code: str, monkeypatch, name: str) -> dict:
    monkeypatch.chdir(REPO_ROOT)  # the examples name the embedded pair by relative path
    scope: dict = {}
    exec(compile(code, name, "exec"), scope)  # noqa: S102 - the project's own docs
    return scope


def test_every_runnable_python_example_has_its_test():
    """The Python examples marked runnable are the three run below; a new one needs its test here."""
    assert {page.name: len(blocks(page, "python")) for page in PAGES if blocks(page, "python")} == {
        "README.md": 1, "engine.md": 1, "rules.md": 1}


def test_the_readme_example_decodes_with_the_settings_it_measured(monkeypatch, capsys):
    """`tuned` measures (here on a budget of 1 s instead of the default minute, and with the paired finals'
    floor of held-out prompts, `mars.tuning.finals.FLOOR`, lowered to the least they time, LEAST: what is
    tested is which settings the generator decodes with, not how precisely they were measured; on the embedded
    pair) and the generator it returns decodes with what was measured: the trees at strict's kernels, MARS's
    own tree, plain decoding at the plain kernels calibration raced."""
    from mars.tuning import finals, measure

    monkeypatch.setattr(measure, "DEFAULT_BUDGET", 1.0)  # the README passes no budget
    monkeypatch.setattr(finals, "FLOOR", finals.LEAST)
    scope = run_python(blocks(README, "python")[0], monkeypatch, "README.md")
    gen, out, base = scope["gen"], scope["out"], scope["base"]  # MARS and plain decoding
    assert len(base.tokens) == len(out.tokens) == 128 and out.num_cycles < 128
    assert set(gen.calibration) == {"strict", "mars"} and gen.calibration["mars"].rule["theta"] == 0.9
    strict, mars = gen.calibration["strict"], gen.calibration["mars"]
    assert strict.budget_s == 1.0 and mars.kernels == strict.kernels
    assert gen.target.model.dtype == strict.kernels.torch_dtype
    assert (gen.tree_kernels, gen.plain_kernels) == (strict.kernels, strict.plain_kernels)
    assert gen.tree == mars.tree
    assert f"tau {out.tau:.2f}" in capsys.readouterr().out


@pytest.mark.parametrize("bf16_cpu", [True, False], ids=["bf16-capable CPU", "AVX2-only CPU"])
def test_the_engine_example_by_hand_runs_as_written(monkeypatch, bf16_cpu):
    """On either CPU class, whichever this one is: `resolve_dtype("auto")` in the example follows the
    CPU's bf16 support, so both of its precisions run here; strict greedy is plain greedy decoding."""
    from eagle import precision

    monkeypatch.setattr(precision, "cpu_bf16_matmul", lambda: (bf16_cpu, "as the test says"))
    scope = run_python(blocks(REPO_ROOT / "docs" / "engine.md", "python")[0], monkeypatch, "docs/engine.md")
    strict, out, base, sampled = scope["strict"], scope["out"], scope["base"], scope["sampled"]
    assert scope["dtype"] == (torch.bfloat16 if bf16_cpu else torch.float32)
    assert len(base.tokens) == len(out.tokens) == 128 and out.num_cycles < 128
    assert strict.tokens == base.tokens  # float32, or bf16 with exact attention ("auto" turns it on)
    assert len(sampled.tokens) == 32


def test_the_example_rule_runs_and_relaxes_only_where_it_says(tmp_path):
    code = blocks(REPO_ROOT / "docs" / "rules.md", "python")[0]
    plugin = tmp_path / "confident.py"
    plugin.write_text(code)
    from eval.config.methods import load_plugins
    from mars.rules import RULES, make_rule

    if "confident" not in RULES:  # imported once per session (the registry refuses a second class)
        load_plugins(str(plugin))
    from helpers import tiny_generator

    gen = tiny_generator(2, 3, sharpen=0.5, total_tokens=10, depth=3, branching=3)
    prompt = torch.tensor([[1, 2, 3, 4]])
    assert make_rule("confident", mass=0.7).display == "confident@0.7"
    relaxed = gen.generate(prompt, max_new_tokens=30, rule="confident", mass=0.0)
    never = gen.generate(prompt, max_new_tokens=30, rule="confident", mass=1.0)
    assert never.tokens == gen.vanilla(prompt, max_new_tokens=30).tokens and never.relaxed_tokens == 0
    assert relaxed.stats.relax_allowed > 0


SHELL = [(page.name, line) for page in PAGES for code in blocks(page, "bash") for line in code.splitlines()
         if line.strip() and not line.lstrip().startswith("#")]


def test_the_runnable_commands_are_the_short_ones():
    """Long or GPU commands are shown in plain `bash` blocks, not run; the runnable ones take seconds."""
    assert sorted(page for page, _ in SHELL) == ["evaluation.md", "reproducing-the-paper.md"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("page,command", SHELL, ids=[f"{page}: {line[:40]}" for page, line in SHELL])
def test_a_runnable_command_runs_as_written(page, command):
    done = subprocess.run(["bash", "-c", command], cwd=REPO_ROOT, capture_output=True, text=True, timeout=230)
    assert done.returncode == 0, f"{page}: {command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
