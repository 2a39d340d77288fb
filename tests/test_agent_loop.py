"""The agent loop a small model can live in (issue 19): every tool-call form the embedded 0.5B
model writes is executed as a call and never returned as the answer; the system prompt stays
short; the loop stops when the model has answered."""

from __future__ import annotations

import json
from typing import Any

import pytest

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.runtime import Agent, RunConfig
from whetstone.engine.types import Trace

TASK = "What is 17 * 23?"
ANSWER = "17 * 23 = 391, so the answer is 391."
CALC = {"name": "calculator", "arguments": {"expression": "17 * 23"}}


def acts(trace: Trace) -> list[Any]:
    return [s for s in trace.steps if s.kind == "act"]


# Each form as the model wrote it (observed on Qwen2.5-Coder-0.5B-Instruct, see
# docs/results.md), and the tool it calls.
FORMS = {
    "tool_call tags": (('<tool_call>\n{"name": "calculator", "arguments": {"expression": '
                       '"17 * 23"}}\n</tool_call>'), "calculator"),
    "tool_call tags, unclosed": (('I will compute it.\n<tool_call>\n{"name": "calculator", '
                                 '"arguments": {"expression": "17 * 23"}}'), "calculator"),
    "bare JSON in prose": (('Let me use the calculator.\n{"name": "calculator", "arguments": '
                           '{"expression": "17 * 23"}}\nThen I will answer.'), "calculator"),
    "json fence": (('To multiply:\n```json\n{"name": "calculator", "arguments": {"expression": '
                   '"17 * 23"}}\n```'), "calculator"),
    "json list": ('[{"name": "calculator", "arguments": {"expression": "17 * 23"}}]',
                  "calculator"),
    "parameters key": ('{"name": "calculator", "parameters": {"expression": "17 * 23"}}',
                       "calculator"),
    "final answer wrapping a call": (('Therefore, the final answer is: ```json {"name": '
                                     '"calculator", "arguments": {"expression": "17 * 23"}}```'),
                                     "calculator"),
    "Action line": ("Thought: multiply.\nAction: calculator[17 * 23]", "calculator"),
    "Action JSON": ('Action: {"name": "calculator", "arguments": {"expression": "17 * 23"}}',
                    "calculator"),
    "python block then prose": (("Let's compute it in Python.\n```python\nprint(17 * 23)\n```\n"
                                "The result is printed above."), "python"),
    # Issue 27, through llama.cpp's server: a call object in the fence the model writes most.
    # Run as a program it echoed the object, and the echo became the answer.
    "JSON in a python fence": (('```python\n{"name": "calculator", "arguments": {"expression": '
                               '"17 * 23"}}\n```'), "calculator"),
    "Python dict in a python fence": (("```python\n{'name': 'calculator', 'arguments': "
                                      "{'expression': '17 * 23'}}\n```"), "calculator"),
    "printed dict in a python fence": (("```python\nprint({'name': 'calculator', 'arguments': "
                                       "{'expression': '17 * 23'}})\n```"), "calculator"),
    "call object assigned and printed": (('```python\ncall = {"name": "calculator", '
                                         '"arguments": {"expression": "17 * 23"}}\n'
                                         "print(call)\n```"), "calculator"),
    "bare Python dict": (("I'll use {'name': 'calculator', 'arguments': {'expression': "
                          "'17 * 23'}} for this."), "calculator"),
    "OpenAI function wrapper": (('{"type": "function", "function": {"name": "calculator", '
                                 '"arguments": "{\\"expression\\": \\"17 * 23\\"}"}}'),
                                "calculator"),
    "arguments before name": ('{"arguments": {"expression": "17 * 23"}, "name": "calculator"}',
                              "calculator"),
}


