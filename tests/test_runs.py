"""Runs never lose or mix work: run directories named by their settings, baselines shared by the
jobs of a sweep, finished jobs skipped, shards that merge to the unsharded run, parallel jobs,
resume after SIGKILL, context budgets, errors before any model loads. On a tiny stand-in pair
built from configs."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import save_standin_pair
from hydra import compose, initialize_config_dir

from eval.benchmarks.prompting import PromptFormat
from eval.config.paths import REPO_ROOT
from eval.config.schema import validate
from eval.reporting.summaries import batched_name, load_runs, merge_runs
from eval.rundirs.layout import AnswerFile, read_answers
from eval.runner.directories import job_methods, run_directory
from eval.runner.job import run
from eval.runner.job_settings import resolve_settings
from eval.runner.models import check_offload, claim_gpus, load_head
from mars.decoding.settings import TreeShape
from mars.tuning.candidates import CANDIDATES

pytestmark = pytest.mark.usefixtures("single_thread")
# float32 on a CPU: model.generate is also timed in bf16, and on a CPU with more than AVX2 in bf16 under the
# AVX2 limits, in a worker process (eval.runner.directories.job_methods)
LIMITED = ["generate@bfloat16+avx2"] if torch.backends.cpu.get_cpu_capability() != "AVX2" else []
PLAIN_METHODS = ["generate", "generate@bfloat16", *LIMITED, "vanilla"]
METHODS = [*PLAIN_METHODS, "strict", "mars@0.9"]
# Where the plain baselines are not what a test is about (sharding, resuming, launchers), vanilla and strict alone:
# model.generate's runs, one of them in a worker process of its own, cost the suite seconds each and test nothing new
FEW = "baselines=[vanilla,strict]"
FEW_METHODS = ["vanilla", "strict", "mars@0.9"]


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    return save_standin_pair(tmp_path_factory.mktemp("standin"))


def overrides(standin: Path, out: Path, *more: str) -> list[str]:
    """The tests' settings; `more` adds to or replaces them (a fixed tree unless a test asks for another:
    the embedded default, tree=calibrated, times candidates)."""
    base = [f"model.target={standin / 'target'}", f"model.draft={standin / 'draft'}", "model.dtype=float32",
            "model.exact_attention=false", "num_prompts=2", "max_new_tokens=8", "threads=1", "warmup=false",
            f"out_dir={out}", "tree=cpu", "model.sampling_draft=null"]  # the embedded sampling head fits no stand-in
    given = {m.split("=", 1)[0] for m in more}
    return [b for b in base if b.split("=", 1)[0] not in given] + list(more)


def config(standin: Path, out: Path, *more: str):
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        return compose("config", overrides=overrides(standin, out, *more))


def directories(cfg) -> dict[str, Path]:
    """Each method's run directory for a composed job config."""
    config = validate(cfg)
    resolved = resolve_settings(config, PromptFormat.of(config.model.prompt))
    return {m.name: run_directory(config, m, resolved) for m in job_methods(config, resolved)}


