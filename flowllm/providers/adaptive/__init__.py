"""Adaptive concurrency (``experiment.max_concurrent=auto``): the calls in flight per provider and model, found
by additive increase and multiplicative decrease (flowllm/providers/adaptive/aimd.py)."""
