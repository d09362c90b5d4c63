"""The benchmark answer sources the web tools refuse by default (``tools.web.block``, flowllm/tools/web/guard.py).

An entry is ``host`` or ``host/path``: the host matches itself and its subdomains, the path matches itself and
what lies below it (``/datasets/gaia-benchmark/GAIA`` covers its file listing, ``/resolve/...`` downloads and
``/viewer``), compared without case. The defaults cover the benchmarks flowllm ships (conf/experiment): each
dataset's pages, file listings and API on Hugging Face (and its mirror), the files the answer keys are published
as, and the leaderboards' dumps of submitted answers.
"""

from __future__ import annotations

# Hugging Face dataset repositories of the shipped benchmarks (conf/experiment/*.yaml source_hint).
_HF_DATASETS = (
    "gaia-benchmark/GAIA",
    "gaia-benchmark/results_public",  # the GAIA leaderboard's submissions, answers included
    "gaia-benchmark/submissions_internal",
    "google/frames-benchmark",
    "cais/hle",
    "callanwu/WebWalkerQA",
    "xbench/DeepSearch",
    "basicv8vc/SimpleQA",  # SimpleQA re-published with its answers
)

DEFAULT_BLOCK: tuple[str, ...] = (
    *(f"huggingface.co/datasets/{name}" for name in _HF_DATASETS),
    *(f"huggingface.co/api/datasets/{name}" for name in _HF_DATASETS),
    *(f"hf-mirror.com/datasets/{name}" for name in _HF_DATASETS),
    "datasets-server.huggingface.co",  # the dataset viewer's API: rows of any dataset, answers included
    "huggingface.co/spaces/gaia-benchmark/leaderboard",
    # SimpleQA's and BrowseComp's answer keys, as simple-evals downloads them.
    "openaipublic.blob.core.windows.net/simple-evals",
)
