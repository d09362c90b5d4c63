"""Safe arithmetic: parse an expression with ``ast`` and evaluate only what a calculator needs.

No ``eval``: the expression is parsed into a syntax tree and every node is checked against a whitelist
(numbers, arithmetic and comparison operators, a fixed table of math functions and constants). Attribute
access, subscripts, names outside the table, lambdas and comprehensions are refused. Results that would take
unbounded time or memory (``9**9**9``, ``factorial(10**6)``) are refused before they are computed.

``tool-math`` (``flowllm.tools.math``) serves ``evaluate`` over MCP; the logic lives here, in a module whose
name cannot be confused with the standard library's ``math``.
"""

from __future__ import annotations

import ast
import math
import operator
import time
from collections.abc import Callable
from typing import Any

MAX_EXPRESSION_CHARS = 2000
MAX_INT_BITS = 14_000  # about 4,200 decimal digits (under Python's 4,300-digit str() limit)
MAX_FACTORIAL_N = 1_500
MAX_NESTING = 60
MAX_ROUND_DIGITS = 4_400  # round(x, n) beyond any int's or float's digits only costs time (10**n is built)
MAX_SECONDS = 5.0  # the whole evaluation; below tool-math's per-call timeout so it is the one that reports

Number = int | float


class CalculationError(ValueError):
    """The expression is not allowed or cannot be evaluated; the message says why, for the model."""


def _check_int(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise CalculationError(f"the result has more than {MAX_INT_BITS:,} bits; use floats (e.g. 2.0**x) instead")
    return value


def _pow(base: Any, exp: Any) -> Any:
    exact = isinstance(base, int) and isinstance(exp, int)
    # bit_length(base**exp) is about exp * log2(|base|): refuse before spending the time.
    if exact and exp > 0 and abs(base) > 1 and exp * math.log2(abs(base)) > MAX_INT_BITS:
        raise CalculationError(
            f"{base}**{exp} is too large to compute exactly (over {MAX_INT_BITS:,} bits); "
            "use a float base such as 2.0 for an approximation"
        )
    if isinstance(base, float | int) and isinstance(exp, float | int) and not exact:
        return math.pow(base, exp)  # raises OverflowError/ValueError instead of returning a complex number
    return base**exp


def _factorial(n: Any) -> int:
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise CalculationError("factorial() needs a non-negative integer")
    if n > MAX_FACTORIAL_N:
        raise CalculationError(f"factorial() is limited to n <= {MAX_FACTORIAL_N}; use lgamma(n + 1) for logs")
    return math.factorial(n)


def _bounded_comb(fn: Callable[[int, int], int]) -> Callable[[int, int], int]:
    def wrapped(n: int, k: int) -> int:
        if isinstance(n, int) and n > 100_000:
            raise CalculationError("comb()/perm() are limited to n <= 100000")
        if isinstance(n, int) and isinstance(k, int) and 0 <= k <= n:
            # log2 of the result, from lgamma, before computing it (comb(100000, 50000) takes seconds).
            log_result = math.lgamma(n + 1) - math.lgamma(n - k + 1)
            if fn is math.comb:
                log_result -= math.lgamma(k + 1)
            if log_result / math.log(2) > MAX_INT_BITS:
                raise CalculationError(f"the result has more than {MAX_INT_BITS:,} bits; use lgamma() for logs")
        return fn(n, k)

    return wrapped


def _lcm(*args: int) -> int:
    result = 1
    for value in args:  # one at a time, each checked: a product of many large arguments grows without bound
        result = _check_int(math.lcm(result, value))
    return result


def _log(x: Number, base: Number | None = None) -> float:
    return math.log(x) if base is None else math.log(x, base)


def _round(x: Number, ndigits: int | None = None) -> Number:
    if ndigits is None:
        return round(x)
    if isinstance(ndigits, int) and abs(ndigits) > MAX_ROUND_DIGITS:
        raise CalculationError(f"round() takes at most {MAX_ROUND_DIGITS:,} digits either way")
    return round(x, ndigits)


def _sum(*args: Any) -> Number:
    values = args[0] if len(args) == 1 and isinstance(args[0], list | tuple) else args
    return sum(values)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "round": _round,
    "min": min,
    "max": max,
    "sum": _sum,
    "pow": _pow,
    "sqrt": math.sqrt,
    "cbrt": math.cbrt,
    "isqrt": math.isqrt,
    "exp": math.exp,
    "log": _log,
    "ln": math.log,
    "log10": math.log10,
    "log2": math.log2,
    "log1p": math.log1p,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "atan2": math.atan2,
    "sinh": math.sinh,
    "cosh": math.cosh,
    "tanh": math.tanh,
    "degrees": math.degrees,
    "radians": math.radians,
    "floor": math.floor,
    "ceil": math.ceil,
    "trunc": math.trunc,
    "fabs": math.fabs,
    "hypot": math.hypot,
    "factorial": _factorial,
    "comb": _bounded_comb(math.comb),
    "perm": _bounded_comb(math.perm),
    "gcd": math.gcd,
    "lcm": _lcm,
    "gamma": math.gamma,
    "lgamma": math.lgamma,
    "erf": math.erf,
}

