"""``whetstone traces show`` on every kind of trace the engine writes: agent runs, the direct
solver (``--solver direct``), chat exchanges (``whetstone.engine.chat.exchange.chat_trace``) and MARCH
verifications (``whetstone.engine.methods.march.verifier.result_trace``). Each trace is made for real through the
CLI or ``Engine`` with the ``scripted:`` backend, then shown by id."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import BackendError


def script(tmp_path: Path, replies: list[Any], name: str = "replies.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"replies": replies}))
    return f"scripted:{path}"


def show(trace_id: str) -> str:
    res = CliRunner(env={"COLUMNS": "200"}).invoke(cli, ["traces", "show", trace_id],
                                                   catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def latest() -> dict[str, Any]:
    res = CliRunner().invoke(cli, ["traces", "ls", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)[-1]


def test_an_agent_trace(tmp_path: Path) -> None:
    spec = script(tmp_path, ["Thought: multiply\nAction: calculator[17*23]", "Final Answer: 391"])
    assert CliRunner().invoke(cli, ["run", "17 * 23?", "--model", spec]).exit_code == 0
    out = show(latest()["id"])
    assert "Task: 17 * 23?" in out and "Thought: multiply" in out
    assert "Observation: 391" in out and "Answer: 391" in out


def test_a_direct_solver_trace(tmp_path: Path) -> None:
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"id": "a", "question": "2+2?", "expected": "4"}\n')
    spec = script(tmp_path, ["The answer is 4."])
    res = CliRunner().invoke(cli, ["eval", "--tasks", str(tasks), "--model", spec,
                                   "--solver", "direct", "-j", "1"])
    assert res.exit_code == 0, res.output
    row = latest()
    out = show(row["id"])  # crashed: 'str' object has no attribute 'get'
    assert "Task: 2+2?" in out and "Answer: The answer is 4." in out
    assert "tokens" in out and row["id"] in out


def test_a_direct_solver_trace_with_native_tool_calls(whetstone_home: Path) -> None:
    from whetstone.engine.evaluation.direct import direct_solver
    from whetstone.engine.evaluation.tasks import TaskRecord
    from whetstone.library_store.traces import TraceStore

    backend = ScriptedBackend([{"text": "", "tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Oslo"}}]}], tool_calls=True)
    trace = direct_solver(backend)(TaskRecord(id="w", question="Weather in Oslo?"), 0)
    TraceStore(whetstone_home / "library" / "traces").append(trace)
    out = show(trace.id)
    assert 'Action: get_weather({"city": "Oslo"})' in out


def test_a_chat_trace_and_a_failed_one(tmp_path: Path) -> None:
    with Engine(script(tmp_path, ["Paris.", {"text": "Let me check.", "tool_calls": [
            {"name": "lookup", "arguments": {"q": "capital"}}]}]), skills=False,
            checkpointing=False) as engine:
        reply = engine.chat("Capital of France?")
        called = engine.chat("Look it up")
        with contextlib.suppress(BackendError):
            engine.chat("One more?")  # the script is spent: the backend fails
    out = show(reply.trace_id or "")
    assert "Task: Capital of France?" in out and "Answer: Paris." in out and "tokens" in out
    out = show(called.trace_id or "")
    assert 'Tool call: lookup({"q": "capital"})' in out and "Answer: Let me check." in out
    failed = latest()
    assert failed["outcome"] == "error"
    out = show(failed["id"])
    assert "Model call failed:" in out and "No answer (error)" in out and "ran out" in out


@pytest.mark.march
def test_a_march_verification_trace(tmp_path: Path) -> None:
    proposed = ("- Question: In what city is the head office of the Oberoi Group? "
                "[Answer: Mumbai]\n"
                "- Question: What kind of company is the Oberoi Group? [Answer: hotel company]")
    check = ("1. Evidence: The Oberoi Group has its head office in Delhi. [Answer: Delhi]\n"
             "2. Evidence: The Oberoi Group is a hotel company [Answer: hotel company]")
    spec = script(tmp_path, [proposed, check, check, check])
    res = CliRunner().invoke(cli, [
        "verify", "-q", "Where is the Oberoi Group's head office?",
        "-a", "The Oberoi Group is based in Mumbai.",
        "-e", "The Oberoi Group is a hotel company with its head office in Delhi.",
        "--model", spec])
    assert res.exit_code == 9, res.output
    out = show(latest()["id"])
    assert "Task: Where is the Oberoi Group's head office?" in out
    assert "contradicted" in out and "claimed Mumbai" in out and "evidence says Delhi" in out
    assert "hallucination flagged: 1 of 2 claim(s) flagged" in out
    assert "Answer: The Oberoi Group is based in Mumbai." in out


def test_a_step_of_an_unknown_shape_prints_a_line_not_a_crash(whetstone_home: Path) -> None:
    # names, not uses: co_react
    from whetstone.engine.types import Step, Trace
    from whetstone.library_store.traces import TraceStore

    trace = Trace(id="odd1", task="t", outcome="answered", answer="x", steps=(
        Step(kind="think", module="think", output=["not", "a", "dict"]),
        Step(kind="act", module="act", input="calculator 2*3", output="6"),
        Step(kind="verify", module="march_verify", output={"rounds": "?"}),
        Step(kind="rubric", module="co_react", output=None, error="rubric dropped: empty"),
        Step(kind="other", module="plugin", error="boom")))
    TraceStore(whetstone_home / "library" / "traces").append(trace)
    out = show("odd1")
    assert "rubric dropped: empty" in out and "other (plugin) boom" in out
    assert "Answer: x" in out


def test_a_step_kind_no_method_declares_round_trips_and_prints_one_line(
        whetstone_home: Path) -> None:
    """A step kind is open: a method records its own (``MethodSpec.step_kinds`` names their
    printers), and a trace holding a kind nobody installed declares, from a method since
    removed, is stored, read back unchanged, shown in one short line and told to an analyst."""
    from whetstone.engine.methods.analyst import render_trace
    from whetstone.engine.types import Step, Trace
    from whetstone.library_store.traces import TraceStore

    tally = Step(kind="tally", module="counter_tally", input={"n": 2}, output={"sum": 5},
                 route="think")
    trace = Trace(id="kinds1", task="Add them up", outcome="answered", answer="5",
                  steps=(Step(kind="think", module="think"), tally))
    store = TraceStore(whetstone_home / "library" / "traces")
    store.append(trace)
    assert store.get("kinds1").steps[1] == tally
    res = CliRunner().invoke(cli, ["traces", "show", "kinds1", "--json"])
    assert Trace.from_dict(json.loads(res.stdout)).steps[1] == tally
    lines = show("kinds1").splitlines()
    assert [line for line in lines if "tally" in line] == ["tally (counter_tally)"]
    assert '[tally] {"sum": 5}' in render_trace(trace)


def test_the_runtimes_reminder_is_not_printed_as_the_models_reply(tmp_path: Path) -> None:
    """Issue 37 item 9: on a step-limit run the reminder sent after a repeated call printed
    as ``Unparseable reply: You already have the result...``, as if the model had said it."""
    call = "Thought: multiply\nAction: calculator[17*23]"
    spec = script(tmp_path, [call, call, call, call])
    res = CliRunner(env={"COLUMNS": "200"}).invoke(
        cli, ["run", "17 * 23?", "--model", spec, "--max-steps", "4"])
    assert res.exit_code == 8, res.output  # stopped at the step limit
    for out in (res.output, show(latest()["id"])):
        assert "You already have the result" not in out, out
        assert "Unparseable reply" not in out
        assert "Tool call not run: tools were off for this reply" in out
    trace = json.loads(CliRunner().invoke(cli, ["traces", "show", latest()["id"], "--json"]
                                          ).stdout)
    observed = [s for s in trace["steps"] if s["kind"] == "observe"]
    # The model is still told, in the runtime's words.
    assert observed and all(s["output"]["observation"].startswith(
        "You already have the result") for s in observed)


def test_a_chat_reply_that_only_calls_tools_shows_the_calls_not_an_answer(
        tmp_path: Path) -> None:
    """Issue 37 item 8: such a reply printed as ``Answer: convert_units({...})``."""
    with Engine(script(tmp_path, [{"text": "", "tool_calls": [
            {"name": "convert_units", "arguments": {"value": 2.5, "to": "min"}}]}]),
            skills=False, checkpointing=False) as engine:
        called = engine.chat("How many minutes are 2.5 hours?")
    out = show(called.trace_id or "")
    assert 'Tool call: convert_units({"value": 2.5, "to": "min"})' in out
    assert "Answer: convert_units" not in out and "Replied with tool calls" in out
