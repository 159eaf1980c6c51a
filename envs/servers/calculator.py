"""The calculator MCP server: the tool the embedded default model learns to use.

`evaluate()` walks the expression's AST and allows only numbers, + - * / // % ** and
parentheses, so nothing can reach names, attributes or calls (no `eval`). Work is bounded: the
expression length is capped and `**` refuses results wider than MAX_RESULT_BITS before
computing them, so `9**9**9` fails at once instead of hanging. Integers stay exact; `/` gives an
int when the division is exact, else a float shown with 12 significant digits.

Run: `python -m envs.servers.calculator` (stdio, what the manifest uses) or
`python -m envs.servers.calculator --transport streamable-http --port 8000` (URL `/mcp`).
`--latency-ms 200` makes every call take that much longer (benchmarks: a slow tool, same schema).
"""
from __future__ import annotations

import argparse
import asyncio
import ast
import math
import operator
from collections.abc import Callable

from envs.servers.stdio import serve

MAX_EXPRESSION_CHARS = 500
MAX_RESULT_BITS = 4096  # ~1233 decimal digits: longer than any answer a model should read
FLOAT_DIGITS = 12


class CalculatorError(ValueError):
    """The expression is not allowed or cannot be computed; the message is shown to the model."""


def _true_divide(a: int | float, b: int | float) -> int | float:
    # Exact integer division stays an int (and exact for huge ints, unlike float division).
    if isinstance(a, int) and isinstance(b, int) and b != 0 and a % b == 0:
        return a // b
    return a / b


def _power(base: int | float, exp: int | float) -> int | float:
    # bits(base**exp) ~= exp * log2(base): refuse before computing, not after.
    if isinstance(exp, int) and abs(base) > 1 and abs(exp) * math.log2(abs(base)) > MAX_RESULT_BITS:
        raise CalculatorError("result too large")
    result = base ** exp
    if isinstance(result, complex):
        raise CalculatorError("result is not a real number")
    return result


BINARY_OPS: dict[type, Callable] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: _true_divide,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}
UNARY_OPS: dict[type, Callable] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def evaluate(expression: str) -> int | float:
    """Evaluate an arithmetic expression safely.

    Raises:
        CalculatorError: syntax error, a disallowed construct, division by zero, or a result
            too large.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"invalid expression: {expression!r}") from None
    try:
        return _eval(tree.body)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("result too large") from None


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # bool is not a number
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY_OPS:
        result = BINARY_OPS[type(node.op)](_eval(node.left), _eval(node.right))
    elif isinstance(node, ast.UnaryOp) and type(node.op) in UNARY_OPS:
        result = UNARY_OPS[type(node.op)](_eval(node.operand))
    else:
        raise CalculatorError(f"unsupported syntax: {ast.unparse(node)!r} (use numbers, "
                              "+ - * / // % ** and parentheses)")
    # Products of big ints can also grow past the cap (each factor under it).
    if isinstance(result, int) and result.bit_length() > MAX_RESULT_BITS:
        raise CalculatorError("result too large")
    return result


def format_number(value: int | float) -> str:
    """Ints exactly; integral floats as ints; other floats with FLOAT_DIGITS significant digits."""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise CalculatorError("result is not a finite number")
        if value.is_integer() and abs(value) < 2**53:
            return str(int(value))
        return format(value, f".{FLOAT_DIGITS}g")
    return str(value)


def build_server(latency_s: float = 0.0):
    """The MCP server object (imported lazily so `evaluate` works without the server stack).

    `latency_s` delays every answer (without blocking other calls), to stand in for a slow tool.
    """
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    # WARNING: model mistakes are routine in RL; logging each at INFO would flood the log file.
    server = MCPServer("calculator", log_level="WARNING")

    # async: a sync tool would run in a worker thread per call; evaluate() is bounded and fast.
    @server.tool()
    async def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / // % ** and parentheses."""
        if latency_s:
            await asyncio.sleep(latency_s)
        try:
            return format_number(evaluate(expression))
        except CalculatorError as err:
            raise ToolError(str(err)) from None

    return server


def main() -> None:
    parser = argparse.ArgumentParser(description="Calculator MCP server.")
    parser.add_argument("--transport", choices=["stdio", "streamable-http", "sse"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay every answer (benchmarks)")
    args = parser.parse_args()
    server = build_server(args.latency_ms / 1000)
    serve(server, args.transport, args.host, args.port)  # stdio without the SDK's per-message thread hops


if __name__ == "__main__":
    main()
