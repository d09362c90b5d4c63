"""The scorer registry and the judge's reply parsers."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowllm.datasets.task import Task
from flowllm.errors import ConfigError
from flowllm.scoring import ExactScorer, GaiaScorer, check_scorer, normalize_answer
from flowllm.scoring.templates import TEMPLATES, Verdict, parse_letter, parse_yes_no


def task(answer: str) -> Task:
    return Task("t", "q?", None, answer, None, Path("."))


async def test_gaia_and_exact_scorers() -> None:
    assert (await GaiaScorer().score(task("1,000"), "1000", attempt=1)).correct is False  # GAIA: a list
    assert (await GaiaScorer().score(task("1000"), "$1,000", attempt=1)).correct is True
    assert (await ExactScorer().score(task("The Heron Waltz"), "heron waltz.", attempt=1)).correct is True
    assert (await ExactScorer().score(task("Heron Waltz"), "Heron Polka", attempt=1)).correct is False
    assert (await ExactScorer().score(task("x"), None, attempt=1)).correct is False


def test_an_unknown_scorer_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"dataset\.scorer must be one of gaia, exact, judge"):
        check_scorer("fuzzy")


@given(st.text(max_size=60))
def test_normalisation_is_idempotent(text: str) -> None:
    assert normalize_answer(normalize_answer(text)) == normalize_answer(text)


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("extracted_final_answer: April\nreasoning: same\ncorrect: yes\nconfidence: 90", Verdict.CORRECT),
        ("**correct:** no", Verdict.INCORRECT),
        ("correct: yes|no (format)\n...\ncorrect: no", Verdict.INCORRECT),
        ("The answer looks right to me.", None),
        ("incorrect: yes", None),
    ],
)
def test_yes_no_replies(reply: str, verdict: Verdict | None) -> None:
    assert parse_yes_no(reply) == verdict


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("A", Verdict.CORRECT),
        (" B\n", Verdict.INCORRECT),
        ("C", Verdict.NOT_ATTEMPTED),
        ("NOT_ATTEMPTED", Verdict.NOT_ATTEMPTED),
        ("Always a pleasure.", None),  # simple-evals would find an "A" in it
        ("CORRECT or INCORRECT, hard to say", None),
        ("", None),
    ],
)
def test_simpleqa_letters(reply: str, verdict: Verdict | None) -> None:
    assert parse_letter(reply) == verdict


def test_every_template_shows_the_question_answer_and_truth() -> None:
    for template in TEMPLATES.values():
        text = template.render(question="QQ", response="RR", correct_answer="GG")
        assert "QQ" in text and "RR" in text and "GG" in text
