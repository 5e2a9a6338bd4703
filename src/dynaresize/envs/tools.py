"""Tool calling with tools written as plain Python functions.

The format (the Hermes / Qwen convention, which many chat templates and instruct models know):
a model turn that calls a tool contains one

    <tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>

and the environment answers with the tool's result as a `tool` message (envs.render puts it in
the chat template). A turn without a tool call is the final answer. `tools_prompt` is the
system text that lists the tools (name, parameters, first docstring line) and the format.

A tool is any function (sync or `async def`) with keyword parameters; `Tool.from_function`
reads its name, docstring and signature. An async tool may take wall time (a sandbox, a web
call, `clock.sleep` in tests); the driver awaits it off the engine. A sync tool runs inline and
must be quick (wrap slow sync work with `asyncio.to_thread` in an async tool).
"""

from __future__ import annotations

import ast
import inspect
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class ToolCallError(ValueError):
    """A `<tool_call>` block that is not a valid call (bad JSON, unknown tool, bad args)."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    description: str
    parameters: tuple[str, ...]

    @classmethod
    def from_function(cls, fn: Callable[..., Any], name: str | None = None) -> Tool:
        params = tuple(p.name for p in inspect.signature(fn).parameters.values()
                       if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        doc = (inspect.getdoc(fn) or "").strip().split("\n", 1)[0]
        return cls(name or fn.__name__, fn, doc, params)

    def spec(self) -> dict[str, Any]:
        """The tool as JSON-able data (what `tools_prompt` lists)."""
        return {"name": self.name, "description": self.description,
                "parameters": list(self.parameters)}


def tools_prompt(tools: Sequence[Tool]) -> str:
    """System text: the tools and the call format."""
    lines = ["You can call these tools:"]
    lines += [json.dumps(t.spec()) for t in tools]
    lines.append('To call one, write <tool_call>{"name": NAME, "arguments": {ARG: VALUE}}'
                 "</tool_call> and stop; its result comes back in the next message. "
                 "Without a tool call, your message is the final answer.")
    return "\n".join(lines)


def parse_tool_call(text: str, tools: Mapping[str, Tool]) -> ToolCall | None:
    """The first tool call in `text`, None if there is none; ToolCallError if malformed."""
    found = CALL_RE.search(text)
    if found is None:
        return None
    try:
        data = json.loads(found.group(1))
    except json.JSONDecodeError as exc:
        raise ToolCallError(f"tool call is not JSON: {exc.msg}") from None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise ToolCallError('tool call needs {"name": ..., "arguments": {...}}')
    args = data.get("arguments", {})
    if not isinstance(args, dict):
        raise ToolCallError("tool call arguments must be an object")
    tool = tools.get(data["name"])
    if tool is None:
        raise ToolCallError(f"unknown tool {data['name']!r}; tools: {', '.join(sorted(tools))}")
    unknown = sorted(set(args) - set(tool.parameters))
    if unknown:
        raise ToolCallError(f"tool {tool.name!r} has no parameter(s) {', '.join(unknown)}; "
                            f"parameters: {', '.join(tool.parameters)}")
    return ToolCall(tool.name, dict(args))


async def call_tool(tool: Tool, call: ToolCall) -> str:
    """Run `tool` on `call.arguments`; its result as text (an error becomes 'error: …')."""
    try:
        result = tool.fn(**call.arguments)
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:  # a tool's failure is an observation, not a crash
        return f"error: {type(exc).__name__}: {exc}"
    return result if isinstance(result, str) else json.dumps(result)


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value  # type: ignore[no-any-return]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))  # type: ignore[no-any-return]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is above {MAX_EXPONENT}")
        return _BINARY[type(node.op)](left, right)  # type: ignore[no-any-return]
    raise ValueError(f"not arithmetic: {type(node).__name__}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * / // % ** and parentheses)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    value = _evaluate(ast.parse(expression, mode="eval"))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)
