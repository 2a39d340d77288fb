"""The agent runtime on the scripted backend: prompts built, steps recorded, limits enforced."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import BackendUnavailable
from whetstone.engine.runtime import Agent, Guidance, Plugin, RunConfig, RunFinished, StepEvent
from whetstone.engine.runtime.checkpoints import Checkpoints
from whetstone.engine.runtime.plugins import Node
from whetstone.engine.types import Completion, Request
from whetstone.library_store.traces import TraceStore
from whetstone.tools.builtin import builtin_tools, make_python


def kinds(trace: Any) -> list[str]:
    return [s.kind for s in trace.steps]


def test_text_mode_calculator_round_trip(tmp_path: Path) -> None:
    backend = ScriptedBackend([
        "Thought: I should multiply.\nAction: calculator[17 * 23]\nObservation: 400",
        "Thought: done\nFinal Answer: 391",
    ])
    store = TraceStore(tmp_path / "traces")
    trace = Agent(backend, trace_store=store).run("What is 17 * 23?")
    assert trace.outcome == "answered" and trace.answer == "391"
    assert kinds(trace) == ["prepare", "think", "act", "think", "finish"]
    act = trace.steps[2]
    assert act.input == {"tool": "calculator", "arguments": "17 * 23"}
    assert act.output["observation"] == "391"
    # The imagined "Observation: 400" is not shown back; the real one is.
    second = backend.requests[1]
    assert second.messages[-1].text == "Observation: 391"
    assert "Action: <tool name>[<input>]" in second.messages[0].text  # text-format instructions
    assert second.stop == ("\nObservation:", "```output")  # an imagined result is not read
    # Every model call is in the trace with its completion, tokens and latency.
    think = trace.steps[1]
    assert think.input["messages"][1]["content"] == "What is 17 * 23?"
    assert think.output["completion"]["text"].startswith("Thought: I should multiply.")
    assert think.tokens > 0 and "latency_s" in think.meta
    # Stored: a "running" line, then the final one; the latest wins.
    assert store.get(trace.id).outcome == "answered"
    lines = (tmp_path / "traces").glob("*.jsonl")
    assert sum(len(p.read_text().splitlines()) for p in lines) == 2


def test_native_tool_calls_use_tool_messages() -> None:
    backend = ScriptedBackend([
        {"text": "", "tool_calls": [{"name": "calculator", "arguments": {"expression": "17*23"}}]},
        "17 * 23 = 391.\nFinal Answer: 391",
    ], tool_calls=True)
    trace = Agent(backend, config=RunConfig(tool_format="native")).run(
        "What is 17 * 23? Use the calculator.")
    assert trace.answer == "391"
    first, second = backend.requests
    assert [t["function"]["name"] for t in first.tools] == ["calculator", "python"]
    assert "Action:" not in first.messages[0].text  # the model's own format, no ReAct text
    assert second.messages[-2].role == "tool" and second.messages[-2].text == "391"
    assert second.messages[-3].tool_calls[0].name == "calculator"
    # The reminder that small models need to stop calling tools (RunConfig.after_tool_nudge).
    assert second.messages[-1].role == "user" and "reply in plain text" in second.messages[-1].text
    assert trace.steps[2].input == {"tool": "calculator", "arguments": {"expression": "17*23"}}


def test_native_reply_without_marker_is_the_answer() -> None:
    backend = ScriptedBackend(["It is 391."], tool_calls=True)
    assert Agent(backend).run("17*23?").answer == "It is 391."


def test_bad_native_arguments_become_an_observation() -> None:
    backend = ScriptedBackend([
        {"tool_calls": [{"name": "calculator", "arguments": '{"expression": "17*23"'}]},
        "Final Answer: 391",
    ], tool_calls=True)
    trace = Agent(backend).run("17*23?")
    act = trace.steps[2]
    assert act.error and "not valid JSON" in act.error
    assert "not valid JSON" in backend.requests[1].messages[-2].text
    assert trace.answer == "391"


def test_unknown_tool_is_an_observation_not_a_crash() -> None:
    backend = ScriptedBackend(["Action: search[weather]", "Final Answer: sunny"])
    trace = Agent(backend).run("weather?")
    assert "unknown tool 'search'" in trace.steps[2].output["observation"]
    assert "calculator, python" in backend.requests[1].messages[-1].text
    assert trace.outcome == "answered"


def test_never_parseable_stops_at_the_horizon_and_says_why() -> None:
    backend = ScriptedBackend(["I think maybe something."] * 10)
    trace = Agent(backend, config=RunConfig(max_steps=3)).run("x")
    assert trace.outcome == "horizon" and trace.answer is None
    assert "step horizon (3 model calls)" in trace.meta["reason"]
    observes = [s for s in trace.steps if s.kind == "observe"]
    assert len(observes) == 3
    assert observes[0].input["raw"] == "I think maybe something."
    assert "neither an Action nor a Final Answer" in observes[0].error
    # The model was told what was expected, each time.
    assert "Final Answer: <answer>" in backend.requests[1].messages[-1].text
    assert backend.remaining == 7


def test_hanging_tool_is_killed_at_its_timeout() -> None:
    backend = ScriptedBackend(["Action: python[while True: pass]", "Final Answer: gave up"])
    agent = Agent(backend, tools=[make_python(timeout_s=1.0)])
    start = time.perf_counter()
    trace = agent.run("loop forever")
    assert time.perf_counter() - start < 10
    act = trace.steps[2]
    assert act.output["timed_out"] is True
    assert "timed out after 1 s and was killed" in act.output["observation"]
    assert trace.outcome == "answered"


def test_token_budget_stops_the_run() -> None:
    backend = ScriptedBackend(["Action: calculator[1+1]"] * 10)
    trace = Agent(backend, config=RunConfig(max_total_tokens=300)).run("x")
    assert trace.outcome == "budget"
    assert "token budget" in trace.meta["reason"]


def test_wall_clock_limit_stops_the_run() -> None:
    backend = ScriptedBackend(["Action: calculator[1+1]"] * 10, delay_s=0.3)
    trace = Agent(backend, config=RunConfig(timeout_s=0.5)).run("x")
    assert trace.outcome == "timeout"
    assert backend.remaining >= 7
    # Remaining time is passed down so local backends stop generating too.
    assert backend.requests[0].timeout is not None and backend.requests[0].timeout <= 1.0


def test_backend_failure_ends_the_run_with_an_error_trace(tmp_path: Path) -> None:
    class Down(ScriptedBackend):
        def complete(self, request: Request) -> Completion:
            raise BackendUnavailable("cannot reach http://127.0.0.1:9/v1", hint="start it")

    store = TraceStore(tmp_path / "t")
    trace = Agent(Down(), trace_store=store).run("x")
    assert trace.outcome == "error"
    assert "cannot reach" in trace.meta["reason"]
    assert store.get(trace.id).outcome == "error"


def test_answer_tools_end_the_run_with_the_call() -> None:
    schema = {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}
    backend = ScriptedBackend([
        {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}],
        tool_calls=True)
    trace = Agent(backend, tools=[]).run("Weather in Paris?", answer_tools=[schema])
    assert json.loads(trace.answer or "") == {"name": "get_weather",
                                              "arguments": {"city": "Paris"}}
    assert [t["function"]["name"] for t in backend.requests[0].tools] == ["get_weather"]
    assert trace.steps[-2].output["answer_call"] is True


def test_stream_yields_steps_before_the_run_ends() -> None:
    backend = ScriptedBackend(["Action: calculator[2+2]", "Final Answer: 4"])
    events = list(Agent(backend).stream("2+2"))
    assert [type(e) for e in events[:-1]] == [StepEvent] * 5
    assert isinstance(events[-1], RunFinished) and events[-1].trace.answer == "4"


class _Recorder(Plugin):
    """A plugin with every hook, to check the graph wiring and the guidance budget."""

    name = "recorder"
    stages = ("decide", "answer")

    def __init__(self) -> None:
        self.order: list[str] = []

    def guidance(self, task: str, ctx: Any, budget_tokens: int) -> Guidance:
        return Guidance("Lessons", f"Budget {budget_tokens}: check units.", {"shown": ["units"]})

    def nodes(self) -> list[Node]:
        def rubric(state: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
            self.order.append("rubric")
            return {}

        def check(state: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
            self.order.append(f"verify:{state.get('answer')}")
            return {}
        return [Node("decide", rubric), Node("answer", check)]

    def finish_meta(self, state: Mapping[str, Any]) -> dict[str, Any]:
        return {"calls": state.get("n_calls")}


def test_plugins_add_guidance_nodes_and_meta() -> None:
    rec = _Recorder()
    backend = ScriptedBackend(["Action: calculator[2+2]", "Final Answer: 4"])
    trace = Agent(backend, plugins=[rec], config=RunConfig(guidance_budget_tokens=500)).run("2+2")
    system = backend.requests[0].messages[0].text
    assert "# Lessons\nBudget 500: check units." in system
    assert rec.order == ["rubric", "rubric", "verify:4"]
    assert trace.meta["recorder"] == {"shown": ["units"], "calls": 2}


def test_seeds_differ_per_call_but_repeat_per_run() -> None:
    b1 = ScriptedBackend(["Action: calculator[1+1]", "Final Answer: 2"])
    Agent(b1, config=RunConfig(seed=7)).run("x")
    assert [r.seed for r in b1.requests] == [7, 8]


def test_resume_continues_from_the_checkpoint(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "traces")
    cps = Checkpoints(tmp_path / "cp.sqlite")
    replies = iter(["Action: calculator[17*23]"])

    def ctrl_c_on_second_call(request: Request) -> str:
        try:
            return next(replies)
        except StopIteration:
            raise KeyboardInterrupt from None  # the user presses Ctrl-C mid-run

    agent = Agent(ScriptedBackend(responder=ctrl_c_on_second_call), trace_store=store,
                  checkpoints=cps)
    with pytest.raises(KeyboardInterrupt):
        agent.run("17*23?", trace_id="run-1")
    interrupted = store.get("run-1")
    assert interrupted.outcome == "interrupted"
    assert kinds(interrupted) == ["prepare", "think", "act"]
    assert cps.resumable("run-1")
    second = ScriptedBackend(["Final Answer: 391"])
    trace = Agent(second, trace_store=store, checkpoints=cps).resume("run-1")
    assert trace.answer == "391" and trace.outcome == "answered"
    assert kinds(trace) == ["prepare", "think", "act", "think", "finish"]
    # The resumed call saw the whole conversation so far.
    assert second.requests[0].messages[-1].text == "Observation: 391"
    assert not cps.resumable("run-1")  # finished runs are pruned


def test_checkpoint_retention(tmp_path: Path) -> None:
    cps = Checkpoints(tmp_path / "cp.sqlite", keep_days=1, keep_runs=2)
    now = time.time()
    for i, age_days in enumerate([0, 0.1, 0.2, 3]):
        cps.started(f"t{i}", now - age_days * 86400)
    dropped = cps.prune(now)
    assert set(dropped) == {"t2", "t3"}  # t2: beyond keep_runs; t3: too old
    assert [t for t, _ in cps.unfinished()] == ["t0", "t1"]


def test_builtin_tool_names_are_checked() -> None:
    with pytest.raises(Exception, match="unknown built-in tool"):
        builtin_tools(("calculator", "browser"))


def test_bare_json_tool_call_without_tags_is_an_action() -> None:
    # Observed with the embedded 0.5B model: the call JSON without <tool_call> tags.
    backend = ScriptedBackend([
        '{"name": "calculator", "arguments": {"expression": "17 * 23"}}',
        "The product is 391.\nFinal Answer: 391",
    ], tool_calls=True)
    trace = Agent(backend).run("What is 17 * 23? Use the calculator.")
    assert trace.steps[2].input == {"tool": "calculator", "arguments": {"expression": "17 * 23"}}
    assert trace.answer == "391"
    # JSON that names no known tool is just text.
    backend = ScriptedBackend(['{"name": "Ann", "arguments": 3}'], tool_calls=True)
    assert Agent(backend).run("x").answer == '{"name": "Ann", "arguments": 3}'


def test_abandoning_the_stream_records_an_interrupted_run(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    backend = ScriptedBackend(["Action: calculator[1+1]", "Final Answer: 2"])
    events = Agent(backend, trace_store=store).stream("1+1", trace_id="gone")
    next(events)  # the prepare step
    events.close()
    trace = store.get("gone")
    assert trace.outcome == "interrupted" and trace.meta["reason"] == "interrupted by the caller"


def test_repeated_calls_run_once_and_the_model_is_told() -> None:
    # Observed with the embedded 0.5B model: 30 copies of one call in a reply, then again.
    same = {"name": "calculator", "arguments": {"expression": "391"}}
    backend = ScriptedBackend([
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": "17*23"}}]},
        {"tool_calls": [same] * 30},
        {"tool_calls": [same]},
        "Final Answer: 391",
    ], tool_calls=True)
    trace = Agent(backend, config=RunConfig(tool_format="native")).run("17*23?")
    acts = [s for s in trace.steps if s.kind == "act"]
    assert len(acts) == 3  # 1 + 1 (29 duplicates dropped) + 1 repeat
    assert trace.steps[3].meta["duplicate_calls_dropped"] == 29
    assert len(backend.requests[2].messages[-3].tool_calls) == 1  # history holds what ran
    assert "already made this exact call" in acts[2].output["observation"]
    assert trace.answer == "391"
    # After a repeat the next decision is offered no tools, so the model has to answer.
    assert backend.requests[2].tools and not backend.requests[3].tools


def test_a_failing_call_repeated_is_not_run_again_and_the_model_must_answer() -> None:
    # Observed on GSM8K dev: the same failing calculator call, 8 times, to the horizon.
    bad = '<tool_call>{"name": "calculator", "arguments": {"expression": "Grace * 4"}}</tool_call>'
    backend = ScriptedBackend([bad, bad, "The combined weight is 623 pounds."], tool_calls=True)
    trace = Agent(backend).run("Grace weighs 125 pounds...")
    acts = [s for s in trace.steps if s.kind == "act"]
    assert len(acts) == 2 and "already made this exact call" in acts[1].output["observation"]
    assert "unsupported expression" in acts[1].output["observation"]
    assert acts[1].error == "repeated a call that failed"
    # Two failed rounds: the answer is asked for afresh, from the task alone.
    assert [m.role for m in backend.requests[2].messages] == ["user"]
    assert trace.answer == "The combined weight is 623 pounds."


def test_after_a_repeat_a_call_written_anyway_is_not_run_and_not_the_answer() -> None:
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "17*23"}}</tool_call>'
    backend = ScriptedBackend([call, call, call, "The answer is 391."], tool_calls=True)
    trace = Agent(backend).run("17*23?")
    assert len([s for s in trace.steps if s.kind == "act"]) == 2
    assert "tools are off" in backend.requests[3].messages[-1].text
    assert trace.answer == "The answer is 391."


def test_two_failed_rounds_in_a_row_turn_the_tools_off() -> None:
    # Observed on GSM8K dev: a new broken program each round until the horizon.
    first = "```python\nprint(total - gift)\n```"
    second = "```python\ntotal = 10\nprint(total - gift)\n```"
    backend = ScriptedBackend([first, second, "```python\nprint(3)\n```", "It costs $8."],
                              tool_calls=True)
    trace = Agent(backend, config=RunConfig(fresh_start_after_failures=False)).run(
        "How much does Chad pay?")
    assert len([s for s in trace.steps if s.kind == "act"]) == 2
    assert "Do not call tools now" in backend.requests[2].messages[-1].text
    assert "tools are off" in backend.requests[3].messages[-1].text
    assert trace.answer == "It costs $8."


def test_after_two_failed_rounds_the_task_is_answered_afresh_as_direct_would() -> None:
    first = "```python\nprint(total - gift)\n```"
    second = "```python\ntotal = 10\nprint(total - gift)\n```"
    answer = "Step by step:\n```python\nprint(8)\n```\nSo he pays $8."
    backend = ScriptedBackend([first, second, answer], tool_calls=True)
    trace = Agent(backend).run("How much does Chad pay?")
    fresh = backend.requests[2]
    # The task alone: no system message (empty library), no tools, no failed attempts.
    assert [m.role for m in fresh.messages] == ["user"]
    assert fresh.messages[0].text == "How much does Chad pay?" and not fresh.tools
    assert trace.answer == answer and len([s for s in trace.steps if s.kind == "act"]) == 2