@pytest.mark.parametrize("tool_format", ["tags", "react"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_call_form_runs_as_a_call_and_is_never_the_answer(form: str,
                                                               tool_format: str) -> None:
    reply, tool = FORMS[form]
    backend = ScriptedBackend([reply, ANSWER], tool_calls=tool_format == "tags")
    trace = Agent(backend, config=RunConfig(tool_format=tool_format)).run(TASK)
    [act] = acts(trace)
    assert act.input["tool"] == tool and act.error is None
    assert act.output["observation"].strip() == "391"
    if "```python" in reply:
        # Written as a program (the call, or the code): its real output answers; the prose
        # after it was written before it ran.
        assert trace.answer == "391" and len(backend.requests) == 1
        return
    # The model saw the real result, then answered; the call itself never became the answer.
    second = backend.requests[1].messages[-1].text
    assert "391" in second
    assert trace.answer == ANSWER and trace.outcome == "answered"
    assert "calculator" not in (trace.answer or "") and "print(" not in (trace.answer or "")


@pytest.mark.parametrize("block", ['calculator(expression="17 * 23")',
                                   'print(calculator("17 * 23"))'])
def test_a_tool_called_inside_a_python_block_is_that_tool_call(block: str) -> None:
    # Seen on GSM8K and the demo task: as a program it only raised a NameError. A reply that
    # ends with the block answers with its output, as a program's output does.
    backend = ScriptedBackend([f"```python\n{block}\n```"], tool_calls=True)
    trace = Agent(backend).run(TASK)
    [act] = acts(trace)
    assert act.input["tool"] == "calculator" and act.output["observation"].strip() == "391"
    assert trace.answer == "391" and len(backend.requests) == 1


def test_native_tool_calls_from_the_backend_run_and_are_not_the_answer() -> None:
    backend = ScriptedBackend([{"text": "", "tool_calls": [CALC]}, ANSWER], tool_calls=True)
    trace = Agent(backend).run(TASK)
    assert acts(trace)[0].output["observation"] == "391"
    assert backend.requests[1].messages[-2].role == "tool"
    assert trace.answer == ANSWER


def test_a_call_to_a_tool_that_is_not_offered_is_an_error_the_model_sees() -> None:
    # Observed: with an empty library the model "called" read_skill as its final answer.
    reply = ('4. Formulate the JSON Object: The function name is read_skill.\nTherefore, the '
             'final answer is: ```json {"name": "read_skill", "arguments": {"name": "all"}}```')
    backend = ScriptedBackend([reply, ANSWER], tool_calls=True)
    trace = Agent(backend).run(TASK)
    [act] = acts(trace)
    assert act.input["tool"] == "read_skill" and "unknown tool 'read_skill'" in act.error
    assert "calculator, python" in backend.requests[1].messages[-1].text
    assert trace.answer == ANSWER


def test_a_call_that_is_not_valid_json_is_retried_not_answered() -> None:
    broken = '{"name": "calculator", "arguments": {"expression": "17 * 23" +}'
    backend = ScriptedBackend([broken, ANSWER], tool_calls=True)
    trace = Agent(backend).run(TASK)
    observe = next(s for s in trace.steps if s.kind == "observe")
    assert "not valid JSON" in observe.error and observe.input["raw"] == broken
    assert "not valid JSON" in backend.requests[1].messages[-1].text
    assert trace.answer == ANSWER


def test_a_program_that_ends_the_reply_answers_with_its_output_in_one_call() -> None:
    # The model writes the block and stops at ```output; the real output is the answer.
    reply = ("Charleston has 4 * 20 sheep and Toulouse twice that.\n```python\nseattle = 20\n"
             "charleston = 4 * seattle\ntoulouse = 2 * charleston\n"
             "print(seattle + charleston + toulouse)\n```")
    backend = ScriptedBackend([reply], tool_calls=True)
    trace = Agent(backend).run("How many sheep do they have together?")
    assert trace.answer == "260" and trace.outcome == "answered"
    assert len(backend.requests) == 1
    [act] = acts(trace)
    assert act.output["form"] == "code" and act.route == "finish"
    assert "```output" in backend.requests[0].stop


def test_a_program_that_fails_is_shown_to_the_model_which_answers_after() -> None:
    reply = "```python\ntotal = 2 * Charleston\nprint(total)\n```"
    backend = ScriptedBackend([reply, "The answer is 160."], tool_calls=True)
    trace = Agent(backend).run("How many?")
    shown = backend.requests[1].messages[-1].text
    assert shown.startswith("```output\n") and "NameError" in shown
    assert trace.answer == "The answer is 160."


def test_a_guessed_output_after_a_program_is_replaced_by_the_real_one() -> None:
    # Seen on GSM8K dev: the program printed 130, the model had already "shown" 180 after the
    # block, then, shown 130, answered with nonsense. The real output is the answer.
    reply = ("Here's the Python block:\n```python\nprint(10 * 5 + 10 * 8)\n```\n\n"
             "When you run this block, it will output:\n\n```\n180\n```\n\n"
             "This means Lloyd earned $180.")
    backend = ScriptedBackend([reply], tool_calls=True)
    trace = Agent(backend).run("How much did Lloyd earn?")
    assert trace.answer == "130" and len(backend.requests) == 1


def test_a_failed_program_is_shown_without_the_guess_written_after_it() -> None:
    reply = ("```python\nprint(total)\n```\nIt prints 180, so the answer is 180.")
    backend = ScriptedBackend([reply, "The answer is 130."], tool_calls=True)
    trace = Agent(backend).run("How much?")
    history = backend.requests[1].messages
    assert history[-2].role == "assistant" and "180" not in history[-2].text
    assert history[-2].text.endswith("```")
    assert "NameError" in history[-1].text and "step by step" in history[-1].text
    assert trace.answer == "The answer is 130."


def test_a_tool_error_asks_to_fix_the_call_or_solve_it_without_the_tool() -> None:
    reply = '<tool_call>{"name": "calculator", "arguments": {"expression": "Grace * 4"}}</tool_call>'
    backend = ScriptedBackend([reply, ANSWER], tool_calls=True)
    trace = Agent(backend).run(TASK)
    last = backend.requests[1].messages[-1].text
    assert "Error in calculator" in last and "without it" in last
    assert trace.answer == ANSWER


def test_the_program_output_is_not_the_answer_when_that_is_switched_off() -> None:
    reply = "```python\nprint(17 * 23)\n```"
    backend = ScriptedBackend([reply, ANSWER], tool_calls=True)
    trace = Agent(backend, config=RunConfig(answer_with_program_output=False)).run(TASK)
    assert trace.answer == ANSWER and len(backend.requests) == 2


def test_code_that_only_defines_a_function_is_the_answer_not_a_call() -> None:
    code = "```python\ndef add(a, b):\n    return a + b\n```"
    backend = ScriptedBackend([code], tool_calls=True)
    trace = Agent(backend).run("Write a Python function that adds two numbers.")
    assert trace.answer == code and not acts(trace)


def test_several_blocks_in_one_reply_run_as_one_program() -> None:
    reply = "First the data:\n```python\nx = 6\n```\nThen:\n```python\nprint(x * 7)\n```"
    backend = ScriptedBackend([reply], tool_calls=True)
    trace = Agent(backend).run("6 * 7?")
    assert trace.answer == "42" and len(acts(trace)) == 1


def test_code_blocks_are_text_when_python_is_not_offered() -> None:
    reply = "```python\nprint(17 * 23)\n```\nThe answer is 391."
    backend = ScriptedBackend([reply], tool_calls=True)
    from whetstone.tools.builtin import builtin_tools
    trace = Agent(backend, tools=builtin_tools(("calculator",))).run(TASK)
    assert trace.answer == reply and not acts(trace)


def test_a_final_answer_before_a_call_wins_and_a_call_before_it_runs() -> None:
    answered = ScriptedBackend(["Final Answer: 391\nAction: calculator[1+1]"])
    assert Agent(answered).run(TASK).answer == "391"
    call_first = ScriptedBackend(["Action: calculator[17*23]\nFinal Answer: 400", ANSWER])
    trace = Agent(call_first).run(TASK)
    assert acts(trace) and trace.answer == ANSWER


def test_react_mode_accepts_an_answer_stated_without_the_marker() -> None:
    # "stop when the model has answered": no retry for "the answer is" or a box.
    for reply in ("So the answer is 391.", r"Thus \boxed{391}."):
        backend = ScriptedBackend([reply])
        trace = Agent(backend).run(TASK)
        assert trace.answer == reply and len(backend.requests) == 1


def test_the_system_prompt_is_short_and_offers_no_read_skill_without_skills() -> None:
    backend = ScriptedBackend([ANSWER], tool_calls=True)
    trace = Agent(backend).run(TASK)
    system = backend.requests[0].messages[0].text
    assert backend.count_tokens(system) < 120, system
    assert "read_skill" not in system and "Skills" not in system
    assert "- calculator(expression): Evaluate an arithmetic expression written with the " \
           "task's numbers, exactly." in system
    assert "17 * 23" not in system  # a number a small model would copy into its calls
    assert "```python" in system and "python(code)" not in system  # the block covers it
    assert trace.steps[0].output["tools"] == ["calculator", "python"]
    assert backend.requests[0].tools == ()  # no template tools block (~300 tokens)


def test_task_answer_tools_go_natively_and_builtin_tools_compactly() -> None:
    schema = {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}
    backend = ScriptedBackend([('<tool_call>\n{"name": "get_weather", "arguments": '
                               '{"city": "Paris"}}\n</tool_call>')], tool_calls=True)
    trace = Agent(backend).run("Weather in Paris?", answer_tools=[schema])
    assert json.loads(trace.answer or "") == {"name": "get_weather",
                                              "arguments": {"city": "Paris"}}
    assert [t["function"]["name"] for t in backend.requests[0].tools] == ["get_weather"]
    assert "get_weather" not in backend.requests[0].messages[0].text
    # Without a native channel the answer tool is described in full in the system message.
    text_backend = ScriptedBackend(['Action: get_weather[{"city": "Paris"}]'])
    trace = Agent(text_backend).run("Weather in Paris?", answer_tools=[schema])
    assert '"city": {"type": "string"}' in text_backend.requests[0].messages[0].text
    assert json.loads(trace.answer or "")["arguments"] == {"city": "Paris"}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "metric": {"type": "boolean"}},
                   "required": ["city"]}}}


