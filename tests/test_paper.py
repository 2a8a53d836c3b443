"""eval.paper: the paper's experiments as data, their Hydra sweeps, the checks before launching, and
the wrapper scripts in scripts/paper/. Nothing runs a model: every printed job is composed by Hydra
and validated as eval.run would, and the launch is intercepted."""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import threading
import time

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from eval import paper
from eval.config.methods import method_spec
from eval.config.paths import REPO_ROOT
from eval.config.schema import SAMPLINGS, TREES, validate
from eval.reporting import experiments, paper_jobs, zoo_sweep

CONFIGS = REPO_ROOT / "configs"
SCRIPTS = REPO_ROOT / "scripts" / "paper"
WRAPPERS = {"main_table.sh": "main", "main_table_t0.sh": "main_t0", "quality_table.sh": "quality",
            "theta_ablation.sh": "theta", "depth_ablation.sh": "depth", "temperature_sweep.sh": "temperature",
            "rule_zoo.sh": "zoo", "batch_sweep.sh": "batch"}
JOB_LINE = re.compile(r"^#\s{3,}\d+\s+(.*)$")  # "#      3  qwen3_8b  humaneval  mars@0.88  0.88  7  1  t02 (T=0.2)"
JOBS = {"main": 4 * 5, "main_t0": 4 * 5, "quality": 4 * 5, "theta": 8 * 2, "depth": 4, "temperature": 5 * 2,
        "zoo": 4 * 2 * 2, "batch": 2 * 2 * 2 * 4}


