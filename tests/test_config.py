"""The Hydra structured configs: every option of every group composes into a valid job config, and
bad values fail when the config is composed (types, unknown options and keys) or validated (ranges)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException

from eval.config.methods import PLAIN, RuleMethod, method_spec
from eval.config.paths import REPO_ROOT
from eval.config.schema import PROMPTS, SAMPLINGS, TREES, RunConfig, WandbMode, parse_shard, validate
from mars.rules import BUILT_IN, RULES

CONFIGS = REPO_ROOT / "configs"
GROUPS = {
    "model": sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml")),
    "bench": sorted(p.stem for p in (CONFIGS / "bench").glob("*.yaml")),
    "method": [*PLAIN, *BUILT_IN],  # every rule the package registers: a new one composes here untouched
    "tree": sorted(TREES),
    "sampling": sorted(SAMPLINGS),
    "logging": [m.value for m in WandbMode],
    "hydra/launcher": ["basic", "joblib", "gpus", "slurm", "submitit_local"],
}


def composed(*overrides: str, hydra: bool = False):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def test_named_trees_keep_their_drafting_mode_in_the_job_config():
    """tree=cpu drafts top-k at T > 0 through eval.run as through mars.tuned(tree="cpu") (NAMED_TREES)."""
    from mars.decoding.settings import NAMED_TREES

    for name, shape in NAMED_TREES.items():
        assert TREES[name].drafting == shape.drafting, name
    assert validate(composed("tree=cpu", "sampling=t1")).tree.drafting == "topk"


@pytest.mark.parametrize("group,option", [(g, o) for g, options in GROUPS.items() for o in options])
def test_every_option_of_every_group_composes_and_validates(group, option):
    if group.startswith("hydra/"):  # launcher presets configure Hydra, not the job
        cfg = composed(f"{group}={option}", hydra=True)
        assert cfg.hydra.runtime.choices["hydra/launcher"] == option
        assert cfg.hydra.launcher._target_.startswith("hydra")
        return
    greedy = group != "method" or option in PLAIN or RULES[option].greedy_form
    run = validate(composed(f"{group}={option}", *([] if greedy else ["sampling=t1"])))
    assert isinstance(run, RunConfig)
    if group == "method":
        assert run.method.kind == option and isinstance(run.method, RuleMethod) == (option not in PLAIN)
    elif group == "tree":
        assert run.tree == TREES[option]
    elif group == "sampling":
        assert run.sampling == SAMPLINGS[option]
    elif group == "logging":
        assert run.logging.mode.value == option
    else:
        assert getattr(run, group).name


def test_the_gpus_launcher_runs_one_job_per_gpu(monkeypatch):
    monkeypatch.setenv("MARS_GPUS", "4")
    assert composed("hydra/launcher=gpus", hydra=True).hydra.launcher.n_jobs == 4


def test_the_default_is_the_cpu_quickstart():
    run = validate(composed())
    assert (run.model.name, run.bench.name, run.method.name) == ("embedded", "stdlib_heldout", "mars@0.9")
    assert run.tree == TREES["calibrated"] and run.sampling.temperature == 0 and run.logging.mode is WandbMode.disabled
    assert run.baselines == ["generate", "vanilla", "strict"]


def test_a_model_takes_its_prompt_preset_and_the_command_line_overrides_both():
    """qwen3_8b takes the llama3 prompt preset (the chat template with the LLaMA-3 scripts' system message) and
    turns thinking off; model.prompt.* on the command line overrides either."""
    prompt = validate(composed("model=qwen3_8b")).model.prompt
    assert (prompt.system_prompt, prompt.thinking) == (PROMPTS["llama3"].system_prompt, False)
    assert validate(composed("model=qwen3_8b", "model.prompt.system_prompt=null")).model.prompt.system_prompt is None
    assert validate(composed("model=llama31_8b", "model.prompt.thinking=true")).model.prompt.thinking is True


def test_each_model_brings_its_tree_preset_and_the_command_line_overrides_it():
    assert validate(composed("model=qwen3_8b")).tree == TREES["paper"]
    assert validate(composed("model=qwen3_8b", "tree=eagle")).tree == TREES["eagle"]
    assert validate(composed("model=qwen3_32b", "tree.depth=12")).tree.depth == 12


@pytest.mark.parametrize("override,error", [
    ("method.theta=abc", ConfigCompositionException),  # a string where a float belongs
    ("tree.depth=two", ConfigCompositionException),
    ("model=no_such_model", MissingConfigException),
    ("bench=no_such_bench", MissingConfigException),
    ("tree=no_such_tree", MissingConfigException),
    ("model.dtype=int8", ConfigCompositionException),  # not one of the enum's values
    ("logging.mode=loud", ConfigCompositionException),
    ("model.no_such_key=1", ConfigCompositionException),  # unknown keys are refused
    ("num_prompts=some", ConfigCompositionException),
])
def test_bad_types_and_names_fail_at_compose_time(override, error):
    with pytest.raises(error):
        composed(override)


def test_theta_only_belongs_to_mars():
    with pytest.raises(ConfigCompositionException):
        composed("method=strict", "method.theta=0.9")


@pytest.mark.parametrize("overrides,message", [
    (["method.theta=1.5"], r"theta=1.5 is outside \[0.0, 1.0\]"),
    (["method.theta=-0.1"], "theta=-0.1"),
    (["method.margin=logprob_gap", "method.theta=-1"], "theta=-1"),
    (["method.margin=cosine"], "unknown mars.margin 'cosine'"),
    (["model.compile=default"], r"apply to static shapes: .*\(model.static=true"),
    (["model.static=true", "model.max_cache_len=0"], "max_cache_len must be an integer >= 1"),
    (["method=ears"], "rule 'ears' has no greedy form"),
    (["method=typical", "method.epsilon=2"], r"typical.epsilon=2.0 is outside \[0.0, 1.0\]"),
    (["tree.depth=-1"], "tree.depth must be an integer >= 1"),
    (["tree.total_tokens=0"], "tree.total_tokens"),
    (["tree.drafting=beam"], "tree.drafting must be one of auto, topk, sample"),  # TreeShape's rules
    (["tree.adaptive=true", "tree.drafting=sample"], "sampled tree's shape must not depend on its draws"),
    (["sampling.temperature=-1"], "temperature"),
    (["sampling.top_p=0"], "top_p"),
    (["max_new_tokens=0"], "max_new_tokens"),
    (["num_prompts=0"], "num_prompts"),
    (["exactness_checks=-1"], "exactness_checks is a count of questions"),
    (["shard=2/2"], "shard must be 'i/n'"),
    (["shard=a/b"], "shard must be 'i/n'"),
    (["baselines=[vanilla,fast]"], "unknown method 'fast'"),
    (["baselines=[mars@1.2]"], "theta=1.2"),
    (["model.max_memory={0: 70GiB}"], "needs model.device_map"),
    (["model=qwen3_8b", "model.max_memory=5"], "must map GPU indices"),
    (["gpus_per_job=0"], "gpus_per_job"),
])
def test_bad_values_fail_when_the_composed_config_is_validated(overrides, message):
    cfg = composed(*overrides)  # types are right: Hydra composes it
    with pytest.raises(ValueError, match=message):
        validate(cfg)


def test_method_short_forms_and_shards():
    assert method_spec("mars@0.95").name == "mars@0.95" and method_spec("strict").kind == "strict"
    with pytest.raises(ValueError, match="bad method 'mars@high'"):
        method_spec("mars@high")
    with pytest.raises(ValueError, match="unknown method 'fast'"):
        method_spec("fast")
    for spec in ("typical@0.05[delta=0.2]", "mars@0.8[margin=prob_ratio,fallback=reference]", "topm@3", "ears@0.2"):
        assert method_spec(spec).name == spec  # a display name parses back to the same method
    assert method_spec("typical@0.05[delta=0.2]").rule().delta == 0.2
    assert parse_shard("1/4") == (1, 4) and parse_shard(None) is None
