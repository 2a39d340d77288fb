"""A Whetstone library inside LangChain and LangGraph: ``WhetstoneChatModel`` around
langchain-core's own fake chat models, in real compiled graphs (the ReAct loop of a
``ToolNode`` and ``tools_condition``, a ``StateGraph`` over ``MessagesState``), with a real
library, the real embedder and the sandbox. Nothing of Whetstone is mocked; the only doubles
are the LangChain models."""

from __future__ import annotations

import asyncio
import json
import textwrap
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import (
    FakeMessagesListChatModel,
    GenericFakeChatModel,
)
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import END, START, MessagesState, StateGraph

from whetstone.cli import cli
from whetstone.engine.api import Engine, open_library
from whetstone.engine.errors import ConfigError, NotFound
from whetstone.engine.integrations.langchain import (
    LangChainBackend,
    WhetstoneChatModel,
    library_tools_for_langchain,
    trace_id_of,
    whetstone_node,
)
from whetstone.engine.library.checks import validate_library
from whetstone.engine.types import Step, Trace
from whetstone.library_store.store import Library
from whetstone.library_store.traces import TraceStore

UNITS = """---
name: unit-conversion
description: Convert between units (hours, minutes, metres, kilometres) in word problems.
---

# Unit conversion

## Procedure
1. Write every quantity with its unit.
2. Convert to one unit before adding.
"""
SUM_SKILL = textwrap.dedent("""\
    ---
    name: sum-amounts
    description: Add up a list of amounts. Use when a word problem sums several prices.
    ---
    # Sum amounts
    Call `sum_amounts` with the amounts.
    """)
SUM_TOOL = textwrap.dedent('''\
    def sum_amounts(amounts: list[float]) -> float:
        """Add up amounts exactly.

        Args:
            amounts: the numbers to add.
        """
        return sum(amounts)
    ''')
TASK = "How many minutes are 2.5 hours?"
PRICES = "A pen costs 1.5 and a book costs 4.25. Add up the prices: what do they cost together?"


class Seen(BaseCallbackHandler):
    """What the inner model was sent, call by call (a LangChain callback, not a mock)."""

    def __init__(self) -> None:
        self.calls: list[list[BaseMessage]] = []
        self.params: list[dict[str, Any]] = []

    def on_chat_model_start(self, serialized: Any, messages: list[list[BaseMessage]],
                            **kwargs: Any) -> None:
        self.calls.append(list(messages[0]))
        self.params.append(dict(kwargs.get("invocation_params") or {}))


class ToolCallingFake(FakeMessagesListChatModel):
    """langchain-core's list-replaying fake with the ``bind_tools`` it ships without."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


def skills_library(path: Path) -> Library:
    lib = open_library(path, create=True)
    lib.commit({"skills/unit-conversion/SKILL.md": UNITS,
                "skills/sum-amounts/SKILL.md": SUM_SKILL,
                "skills/sum-amounts/scripts/sum_amounts.py": SUM_TOOL},
               method="test", message="two skills, one learned tool", validate=validate_library)
    return lib


@pytest.fixture
def library(tmp_path: Path) -> Library:
    return skills_library(tmp_path / "lib")


def fake(replies: Sequence[str | AIMessage], seen: Seen) -> GenericFakeChatModel:
    return GenericFakeChatModel(messages=iter([AIMessage(r) if isinstance(r, str) else r
                                               for r in replies]), callbacks=[seen])


def system_text(messages: Sequence[BaseMessage]) -> str:
    return "\n".join(str(m.text) for m in messages if isinstance(m, SystemMessage))


def test_the_inner_model_gets_the_skill_and_the_exchange_is_a_trace_with_feedback(
        library: Library) -> None:
    seen = Seen()
    model = WhetstoneChatModel(inner=fake(["150 minutes"], seen), library=library.root)
    reply = model.invoke([SystemMessage("Be brief."), HumanMessage(TASK)])
    assert reply.content == "150 minutes"
    sent = seen.calls[0]
    # Appended to the caller's own system message; the unrelated skill stays out.
    assert isinstance(sent[0], SystemMessage) and sent[0].content.startswith("Be brief.\n\n")
    assert "## Skill: unit-conversion" in sent[0].content and "sum-amounts" not in sent[0].content
    assert sent[1:] == [HumanMessage(TASK)]
    trace_id = trace_id_of(reply)
    assert trace_id and reply.response_metadata["whetstone_library_version"] == "v2"
    assert reply.response_metadata["whetstone_skills"] == ["unit-conversion"]
    trace = library.traces.get(trace_id)
    assert trace.task == TASK and trace.answer == "150 minutes" and trace.outcome == "answered"
    assert trace.meta["source"] == "chat" and trace.meta["client"] == "langchain"
    assert trace.model == "langchain:GenericFakeChatModel" and trace.library_version == "v2"
    assert trace.meta["skills"]["shown"] == ["unit-conversion"]
    # The trace keeps what the model was sent: the guidance included.
    assert "## Skill: unit-conversion" in trace.steps[0].input["messages"][0]["content"]
    labelled = model.feedback(trace_id, 1.0, "right")
    assert labelled.score == 1.0
    out = CliRunner().invoke(cli, ["traces", "ls", "--library", str(library.root), "--json"])
    assert out.exit_code == 0, out.output
    rows = {row["id"]: row for row in json.loads(out.output)}
    assert rows[trace_id]["score"] == 1.0


def react_graph(model: Any, tools: Sequence[Any], checkpointer: Any = None) -> Any:
    """The ReAct loop as docs/langchain.md builds it with LangGraph 1.x's own parts."""
    from langgraph.prebuilt import ToolNode, tools_condition

    builder = StateGraph(MessagesState)
    builder.add_node("model", whetstone_node(model, tools=tools))
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


