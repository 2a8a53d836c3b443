"""transformers' own `model.generate`, the plain decoding every speedup is quoted against: in this
process, or in a worker process whose torch and oneDNN are limited to an instruction set.

Why here, under the engine and not in `eval/`: the calibration (`mars.tuning.search`) judges every tree
against the fastest plain decoding a user has on the machine, `model.generate` included, and both doors
to it (`eval.run` and `mars.tuned`) must time the same configurations to reach the same record; `eval/`
re-uses these (`eval.runner.plain`) for its `generate` baselines.

Why a worker: `ATEN_CPU_CAPABILITY` and `ONEDNN_MAX_CPU_ISA` are read when torch loads, and on an
AVX-512 BF16 CPU torch's bf16 decoding is faster under the AVX2 limits than natively (one-row
products reorder the weight into oneDNN's layout at every call natively; 208.7 against 139.7 tok/s
on the embedded target). A user can run `model.generate` that way, so it is a plain decoding the
speedups are quoted against. The worker loads the target once and answers one batch of prompts at a
time on request, timed inside the worker, so its answers interleave with the other methods' like any other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch

from mars.accounting.timing import frozen_heap
from mars.decoding.output import GenerationOutput
from mars.verification.sampling import SamplingConfig

# What `generate@<dtype>+<isa>` sets in its process's environment (read by torch when it loads).
ISA_LIMITS = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}
REPLY = "mars-generate-worker: "  # marks the worker's replies on its standard output
# The worker's program: a function called, not `python -m` on this module, which `import mars` may have
# loaded already (runpy then warns).
WORKER = "from mars.decoding.reference import serve; serve()"


def hf_generate_batch(model, batch: list[list[int]], sampling: SamplingConfig, max_new_tokens: int, eos: list[int],
                      seed: int) -> list[GenerationOutput]:
    """`model.generate` on several prompts at once, left-padded as transformers decodes a batch; each
    prompt's tokens up to its EOS. Every row's `seconds` is the batch's: `generate` returns when the last
    row ends. One prompt: no padding, exactly `model.generate` on it."""
    from transformers import GenerationConfig

    greedy = sampling.greedy
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else (eos[0] if eos else 0)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=not greedy, eos_token_id=eos or None,
        pad_token_id=pad, temperature=None if greedy else sampling.temperature,
        top_p=None if greedy else sampling.top_p, top_k=None if greedy else sampling.top_k,
    )
    device = model.get_input_embeddings().weight.device
    width = max(map(len, batch))
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=device)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=device)
    torch.manual_seed(seed)  # generate samples from torch's global generator
    start = time.perf_counter()
    with torch.inference_mode(), frozen_heap():  # as our own decoding runs (`mars.decoding.generate`)
        out = model.generate(input_ids, attention_mask=mask, generation_config=config)
    seconds = time.perf_counter() - start
    outputs = []
    for row in out[:, width:].tolist():
        stopped = next((i for i, t in enumerate(row) if t in eos), None)
        tokens = row[: stopped + 1] if stopped is not None else row
        outputs.append(GenerationOutput(tokens=tokens, accept_lengths=[0] * max(len(tokens) - 1, 0),
                                        num_cycles=max(len(tokens) - 1, 0), seconds=seconds,
                                        stopped_by="eos" if stopped is not None else "length"))
    return outputs


class GenerateWorker:
    """`model.generate` in a process of its own, started with the environment of ISA_LIMITS[isa].

    `answer_batch` takes what `hf_generate_batch` takes (but the model) and returns its outputs; `close`
    (or the end of a `with` block) ends the process. The worker loads `target` (a local directory or hub
    id) on the CPU in `dtype`, with `threads` torch threads (default: this process's)."""

    def __init__(self, target: str, dtype: str, isa: str, threads: int | None = None, wait: bool = True):
        self.isa = isa
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env={**os.environ, **ISA_LIMITS[isa]})
        self._send({"target": str(target), "dtype": dtype, "threads": threads or torch.get_num_threads()})
        self.ready = False
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Wait until the worker has loaded torch and the target (seconds: `wait=False` lets it start meanwhile)."""
        if self.ready:
            return
        ready = self._receive()
        if ready.get("capability") != ISA_LIMITS[self.isa]["ATEN_CPU_CAPABILITY"].upper():
            self.close()
            raise RuntimeError(f"the {self.isa} worker's torch runs at CPU capability {ready.get('capability')}, not "
                               f"{self.isa.upper()}: drop the generate@<dtype>+{self.isa} baseline on this machine")
        self.ready = True

    def _send(self, message: dict) -> None:
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def _receive(self) -> dict:
        while line := self.process.stdout.readline():
            if line.startswith(REPLY):  # anything else a library printed is not ours
                return json.loads(line[len(REPLY):])
        raise RuntimeError(f"the {self.isa} generate worker exited (code {self.process.poll()}); its error is "
                           "above in the job's output")

    def answer(self, ids: list[int], sampling: SamplingConfig, max_new_tokens: int, eos: list[int],
               seed: int) -> GenerationOutput:
        return self.answer_batch([ids], sampling, max_new_tokens, eos, seed)[0]

    def answer_batch(self, batch: list[list[int]], sampling: SamplingConfig, max_new_tokens: int, eos: list[int],
                     seed: int) -> list[GenerationOutput]:
        """`hf_generate_batch` in the worker."""
        self.wait_ready()
        self._send({"batch": batch, "temperature": sampling.temperature, "top_p": sampling.top_p,
                    "top_k": sampling.top_k, "max_new_tokens": max_new_tokens, "eos": eos, "seed": seed})
        done = self._receive()
        return [GenerationOutput(tokens=row["tokens"], accept_lengths=[0] * max(len(row["tokens"]) - 1, 0),
                                 num_cycles=max(len(row["tokens"]) - 1, 0), seconds=row["seconds"],
                                 stopped_by=row["stopped_by"]) for row in done["rows"]]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=60)

    def __enter__(self) -> GenerateWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def rows_of(unit: list[torch.Tensor]) -> list[list[int]]:
    """A calibration unit (prompts [T] or [1, T]) as `hf_generate_batch` takes it."""
    return [p.reshape(-1).tolist() for p in unit]


class LimitedGenerate:
    """`model.generate` in a `GenerateWorker` under the limits of ISA_LIMITS[isa], as a plain configuration
    a calibration races (`mars.tuning.plan.Plan.references`): `label` names it as `eval.run` names that
    baseline (`generate@bfloat16+avx2`); `time` answers a unit of prompts and returns (tokens, seconds).
    The worker starts at the first `time` (a cached calibration starts none) and ends at `close`."""

    def __init__(self, target: str, dtype: str = "bfloat16", isa: str = "avx2"):
        self.target, self.dtype, self.isa = str(target), dtype, isa
        self.label = f"generate@{dtype}+{isa}"
        self.worker: GenerateWorker | None = None

    def pids(self) -> list[int]:
        """The worker's process, once started (its CPU time is the calibration's own, not another's)."""
        return [self.worker.process.pid] if self.worker is not None else []

    def start(self) -> None:
        """Start the worker without waiting for it (its torch import and load take seconds: they overlap what the
        caller does next, e.g. loading the models, untimed)."""
        if self.worker is None:
            self.worker = GenerateWorker(self.target, self.dtype, self.isa, wait=False)

    def time(self, unit: list[torch.Tensor], sampling: SamplingConfig, max_new_tokens: int,
             seed: int) -> tuple[int, float]:
        self.start()
        outs = self.worker.answer_batch(rows_of(unit), sampling, max_new_tokens, [], seed)
        return sum(len(o.tokens) for o in outs), max(o.seconds for o in outs)

    def decode(self, rows: list[list[int]], sampling: SamplingConfig, max_new_tokens: int, eos: list[int],
               seed: int) -> list[GenerationOutput]:
        """`model.generate` in the worker as a generator's plain decoding (`SpeculativeGenerator.plain_decoding`)."""
        self.start()
        return self.worker.answer_batch(rows, sampling, max_new_tokens, eos, seed)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


