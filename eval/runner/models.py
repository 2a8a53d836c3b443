"""Loading what a job decodes with: precision, exact attention and kernels chosen for the machine,
the target (one device, one GPU or several), the tokenizer, the draft head, the generator and,
with `tree=calibrated`, the tree that decodes fastest here.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import replace
from pathlib import Path

import torch

from eagle.precision import Precision, needs_exact_attention, resolve_dtype
from eval.benchmarks import load_questions
from eval.benchmarks.prompting import PromptFormat, encode
from eval.config.methods import STRICT, method_spec
from eval.config.paths import resolve
from eval.config.schema import HUB_ID, RunConfig, TreeConfig, sampling_of
from mars.generate import SpeculativeGenerator

GPU_LOCK_DIR = Path(os.environ.get("MARS_GPU_LOCK_DIR", "/tmp/mars-gpu-locks"))


def run_precision(run: RunConfig) -> Precision:
    """The precision the target runs in: model.dtype, "auto" resolved for the run's device (eagle.precision)."""
    m = run.model
    return resolve_dtype(m.dtype.value, "cuda" if (m.device_map or m.device.startswith("cuda")) else m.device)


def exact_attention_choice(run: RunConfig, precision: Precision) -> tuple[bool, str]:
    """Whether verification uses exact attention, and why (model.exact_attention null = auto)."""
    if run.model.exact_attention is not None:
        return run.model.exact_attention, "set explicitly"
    if run.model.static:
        return False, "auto: static shapes (exact attention gathers shapes that change from tree to tree)"
    if needs_exact_attention(precision.dtype):
        return True, f"auto: {precision.name} tree verification differs from plain decoding without it"
    return False, f"auto: {precision.name} tree verification already reproduces plain decoding"


def prepack_choice(run: RunConfig, precision: Precision) -> tuple[bool, str]:
    """Whether our loop multiplies float32 CPU linears by prepacked weights, and why (model.prepack null = auto)."""
    if run.model.prepack is not None:
        return run.model.prepack, "set explicitly"
    if run.model.compile is not None:
        return False, "auto: torch.compile chooses the kernels of the compiled forwards"
    on_cpu = not run.model.device_map and run.model.device == "cpu"
    if on_cpu and precision.dtype == torch.float32 and torch.backends.mkldnn.is_available():
        return True, "auto: float32 on CPU, where oneDNN's prepacked products beat MKL's over a few rows"
    where = run.model.device_map or run.model.device
    return False, f"auto: only for float32 on CPU with oneDNN (here {precision.name} on {where})"


def model_source(spec: str, what: str) -> str:
    """A local directory (absolute or relative to the repository root) or a Hugging Face hub id."""
    local = resolve(spec)
    if local.exists():
        return str(local)
    if HUB_ID.match(spec):
        return spec
    raise FileNotFoundError(
        f"{what} not found at {local} (and {spec!r} is not a hub id 'owner/name'). The embedded pair lives in "
        "data/models/{target,draft} once built (data/models/README.md); otherwise set model.target / model.draft to a "
        "directory or hub id."
    )