def answers(directory: Path, method: str) -> list[dict]:
    return read_answers(directory / "answers" / f"{method}.jsonl")


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_each_method_lives_in_a_directory_named_by_its_settings_and_resumes_there(standin, tmp_path, capsys):
    out = tmp_path / "out"
    cfg = config(standin, out)
    summary = run(cfg)
    dirs = directories(cfg)
    assert list(dirs) == METHODS and all(d.parent == out for d in dirs.values())
    assert dirs["mars@0.9"].name.startswith("mars@0.9-T0-") and dirs["vanilla"].name.startswith("vanilla-T0-")
    job = dirs["mars@0.9"]  # the job's own method holds its summary and resolved config
    assert json.loads((job / "summary.json").read_text()) == json.loads(json.dumps(summary))
    assert (job / "config.yaml").exists() and "theta: 0.9" in (job / "config.yaml").read_text()
    methods = summary["methods"]
    assert list(methods) == METHODS
    assert all(methods[m]["run_dir"] == str(dirs[m]) for m in METHODS)
    # transformers' own greedy decoding and ours emit the same tokens (fp32); speedups against both.
    assert methods["generate"]["identical_to_vanilla"] == 1.0 and methods["strict"]["identical_to_vanilla"] == 1.0
    assert methods["strict"]["speedup_vs_generate"] > 0 and methods["strict"]["speedup"] > 0
    # against the fastest plain decoding timed: model.generate in either precision or vanilla
    fastest = max(methods[m]["tokens_per_s"] for m in PLAIN_METHODS)
    assert methods["strict"]["fastest_plain"] in PLAIN_METHODS
    assert methods["strict"]["speedup_vs_fastest"] == pytest.approx(methods["strict"]["tokens_per_s"] / fastest)
    assert json.loads((dirs["generate@bfloat16"] / "identity.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((dirs["generate"] / "identity.json").read_text())["dtype"] == "float32"
    assert summary["settings"]["dtype"] == "float32" and summary["settings"]["exact_attention"] is False
    assert summary["settings"]["prepack"] is True and "auto" in summary["settings"]["prepack_reason"]
    assert methods["mars@0.9"]["margin_histogram"]["theta"] == 0.9
    assert sum(methods["strict"]["margin_histogram"]["counts"]) > 0
    assert summary["quality_metric"] == "parse_rate" and "quality" in methods["strict"]
    assert "run:" in capsys.readouterr().out
    first = {m: answers(dirs[m], m) for m in METHODS}
    assert all([r["question_id"] for r in recs] == [0, 1] for recs in first.values())

    # A rerun of a finished job loads no model and writes nothing.
    before = {m: snapshot(d) for m, d in dirs.items()}
    run(config(standin, out))
    assert "done already" in capsys.readouterr().out
    assert {m: snapshot(d) for m, d in dirs.items()} == before

    # The same settings with more questions: the same directories, the finished answers kept as they were.
    again = run(config(standin, out, "num_prompts=3"))
    assert directories(config(standin, out, "num_prompts=3")) == dirs
    for m in METHODS:
        resumed = answers(dirs[m], m)
        assert [r["answer_id"] for r in resumed[:2]] == [r["answer_id"] for r in first[m]]
        assert [r["question_id"] for r in resumed] == [0, 1, 2]
    assert again["methods"]["vanilla"]["questions"] == 3

    # Another setting: other directories; the first ones are not touched.
    before = {m: snapshot(d) for m, d in dirs.items()}
    run(config(standin, out, "max_new_tokens=4"))
    assert set(directories(config(standin, out, "max_new_tokens=4")).values()).isdisjoint(dirs.values())
    with pytest.raises(ValueError, match="resume=false"):
        run(config(standin, out, "resume=false"))
    assert {m: snapshot(d) for m, d in dirs.items()} == before


def test_max_turns_answers_the_first_turns_in_directories_of_their_own(standin, tmp_path):
    """bench.max_turns=1 (MT-bench's first turns) answers one turn of a two-turn question, in run directories
    other than the full run's, so neither is resumed as the other; 0 turns is refused."""
    questions = tmp_path / "two_turns.jsonl"
    questions.write_text("".join(json.dumps({"question_id": i, "turns": [f"def f{i}(x):", "Again, shorter."]}) + "\n"
                                 for i in range(2)))
    out, few = tmp_path / "out", ("method=strict", "baselines=[vanilla]", f"bench.questions={questions}")
    every, first = config(standin, out, *few), config(standin, out, *few, "bench.max_turns=1")
    for cfg, turns in ((every, 2), (first, 1)):
        run(cfg)
        for method in ("strict", "vanilla"):
            assert [len(r["choices"][0]["turns"]) for r in answers(directories(cfg)[method], method)] == [turns] * 2
    assert set(directories(every).values()).isdisjoint(directories(first).values())
    with pytest.raises(ValueError, match="bench.max_turns"):
        validate(config(standin, out, "bench.max_turns=0"))


def test_a_theta_sweep_times_the_baselines_once_and_skips_finished_jobs(standin, tmp_path, capsys):
    out = tmp_path / "out"
    first = run(config(standin, out, "method.theta=0.8"))
    dirs = directories(config(standin, out, "method.theta=0.8"))
    baselines = {m: snapshot(dirs[m]) for m in (*PLAIN_METHODS, "strict")}
    second = run(config(standin, out, "method.theta=0.95"))
    assert second["job"]["answered"] == ["mars@0.95"]  # the baselines were already answered
    assert {m: snapshot(dirs[m]) for m in baselines} == baselines
    assert second["methods"]["vanilla"] == {**first["methods"]["vanilla"]}
    assert second["methods"]["mars@0.95"]["speedup"] > 0 and "quality" in second["methods"]["mars@0.95"]
    # A method under test that is also a baseline shares its directory.
    strict = run(config(standin, out, "method=strict"))
    assert strict["job"]["answered"] == [] and strict["methods"]["strict"]["run_dir"] == str(dirs["strict"])
    # The report counts each shared baseline once and shows both thresholds.
    entries = merge_runs(load_runs([out]))
    assert sorted(e.method for e in entries) == sorted([*PLAIN_METHODS, "strict", "mars@0.8", "mars@0.95"])


def test_calibrated_tree_is_timed_once_per_machine_and_names_the_run_directory(standin, tmp_path, monkeypatch):
    monkeypatch.setenv("MARS_CACHE_DIR", str(tmp_path / "cache"))
    prompts = tmp_path / "calibration.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "prompt": f"def f{i}(x):\n    "}) + "\n"
                               for i in range(4)))  # calibration's least is 3 (mars.tuning.search.PROFILE_UNITS + 1)
    more = ("tree=calibrated", f"tree.calibration_prompts={prompts}", "method=strict", "baselines=[vanilla]")
    first = run(config(standin, tmp_path / "out", *more))
    record = first["settings"]["calibration"]
    assert not record["cached"] and record["cache"].startswith(str(tmp_path / "cache"))
    chosen = first["settings"]["tree"]
    assert chosen == record["tree"] and first["settings"]["tree_reason"].startswith("measured")
    assert TreeShape(**record["tree"]) in CANDIDATES and record["reference"]["tokens_per_s"] > 0
    # the directory is named by the tree chosen: the same as a run that asks for that tree explicitly, unless
    # no tree beat plain decoding in calibration (speculation off: plain decoding's answers, named so)
    explicit = [f"tree.{k}={v}" for k, v in record["tree"].items()]
    forced = str(directories(config(standin, tmp_path / "out", *more[1:], *explicit))["strict"])
    speculates = first["settings"]["speculation"]["strict"]["speculate"]
    assert (first["methods"]["strict"]["run_dir"] == forced) is speculates
    assert first["methods"]["strict"]["speculation"] == ("on" if speculates else "off")
    # the second run reads the calibration from the cache (and finds its answers done)
    again = run(config(standin, tmp_path / "out", *more, "num_prompts=3"))
    assert again["settings"]["calibration"]["cached"] and again["settings"]["tree"] == chosen


