"""Loading what a job decodes with: the target (one device, one GPU or several), the tokenizer, the
draft head, and the generator with the job's resolved settings (`eval.runner.job_settings`).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import torch

from eval.config.paths import resolve
from eval.config.schema import HUB_ID, RunConfig
from mars.adapter.sources import PACKAGE, is_gguf, local_model
from mars.decoding.generate import SpeculativeGenerator
from mars.decoding.settings import DecodeSettings, Setting

GPU_LOCK_DIR = Path(os.environ.get("MARS_GPU_LOCK_DIR", "/tmp/mars-gpu-locks"))


def model_source(spec: str, what: str, sha256: str | None = None) -> str:
    """A local directory (absolute or relative to the repository root), a Hugging Face hub id, or a GGUF
    file's converted directory (`mars.adapter.sources.local_model`, checked against `sha256`)."""
    if is_gguf(spec):
        return local_model(spec if spec.startswith(PACKAGE) else str(resolve(spec)), sha256)
    local = resolve(spec)
    if local.exists():
        return str(local)
    if HUB_ID.match(spec):
        return spec
    raise FileNotFoundError(
        f"{what} not found at {local} (and {spec!r} is not a hub id 'owner/name'). The embedded pair lives in "
        "data/models/{target,draft} once built (data/models/README.md); otherwise set model.target / model.draft "
        "/ model.sampling_draft to a directory or hub id."
    )


def target_source(run: RunConfig) -> str:
    """Where the run's target loads from (`model_source` of `model.target` with its pinned checksum)."""
    return model_source(run.model.target, "target model", run.model.target_sha256)


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


def placement(run: RunConfig, gpus: list[int] | None, dtype: torch.dtype, tree_rows: int | None = None) -> dict:
    """from_pretrained's device arguments: the configured device, one GPU or several (eval.runner.placement).
    tree_rows: the queries of one tree forward (default: the config's tree), which the cache must hold."""
    m = run.model
    if m.device_map:
        if not torch.cuda.is_available() and not m.allow_offload:
            raise RuntimeError(f"model.device_map={m.device_map} shards the target over GPUs but none is visible: "
                               "run on a GPU node, or set model.device_map=null model.device=cpu")
        memory = {int(k) if str(k).isdigit() else k: v for k, v in (m.max_memory or {}).items()}
        if m.device_map == "auto" and torch.cuda.is_available():  # fit first, spread only what does not fit
            from transformers import AutoConfig

            from eval.runner.placement import fit_first, parse_bytes

            config = AutoConfig.from_pretrained(target_source(run))
            job = gpus if gpus is not None else list(range(torch.cuda.device_count()))
            sizes = {g: parse_bytes(memory[g]) if g in memory else gpu_bytes(g) for g in job}
            return fit_first(config, dtype, sizes, run.max_new_tokens, tree_rows or run.tree.total_tokens + 1,
                             m.headroom_gib)
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

    source = model_source(run.model.tokenizer, "tokenizer") if run.model.tokenizer else target_source(run)
    return AutoTokenizer.from_pretrained(source)


def load_target(run: RunConfig, dtype: torch.dtype, gpus: list[int] | None = None, tree_rows: int | None = None):
    """The target with `AutoModelForCausalLM.from_pretrained` in `dtype`, on `device` or sharded by `device_map`."""
    from transformers import AutoModelForCausalLM

    m = run.model
    model = AutoModelForCausalLM.from_pretrained(target_source(run), dtype=dtype,
                                                 **placement(run, gpus, dtype, tree_rows)).eval()
    check_offload(model, m.allow_offload)
    return model


def make_generator(target, head, settings: DecodeSettings, run: RunConfig, profile: bool = False,
                   plain_model=None) -> SpeculativeGenerator:
    """Our decoding loop with the job's resolved settings (its tree, exact attention and kernels; plain decoding
    at its own kernels, on `plain_model`, the target in their precision, where that is not the trees')."""
    m = run.model
    return SpeculativeGenerator(target, head, settings.tree.value, exact_attention=settings.exact_attention.value,
                                prepack=settings.prepack.value, onednn=settings.onednn.value,
                                plain_kernels=settings.plain, plain_model=plain_model, profile=profile,
                                static=m.static, compile=m.compile, max_cache_len=m.max_cache_len)


def load_head(head: Setting, target):
    """The draft head `head` (the run's resolved `DecodeSettings.head`): a local EAGLE checkpoint
    directory, or a hub repository downloaded first."""
    from eagle.checkpoint import load_draft

    source = model_source(head.value, "draft model")
    if not Path(source).exists():
        from huggingface_hub import snapshot_download

        source = snapshot_download(repo_id=source)
    try:
        return load_draft(source, target)
    except ValueError as err:
        if not head.reason.startswith("model.sampling_draft"):
            raise
        raise ValueError(f"the sampling head {head.value} (model.sampling_draft, used at temperature > 0) does not "
                         f"fit this target: {err} Set model.sampling_draft to this target's sampling head, or to null "
                         "to draft with model.draft at every temperature.") from err
