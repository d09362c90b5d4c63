"""Runs as pandas dataframes, for a notebook: ``load(path, ...)`` reads run folders (a sweep folder too).

    from flowllm import analysis
    frames = analysis.load("runs/multirun/2026-12-04/10-00-00")
    frames.tasks.groupby("model")["correct"].mean()

pandas is an optional dependency (``pip install "flowllm[analysis]"``); without it ``load`` raises
``AnalysisUnavailable`` with that command. A path holding no run raises ``ExportError``.
"""

from flowllm.analysis.frames import AnalysisUnavailable, Frames, find_runs, load
from flowllm.export.source import ExportError

__all__ = ["AnalysisUnavailable", "ExportError", "Frames", "find_runs", "load"]