def claim_gpus(count: int, total: int, lock_dir: Path = GPU_LOCK_DIR) -> tuple[list[int], list]:
    """`count` of this node's `total` GPUs that no other job holds, locked until the returned handles close.

    Jobs of a sweep on one node (hydra/launcher=gpus) start in worker processes that know nothing of
    each other; a lock file per GPU gives each its own. Raises when fewer than `count` are free.
    """
    lock_dir.mkdir(parents=True, exist_ok=True)
    gpus, handles = [], []
    for index in range(total):
        handle = open(lock_dir / f"gpu{index}.lock", "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        gpus.append(index)
        handles.append(handle)
        if len(gpus) == count:
            return gpus, handles
    for handle in handles:
        handle.close()
    raise RuntimeError(f"gpus_per_job={count} but only {len(gpus)} of this node's {total} GPUs are free (locks in "
                       f"{lock_dir}): run fewer parallel jobs (hydra.launcher.n_jobs) or fewer GPUs per job")


def gpu_bytes(index: int) -> int:
    return torch.cuda.get_device_properties(index).total_memory


def placement(run: RunConfig, gpus: list[int] | None, dtype: torch.dtype | None = None) -> dict:
    """from_pretrained's device arguments: the configured device, one GPU or several (eval.runner.placement)."""
    m = run.model
    if m.device_map:
        if not torch.cuda.is_available() and not m.allow_offload:
            raise RuntimeError(f"model.device_map={m.device_map} shards the target over GPUs but none is visible: "
                               "run on a GPU node, or set model.device_map=null model.device=cpu")
        memory = {int(k) if str(k).isdigit() else k: v for k, v in (m.max_memory or {}).items()}
        if m.device_map == "auto" and torch.cuda.is_available():  # fit first, spread only what does not fit
            from transformers import AutoConfig

            from eval.runner.placement import fit_first, parse_bytes

            config = AutoConfig.from_pretrained(model_source(m.target, "target model"))
            job = gpus if gpus is not None else list(range(torch.cuda.device_count()))
            sizes = {g: parse_bytes(memory[g]) if g in memory else gpu_bytes(g) for g in job}
            return fit_first(config, dtype or run_precision(run).dtype, sizes, run.max_new_tokens,
                             run.tree.total_tokens + 1, m.headroom_gib)
        kwargs: dict = {"device_map": m.device_map}
        if gpus is not None:  # only the job's own GPUs (with their configured limits, if any)
            memory = {g: memory.get(g, f"{gpu_bytes(g) // 2**30}GiB") for g in gpus}
        if memory:
            kwargs["max_memory"] = memory
        return kwargs
    if gpus is not None:
        return {"device_map": {"": gpus[0]}}
    return {"device_map": {"": m.device}}


def check_offload(model, allow: bool) -> None:
    """Refuse a target that `device_map` spilled onto the CPU or disk, unless asked for (it is very slow)."""
    spilled = sorted({str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()} & {"cpu", "disk"})
    if spilled and not allow:
        raise RuntimeError(f"the target does not fit the job's GPUs: device_map placed layers on {', '.join(spilled)}. "
                           "Give it more GPUs (gpus_per_job, model.max_memory), or set model.allow_offload=true "
                           "to accept offloading")


def load_tokenizer(run: RunConfig):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_source(run.model.tokenizer or run.model.target, "tokenizer"))


def load_target(run: RunConfig, dtype: torch.dtype, gpus: list[int] | None = None):
    """The target with `AutoModelForCausalLM.from_pretrained` in `dtype`, on `device` or sharded by `device_map`."""
    from transformers import AutoModelForCausalLM

    m = run.model
    model = AutoModelForCausalLM.from_pretrained(model_source(m.target, "target model"), dtype=dtype,
                                                 **placement(run, gpus, dtype)).eval()
    check_offload(model, m.allow_offload)
    return model


def tree_shape(tree: TreeConfig) -> dict:
    """SpeculativeGenerator's tree arguments."""
    return {"total_tokens": tree.total_tokens, "depth": tree.depth, "branching": tree.branching,
            "adaptive": tree.adaptive}


def calibrated_tree(run: RunConfig, fmt: PromptFormat) -> tuple[TreeConfig, dict]:
    """`tree=calibrated`: the candidate tree that decodes fastest here (mars.calibrate; timed once per
    machine, model and greedy/sampled decoding, then read from the cache), and the calibration's record."""
    from mars.calibrate import calibrate_tree

    precision = run_precision(run)
    tokenizer = load_tokenizer(run)
    target = load_target(run, precision.dtype)
    prompts = [torch.tensor([encode(tokenizer, q, [], fmt)])
               for q in load_questions(run.tree.calibration_prompts)]
    with make_generator(run, target, load_head(run, target), precision) as gen:
        record = calibrate_tree(gen, prompts, sampling_of(method_spec(STRICT), run.sampling))
    shape = record["tree"]
    print(f"tree: {shape['total_tokens']}/{shape['depth']}/{shape['branching']}"
          f"{' adaptive' if shape['adaptive'] else ''}, the fastest here "
          f"({record['speedup_over_plain']:.2f}x plain decoding in calibration; "
          f"{'cached: ' if record['cached'] else 'saved to '}{record['cache']})")
    return replace(run.tree, **shape, calibrate=False), record


def make_generator(run: RunConfig, target, head, precision: Precision, profile: bool = False) -> SpeculativeGenerator:
    """Our decoding loop as the run configures it: its tree, exact attention and kernels."""
    m = run.model
    return SpeculativeGenerator(target, head, **tree_shape(run.tree),
                                exact_attention=exact_attention_choice(run, precision)[0],
                                prepack=prepack_choice(run, precision)[0], profile=profile,
                                static=m.static, compile=m.compile, max_cache_len=m.max_cache_len)


def load_head(run: RunConfig, target):
    """The draft head: a local EAGLE checkpoint directory, or a hub repository downloaded first."""
    from eagle.checkpoint import load_draft

    source = model_source(run.model.draft, "draft model")
    if not Path(source).exists():
        from huggingface_hub import snapshot_download

        source = snapshot_download(repo_id=source)
    return load_draft(source, target)