def test_shards_answer_exactly_what_the_unsharded_run_does(standin, tmp_path):
    whole = run(config(standin, tmp_path / "whole", "num_prompts=5", "sampling=t1", FEW))
    for i in range(2):
        run(config(standin, tmp_path / "shards", "num_prompts=5", "sampling=t1", FEW, f"shard={i}/2"))
    unsharded = directories(config(standin, tmp_path / "whole", "num_prompts=5", "sampling=t1", FEW))
    for m in FEW_METHODS:
        merged = [r for i in range(2) for r in answers(directories(config(
            standin, tmp_path / "shards", "num_prompts=5", "sampling=t1", FEW, f"shard={i}/2"))[m], m)]
        assert sorted(r["question_id"] for r in merged) == list(range(5))
        tokens = {r["question_id"]: r["eval"]["token_ids"] for r in merged}
        assert tokens == {r["question_id"]: r["eval"]["token_ids"] for r in answers(unsharded[m], m)}, m
    entries = {e.method: e for e in merge_runs(load_runs([tmp_path / "shards"]))}
    for m in FEW_METHODS:
        ref = whole["methods"][m]
        fig = entries[batched_name(m, ref)].fig  # "strict (sampled drafts)" where the run's tree sampled
        assert fig["questions"] == ref["questions"] == 5 and fig["tokens"] == ref["tokens"]
        assert fig["tau"] == pytest.approx(ref["tau"])


