"""Run directories on disk: their layout and files (`layout`), and the one JSONL reader (`jsonl`)."""
