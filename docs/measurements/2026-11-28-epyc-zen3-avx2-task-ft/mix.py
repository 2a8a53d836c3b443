"""The fine-tune's prompts: every task prompt and a third as many of the general training prompts (a quarter of
the mix), shuffled together (seed 0). Paths as run on 2026-11-28 (/work/s63/ft)."""
import json
import random

with open("/work/s63/ft/task_prompts.jsonl") as f:
    task = [json.loads(line) for line in f]
with open("/work/main/data/prompts/smollm2_train.jsonl") as f:
    general_all = [json.loads(line) for line in f]
rng = random.Random(0)
general = rng.sample(general_all, len(task) // 3)
mix = task + general
rng.shuffle(mix)
with open("/work/s63/ft/mix_prompts.jsonl", "w") as f:
    for record in mix:
        f.write(json.dumps(record) + "\n")
print(len(task), len(general), len(mix))
