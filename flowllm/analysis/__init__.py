"""Runs as pandas dataframes, for a notebook: ``load(path, ...)`` reads run folders (a sweep folder too).

    from flowllm import analysis
    frames = analysis.load("runs/multirun/2026-12-04/10-00-00")
    frames.tasks.groupby("model")["correct"].mean()

pandas is an optional dependency (``pip install "flowllm[analysis]"``); without it ``load`` raises
``AnalysisUnavailable`` with that command.
"""

from flowllm.analysis.frames import AnalysisUnavailable, Frames, find_runs, load

__all__ = ["AnalysisUnavailable", "Frames", "find_runs", "load"]