def test_a_react_agent_runs_a_learned_tool_in_the_sandbox_with_its_skill_shown(
        library: Library) -> None:
    seen = Seen()
    call = {"name": "sum_amounts", "args": {"amounts": [1.5, 4.25]}, "id": "call_1",
            "type": "tool_call"}
    inner = ToolCallingFake(responses=[AIMessage("", tool_calls=[call]),
                                       AIMessage("Together they cost 5.75.")], callbacks=[seen])
    model = WhetstoneChatModel(inner=inner, library=library.root)
    tools = library_tools_for_langchain(library.root)
    assert [t.name for t in tools] == ["sum_amounts"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the current API: nothing deprecated
        graph = react_graph(model, tools)
    state = graph.invoke({"messages": [HumanMessage(PRICES)]})
    messages = state["messages"]
    assert messages[-1].content == "Together they cost 5.75."
    result = messages[2]
    assert result.type == "tool" and json.loads(result.content) == 5.75
    assert result.artifact["ok"] and result.artifact["sandbox"]["isolation"] in ("bwrap",
                                                                                 "process")
    # Both decisions saw the skill that says when to call the tool, and the tool itself.
    assert len(seen.calls) == 2
    for sent, params in zip(seen.calls, seen.params, strict=False):
        assert "Call `sum_amounts`" in system_text(sent)
        assert [t["function"]["name"] for t in params["tools"]] == ["sum_amounts"]


def test_the_model_calls_of_one_graph_run_are_one_trace(library: Library) -> None:
    """Issue 37 item 8: each model call of one agent run was its own trace, nothing tying
    them together; `traces show` printed the tool call as ``Answer: sum_amounts({...})``."""
    from langgraph.checkpoint.memory import InMemorySaver

    call = {"name": "sum_amounts", "args": {"amounts": [1.5, 4.25]}, "id": "call_1",
            "type": "tool_call"}
    inner = ToolCallingFake(responses=[AIMessage("Adding them.", tool_calls=[call]),
                                       AIMessage("Together they cost 5.75."),
                                       AIMessage("You are welcome.")])
    model = WhetstoneChatModel(inner=inner, library=library.root)
    graph = react_graph(model, library_tools_for_langchain(library.root), InMemorySaver())
    thread = {"configurable": {"thread_id": "order-7"}}
    messages = graph.invoke({"messages": [HumanMessage(PRICES)]}, thread)["messages"]
    run_id = trace_id_of(messages[1])
    assert run_id and trace_id_of(messages[-1]) == run_id  # one id for the whole run
    runs = [t for t in library.traces.query() if t.meta.get("client") == "langchain"]
    assert [t.id for t in runs] == [run_id]
    (run,) = runs
    assert [s.kind for s in run.steps] == ["think", "act", "think"]
    assert run.steps[0].route == "act" and run.steps[-1].route == "end"
    act = run.steps[1]
    assert act.input["tool"] == "sum_amounts" and act.input["arguments"] == {
        "amounts": [1.5, 4.25]}
    assert json.loads(act.output["observation"]) == 5.75 and act.error is None
    assert run.outcome == "answered" and run.answer == "Together they cost 5.75."
    assert run.task == PRICES and run.meta["langchain"]["calls"] == 2
    assert run.meta["langchain"]["thread_id"] == "order-7"
    assert len(run.meta["langchain"]["run_ids"]) == 2
    model.feedback(run_id, 1.0)  # labels the run
    # What an evolver reads: the whole run, in the agent's vocabulary.
    from whetstone.engine.evolution.pipeline import training_traces

    assert [t.id for t in training_traces(library.traces.query())] == [run_id]
    shown = CliRunner(env={"COLUMNS": "200"}).invoke(
        cli, ["traces", "show", run_id, "--library", str(library.root)])
    assert shown.exit_code == 0, shown.output
    out = shown.output
    assert "Thought: Adding them." in out
    assert 'Tool call: sum_amounts({"amounts": [1.5, 4.25]})' in out
    assert "Observation: 5.75" in out and "Answer: Together they cost 5.75." in out
    assert "Answer: sum_amounts" not in out
    # A new turn in the same thread is a new run that names the one before.
    later = graph.invoke({"messages": [HumanMessage("Thanks!")]}, thread)["messages"]
    second = library.traces.get(trace_id_of(later[-1]) or "")
    assert second.id != run_id and second.meta["langchain"]["previous"] == run_id
    assert library.traces.get(run_id).score == 1.0  # its label survives


def test_a_state_graph_node_streams_each_token_once_and_leaves_a_trace(
        library: Library) -> None:
    seen = Seen()
    graph_builder = StateGraph(MessagesState)
    graph_builder.add_node("model", whetstone_node(fake(["It is 150 minutes"], seen),
                                                   library=library.root))
    graph_builder.add_edge(START, "model")
    graph_builder.add_edge("model", END)
    graph = graph_builder.compile()
    pieces = [chunk for chunk, _ in graph.stream({"messages": [HumanMessage(TASK)]},
                                                 stream_mode="messages")]
    assert "".join(str(p.content) for p in pieces) == "It is 150 minutes"
    assert "unit-conversion" in system_text(seen.calls[0])
    trace_id = next(p.response_metadata["whetstone_trace_id"] for p in pieces
                    if p.response_metadata.get("whetstone_trace_id"))
    trace = library.traces.get(trace_id)
    assert trace.answer == "It is 150 minutes" and trace.meta["stream"] is True


async def test_async_calls_and_streams_are_recorded(library: Library) -> None:
    seen = Seen()
    model = WhetstoneChatModel(inner=fake(["150 minutes", "one two"], seen), library=library)
    reply = await model.ainvoke(TASK)
    pieces = [c async for c in model.astream("How many metres are 2 kilometres?")]
    assert "".join(str(p.content) for p in pieces) == "one two"
    streamed = next(trace_id_of(p) for p in pieces if trace_id_of(p))
    for trace_id, answer in ((trace_id_of(reply), "150 minutes"), (streamed, "one two")):
        assert trace_id is not None
        assert (await asyncio.to_thread(library.traces.get, trace_id)).answer == answer
    assert all("unit-conversion" in system_text(sent) for sent in seen.calls)
    assert (await model.afeedback(streamed, 0.0)).score == 0.0


@pytest.mark.horizon
@pytest.mark.co_react
@pytest.mark.march
@pytest.mark.self_consistency
@pytest.mark.parametrize(("method", "hooks"), [
    ("co_react", ("a node before every model decision, a wrapper around one model call of "
                  "the think node")),
    ("march", "a node on the answer, before the run finishes"),
    ("horizon", r"per-task budgets \(adjust_config\)"),
    ("self_consistency", (r"a wrapper around solving one whole task in an evaluation, "
                          r"per-task budgets \(adjust_config\)")),
])
def test_a_method_that_needs_the_agent_loop_is_refused_not_dropped(
        library: Library, method: str, hooks: str) -> None:
    with pytest.raises(ConfigError, match=f"chat mode.*: {hooks} act") as err:
        WhetstoneChatModel(inner=fake([], Seen()), library=library.root, methods=[method])
    assert "agent" in err.value.hint
    engine = Engine(LangChainBackend(fake([], Seen())), library=library.root,
                    methods=[method], checkpointing=False)
    with pytest.raises(ConfigError, match=method):
        WhetstoneChatModel(inner=fake([], Seen()), library=engine)
    engine.close()


@pytest.mark.memory
def test_memory_demonstrations_come_before_the_conversation(tmp_path: Path) -> None:
    from whetstone.engine.methods.memory.method import Memory, MemoryConfig

    lib = open_library(tmp_path / "lib", create=True)
    runs = [Trace(id=f"tr{i}", task=f"Ann has {i} pens and gets {i} more. How many pens?",
                  answer=str(2 * i), label=str(2 * i), score=1.0, outcome="answered",
                  steps=(Step(kind="think", module="think",
                              output={"completion": {"text": f"She has {2 * i} pens."}}),),
                  meta={"scorer": "numeric", "task_id": f"tr{i}"}) for i in (1, 2)]
    patch = Memory(MemoryConfig(name="pens")).fit(runs, lib.snapshot(), None)  # type: ignore
    lib.commit(patch.changes, message="memory", method="memory")
    seen = Seen()
    model = WhetstoneChatModel(inner=fake(["8"], seen), library=lib,
                               methods=[("memory", {"k": 1, "turns": True})])
    reply = model.invoke("Ann has 4 pens and gets 4 more. How many pens?")
    sent = seen.calls[0]
    assert [m.type for m in sent] == ["human", "ai", "human"]
    assert sent[0].content.startswith("Ann has") and sent[1].content.startswith("She has")
    trace = lib.traces.get(trace_id_of(reply) or "")
    assert len(trace.meta["memory"]["shown"]) == 1


def test_switches_per_call_and_a_bad_one_says_what_is_known(library: Library) -> None:
    seen = Seen()
    model = WhetstoneChatModel(inner=fake(["a", "b"], seen), library=library.root)
    plain = model.bind(whetstone={"library": False}).invoke(TASK)
    assert seen.calls[0] == [HumanMessage(TASK)]
    assert library.traces.get(trace_id_of(plain) or "").meta["library"] is False
    unrecorded = model.bind(whetstone={"record": False}).invoke(TASK)
    assert trace_id_of(unrecorded) is None and "unit-conversion" in system_text(seen.calls[1])
    with pytest.raises(ConfigError, match="server"):
        model.bind(whetstone={"endpoints": ["verify"]}).invoke(TASK)
    with pytest.raises(ConfigError, match="librar") as err:
        model.bind(whetstone={"libary": False}).invoke(TASK)
    assert "known" in err.value.hint
    with pytest.raises(ConfigError, match="chat model"):
        WhetstoneChatModel(inner=object(), library=library.root)


def test_a_failure_or_an_abandoned_stream_is_recorded_and_feedback_is_checked(
        library: Library) -> None:
    model = WhetstoneChatModel(inner=fake([], Seen()), library=library.root)
    with pytest.raises(StopIteration):  # the fake has no reply left: the app sees its error
        model.invoke(TASK)
    failed = [t for t in library.traces.query() if t.outcome == "error"]
    assert len(failed) == 1 and "StopIteration" in (failed[0].meta["reason"] or "")
    streaming = WhetstoneChatModel(inner=fake(["one two three"], Seen()), library=library.root)
    stream: Iterator[Any] = streaming.stream(TASK)
    assert next(stream).content == "one"
    stream.close()  # type: ignore[attr-defined]
    interrupted = [t for t in library.traces.query() if t.outcome == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0].meta["partial"] == "one"
    with pytest.raises(ConfigError, match="from 0 to 1"):
        model.feedback(failed[0].id, 2.0)
    with pytest.raises(NotFound):
        model.feedback("20990101-000000-00000000", 1.0)


def test_the_engine_over_a_langchain_model_answers_engine_chat(library: Library) -> None:
    seen = Seen()
    engine = Engine(LangChainBackend(fake(["150"], seen)), library=library.root,
                    checkpointing=False)
    reply = engine.chat(TASK)
    assert reply.text == "150" and "unit-conversion" in system_text(seen.calls[0])
    assert engine.traces.get(reply.trace_id or "").model == "langchain:GenericFakeChatModel"
    engine.close()


def test_a_trace_that_cannot_be_written_costs_the_trace_not_the_reply(
        library: Library, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(self: TraceStore, trace: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(TraceStore, "append", full)
    model = WhetstoneChatModel(inner=fake(["150 minutes"], Seen()), library=library.root)
    reply = model.invoke([HumanMessage(TASK)])
    assert reply.content == "150 minutes" and trace_id_of(reply) is None
