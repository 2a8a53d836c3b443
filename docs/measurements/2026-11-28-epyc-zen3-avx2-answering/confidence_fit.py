"""Where a confidence fit's time goes (`eagle.train.confidence.fit_confidence`) on SmolLM2 with its shipped head:
32 greedy continuations of training prompts (256 tokens), 5 draft steps, top-10; the target's forwards
(`collect_features`) and the grid's sums (`Calibration.add`) timed apart.

    python confidence_fit.py   # from the repository root
"""

import argparse
import json
import time

import eagle.train.confidence as confidence
from eagle.train.evaluate import continuation_data, load_pair, pair_arguments

TARGET = "/root/.cache/mars-spec/models/SmolLM2-135M-Instruct.Q4_1-b179c9523d0e"
ap = argparse.ArgumentParser()
pair_arguments(ap)
target, tokenizer, head, _ = load_pair(ap.parse_args(["--target", TARGET, "--draft", "data/models/smollm2/draft",
                                                      "--dtype", "float32"]))
started = time.perf_counter()
seqs = continuation_data(target, tokenizer, "data/prompts/smollm2_train.jsonl", 256, 32, temperature=0.0)
spent = {"continuations": time.perf_counter() - started, "features": 0.0, "grid": 0.0}
collect, add = confidence.collect_features, confidence.Calibration.add


def timed_collect(*args, **kwargs):
    began = time.perf_counter()
    out = collect(*args, **kwargs)
    spent["features"] += time.perf_counter() - began
    return out


def timed_add(self, *args, **kwargs):
    began = time.perf_counter()
    add(self, *args, **kwargs)
    spent["grid"] += time.perf_counter() - began


confidence.collect_features, confidence.Calibration.add = timed_collect, timed_add
started = time.perf_counter()
report = confidence.fit_confidence(head, target, seqs, 5, 10)
spent["fit"] = time.perf_counter() - started
print(json.dumps({"seconds": spent, "confidence_temperature": report["confidence_temperature"],
                  "bce_per_event_fitted": report["bce_per_event_fitted"], "steps": report["steps"]}))
