"""tool-math's evaluator: exact answers, clear refusals, and nothing but arithmetic."""

from __future__ import annotations

import pytest

from flowllm.tools import calculator
from flowllm.tools.calculator import CalculationError, calculate


@pytest.mark.parametrize(
    ("expression", "answer"),
    [
        ("1 + 2 * 3", "7"),
        ("(17.5 - 3) * 12 / 7", "24.857142857142858"),
        ("2 ** 100", "1267650600228229401496703205376"),
        ("7 // 2, 7 % 2", "[3, 1]"),
        ("sqrt(16) + log(100, 10)", "6.0"),
        ("round(pi, 4)", "3.1416"),
        ("max(3, 9, 4) - min([2, 5])", "7"),
        ("sum([1, 2, 3.5])", "6.5"),
        ("factorial(20)", "2432902008176640000"),
        ("comb(10, 3)", "120"),
        ("0.1 + 0.2", "0.30000000000000004"),
        ("10 ** -3", "0.001"),
        ("-2 ** 2", "-4"),
        ("3 > 2 >= 2", "true"),
        ("1_000_000 * 3", "3000000"),
        ("1e308 * 10", "inf"),
    ],
)
def test_answers(expression: str, answer: str) -> None:
    assert calculate(expression) == answer


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("2 ^ 8", "write powers as a ** b"),
        ("__import__('os').system('true')", "unknown function"),
        ("().__class__.__bases__", "is not allowed in a calculation"),
        ("open('x')", "unknown function 'open'"),
        ("[x for x in range(3)]", "is not allowed"),
        ("lambda: 1", "is not allowed"),
        ("'abc' * 3", "only numbers are allowed"),
        ("x + 1", "unknown name 'x'"),
        ("sqrt", "'sqrt' is a function"),
        ("1 / 0", "division by zero"),
        ("sqrt(-1)", "math domain error"),
        ("9 ** 9 ** 9", "too large to compute exactly"),
        ("factorial(100000)", "limited to n <= 1500"),
        ("exp(1000)", "too large for a float"),
        ("round(2.5, ndigits=1)", "keyword arguments are not supported"),
        ("1 +", "not a valid expression"),
        ("", "empty"),
        ("abs(" * 100 + "1" + ")" * 100, "nested too deeply"),
        ("1" * 3000, "longer than 2000 characters"),
        # Work bounded before it is done (each of these took seconds and tens of MB).
        ("[[[0]*300]*300]*300", "arithmetic on lists is not supported"),
        ("-[1, 2]", "arithmetic on lists is not supported"),
        ("round(1, -4*10**6)", "round() takes at most 4,400 digits"),
        ("comb(100000, 50000)", "more than 14,000 bits"),
        ("perm(100000, 50000)", "more than 14,000 bits"),
        ("lcm(" + ", ".join([f"7**4900 + {i}" for i in range(40)]) + ")", "more than 14,000 bits"),
    ],
)
def test_refusals_say_why(expression: str, reason: str) -> None:
    with pytest.raises(CalculationError, match=reason.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        calculate(expression)


def test_answers_near_the_bounds_still_come_back() -> None:
    assert calculate("round(123456, -3)") == "123000"
    assert calculate("comb(100000, 3)") == "166661666700000"
    assert calculate("lcm(4, 6, 10)") == "60"


def test_the_evaluation_stops_itself_at_its_time_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    # The budget is checked between operations, each of them bounded: the work ends when the budget does, in
    # the calling thread itself, so nothing keeps computing after a caller's timeout.
    monkeypatch.setattr(calculator, "MAX_SECONDS", -1.0)
    with pytest.raises(CalculationError, match="took longer than"):
        calculate("1 + 1")
