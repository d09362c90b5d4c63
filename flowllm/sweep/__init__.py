"""Sweeps: the summary of a multirun, its statistics and tables."""