def test_a_task_with_its_own_tools_is_offered_only_those() -> None:
    backend = ScriptedBackend(['{"name": "get_weather", "arguments": {"city": "Paris"}}'],
                              tool_calls=True)
    trace = Agent(backend).run("Weather in Paris?", answer_tools=[WEATHER])
    system = backend.requests[0].messages[0].text
    assert "calculator" not in system and "python" not in system
    assert trace.steps[0].output["tools"] == []
    both = ScriptedBackend(['{"name": "get_weather", "arguments": {"city": "Paris"}}'],
                           tool_calls=True)
    Agent(both, config=RunConfig(own_tools_with_answer_tools=True)).run(
        "Weather in Paris?", answer_tools=[WEATHER])
    assert "calculator(expression)" in both.requests[0].messages[0].text


@pytest.mark.parametrize("reply", [
    # A Python literal in a python fence (seen on bfcl-simple: True, not true).
    '```python\n{"name": "get_weather", "arguments": {"city": "Paris", "metric": True}}\n```',
    # A stray brace and a fence after the object.
    '{"name": "get_weather", "arguments": {"city": "Paris", "metric": true}}\n}\n```',
])
def test_call_arguments_written_loosely_are_read(reply: str) -> None:
    backend = ScriptedBackend([reply], tool_calls=True)
    trace = Agent(backend).run("Weather in Paris?", answer_tools=[WEATHER])
    assert json.loads(trace.answer or "")["arguments"] == {"city": "Paris", "metric": True}


