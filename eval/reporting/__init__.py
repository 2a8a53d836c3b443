"""From answers to figures: speed metrics, W&B tracking, the report, the rule zoo and the paper's experiments."""
