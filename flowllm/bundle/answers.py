"""Ground truth out of a bundle, and back in for a check: what a published bundle must not carry (GAIA's terms
forbid publishing its answers) is replaced by the hash of the normalised answer.

The normalisation is GAIA's: a number compared as a number (``$``, ``%`` and ``,`` dropped), a list item by item,
text without white space, case and punctuation. Two answers GAIA's rule calls equal usually hash alike; a fuzzy
scorer (a judge, F1) can only be checked against the dataset itself (``flowllm verify --dataset``).
A short answer's hash can be found by trying candidates: the hash hides an answer from a reader, not from a
search.
"""

from __future__ import annotations

import hashlib
from typing import Any

from flowllm.datasets.gaia import normalize_number_str, normalize_str, split_string

__all__ = ["GROUND_TRUTH_KEYS", "answer_hash", "normalised_answer", "strip_answers"]

HASH_PREFIX = "flowllm-ground-truth-v1:"
# The keys that carry a task's answer in a run's records: result.json's, and the judge's verdict.json.
GROUND_TRUTH_KEYS = frozenset({"ground_truth", "target", "expected", "reference"})


def _item(text: str) -> str:
    number = normalize_number_str(text)
    return repr(number) if number is not None else normalize_str(text, remove_punct=False)


def normalised_answer(text: str) -> str:
    """``text`` as GAIA's rule compares it."""
    number = normalize_number_str(text)
    if number is not None:
        return repr(number)
    if any(char in text for char in (",", ";")):
        return ",".join(_item(part) for part in split_string(text))
    return normalize_str(text)


def answer_hash(text: str | None) -> str | None:
    """The SHA-256 of the normalised answer; None for no answer."""
    if text is None:
        return None
    return hashlib.sha256((HASH_PREFIX + normalised_answer(str(text))).encode()).hexdigest()


def strip_answers(value: Any) -> Any:
    """``value`` with every ground-truth field (at any depth) set to None."""
    if isinstance(value, dict):
        return {k: (None if k in GROUND_TRUTH_KEYS else strip_answers(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [strip_answers(v) for v in value]
    return value
