"""The judge prompts, one per published grader, and how each one's reply is read.

* ``browsecomp``: the BrowseComp grader (openai/simple-evals ``browsecomp_eval.py``): the judge extracts the
  response's final answer, reasons about it against the correct answer and ends with ``correct: yes|no`` and a
  ``confidence``.
* ``hle``: Humanity's Last Exam's judge (centerforaisafety/hle ``run_judge_results.py``), the same four fields
  (BrowseComp's grader was derived from it); HLE asks for them as structured output, here they are read from
  the text, which every provider can give.
* ``simpleqa``: the SimpleQA grader (simple-evals ``simpleqa_eval.py``): one letter, A (CORRECT), B (INCORRECT)
  or C (NOT_ATTEMPTED).

A reply without a verdict is a parse failure, never a guess: the reference code falls back to "not attempted"
(SimpleQA) or "no" (BrowseComp); flowllm records a scoring error for the task instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from flowllm.core.registry import Registry


class Verdict(StrEnum):
    CORRECT = "correct"
    INCORRECT = "incorrect"
    NOT_ATTEMPTED = "not_attempted"


@dataclass(frozen=True)
class JudgeTemplate:
    name: str
    prompt: str  # str.format fields: question, response, correct_answer
    parse: Callable[[str], Verdict | None]

    def render(self, *, question: str, response: str, correct_answer: str) -> str:
        return self.prompt.format(question=question, response=response, correct_answer=correct_answer)


_YES_NO_PROMPT = """\
Judge whether the following [response] to [question] is correct or not, based on the precise and unambiguous \
[correct_answer] below.

[question]: {question}

[response]: {response}

Your judgement must follow the format and criteria below:

extracted_final_answer: the final exact answer extracted from the [response]. Write 'None' if there is no \
exact, final answer to extract from the response.

[correct_answer]: {correct_answer}

reasoning: explain why the extracted_final_answer is correct or incorrect given [correct_answer], looking only \
at whether there are meaningful differences between [correct_answer] and the extracted_final_answer. Do not \
comment on the background of the problem, do not try to solve it, do not argue for any answer other than \
[correct_answer]; only decide whether the answers match.

correct: answer 'yes' if extracted_final_answer matches the [correct_answer] above, or is within a small margin \
of error for numerical problems. Answer 'no' otherwise, i.e. if there is any inconsistency, ambiguity or \
non-equivalency, or if the extracted answer is incorrect.

confidence: the confidence score between 0% and 100% given in the [response]; 100 if it gives none.
"""

_HLE_PROMPT = """\
Judge whether the following [response] to [question] is correct or not, based on the precise and unambiguous \
[correct_answer] below.

[question]: {question}

[response]: {response}

Your judgement must follow the format and criteria below:

extracted_final_answer: the final exact answer extracted from the [response]. Write 'None' if there is no \
exact, final answer to extract from the response.

[correct_answer]: {correct_answer}

reasoning: explain why the extracted_final_answer is correct or incorrect given [correct_answer], looking only \
at whether there are meaningful differences between [correct_answer] and the extracted_final_answer. Do not \
comment on the background of the problem, do not try to solve it, do not argue for any answer other than \
[correct_answer]; only decide whether the answers match.

correct: answer 'yes' if extracted_final_answer matches the [correct_answer] above, or is within a small margin \
of error for numerical problems. Answer 'no' otherwise, i.e. if there is any inconsistency, ambiguity or \
non-equivalency, or if the extracted answer is incorrect.

confidence: the extracted confidence score between 0% and 100% from the [response]; 100 if it gives none.

Write each of the four fields on its own line, as `name: value`.
"""

_SIMPLEQA_PROMPT = """\
Your job is to look at a question, a gold target and a predicted answer, and then assign a grade of either \
["CORRECT", "INCORRECT", "NOT_ATTEMPTED"].

- CORRECT: the predicted answer fully contains the important information of the gold target and contradicts \
none of it. Hedging and guessing are allowed as long as the gold target is fully included and nothing \
contradicts it; capitalization, punctuation, grammar and order do not matter.
- INCORRECT: a factual statement in the predicted answer contradicts the gold target, including a hedged one \
("I think it is X, but I am not sure" when X is wrong) and answers that list several candidates of which one \
is wrong.
- NOT_ATTEMPTED: the important information of the gold target is not in the predicted answer, and nothing in it \
contradicts the gold target (for example "I don't know", or a refusal).

Also note: a number must be correct to the last significant figure of the gold target; the predicted answer \
may leave out information the question makes obvious; misspelled names are fine when it is clearly the same \
name.

Here is a new example. Simply reply with either CORRECT, INCORRECT or NOT_ATTEMPTED. Don't apologize or correct \
yourself if there was a mistake; we are just trying to grade the answer.
```
Question: {question}
Gold target: {correct_answer}
Predicted answer: {response}
```

Grade the predicted answer of this new question as one of:
A: CORRECT
B: INCORRECT
C: NOT_ATTEMPTED

Just return the letters "A", "B", or "C", with no text around it.
"""

_CORRECT_LINE = re.compile(r"^[\s*_#>-]*correct[\s*_]*:[\s*_]*(yes|no)\b", re.IGNORECASE | re.MULTILINE)
_LETTER = re.compile(r"^[\s*_(\[\"']*([ABC])(?![A-Za-z])")
_GRADE_WORD = re.compile(r"\b(NOT_ATTEMPTED|INCORRECT|CORRECT)\b")
_LETTERS = {"A": Verdict.CORRECT, "B": Verdict.INCORRECT, "C": Verdict.NOT_ATTEMPTED}


def parse_yes_no(reply: str) -> Verdict | None:
    """The ``correct: yes|no`` line (the last one, if the judge wrote the format out before using it)."""
    found = _CORRECT_LINE.findall(reply)
    if not found:
        return None
    return Verdict.CORRECT if found[-1].lower() == "yes" else Verdict.INCORRECT


def parse_letter(reply: str) -> Verdict | None:
    """SimpleQA's grade: a leading A, B or C, or the grade spelled out (one kind only)."""
    letter = _LETTER.match(reply)
    if letter:
        return _LETTERS[letter.group(1)]
    words = set(_GRADE_WORD.findall(reply))
    if len(words) == 1:
        return {"CORRECT": Verdict.CORRECT, "INCORRECT": Verdict.INCORRECT}.get(words.pop(), Verdict.NOT_ATTEMPTED)
    return None


def _template(name: str, loaded: Any) -> JudgeTemplate:
    if not isinstance(loaded, JudgeTemplate):
        raise TypeError(f"expected a flowllm.scoring.templates.JudgeTemplate, got {loaded!r}")
    return loaded


# judge.template; a plug-in adds one under ``flowllm.judge_templates``.
TEMPLATES: Registry[JudgeTemplate] = Registry(
    "judge.template",
    {
        "browsecomp": JudgeTemplate("browsecomp", _YES_NO_PROMPT, parse_yes_no),
        "hle": JudgeTemplate("hle", _HLE_PROMPT, parse_yes_no),
        "simpleqa": JudgeTemplate("simpleqa", _SIMPLEQA_PROMPT, parse_letter),
    },
    group="flowllm.judge_templates",
    adapt=_template,
)