def test_two_jobs_of_a_sweep_run_in_parallel_with_the_joblib_launcher(standin, tmp_path):
    out = tmp_path / "out"
    # long enough jobs (48 tokens) that both are still running once the slower worker has imported torch
    args = [*overrides(standin, out, "num_prompts=3", "max_new_tokens=48", FEW), "method.theta=0.8,0.95",
            "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    # A lock folder of their own: whether the two jobs time each other's work, not whether the machine is idle.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MARS_LOCK_DIR": str(tmp_path / "locks")}
    done = subprocess.run([sys.executable, "-m", "eval.run", "-m", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = [json.loads(p.read_text())["job"] for p in sorted(out.glob("mars@*/summary.json"))]
    assert len(jobs) == 2 and jobs[0]["pid"] != jobs[1]["pid"] and os.getpid() not in {j["pid"] for j in jobs}
    assert max(j["started"] for j in jobs) < min(j["finished"] for j in jobs)  # they overlapped in time
    # Both needed the baselines; one answered them while the other waited: one answer per question.
    for m in ("vanilla", "strict"):
        (directory,) = out.glob(f"{glob.escape(m)}-T0-*")
        assert sorted(r["question_id"] for r in answers(directory, m)) == [0, 1, 2]
    assert sorted(sum((j["answered"] for j in jobs), [])) == ["mars@0.8", "mars@0.95", "strict", "vanilla"]
    # Timed one job at a time (eval.runner.locks): every answer held the timing lock, none contended.
    for summary in (json.loads(p.read_text()) for p in out.glob("mars@*/summary.json")):
        for name, fig in summary["methods"].items():
            assert fig["timed_exclusive"] and fig["unchecked_questions"] == 0 and not fig["speed_contended"], name


def loky_leftovers(pid: int) -> list[str]:
    """The semaphores and memmapping folders of the joblib pool started by process `pid`."""
    import tempfile

    return sorted({*glob.glob(f"/dev/shm/sem.loky-{pid}-*"), *glob.glob(f"/dev/shm/joblib_memmapping_folder_{pid}_*"),
                   *glob.glob(f"{tempfile.gettempdir()}/joblib_memmapping_folder_{pid}_*")})


def test_a_sweep_killed_outright_leaves_no_job_semaphore_or_folder_behind(standin, tmp_path):
    locks = tmp_path / "locks"  # the jobs register here once they are answering (eval.runner.locks)
    args = [*overrides(standin, tmp_path / "out", "num_prompts=3", "max_new_tokens=400", FEW), "method.theta=0.8,0.95",
            "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MARS_LOCK_DIR": str(locks)}
    sweep = subprocess.Popen([sys.executable, "-m", "eval.run", "-m", *args], cwd=REPO_ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while len([f for f in locks.glob("jobs/*.json") if "ended" not in f.read_text()]) < 2:
            assert sweep.poll() is None and time.monotonic() < deadline, "the jobs never started answering"
            time.sleep(0.2)
        assert loky_leftovers(sweep.pid)  # the pool's semaphores exist while it runs
        sweep.kill()  # SIGKILL: the sweep cannot tell its workers
        sweep.wait()
        deadline = time.monotonic() + 30
        while subprocess.run(["pgrep", "-g", str(sweep.pid)], capture_output=True).stdout:
            assert time.monotonic() < deadline, "the sweep's workers outlived it"
            time.sleep(0.2)
        assert not loky_leftovers(sweep.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sweep.pid, signal.SIGKILL)


def test_bad_settings_fail_before_any_model_loads(standin, tmp_path):
    missing = f"model.target={tmp_path / 'missing'}"  # would fail only when loading
    with pytest.raises(ValueError, match="bad method 'mars@x'"):
        run(config(standin, tmp_path, missing, "baselines=[vanilla,mars@x]"))
    with pytest.raises(ValueError, match="theta=1.5"):
        run(config(standin, tmp_path, missing, "method.theta=1.5"))
    with pytest.raises(ValueError, match="max_new_tokens"):
        run(config(standin, tmp_path, missing, "max_new_tokens=0"))
    with pytest.raises(FileNotFoundError, match="no_such_set"):
        run(config(standin, tmp_path, missing, "bench.questions=no_such_set"))
    assert not list(tmp_path.iterdir())  # nothing created
    with pytest.raises(FileNotFoundError, match="target model not found"):
        run(config(standin, tmp_path, missing))


def test_a_sampling_head_drafts_when_sampling_and_names_the_directories_it_drafts_for(standin, tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    import eval.runner.job as job

    sampling = tmp_path / "draft_sampling"  # another head: the stand-in's, its weights perturbed
    sampling.mkdir()
    for f in (standin / "draft").iterdir():
        (sampling / f.name).write_bytes(f.read_bytes())
    state = load_file(str(sampling / "model.safetensors"))
    state = {k: v * 1.01 if v.is_floating_point() else v for k, v in state.items()}
    save_file(state, str(sampling / "model.safetensors"))
    loaded = []
    monkeypatch.setattr(job, "load_head", lambda head, target: loaded.append(head.value) or load_head(head, target))
    out = tmp_path / "out"
    more = ("baselines=[vanilla]", "num_prompts=1", "max_new_tokens=4", f"model.sampling_draft={sampling}")

    greedy = run(config(standin, out, *more))
    hot = run(config(standin, out, *more, "sampling=t1"))
    assert loaded == [str(standin / "draft"), str(sampling)]  # the head each job decoded with
    assert greedy["settings"]["draft"] == str(standin / "draft") and "greedy" in greedy["settings"]["draft_reason"]
    assert hot["settings"]["draft"] == str(sampling) and "temperature > 0" in hot["settings"]["draft_reason"]
    identity = json.loads((Path(hot["methods"]["mars@0.9"]["run_dir"]) / "identity.json").read_text())
    assert identity["draft"] == str(sampling)
    # without model.sampling_draft the T = 1 run drafts with model.draft, in a directory of its own
    plain_hot = run(config(standin, out, *more[:-1], "sampling=t1"))
    assert plain_hot["settings"]["draft"] == str(standin / "draft")
    assert plain_hot["methods"]["mars@0.9"]["run_dir"] != hot["methods"]["mars@0.9"]["run_dir"]
    with pytest.raises(FileNotFoundError, match="sampling draft model"):
        run(config(standin, out, *more[:-1], f"model.sampling_draft={tmp_path / 'missing'}"))
    # another target's sampling head (the embedded one): refused, naming the setting and the fix
    with pytest.raises(ValueError, match="model.sampling_draft to this target's sampling head, or to null"):
        run(config(standin, out, *more[:-1], "model.sampling_draft=data/models/draft_sampling", "sampling=t1"))


def test_long_prompts_get_the_budget_that_fits_or_are_skipped_with_the_reason(standin, tmp_path):
    questions = tmp_path / "long.jsonl"
    # The stand-in's context is 2048 tokens; its tokenizer spends about one token per character here.
    fits = "x = 1\n" * 40
    tight = "y" * 2045
    too_long = "z" * 3000
    questions.write_text("".join(json.dumps({"question_id": i, "prompt": p}) + "\n"
                                 for i, p in enumerate([fits, tight, too_long])))
    cfg = config(standin, tmp_path / "out", f"bench.questions={questions}", "bench.name=long", "num_prompts=null",
                 "method=strict", "baselines=[vanilla]", "max_new_tokens=16")
    summary = run(cfg)
    for method, directory in directories(cfg).items():
        answers = {r["question_id"]: r for r in read_answers(directory / "answers" / f"{method}.jsonl")}
        assert answers[0]["eval"]["max_new_tokens"] == [16]
        budget = answers[1]["eval"]["max_new_tokens"][0]
        assert 0 < budget < 16 and answers[1]["choices"][0]["new_tokens"][0] <= budget
        skipped = read_answers(directory / "skipped" / f"{method}.jsonl")
        assert [s["question_id"] for s in skipped] == [2] and "fills the context" in skipped[0]["reason"]
    assert summary["methods"]["strict"]["questions"] == 2


def test_a_malformed_answer_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "answers.jsonl"
    path.write_text('{"question_id": 0}\nnot json\n{"question_id": 2}\n')
    with pytest.raises(ValueError, match=r"answers.jsonl:2: malformed JSON"):
        read_answers(path)
    path.write_text('{"question_id": 0}\n{"question_id": 1, "tor')  # torn by a kill: dropped atomically
    answers = AnswerFile(path)
    assert list(answers.records) == [0] and path.read_text() == '{"question_id": 0}\n'


def test_runs_killed_at_random_moments_resume_to_one_answer_per_question(standin, tmp_path):
    out = tmp_path / "out"
    args = overrides(standin, out, "num_prompts=6", "max_new_tokens=12", FEW)
    dirs = directories(config(standin, out, "num_prompts=6", "max_new_tokens=12", FEW))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rng = random.Random(0)
    kills = 0
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-m", "eval.run", *args], cwd=REPO_ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Kill once answering has started (some answer lines exist) plus a random moment, or at a random time.
        start, wait = time.time(), rng.uniform(0.0, 1.5)
        while proc.poll() is None and time.time() - start < 60:
            lines = sum(len(read_answers(p)) for p in out.glob("*/answers/*.jsonl"))
            if lines >= 1 + kills * 3:
                time.sleep(wait)
                break
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills >= 2  # the test killed runs mid-way, not only after they had finished
    subprocess.run([sys.executable, "-m", "eval.run", *args], cwd=REPO_ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for m in FEW_METHODS:
        ids = [r["question_id"] for r in answers(dirs[m], m)]
        assert sorted(ids) == list(range(6)), (m, ids)  # exactly one answer per question
    assert json.loads((dirs["mars@0.9"] / "summary.json").read_text())["methods"]["strict"]["questions"] == 6


def test_jobs_on_one_node_claim_distinct_gpus_by_lock_file(tmp_path):
    first, held = claim_gpus(2, total=3, lock_dir=tmp_path)
    assert first == [0, 1]
    with pytest.raises(RuntimeError, match="only 1 of this node's 3 GPUs are free"):
        claim_gpus(2, total=3, lock_dir=tmp_path)
    second, other = claim_gpus(1, total=3, lock_dir=tmp_path)
    assert second == [2]
    for handle in held + other:
        handle.close()  # a finished job frees its GPUs
    again, handles = claim_gpus(3, total=3, lock_dir=tmp_path)
    assert again == [0, 1, 2]
    for handle in handles:
        handle.close()


def test_sharding_refuses_offload_unless_asked(standin, tmp_path):
    class Sharded:
        hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 1, "model.layers.1": "cpu", "lm_head": "disk"}

    with pytest.raises(RuntimeError, match="placed layers on cpu, disk.*allow_offload=true"):
        check_offload(Sharded(), allow=False)
    check_offload(Sharded(), allow=True)
    Sharded.hf_device_map = {"model": 0, "lm_head": 1}
    check_offload(Sharded(), allow=False)
    # device_map needs GPUs; without one the job stops before loading, naming the fix.
    with pytest.raises(RuntimeError, match="none is visible"):
        run(config(standin, tmp_path, "model.device_map=auto", "model.max_memory={0: 70GiB}"))
    assert not torch.cuda.is_available()


def test_the_submitit_launcher_runs_jobs_with_its_local_executor(standin, tmp_path):
    out = tmp_path / "out"
    args = [*overrides(standin, out, "num_prompts=1", "max_new_tokens=4", FEW), "method.theta=0.8,0.95",
            "hydra/launcher=submitit_local", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    done = subprocess.run([sys.executable, "-m", "eval.run", "-m", *args], cwd=REPO_ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = [json.loads(p.read_text())["job"] for p in sorted(out.glob("mars@*/summary.json"))]
    assert len(jobs) == 2 and os.getpid() not in {j["pid"] for j in jobs}
    assert len(list((tmp_path / "sweep" / ".submitit").glob("*/*_log.out"))) == 2


def test_static_shapes_run_through_eval_run_in_their_own_directories(standin, tmp_path):
    """model.static reaches the generator; it names the run directory only when on (so the default's
    directories keep their names), and strict greedy still equals vanilla."""
    out = tmp_path / "out"
    plain_dirs = directories(config(standin, out, "baselines=[vanilla]", "method=strict"))
    cfg = config(standin, out, "baselines=[vanilla]", "method=strict", "model.static=true", "model.max_cache_len=256")
    summary = run(cfg)
    static_dirs = directories(cfg)
    assert summary["settings"]["static"] is True and summary["settings"]["max_cache_len"] == 256
    assert summary["methods"]["strict"]["identical_to_vanilla"] == 1.0
    assert static_dirs["strict"] != plain_dirs["strict"] and static_dirs["vanilla"] != plain_dirs["vanilla"]
    assert json.loads((static_dirs["strict"] / "identity.json").read_text())["static"] is True


def test_a_generate_worker_decodes_under_the_avx2_limits_as_model_generate_does(standin, tmp_path):
    """`generate@<dtype>+avx2` answers from a process whose torch runs at AVX2 (the worker checks it):
    float32 greedy decoding of the stand-in gives model.generate's tokens in this process."""
    from transformers import AutoModelForCausalLM

    from eval.runner.plain import GenerateWorker, hf_generate
    from mars import SamplingConfig

    cfg = validate(config(standin, tmp_path))
    model = AutoModelForCausalLM.from_pretrained(standin / "target", dtype=torch.float32).eval()
    greedy = SamplingConfig()
    with GenerateWorker(cfg, "float32", "avx2") as worker:
        for ids in ([1, 5, 9, 2], [3, 3, 7]):
            far = worker.answer(ids, greedy, 12, [], seed=0)
            near = hf_generate(model, ids, greedy, 12, [], seed=0)
            assert far.tokens == near.tokens and len(far.tokens) == 12 and far.seconds > 0
    assert worker.process.returncode == 0  # closed with the block


def test_the_avx2_baseline_joins_only_where_the_cpu_has_more_than_avx2(standin, tmp_path, monkeypatch):
    from eval.config.methods import method_spec

    assert method_spec("generate@bfloat16+avx2").name == "generate@bfloat16+avx2"
    with pytest.raises(ValueError, match="unknown instruction-set limit"):
        method_spec("generate@bfloat16+sse2")
    cfg = config(standin, tmp_path)
    for capability, joins in (("AVX2", False), ("AVX512", True)):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        assert ("generate@bfloat16+avx2" in directories(cfg)) is joins


def test_a_batched_run_answers_as_one_at_a_time_does_in_directories_of_its_own(standin, tmp_path):
    """batch_size=4: every method answers four questions at once (model.generate left-padded, vanilla and generate
    of a list), greedy answers equal the batch-1 run's for our own decoding, the directories are the
    batched run's own, and the summary gives throughput (wall_time: each answer's share of its batch),
    per-request latency and the batch size; a rerun resumes with nothing left to answer."""
    base = ["num_prompts=6", "max_new_tokens=12"]
    one = run(config(standin, tmp_path / "one", *base, FEW))  # our decoding one at a time, to compare with
    cfg = config(standin, tmp_path / "batched", *base, "batch_size=4")
    batched = run(cfg)
    dirs, one_dirs = directories(cfg), directories(config(standin, tmp_path / "one", *base, FEW))
    assert batched["settings"]["batch_size"] == 4 and one["settings"]["batch_size"] == 1
    assert all(json.loads((d / "identity.json").read_text())["batch_size"] == 4 for d in dirs.values())
    for m in ("vanilla", "strict"):
        tokens = {r["question_id"]: r["eval"]["token_ids"] for r in answers(dirs[m], m)}
        assert tokens == {r["question_id"]: r["eval"]["token_ids"] for r in answers(one_dirs[m], m)}, m
        records = answers(dirs[m], m)
        assert [r["eval"]["batch_size"] for r in records] == [4] * 4 + [2] * 2  # the last group has two
        first = [r for r in records if r["question_id"] < 4]  # the first batch: shares add up to its wall time
        assert sum(r["choices"][0]["wall_time"][0] for r in first) == pytest.approx(
            max(r["eval"]["latency"][0] for r in first), rel=1e-3)
    for m in METHODS:
        fig = batched["methods"][m]
        assert fig["batch_size"] == 4 and fig["questions"] == 6 and fig["latency_p90"] >= fig["latency_mean"] > 0
    assert batched["methods"]["strict"]["identical_to_vanilla"] == 1.0
    assert json.loads(json.dumps(run(cfg)["methods"]["strict"]))["questions"] == 6  # resumed: all answered
    entries = {e.method for e in merge_runs(load_runs([tmp_path / "batched"]))}
    assert {"strict[B=4]", "vanilla[B=4]"} <= entries


def test_batched_runs_refuse_what_batched_decoding_does_not_do(standin, tmp_path):
    for more, message in ((["batch_size=0"], "batch_size"), (["batch_size=2", "tree=adaptive"], "tree.adaptive"),
                          (["batch_size=2", "model.static=true"], "model.static")):
        with pytest.raises(ValueError, match=message):
            validate(config(standin, tmp_path, *more))