class InProcessGenerate:
    """`model.generate` in this process as a generator's plain decoding (`SpeculativeGenerator.plain_decoding`,
    where calibration found it the fastest plain decoding), with the model's own attention implementation while it
    decodes (`attention`: a generator on the model switches it for tree attention)."""

    def __init__(self, model, attention: str):
        self.model, self.attention = model, attention
        self.label = f"generate@{str(model.dtype).removeprefix('torch.')}"

    def decode(self, rows: list[list[int]], sampling: SamplingConfig, max_new_tokens: int, eos: list[int],
               seed: int) -> list[GenerationOutput]:
        current = self.model.config._attn_implementation
        self.model.set_attn_implementation(self.attention)
        try:
            return hf_generate_batch(self.model, rows, sampling, max_new_tokens, eos, seed)
        finally:
            self.model.set_attn_implementation(current)

    def close(self) -> None:
        pass


def limited_references(target: str, device: str | torch.device) -> list[LimitedGenerate]:
    """The plain configurations out of this process that a calibration on `device` times: on a CPU with
    more than AVX2, bf16 `model.generate` under the AVX2 limits (faster than native bf16 decoding on
    AVX-512 BF16 CPUs); none elsewhere (the limits would change nothing, or it is not a CPU)."""
    if torch.device(device).type != "cpu" or torch.backends.cpu.get_cpu_capability() == "AVX2":
        return []
    return [LimitedGenerate(target)]


def serve() -> None:
    """The worker's side: load the target, report the CPU capability torch runs at, answer requests."""
    from transformers import AutoModelForCausalLM

    start = json.loads(sys.stdin.readline())
    torch.set_num_threads(start["threads"])
    model = AutoModelForCausalLM.from_pretrained(start["target"], dtype=getattr(torch, start["dtype"])).eval()
    print(REPLY + json.dumps({"capability": torch.backends.cpu.get_cpu_capability()}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        sampling = SamplingConfig(temperature=job["temperature"], top_p=job["top_p"], top_k=job["top_k"])
        outs = hf_generate_batch(model, job["batch"], sampling, job["max_new_tokens"], job["eos"], job["seed"])
        rows = [{"tokens": o.tokens, "seconds": o.seconds, "stopped_by": o.stopped_by} for o in outs]
        print(REPLY + json.dumps({"rows": rows}), flush=True)
