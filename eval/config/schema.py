"""The typed configuration of `python -m eval.run`: Hydra structured configs and the named presets.

Every group is a dataclass registered in Hydra's ConfigStore, so a value of the wrong type or an
unknown key fails when Hydra composes the config, with Hydra's own message; value ranges (θ, depth,
temperature, shard, ...) are checked by `validate`, which `eval.run` calls on the composed config
before anything else runs. Groups and their options:

    model/     the YAML files in configs/model/ (target, draft, dtype, devices, prompt format)
    bench/     the YAML files in configs/bench/ (question set, quality figures)
    method/    generate | vanilla | every rule of mars.rules with its parameters  -- the method under test
               (strict, mars: theta margin fallback, typical: epsilon delta fallback, topm: m alpha,
               ears: beta, entropy: h; rules of MARS_PLUGINS modules too)
    tree/      cpu (20/4/5) | paper (49/7/10) | eagle (60/6/10) | adaptive | calibrated  -- each model picks its default
    prompt/    llama3 (the chat template with the LLaMA-3 scripts' system message)  -- a model config's base
               prompt block (`- /prompt@prompt: llama3` in its defaults list)
    sampling/  t0 (greedy) | t1 (T=1, the paper's main table) | t02 (T=0.2, the paper's Qwen3 runs)
    logging/   disabled | offline | online                                       -- Weights & Biases
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from eval.config.methods import (
    GENERATE,
    PLAIN,
    STRICT,
    VANILLA,
    Dtype,
    GenerateConfig,
    MethodConfig,
    RuleMethod,
    method_spec,
    rule_schema,
)
from eval.config.paths import REPO_ROOT
from mars.adapter.static import check_static_options
from mars.decoding.settings import NAMED_TREES, Kernels, TreeShape
from mars.rules import RULES, make_rule

if TYPE_CHECKING:
    from mars.verification.sampling import SamplingConfig

SHARD = re.compile(r"^(\d+)/(\d+)$")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # a model given as a Hugging Face hub id (owner/name)


class PromptKind(Enum):
    chat = "chat"
    fastchat = "fastchat"
    completion = "completion"


class WandbMode(Enum):
    disabled = "disabled"
    offline = "offline"
    online = "online"


def _positive(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass
class PromptConfig:
    """How questions become prompts (eval.benchmarks.prompting.PromptFormat)."""

    format: PromptKind = PromptKind.chat
    fastchat_template: str | None = None
    system_prompt: str | None = None
    thinking: bool | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelConfig:
    name: str = MISSING
    # A directory (absolute or relative to the repository), a hub id, or a GGUF file: a .gguf path or
    # package:<module>/<file>.gguf in an installed package, converted once into the cache (mars.adapter.sources).
    target: str = MISSING
    target_sha256: str | None = None  # a GGUF target's pinned checksum, checked when it is first converted
    draft: str = MISSING
    # A head for temperature > 0, used instead of `draft` when sampling (eval.runner.job_settings.head_setting);
    # null: `draft` at every temperature.
    sampling_draft: str | None = None
    tokenizer: str | None = None  # default: the target's
    dtype: Dtype = Dtype.auto  # auto: measured on a CPU (mars.tuning.search); bf16 on GPUs (eagle.precision)
    device: str = "cpu"  # cpu | cuda | cuda:N (ignored with device_map)
    # auto: one GPU when the target and what decoding needs beside it fit, else spread over the job's GPUs
    # with that headroom kept free (eval/runner/placement.py); balanced / sequential / ...: transformers' own.
    device_map: str | None = None
    max_memory: Any = None  # a dict per GPU index, e.g. {0: 70GiB, 1: 70GiB}
    headroom_gib: float | None = None  # with device_map=auto: GiB kept free beside the weights (null: estimated)
    allow_offload: bool = False  # with device_map: accept layers placed on the CPU or disk (slow)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    # The model's own calibration prompts (a JSONL file of "prompt" or "turns" records, encoded as the model's
    # prompts are): what tree.calibration_prompts=model times, and where =bench falls back when the benchmark has
    # no question to spare. A chat model names chat prompts (data/prompts/chat_calibration.jsonl), which
    # `mars.tuned` times for any target with a chat template; a completion model the stdlib's functions.
    calibration_prompts: str = "data/prompts/stdlib_calibration.jsonl"
    # Verification attention computed row by row over exactly the visible keys (mars/adapter/exact.py), so
    # that fp16/bf16 strict greedy is bit-identical to plain decoding rather than equal up to rounding.
    # null = auto: on in bf16/fp16 (full-attention models), off in float32 (not needed there).
    exact_attention: bool | None = None
    # Linears on CPU multiplied by oneDNN-prepacked weights in our decoding loop (compute/kernels.py): float32
    # (~30% faster tree forwards where MKL's few-row products are slow) and bf16 on CPUs with AVX-512 BF16
    # (the weight is not reordered at every call). null = auto: measured with dtype=auto or tree=calibrated
    # (eval/runner/job_settings.py), else on where oneDNN packs. In float32 it moves the last bits only and
    # does not name the run directory; in bf16 it changes greedy tokens and names it.
    prepack: bool | None = None
    # Our vanilla's kernels as their label names them (bfloat16+aten, float32+packed): null = the calibration's
    # fastest plain decoding (the plain race's pick), else the trees' kernels. Set it with the tree and kernels
    # to rerun or resume a calibrated run's directories without calibrating again (its log names the label).
    plain_kernels: str | None = None
    # Static shapes for the target's tree forward and decoding step (mars/adapter/static.py): a cache of
    # max_cache_len entries made once, trees padded to total_tokens + 1; what CUDA graphs need.
    # compile: a torch.compile mode for those forwards (default | reduce-overhead | max-autotune; needs
    # static). Off by default; when on they name the run directory (they change roundings and timings).
    static: bool = False
    compile: str | None = None
    max_cache_len: int | None = None  # null: 2048 (or the context plus one tree, if shorter)


@dataclass
class BenchConfig:
    name: str = MISSING
    questions: str = MISSING  # a set's name in data_dir, or a .jsonl path
    data_dir: str | None = None
    quality: list[str] = field(default_factory=list)  # extra figures of eval/scoring/quality.py: parses, loglik
    # local: <questions>.jsonl in data_dir; hub: the benchmark's Hugging Face dataset (eval/benchmarks/,
    # through `datasets`); auto: the local file when there, else the hub
    source: str = "auto"
    # Answer at most this many user turns of each question (1: MT-bench's first turns only); null: every turn.
    # The run directory names it when set, so answers to fewer turns are never resumed as the full ones.
    max_turns: int | None = None


@dataclass
class TreeConfig:
    total_tokens: int = 20  # drafted nodes verified per cycle (the reference's total_token counts the root too)
    depth: int = 4  # draft levels
    branching: int = 5  # children expanded per level (EAGLE's top_k)
    adaptive: bool = False  # size each cycle's tree from measured costs (mars/decoding/adaptive.py); the sizes are caps
    # When sampling (temperature > 0): "topk" drafts the head's most likely tokens (EAGLE-2's tree),
    # "sample" draws children from the head into a fixed shape (eagle/tree.py, lossless by recursive
    # rejection sampling), "auto" whichever the calibration times faster here (sample where nothing is timed).
    # Greedy runs always draft top-k.
    drafting: str = "auto"
    # Choose among mars.tuning.candidates' trees (jointly with the precision when model.dtype=auto) on these
    # prompts (never one the run answers; "bench": the benchmark's spare questions) and use the fastest; cached
    # per machine, model, kind of decoding and method, so it runs once per method. Each method of a run (strict,
    # each rule) gets the tree measured for it.
    calibrate: bool = False
    # With calibrate: true, each rule method gets its own measured tree and may decode plainly where none pays
    # ("the speed you get"). false: every method drafts strict's calibrated tree and speculates (rules compared
    # at one tree, as the paper compares them: the rule zoo, the theta sweep, the paper scripts).
    per_method: bool = True
    # "model": the model's own (model.calibration_prompts); "bench": the benchmark's own questions that the run
    # does not answer, so that calibration times prompts like the run's (a chat head accepts more on its own kind
    # of prompt than on another: its prediction follows), the model's own where none is spare; or a prompt file.
    calibration_prompts: str = "model"
    # Seconds for a run's calibrations together (the paired finals stop when they are spent, after their floor of
    # pairs); null: mars.tuning.plan.DEFAULT_BUDGET. Calibration times turns of at most 64 tokens, whatever the
    # run's length (mars.tuning.plan.TIMED_TOKENS)
    calibration_budget: float | None = None


@dataclass
class SamplingSchema:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off (a sampling filter; the tree's branching factor is tree.branching)


@dataclass
class LoggingConfig:
    mode: WandbMode = WandbMode.disabled
    project: str = "mars-spec"
    entity: str | None = None
    group: str | None = None  # default: the sweep's directory name in a multirun, else none
    name: str | None = None  # default: <model>-<bench>-<method>-T<temperature>
    tags: list[str] = field(default_factory=list)  # added to model:/bench:/method: tags


@dataclass
class SandboxConfig:
    # Score HumanEval even where the sandbox (eval/scoring/sandbox.py) cannot hide the caller's private files
    # (not root, no bubblewrap, no unprivileged user namespaces): the code then runs with the caller's
    # permissions, and summary.json, the report and the W&B run record sandbox: unisolated. Off: refuse.
    allow_unisolated: bool = False


@dataclass
class RunConfig:
    model: ModelConfig = MISSING
    bench: BenchConfig = MISSING
    method: MethodConfig = MISSING
    tree: TreeConfig = MISSING
    sampling: SamplingSchema = MISSING
    logging: LoggingConfig = MISSING
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    # Methods answered alongside `method`, question by question in rotated order; each keeps its own
    # run directory, shared by every job with the same settings (a θ sweep times vanilla once).
    baselines: list[str] = field(default_factory=lambda: [GENERATE, VANILLA, STRICT])
    max_new_tokens: int = 64  # per turn
    # Questions decoded together (`SpeculativeGenerator.generate` of a list): each method answers a batch at once,
    # every baseline too (model.generate left-padded, vanilla batched); the calibration times trees at it.
    batch_size: int = 1
    num_prompts: int | None = 12  # the first N questions of the set; null = all
    shard: str | None = None  # "i/n": this job answers questions i, i+n, i+2n, ... (eval.report merges)
    seed: int = 0
    threads: int | None = None  # torch threads; null = $OMP_NUM_THREADS if set, else all cores
    warmup: bool = True  # one short untimed run of every method first
    # Where vanilla decodes at other kernels than the trees (DecodeSettings.plain), strict greedy's answers to this
    # many questions are checked, untimed, against plain decoding at the trees' kernels; null = every question.
    exactness_checks: int | None = 4
    # Time the decoding loop's phases (phase_seconds in the summary). It synchronises the devices at
    # every phase boundary, which slows a GPU run: for diagnosis, not for speed figures.
    profile: bool = False
    resume: bool = True  # a rerun continues its run directories (false: refuse to reuse one with answers)
    out_dir: str = MISSING  # run directories go under it (eval/runner/directories.py)
    summary_path: str | None = None  # an extra copy of the job's summary.json
    gpus_per_job: int | None = None  # claim this many free GPUs of the node by lock file (joblib launcher)
    # Timed answers hold a machine-wide lock (per GPU set on GPUs), so parallel jobs of a sweep never time
    # each other's work; loading and scoring wait while another job times (eval/runner/locks.py). false:
    # time at once; answers during which another job computed are then marked contended.
    exclusive_timing: bool = True


def sampling_of(method: MethodConfig, sampling: SamplingSchema) -> SamplingConfig:
    """The engine's sampling settings for a method (plain decoding: strict, which it does not use);
    raises on a bad temperature or rule parameter."""
    from mars.verification.sampling import SamplingConfig

    rule = method.rule() if isinstance(method, RuleMethod) else make_rule("strict")
    return SamplingConfig(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k, rule=rule)


def parse_shard(shard: str | None) -> tuple[int, int] | None:
    if shard is None:
        return None
    match = SHARD.match(str(shard))
    if not match or not int(match.group(1)) < int(match.group(2)):
        raise ValueError(f"shard must be 'i/n' with 0 <= i < n (e.g. shard=0/4), got {shard!r}")
    return int(match.group(1)), int(match.group(2))


def validate(composed: DictConfig | RunConfig) -> RunConfig:
    """The composed config as dataclasses, with every value range checked (raises ValueError naming it)."""
    run = OmegaConf.to_object(composed) if isinstance(composed, DictConfig) else composed
    if run.method.kind not in (*PLAIN, *RULES):
        raise ValueError(f"method.kind must be {', '.join(PLAIN)} or a rule ({', '.join(RULES)}), "
                         f"got {run.method.kind!r}")
    methods = [run.method, *(method_spec(b) for b in run.baselines)]
    for method in methods:
        sampling_of(method, run.sampling)
        if isinstance(method, GenerateConfig) and method.dtype == Dtype.auto:
            raise ValueError("a model.generate baseline's dtype must be bfloat16, float16 or float32 (generate@auto "
                             "is the run's own precision: use generate)")
    check_static_options(run.model.static, run.model.compile, run.model.max_cache_len)
    if run.model.plain_kernels is not None:
        try:
            Kernels.from_label(run.model.plain_kernels)
        except ValueError as e:
            raise ValueError(f"model.plain_kernels: {e}") from None
    if run.bench.source not in ("local", "hub", "auto"):
        raise ValueError(f"bench.source must be local, hub or auto, got {run.bench.source!r}")
    if run.bench.max_turns is not None:
        _positive("bench.max_turns", run.bench.max_turns)
    tree = run.tree
    shape = TreeShape(tree.total_tokens, tree.depth, tree.branching, tree.adaptive, tree.drafting)  # checks the tree
    if tree.calibration_budget is not None and not tree.calibration_budget >= 0:
        raise ValueError(f"tree.calibration_budget is seconds >= 0, got {tree.calibration_budget!r}")
    _positive("max_new_tokens", run.max_new_tokens)
    if run.exactness_checks is not None and not (isinstance(run.exactness_checks, int) and run.exactness_checks >= 0):
        raise ValueError(f"exactness_checks is a count of questions >= 0 or null (every question), got "
                         f"{run.exactness_checks!r}")
    _positive("batch_size", run.batch_size)
    if run.batch_size > 1 and (run.model.static or not shape.batchable):
        raise ValueError("batch_size > 1 decodes fixed-size trees on the dynamic cache: drop model.static and "
                         "tree.adaptive, or set batch_size=1")
    if run.num_prompts is not None:
        _positive("num_prompts", run.num_prompts)
    if run.threads is not None:
        _positive("threads", run.threads)
    if run.gpus_per_job is not None:
        _positive("gpus_per_job", run.gpus_per_job)
    parse_shard(run.shard)
    memory = run.model.max_memory
    sizes = isinstance(memory, dict) and all(isinstance(v, (str, int)) for v in memory.values())
    if memory is not None and not sizes:
        raise ValueError("model.max_memory must map GPU indices to sizes, e.g. model.max_memory={0: 70GiB, 1: 70GiB}, "
                         f"got {memory!r}")
    if memory and not run.model.device_map:
        raise ValueError("model.max_memory needs model.device_map (e.g. model.device_map=auto)")
    return run


# --- presets ------------------------------------------------------------------------------------

TREES = {  # the fixed trees of mars.decoding.settings.NAMED_TREES, and the measured one
    **{name: TreeConfig(t.total_tokens, t.depth, t.branching, adaptive=t.adaptive, drafting=t.drafting)
       for name, t in NAMED_TREES.items()},  # each with its drafting mode, as mars.tuned reads it
    "calibrated": TreeConfig(calibrate=True),  # the fastest candidate here (mars/tuning/search.py), cached
}
SAMPLINGS = {"t0": SamplingSchema(0.0), "t1": SamplingSchema(1.0), "t02": SamplingSchema(0.2)}

# The system message of the MARS and EAGLE LLaMA-3 scripts (mars/evaluation/gen_ea_answer_llama3chat.py,
# eagle/evaluation/gen_ea_answer_llama3chat.py): the Llama-2 default system prompt, verbatim including the
# double space after "safe.". The MARS scripts of the other chat targets (DeepSeek-R1-Distill-Llama, Qwen3)
# send it too.
LLAMA3_SYSTEM_PROMPT = (
    "You are a helpful, respectful and honest assistant. Always answer as helpfully as possible, while being "
    "safe.  Your answers should not include any harmful, unethical, racist, sexist, toxic, dangerous, or illegal "
    "content. Please ensure that your responses are socially unbiased and positive in nature.\n\nIf a question "
    "does not make any sense, or is not factually coherent, explain why instead of answering something not "
    "correct. If you don't know the answer to a question, please don't share false information."
)
# Prompt presets a model config takes in its defaults list (`- /prompt@prompt: llama3`), then adjusts.
PROMPTS = {"llama3": PromptConfig(system_prompt=LLAMA3_SYSTEM_PROMPT)}  # format: chat, the default


def register() -> None:
    """Put the schemas and presets into Hydra's ConfigStore (done on import of this module)."""
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    cs.store(group="method", name=GENERATE, node=GenerateConfig)
    cs.store(group="method", name=VANILLA, node=MethodConfig(kind=VANILLA))
    for name in RULES:  # call register() again after registering a rule, to run it through eval.run
        cs.store(group="method", name=name, node=rule_schema(name))
    for name, tree in TREES.items():
        cs.store(group="tree", name=name, node=tree)
    for name, sampling in SAMPLINGS.items():
        cs.store(group="sampling", name=name, node=sampling)
    for name, prompt in PROMPTS.items():
        cs.store(group="prompt", name=name, node=prompt)
    for mode in WandbMode:
        cs.store(group="logging", name=mode.value, node=LoggingConfig(mode=mode))
register()


def composed(*overrides: str) -> DictConfig:
    """The job config `python -m eval.run OVERRIDES` composes, without running it: where a script reads a
    model's settings (`composed("model=smollm2").model`), whatever package its YAML file writes to (a model may
    also set its tree's calibration prompts, `# @package _global_`)."""
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        return compose("config", overrides=list(overrides))


def run_config(*overrides: str) -> RunConfig:
    """The job config `python -m eval.run OVERRIDES` would run, composed and validated (`composed`, `validate`)."""
    return validate(composed(*overrides))
