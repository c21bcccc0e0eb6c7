"""rllab.rollout.tools: the call formats, the parser and tool_step's answers to every kind of turn."""

from __future__ import annotations

import asyncio
import json

import pytest

from rllab.rollout.environment import Step
from rllab.models.tokenizer import CHARACTERS
from rllab.rollout.tools import (
    FORMATS, Tool, ToolCall, ToolCallParseError, ToolDefinitionError, format_tool_call, parse_tool_calls, run_step,
    tool, tool_map, tool_step,
)


def add(a: int, b: int = 0):
    """Add two integers."""
    return int(a) + int(b)


def calc(expression: str):
    """Evaluate an expression."""
    return eval(expression, {"__builtins__": {}})  # test tool only


def boom(x: str):
    raise ZeroDivisionError(f"cannot {x}")


async def slow_echo(text: str):
    await asyncio.sleep(0.01)
    return f"echo {text}"


TOOLS = [tool(add), tool(calc), tool(boom), tool(slow_echo, name="echo")]


def step(text, **kw):
    return run_step(tool_step(text, TOOLS, **kw))


# --------------------------------------------------------------------------- definitions


def test_tool_from_a_function_reads_its_signature_and_docstring():
    t = tool(add)
    assert t.name == "add" and t.description == "Add two integers."
    assert t.parameters == {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"],
    }
    assert t.schema() == {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": t.parameters}}
    assert t.parameter_names == ("a", "b")


def test_bad_tool_definitions_are_refused_by_name():
    with pytest.raises(ToolDefinitionError, match="'2x' is not an identifier"):
        Tool(name="2x", function=add)
    with pytest.raises(ToolDefinitionError, match="required parameters \\['c'\\]"):
        Tool(name="f", function=add, parameters={"type": "object", "properties": {"a": {}}, "required": ["c"]})
    with pytest.raises(ToolDefinitionError, match="two tools are named 'add'"):
        tool_map([tool(add), tool(add)])
    with pytest.raises(ToolDefinitionError, match="expected rllab.rollout.tools.Tool"):
        tool_map([add])
    with pytest.raises(ToolDefinitionError, match="\\*args"):
        tool(lambda *xs: 0, name="f")


def test_the_compact_format_is_in_the_tiny_models_alphabet():
    assert set("<>(),_") <= set(CHARACTERS)


# --------------------------------------------------------------------------- parsing


def test_hermes_calls_parse_with_keyword_arguments_in_order():
    text = 'think first <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n<tool_call>\n{"name": "calc", "arguments": "{\\"expression\\": \\"2*3\\"}"}\n</tool_call>'
    calls = parse_tool_calls(text)
    assert calls == [
        ToolCall(name="add", arguments={"a": 1, "b": 2}, format="hermes"),
        ToolCall(name="calc", arguments={"expression": "2*3"}, format="hermes"),
    ]
    assert parse_tool_calls('<tool_call>{"name": "add"}</tool_call>') == [ToolCall(name="add", arguments={})]


def test_compact_calls_parse_with_positional_strings():
    calls = parse_tool_calls("<calc(123*45)> and <add(1, 2)><f()>")
    assert [(c.name, c.positional, c.format) for c in calls] == [
        ("calc", ("123*45",), "compact"), ("add", ("1", "2"), "compact"), ("f", (), "compact"),
    ]


def test_format_tool_call_is_the_parsers_inverse():
    for fmt in FORMATS:
        text = format_tool_call("add", {"a": 1, "b": 2}, format=fmt)
        (call,) = parse_tool_calls(text)
        assert tool(add).bind(call) == ({"a": 1, "b": 2} if fmt == "hermes" else {"a": "1", "b": "2"})
    assert format_tool_call("calc", ["12*3"]) == "<calc(12*3)>"
    with pytest.raises(ValueError, match="must be one of"):
        format_tool_call("calc", ["1"], format="xml")


def test_a_turn_without_a_call_parses_to_nothing():
    assert parse_tool_calls("5535") == []
    assert parse_tool_calls("3 > 2 and 1 < 2") == []  # '<' not followed by a letter
    assert parse_tool_calls("<calc(1)>", formats=["hermes"]) == []


@pytest.mark.parametrize(
    "text, match",
    [
        ('<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>', "invalid JSON"),
        ("<tool_call>[1, 2]</tool_call>", 'string "name"'),
        ('<tool_call>{"name": "add", "arguments": [1]}</tool_call>', "must be an object"),
        ('<tool_call>{"name": "add", "arguments": "a=1"}</tool_call>', "not JSON"),
        ('<tool_call>{"name": "add"}', "without its closing"),
        ("<calc 12*3>", "must read <name\\(arguments\\)>"),
        ("<calc(12*3>", "must read"),
    ],
)
def test_malformed_calls_raise_a_parse_error_saying_why(text, match):
    with pytest.raises(ToolCallParseError, match=match):
        parse_tool_calls(text)


def test_unknown_formats_are_refused():
    with pytest.raises(ValueError, match="non-empty selection of \\['hermes', 'compact'\\]"):
        parse_tool_calls("x", formats=["json"])


# --------------------------------------------------------------------------- tool_step


def test_a_call_becomes_a_tool_observation_with_counted_metrics():
    s = step("<calc(123*45)>")
    assert s == Step(observation="5535", role="tool", metrics={"tool_calls": 1, "tool_errors": 0, "parse_failures": 0})
    s = step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call><calc(1+1)>', wrap="={};")
    assert s.observation == "=42\n2;" and not s.done and s.reward == 0.0


def test_a_turn_without_a_call_is_left_to_the_environment():
    assert step("5535") is None


def test_non_string_results_are_json():
    t = Tool(name="info", function=lambda: {"k": [1, 2]})
    assert json.loads(run_step(tool_step("<info()>", [t])).observation) == {"k": [1, 2]}


def test_an_unknown_tool_is_an_error_observation_listing_the_tools():
    s = step("<sqrt(4)>")
    assert s.observation == "error: unknown tool 'sqrt' (tools: add, boom, calc, echo)"
    assert s.metrics == {"tool_calls": 1, "tool_errors": 1, "parse_failures": 0} and not s.done


def test_a_raising_tool_is_an_error_observation_with_the_exception_text():
    s = step("<boom(divide)>")
    assert s.observation == "error: boom raised ZeroDivisionError: cannot divide"
    assert s.metrics["tool_errors"] == 1
    s = step("<add(1, 2, 3)>")
    assert s.observation == "error: add raised TypeError: takes 2 argument(s) (a, b), got 3"
    s = step('<tool_call>{"name": "add", "arguments": {"b": 1}}</tool_call>')
    assert s.observation == "error: add raised TypeError: missing required argument(s) ['a']"
    s = step('<tool_call>{"name": "add", "arguments": {"a": 1, "c": 1}}</tool_call>')
    assert "unknown argument(s) ['c']" in s.observation


def test_a_malformed_call_is_an_error_observation_or_the_configured_penalty():
    s = step("<calc 1+1>")
    assert s.observation.startswith("error: malformed tool call: a call must read")
    assert s.metrics == {"tool_calls": 0, "tool_errors": 0, "parse_failures": 1} and not s.done and s.role == "tool"
    s = step("<tool_call>{oops}</tool_call>", failed_parse_reward=-0.5)
    assert s == Step(reward=-0.5, done=True, metrics={"tool_calls": 0, "tool_errors": 0, "parse_failures": 1})


def test_terse_errors_name_the_kind_only():
    for text, obs in [("<calc 1>", "error: malformed call"), ("<sqrt(1)>", "error: unknown tool"), ("<boom(x)>", "error: tool failed")]:
        assert step(text, terse_errors=True).observation == obs


def test_a_malformed_call_runs_none_of_the_turns_calls():
    ran = []
    t = Tool(name="log", function=lambda x: ran.append(x), parameters={"type": "object", "properties": {"x": {}}})
    s = run_step(tool_step("<log(1)> <log 2>", [t]))
    assert ran == [] and s.metrics["parse_failures"] == 1


def test_async_tools_are_awaited_together():
    async def main():
        t0 = asyncio.get_running_loop().time()
        steps = await asyncio.gather(*(tool_step(f"<echo({i})><echo(x{i})>", TOOLS) for i in range(20)))
        return steps, asyncio.get_running_loop().time() - t0

    steps, took = asyncio.run(main())
    assert [s.observation for s in steps] == [f"echo {i}\necho x{i}" for i in range(20)]
    assert took < 0.2  # 40 sleeps of 10 ms, concurrently


def test_plain_tools_answer_at_once_and_async_ones_with_an_awaitable():
    s = tool_step("<add(1,2)><calc(3)>", TOOLS)
    assert isinstance(s, Step) and s.observation == "3\n3" and run_step(s) is s
    pending = tool_step("<add(1,2)><echo(hi)><sqrt(1)>", TOOLS)
    assert not isinstance(pending, Step)
    assert run_step(pending).observation == "3\necho hi\nerror: unknown tool 'sqrt' (tools: add, boom, calc, echo)"


def test_an_async_tool_that_raises_is_an_error_observation():
    async def fail(x: str):
        await asyncio.sleep(0)
        raise KeyError(x)

    s = run_step(tool_step("<fail(k)>", [tool(fail)]))
    assert s.observation == "error: fail raised KeyError: 'k'" and s.metrics["tool_errors"] == 1