CONSTANTS: dict[str, Number] = {"pi": math.pi, "e": math.e, "tau": math.tau, "inf": math.inf, "nan": math.nan}

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
    ast.Not: operator.not_,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def _eval(node: ast.AST, depth: int, deadline: float) -> Any:
    if depth > MAX_NESTING:
        raise CalculationError("the expression is nested too deeply")
    if time.monotonic() > deadline:
        # Each operation is bounded (sizes are checked before computing), so checking between them makes the
        # whole evaluation stop on time: no thread keeps computing after the caller gave up.
        raise CalculationError(f"the calculation took longer than {MAX_SECONDS:g} s; simplify it")
    d = depth + 1
    if isinstance(node, ast.Expression):
        return _eval(node.body, d, deadline)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalculationError(f"only numbers are allowed, not {node.value!r}")
        return node.value
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.BitXor):
            raise CalculationError("'^' is not a power operator here; write powers as a ** b")
        op = _BINARY.get(type(node.op))
        if op is None:
            raise CalculationError(f"the operator {type(node.op).__name__} is not supported")
        left, right = _eval(node.left, d, deadline), _eval(node.right, d, deadline)
        if isinstance(left, list) or isinstance(right, list):
            # [0]*300 nested three deep is 27 million cells: lists exist only to pass to sum(), min(), max().
            raise CalculationError("arithmetic on lists is not supported; lists can only be passed to functions")
        return _check_int(op(left, right))
    if isinstance(node, ast.UnaryOp):
        uop = _UNARY.get(type(node.op))
        if uop is None:
            raise CalculationError(f"the operator {type(node.op).__name__} is not supported")
        operand = _eval(node.operand, d, deadline)
        if isinstance(operand, list):
            raise CalculationError("arithmetic on lists is not supported; lists can only be passed to functions")
        return uop(operand)
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, d, deadline) for v in node.values]
        result = values[0]
        for v in values[1:]:
            result = (result and v) if isinstance(node.op, ast.And) else (result or v)
        return result
    if isinstance(node, ast.Compare):
        left = _eval(node.left, d, deadline)
        for op_node, right_node in zip(node.ops, node.comparators, strict=True):
            cmp = _COMPARE.get(type(op_node))
            if cmp is None:
                raise CalculationError(f"the comparison {type(op_node).__name__} is not supported")
            right = _eval(right_node, d, deadline)
            if not cmp(left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id in FUNCTIONS:
            raise CalculationError(f"'{node.id}' is a function: call it, e.g. {node.id}(...)")
        raise CalculationError(f"unknown name '{node.id}'; known constants: {', '.join(CONSTANTS)}")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise CalculationError(f"unknown function '{name}'; available: {', '.join(sorted(FUNCTIONS))}")
        if node.keywords:
            raise CalculationError("keyword arguments are not supported; pass arguments by position")
        args = [_eval(a, d, deadline) for a in node.args]
        return _check_int(FUNCTIONS[node.func.id](*args))
    if isinstance(node, ast.Tuple | ast.List):
        return [_eval(e, d, deadline) for e in node.elts]
    raise CalculationError(f"'{ast.unparse(node)}' is not allowed in a calculation")


def evaluate(expression: str) -> Any:
    """Evaluate ``expression`` safely; raise ``CalculationError`` with a clear message otherwise."""
    text = expression.strip()
    if not text:
        raise CalculationError("the expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculationError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    # Common spellings models use for multiplication and thousands separators are not guessed at: a wrong
    # guess would return a confident wrong number.
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculationError(f"not a valid expression: {exc.msg} (at column {exc.offset})") from None
    except (RecursionError, MemoryError):
        raise CalculationError("the expression is nested too deeply") from None
    try:
        return _eval(tree, 0, time.monotonic() + MAX_SECONDS)
    except CalculationError:
        raise
    except ZeroDivisionError:
        raise CalculationError("division by zero") from None
    except OverflowError:
        raise CalculationError("the result is too large for a float") from None
    except (ValueError, TypeError) as exc:
        raise CalculationError(str(exc)) from None
    except RecursionError:
        raise CalculationError("the expression is nested too deeply") from None


def format_number(value: Any) -> str:
    """The answer as text: exact integers in full, floats in their shortest round-trip form."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(format_number(v) for v in value) + "]"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return str(value)


def calculate(expression: str) -> str:
    """Evaluate and format in one step (what the ``calculate`` tool returns)."""
    return format_number(evaluate(expression))