def test_parse_call_arguments_raises_the_json_error_when_nothing_reads() -> None:
    from whetstone.engine.replies import parse_call_arguments

    assert parse_call_arguments("{'a': None, 'b': [1, 2]}") == {"a": None, "b": [1, 2]}
    with pytest.raises(json.JSONDecodeError):
        parse_call_arguments("{not: json, nor python")
    with pytest.raises(json.JSONDecodeError):
        parse_call_arguments("__import__('os').system('true')")  # never evaluated


def test_native_format_passes_the_tool_schemas_to_the_backend() -> None:
    backend = ScriptedBackend([ANSWER], tool_calls=True)
    Agent(backend, config=RunConfig(tool_format="native")).run(TASK)
    first = backend.requests[0]
    assert [t["function"]["name"] for t in first.tools] == ["calculator", "python"]
    assert "calculator(" not in first.messages[0].text and first.stop == ()


def test_an_imagined_tool_response_is_cut_by_the_stop() -> None:
    backend = ScriptedBackend([ANSWER], tool_calls=True)
    Agent(backend).run(TASK)
    assert "<tool_response>" in backend.requests[0].stop


def test_the_issue_27_reply_answers_through_the_calculator_not_with_the_echo() -> None:
    # The exact reply llama.cpp's server gave (no function-calling chat format): the loop ran
    # it as a program and answered with the printed dict.
    reply = ("```python\n{'name': 'calculator', 'arguments': {'expression': '17 * 23'}}\n```")
    backend = ScriptedBackend([reply + "\nThe result of `17 * 23` is `409`."],
                              tool_calls=True)  # as openai: is
    trace = Agent(backend).run("Use the calculator: what is 17 * 23?")
    [act] = acts(trace)
    assert act.input["tool"] == "calculator" and act.output["observation"] == "391"
    # As for a program that ends the reply: the real result answers, not the guess after it
    # (through llama.cpp the model, shown the result, chained calls on it to the horizon).
    assert trace.answer == "391" and len(backend.requests) == 1


@pytest.mark.parametrize("program", [
    # It builds a call at run time and prints it: a request for the call, not an answer.
    ('import json\nexpr = str(17) + " * 23"\n'
     'print(json.dumps({"name": "calculator", "arguments": {"expression": expr}}))'),
    'print("calculator(expression=\'17 * 23\')")',  # an echo of a call
    "def area():\n    x = 17 * 23\nprint(area())",     # prints None: no value
])
def test_a_program_that_prints_no_answer_is_shown_to_the_model_not_taken(program: str) -> None:
    backend = ScriptedBackend([f"```python\n{program}\n```", ANSWER], tool_calls=True)
    trace = Agent(backend).run(TASK)
    [act] = acts(trace)
    assert act.input["tool"] == "python" and act.error is None and act.route == "think"
    assert len(backend.requests) == 2 and trace.answer == ANSWER


def test_a_program_and_a_call_block_in_one_reply_both_run() -> None:
    reply = ("```python\nprint(17 * 23)\n```\nAnd to check:\n```python\n{'name': "
             "'calculator', 'arguments': {'expression': '23 * 17'}}\n```")
    backend = ScriptedBackend([reply], tool_calls=True)
    trace = Agent(backend).run(TASK)
    assert [(a.input["tool"], a.output["observation"].strip()) for a in acts(trace)] == [
        ("python", "391"), ("calculator", "391")]
    assert trace.answer == "391"  # the last one, written as a program, answers
