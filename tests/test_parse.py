"""Reading replies: markers in the middle of a thought, JSON actions followed by prose, quoted
brackets in tool input."""

from __future__ import annotations

import json

import pytest

from whetstone.engine.runtime.parse import Parsed, ReplyRules, output_is_answer, parse_reply
from whetstone.engine.types import Completion

TOOLS = ["calculator", "python", "search"]


def parse(text: str) -> Parsed:
    return parse_reply(Completion(text=text), ReplyRules(tool_names=TOOLS, plain_is_answer=False))


def test_final_answer_mentioned_in_a_thought_does_not_swallow_the_action() -> None:
    p = parse("Thought: To reach the final answer: I need 17*23.\nAction: calculator[17*23]")
    assert p.kind == "action" and p.calls[0].arguments == "17*23"
    assert p.thought.startswith("To reach the final answer")


def test_final_answer_stops_before_a_following_action_or_observation() -> None:
    assert parse("Final Answer: 42\nAction: calculator[1+1]").answer == "42"
    assert parse("**Final Answer:** 7\nObservation: ok").answer == "7"


def test_mid_sentence_final_answer_still_counts_without_an_action() -> None:
    p = parse("So the final answer: 12")
    assert p.kind == "answer" and p.answer == "12"


def test_json_action_followed_by_text_with_braces() -> None:
    p = parse('Action: {"name": "calculator", "arguments": {"expression": "1+1"}}\n'
              "I expect the result in {braces}.")
    assert p.kind == "action" and p.calls[0].name == "calculator"
    assert p.calls[0].arguments == '{"expression": "1+1"}'


@pytest.mark.parametrize(("text", "arguments"), [
    ('Action: python[print("]")]', 'print("]")'),
    ("Action: python[x = ']'; print(x)]", "x = ']'; print(x)"),
    ("Action: search[what's up]", "what's up"),  # an apostrophe is not a quote to pair
    ("Action: calculator[(2+3)*[4]]", "(2+3)*[4]"),
])
def test_brackets_inside_quotes_do_not_close_the_input(text: str, arguments: str) -> None:
    p = parse(text)
    assert p.kind == "action" and p.calls[0].arguments == arguments


@pytest.mark.parametrize(("text", "name", "arguments"), [
    ("Action: `calculator[2+3]`", "calculator", "2+3"),      # in backticks
    ("Action: calculator: 2+3", "calculator", "2+3"),        # a colon instead of brackets
    ("Action: calculator\nAction Input: 2+3", "calculator", "2+3"),
])
def test_common_action_variants(text: str, name: str, arguments: str) -> None:
    p = parse(text)
    assert p.kind == "action" and (p.calls[0].name, p.calls[0].arguments) == (name, arguments)


@pytest.mark.parametrize("text", ["Action: Final Answer\nAction Input: 42",
                                  "Action: final_answer[42]"])
def test_final_answer_written_as_an_action_is_the_answer(text: str) -> None:
    p = parse(text)
    assert p.kind == "answer" and p.answer == "42"


def parse_code(text: str) -> Parsed:
    return parse_reply(Completion(text=text), ReplyRules(tool_names=TOOLS, code_tool="python"))


@pytest.mark.parametrize("text", [
    "```python\n{'name': 'calculator', 'arguments': {'expression': '17 * 23'}}\n```",
    '```py\n# the tool\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n```',
    '```python\n[{"name": "calculator", "arguments": {"expression": "17 * 23"}}]\n```',
    "```python\nprint({'tool': 'calculator', 'args': {'expression': '17 * 23'}})\n```",
    ('<tool_call>\n{"function": {"name": "calculator", "arguments": {"expression": "17 * 23"}}}'
     '\n</tool_call>'),
    "Action: {'name': 'calculator', 'arguments': {'expression': '17 * 23'}}",
])
def test_a_call_object_is_a_call_wherever_it_stands(text: str) -> None:
    p = parse_code(text)
    assert p.kind == "action" and [c.name for c in p.calls] == ["calculator"]
    assert json.loads(p.calls[0].arguments) == {"expression": "17 * 23"}
    # In a python fence it is written as a program: its result answers when it ends the reply.
    assert p.ends_with_program is ("```py" in text)


def test_data_inside_a_program_is_not_a_call() -> None:
    # An object of an unknown tool in code that computes is the program's data.
    text = ("```python\nrows = [{'name': 'Ann', 'args': {'age': 3}}]\n"
            "print(sum(r['args']['age'] for r in rows))\n```")
    p = parse_code(text)
    assert p.kind == "action" and [c.name for c in p.calls] == ["python"]
    assert p.ends_with_program


@pytest.mark.parametrize(("output", "answers"), [
    ("391", True),
    ("The total is 260 sheep.", True),
    ("{'apples': 3, 'pears': 4}", True),  # a dict, not a call
    ("[1, 2, 3]", True),
    ("{'name': 'calculator', 'arguments': {'expression': '17 * 23'}}", False),
    ('{"name": "calculator", "arguments": {"expression": "17 * 23"}}', False),
    ("calculator(expression='17 * 23')", False),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>', False),
    ("Action: calculator[17 * 23]", False),
    ("None", False),
    ("<function area at 0x7f3a2c1e0d30>", False),
    ("<__main__.Farm object at 0x7f3a2c1e0d30>", False),
    ("   ", False),
])
def test_a_programs_output_is_an_answer_only_when_it_is_one(output: str, answers: bool) -> None:
    assert output_is_answer(output, TOOLS) is answers


def test_a_python_set_literal_in_a_call_is_read_not_a_crash() -> None:
    """The 0.5B wrote ``{"code", "..."}`` (a set) as a call's arguments on a BIG-bench task;
    json.dumps raised inside the think node and the task failed (a TypeError, not a reply)."""
    from whetstone.engine.replies import json_safe, parse_call_arguments

    text = "```python\n{'name': 'python', 'arguments': {'code', 'print(1)'}}\n```"
    parsed = parse(text)
    assert parsed.calls and parsed.calls[0].name == "python"
    assert json.loads(parsed.calls[0].arguments) == ["code", "print(1)"]
    assert parse_call_arguments("{'a': {1, 2}, 'b': (3, b'x'), 'c': 1j}") == {
        "a": [1, 2], "b": [3, "x"], "c": "1j"}
    assert json_safe({1: {frozenset({2})}}) == {"1": [[2]]}


@pytest.mark.parametrize("text", [
    'Final Answer: price_of(name="Amber Kettle")',
    "I will call price_of('Amber Kettle') to find it.",
    'price_of(name="Amber Kettle")',
])
def test_a_python_call_of_an_offered_tool_in_plain_text_is_a_call(text: str) -> None:
    # The 0.5B wrote its workflow's call as text in its final answer, which was taken as the
    # run's answer (issue 46).
    parsed = parse_reply(Completion(text=text), ReplyRules(tool_names=["price_of", "python"]))
    assert parsed.kind == "action", parsed
    assert parsed.calls[0].name == "price_of"
    args = parsed.calls[0].arguments
    assert args == "Amber Kettle" or json.loads(args) == {"name": "Amber Kettle"}


def test_a_python_call_of_a_tool_not_offered_stays_text() -> None:
    parsed = parse_reply(Completion(text='Final Answer: price_of(name="Amber Kettle")'),
                         ReplyRules(tool_names=["python"]))
    assert parsed.kind == "answer"