@pytest.fixture(scope="module", autouse=True)
def wrapper_without_gpu():
    """scripts/paper/theta_ablation.sh run for real on this GPU-less machine, in the background; a thread
    collects its output and the time it took (not the time until its test comes up)."""
    start = time.monotonic()
    process = subprocess.Popen(["bash", str(SCRIPTS / "theta_ablation.sh")], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    done: dict = {}

    def collect():
        done["stdout"], done["stderr"] = process.communicate()
        done["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=collect, daemon=True)
    thread.start()
    yield process, thread, done
    if process.poll() is None:  # its test was not selected
        process.kill()
    thread.join()


def dry_run(capsys, *argv: str) -> tuple[list[list[str]], list[list[str]], list[str], str]:
    """(multirun commands, job lines, report command, all output) printed by `eval.paper ... --dry-run`."""
    assert paper.main([*argv[:1], "--dry-run", *argv[1:]]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    runs = [shlex.split(line) for line in lines if line.startswith("python -m eval.run -m ")]
    jobs = [m.group(1).split() for m in map(JOB_LINE.match, lines) if m]
    report = next(shlex.split(line) for line in lines
                  if line.startswith(("python -m eval.report ", "python -m eval.zoo ")))
    return runs, jobs, report, text


def hydra_jobs(run: list[str]) -> list[list[str]]:
    """What Hydra's basic sweeper makes of a printed multirun command: one override list per job."""
    assert run[:4] == ["python", "-m", "eval.run", "-m"]
    return BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(run[4:]), None)[0]


def is_hydra(override: str) -> bool:
    return override.startswith(("hydra.", "hydra/"))


def test_experiments_name_known_configs():
    for exp in experiments.EXPERIMENTS.values():
        assert set(exp.models) <= set(experiments.model_names()) and exp.num_jobs() == JOBS[exp.name]
        assert all((CONFIGS / "bench" / f"{b}.yaml").exists() for b in exp.benches)


@pytest.mark.parametrize("name", list(experiments.EXPERIMENTS))
def test_dry_run_prints_jobs_that_compose_and_validate(name, capsys, tmp_path):
    exp = experiments.EXPERIMENTS[name]
    out = tmp_path / "out dir,x=y"  # a space, a comma and '=' must survive the shell and Hydra
    runs, jobs, report, text = dry_run(capsys, name, "--out", str(out))
    split = name == "zoo"  # ears (no greedy form) is a baseline at T=1 only: a multirun per temperature
    assert len(runs) == len(exp.models) * (2 if split else 1)
    assert f"# {JOBS[name]} jobs" in text and len(jobs) == JOBS[name]
    assert report == ["python", "-m", exp.report, *(str(out / m) for m in exp.models), "--out", str(out / "report")]
    expanded = [job for run in runs for job in hydra_jobs(run)]
    assert len(expanded) == JOBS[name]
    kind = method_spec(exp.method).kind
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        hydra_cfg = compose("config", overrides=expanded[0], return_hydra_config=True).hydra
        assert hydra_cfg.sweep.dir == str(out / "sweeps" / exp.models[0] / ("T0" if split else ""))
        seen = set()
        for overrides, printed in zip(expanded, jobs, strict=True):
            run = validate(compose("config", overrides=[o for o in overrides if not is_hydra(o)]))
            model, bench, method, value, depth, batch = printed[:6]
            assert (run.model.name, run.bench.name, run.method.name, run.method.kind) == (model, bench, method, kind)
            assert value == (f"{run.method.theta:g}" if exp.thetas else "-") and str(run.tree.depth) == depth
            assert (run.tree.total_tokens, run.tree.branching) == (49, 10)  # the paper preset's
            assert f"T={run.sampling.temperature:g}" in " ".join(printed[5:])
            assert run.out_dir == str(out / model / run.bench.name)
            assert (run.max_new_tokens, run.num_prompts, run.logging.group) == (1024, None, name)
            assert run.batch_size == int(batch)
            temperature = run.sampling.temperature
            assert run.baselines == (zoo_sweep.baselines(temperature) if split else ["generate", "vanilla", "strict"])
            seen.add((model, bench, value, depth, batch, temperature))
    assert len(seen) == JOBS[name]  # no job twice
    assert {m for m, *_ in seen} == set(exp.models) and {b for _, b, *_ in seen} == set(exp.benches)
    assert {float(t) for _, _, t, *_ in seen if t != "-"} == set(exp.thetas)
    assert {int(d) for *_, d, _, _ in seen} == set(exp.depths or [TREES[exp.tree].depth])
    assert {int(b) for *_, b, _ in seen} == set(exp.batches or [1])
    assert {t for *_, t in seen} == set(exp.temperatures or [SAMPLINGS[exp.sampling].temperature])


def test_the_experiments_are_the_papers(capsys):
    main, theta, depth = (experiments.EXPERIMENTS[n] for n in ("main", "theta", "depth"))
    assert main.benches == ("mt_bench", "humaneval", "gsm8k", "alpaca", "sum") and main.sampling == "t1"
    assert experiments.EXPERIMENTS["main_t0"].sampling == "t0" and main.thetas == (0.9,) and main.tree == "paper"
    assert [round(t, 2) for t in theta.thetas] == [0.84, 0.86, 0.88, 0.90, 0.92, 0.94, 0.96, 0.98]
    assert (theta.models, theta.benches, theta.sampling) == (("qwen3_8b",), ("humaneval", "wmt19"), "t02")
    assert (depth.models, depth.benches, depth.depths) == (("qwen3_32b",), ("gsm8k",), (6, 9, 12, 15))
    assert set(experiments.EXPERIMENTS["quality"].benches) == {"humaneval", "gsm8k", "wmt19", "sum", "mt_bench"}
    assert all(e.method == "mars" and e.baselines == ("generate", "vanilla", "strict") and e.report == "eval.report"
               for e in experiments.EXPERIMENTS.values() if e.name != "zoo")


def test_the_zoo_is_one_strict_job_per_temperature_with_every_rule_point_beside_it(capsys, tmp_path):
    exp = experiments.EXPERIMENTS["zoo"]
    assert (exp.method, exp.thetas, exp.temperatures, exp.report) == ("strict", (), (0.0, 1.0), "eval.zoo")
    runs, jobs, report, text = dry_run(capsys, "zoo", "--out", str(tmp_path), "--models", "llama31_8b")
    t0, t1 = (next(o for o in run if o.startswith("baselines=")) for run in runs)
    assert ("sampling.temperature=0" in runs[0]) and ("sampling.temperature=1" in runs[1])
    assert '"topm@2[alpha=0.3]"' in t0 and "ears@0.1" in t1 and "ears" not in t0
    assert [job[2:] for job in jobs] == [["strict", "-", "7", "1", "T=0"]] * 2 + [["strict", "-", "7", "1", "T=1"]] * 2
    assert f"# command 2/2 (llama31_8b, T=1; baselines {', '.join(zoo_sweep.baselines(1.0))}):" in text
    assert report == ["python", "-m", "eval.zoo", str(tmp_path / "llama31_8b"), "--out", str(tmp_path / "report")]


def test_an_experiment_names_methods_the_catalog_knows():
    with pytest.raises(ValueError, match="unknown method 'nosuchrule@1'"):
        experiments.Experiment("x", "-", ("qwen3_8b",), ("gsm8k",), baselines=("vanilla", "nosuchrule@1"))
    with pytest.raises(ValueError, match="strict has no main parameter"):
        experiments.Experiment("x", "-", ("qwen3_8b",), ("gsm8k",), method="strict", thetas=(0.9,))
    exp = experiments.Experiment("x", "-", ("qwen3_8b",), ("gsm8k",), method="typical[delta=0.2]", thetas=(0.05, 0.1))
    assert paper_jobs.method_overrides(exp) == ["method=typical", "method.delta=0.2", "method.epsilon=0.05,0.1"]


@pytest.mark.parametrize("launcher,target", [("gpus", "JoblibLauncher"), ("slurm", "SlurmLauncher")])
def test_launchers_and_extra_overrides_compose(launcher, target, capsys, tmp_path):
    runs, jobs, _, _ = dry_run(capsys, "theta", "--out", str(tmp_path), "--launcher", launcher, "--num-prompts", "3",
                               "--", "sampling=t1", "seed=3", "hydra.launcher.n_jobs=2" if launcher == "gpus"
                               else "hydra.launcher.partition=gpu")
    (run,) = runs
    assert "sampling=t1" in run and "sampling=t02" not in run  # an extra replaces the experiment's setting
    assert all("t1 (T=1)" in " ".join(job) for job in jobs)
    expanded = hydra_jobs(run)
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose("config", overrides=expanded[-1], return_hydra_config=True)
        assert cfg.hydra.launcher._target_.endswith(target)
        if launcher == "gpus":
            assert cfg.hydra.launcher.n_jobs == 2
        else:
            assert cfg.hydra.launcher.partition == "gpu"
        job = validate(compose("config", overrides=[o for o in expanded[-1] if not is_hydra(o)]))
    assert (job.num_prompts, job.seed, job.sampling.temperature, job.method.theta) == (3, 3, 1.0, 0.98)


def test_model_paths_from_options_env_and_models_dir(capsys, tmp_path, monkeypatch):
    target, draft = tmp_path / "my target", tmp_path / "draft"
    runs, *_ = dry_run(capsys, "theta", "--out", str(tmp_path), "--target", str(target), "--draft", "Org/some-draft")
    overrides = hydra_jobs(runs[0])[0]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        run = validate(compose("config", overrides=[o for o in overrides if not is_hydra(o)]))
    assert (run.model.target, run.model.draft) == (str(target), "Org/some-draft")

    monkeypatch.setenv("MARS_DRAFT_QWEN3_32B", str(draft))
    monkeypatch.setenv("MARS_MODELS_DIR", str(tmp_path / "models"))
    (tmp_path / "models" / "Qwen" / "Qwen3-32B").mkdir(parents=True)
    assert experiments.model_path("qwen3_32b", "target") == str(tmp_path / "models" / "Qwen" / "Qwen3-32B")
    assert experiments.model_path("qwen3_32b", "draft") == str(draft)  # the env var, though it does not exist (yet)
    assert experiments.model_path("qwen3_8b", "target") == "Qwen/Qwen3-8B"  # not under MARS_MODELS_DIR: the hub id
    runs, *_ = dry_run(capsys, "depth", "--out", str(tmp_path))
    assert f'model.target="{tmp_path}/models/Qwen/Qwen3-32B"' in runs[0] and f'model.draft="{draft}"' in runs[0]


def test_bad_arguments_exit_2(capsys):
    for argv in (["main", "--target", "/x"],  # several models, one path
                 ["theta", "--models", "nosuchmodel"],
                 ["theta", "--", "bench=gsm8k"],  # the experiment's benchmarks are not an override
                 ["nosuchexperiment"]):
        with pytest.raises(SystemExit) as e:
            paper.main(argv)
        assert e.value.code == 2
    assert "--target/--draft name one model's paths" in capsys.readouterr().err


def test_model_path_check_names_the_path(tmp_path, monkeypatch):
    missing = tmp_path / "no" / "such" / "model"
    assert str(missing) in experiments.model_path_problem(str(missing))
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text("{}")
    assert experiments.model_path_problem(str(tmp_path / "tiny")) is None
    assert "is a file" in experiments.model_path_problem(str(tmp_path / "tiny" / "config.json"))
    # a hub id counts only when the local Hugging Face cache has it
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hub"))
    problem = experiments.model_path_problem("mars-spec-test/tiny-model")
    assert "mars-spec-test/tiny-model" in problem and "Hugging Face cache" in problem
    repo = tmp_path / "hub" / "models--mars-spec-test--tiny-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (repo / "snapshots" / ("0" * 40) / "config.json").write_text("{}")
    assert experiments.model_path_problem("mars-spec-test/tiny-model") is None


@pytest.mark.parametrize("name", list(experiments.EXPERIMENTS))
def test_without_a_gpu_every_experiment_stops_with_one_line(name, capsys):
    assert paper.main([name]) == 2  # this machine has no GPU; nothing is printed but the reason
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    zoo_like = experiments.EXPERIMENTS[name].report == "eval.zoo"
    cpu_script = "rule_zoo_embedded.sh" if zoo_like else "reproduce_embedded.sh"
    assert "no CUDA GPU" in err and f"scripts/{cpu_script}" in err  # the embedded pair's version of it


def test_missing_models_and_benchmark_files_are_named(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(paper_jobs, "cuda_available", lambda: True)
    (tmp_path / "draft").mkdir()
    argv = ["theta", "--out", str(tmp_path / "out"), "--target", str(tmp_path / "nope"),
            "--draft", str(tmp_path / "draft")]
    assert paper.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nope'} does not exist" in err and "qwen3_8b target" in err and "qwen3_8b draft" not in err
    assert len(err.strip().splitlines()) == 1
    monkeypatch.setenv("MARS_BENCH_DIR", str(tmp_path / "bench"))
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "wmt19.jsonl").write_text("")
    assert paper.main(["theta", "--target", str(tmp_path / "draft"), "--draft", str(tmp_path / "draft")]) == 2
    err = capsys.readouterr().err
    assert "humaneval.jsonl" in err and "HumanEval.jsonl.gz" in err and "wmt19.jsonl" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_run_launches_the_printed_sweeps_then_the_report(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(paper_jobs, "cuda_available", lambda: True)
    (tmp_path / "m").mkdir()
    out = tmp_path / "out"
    calls = []

    def fake_run(argv, cwd=None):
        calls.append((argv, cwd))
        if argv[2] == "eval.run":
            (out / "qwen3_32b" / "gsm8k").mkdir(parents=True, exist_ok=True)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(paper.subprocess, "run", fake_run)
    argv = ["depth", "--out", str(out), "--target", str(tmp_path / "m"), "--draft", str(tmp_path / "m")]
    assert paper.main(argv) == 0
    text = capsys.readouterr().out
    printed = [shlex.split(line) for line in text.splitlines() if line.startswith("python -m eval.")]
    assert [argv[1:] for argv, _ in calls] == [p[1:] for p in printed]  # exactly what --dry-run prints
    assert all(cwd == REPO_ROOT for _, cwd in calls) and calls[-1][0][2] == "eval.report"
    assert str(out / "report" / "report.md") in text

    calls.clear()
    monkeypatch.setattr(paper.subprocess, "run", lambda argv, cwd=None: subprocess.CompletedProcess(argv, 3))
    assert paper.main(argv) == 3 and "rerunning resumes" in capsys.readouterr().err


def test_each_wrapper_execs_eval_paper_from_the_repository_root(tmp_path):
    """Every script in scripts/paper runs `python -m eval.paper <experiment> "$@"` from the repository root
    (a stand-in `python` first on PATH records how it was called)."""
    assert sorted(p.name for p in SCRIPTS.glob("*.sh")) == sorted(WRAPPERS)
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$PWD" "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    for script, name in WRAPPERS.items():
        path = SCRIPTS / script
        text = path.read_text()
        assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text and os.access(path, os.X_OK)
        header = [line for line in text.splitlines() if line.startswith("#")]
        assert any("Reproduces" in line for line in header) and any("GPUs:" in line for line in header)
        assert any(f"scripts/paper/{script}" in line for line in header)  # an example invocation
        done = subprocess.run(["bash", str(path), "--dry-run", "--", "out_dir=a b"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [str(REPO_ROOT), "-m", "eval.paper", name, "--dry-run", "--",
                                            "out_dir=a b"]


def test_a_wrapper_without_a_gpu_exits_2_with_one_line(wrapper_without_gpu):
    """One wrapper for real, started when this module's tests start so that it runs beside them (each
    costs ~8 CPU-seconds: `python -m eval.<module>` imports eval/__init__, which imports the engine,
    torch and transformers); every experiment's own stop is tested in-process above."""
    process, thread, done = wrapper_without_gpu
    thread.join(timeout=120)
    assert process.returncode == 2 and done["stdout"] == ""
    (line,) = done["stderr"].strip().splitlines()
    assert "no CUDA GPU" in line and "eval.paper theta" in line and "scripts/reproduce_embedded.sh" in line
    assert done["seconds"] < 60
