"""Measuring answers: text metrics, HumanEval in the sandbox, the LLM judge, the embedded set's parse rate."""
