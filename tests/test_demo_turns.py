"""Demonstrations as chat turns (memory ``turns=true``): the nearest verified runs go between
the system message and the task as user/assistant exchanges, in the agent, the direct solver
and the middleware, within the guidance budget; scripted models only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.test_adaptation import TASKS, WordEmbedder, code_trace
from whetstone.engine.api import Engine, open_library
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.chat.adapter import ChatAdapter, inject_turns_dicts
from whetstone.engine.runtime.plugins import Guidance, Plugin
from whetstone.engine.types import Message, Request
from whetstone.library_store.store import Library
from whetstone.skills.examples import ExampleRetriever, demo_turns, first_reply
from whetstone.skills.format import Example
from whetstone.skills.retrieval import approx_tokens

PROGRAM = "Compute it.\n```python\nprint(4)\n```"


def test_a_demonstration_turn_ends_before_what_the_runtime_gave_back() -> None:
    assert first_reply(PROGRAM + "\n```output\n4\n```\nSo 4.") == PROGRAM
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert first_reply(call + "\n<tool_response>ok</tool_response>") == call
    assert first_reply("```output\n4\n```") == ""
    near, far = Example("a", "near task", "near reply"), Example("b", "far task", "far reply")
    # Nearest last: it is the exchange closest to the task it precedes.
    assert [t["content"] for t in demo_turns([near, far])] == [
        "far task", "far reply", "near task", "near reply"]
    assert [t["role"] for t in demo_turns([near])] == ["user", "assistant"]


def test_turns_are_chosen_within_the_budget_and_skip_examples_with_no_reply() -> None:
    r = ExampleRetriever(WordEmbedder())
    examples = [Example("x", "Tom has 2 apples", "```output\n2\n```"),
                Example("y", "Tom has 3 apples", PROGRAM), Example("z", "Sue has 5 cats", PROGRAM)]
    shown = r.nearest("Tom has 4 apples", examples, k=2, budget_tokens=10_000,
                      count_tokens=approx_tokens, as_turns=True)
    assert shown.text == "" and shown.trace_ids == ("y", "z") and len(shown.turns) == 4
    assert shown.turns[-1] == {"role": "assistant", "content": PROGRAM}
    assert shown.tokens == sum(approx_tokens(t["content"]) for t in shown.turns)
    tight = r.nearest("Tom has 4 apples", examples, k=2, budget_tokens=shown.tokens - 1,
                      count_tokens=approx_tokens, as_turns=True)
    assert len(tight.trace_ids) == 1


def _library_with_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Library:
    from whetstone.engine.methods.memory.method import Memory, MemoryConfig
    from whetstone.library_store import embeddings

    monkeypatch.setattr(embeddings, "query_embedder",
                        lambda threads=1: WordEmbedder())
    lib = open_library(tmp_path / "lib", create=True)
    train = [code_trace(f"tr{i}", f"Ann has {i} pens and gets {i} more. How many pens?",
                        str(2 * i), label=str(2 * i), score=1.0) for i in range(1, 4)]
    patch = Memory(MemoryConfig(name="gsm8k")).fit(train, lib.snapshot(), ScriptedBackend())
    lib.commit(patch.changes, message="memory", method="memory")
    return lib


@pytest.mark.memory
@pytest.mark.parametrize("solver", ["agent", "direct"])
def test_every_solver_shows_memory_as_turns_before_the_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, solver: str) -> None:
    lib = _library_with_memory(tmp_path, monkeypatch)
    seen: list[Request] = []

    def model(request: Request) -> str:
        seen.append(request)
        return "Final Answer: 2"

    engine = Engine(ScriptedBackend(responder=model), library=lib.root, solver=solver,
                    methods=[("memory", {"k": 2, "turns": True})], checkpointing=False)
    trace = engine.solver()(TASKS[0], 0)
    roles = [m.role for m in seen[0].messages]
    assert roles[-5:] == ["user", "assistant", "user", "assistant", "user"]
    assert seen[0].messages[-1].text == TASKS[0].question
    assert seen[0].messages[-2].text.startswith("Compute it.\n```python")
    assert "```output" not in seen[0].messages[-2].text
    system = seen[0].messages[0].text if roles[0] == "system" else ""
    assert "Worked examples" not in system and "Ann has" not in system
    assert len(trace.meta["memory"]["shown"]) == 2
    # The run's own conversation does not hold them: the trace's task turn is the task.
    assert trace.task == TASKS[0].question


@pytest.mark.memory
def test_the_agent_keeps_the_turns_on_every_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = _library_with_memory(tmp_path, monkeypatch)
    seen: list[Request] = []
    call = '{"name": "calculator", "arguments": {"expression": "1+1"}}'
    replies = iter([f"<tool_call>{call}</tool_call>", "Final Answer: 2"])

    def model(request: Request) -> str:
        seen.append(request)
        return next(replies)

    engine = Engine(ScriptedBackend(responder=model), library=lib.root, solver="agent",
                    methods=[("memory", {"k": 1, "turns": True})], checkpointing=False)
    engine.solver()(TASKS[0], 0)
    assert len(seen) == 2
    for request in seen:
        assert [m.role for m in request.messages][:4] == ["system", "user", "assistant", "user"]
        assert request.messages[3].text == TASKS[0].question


class _Demos(Plugin):
    name = "demos"

    def guidance(self, task: str, ctx: Any, budget_tokens: int) -> Guidance | None:
        return Guidance("", "", {"n": 1}, library_version="v3",
                        turns=({"role": "user", "content": "2+2?"},
                               {"role": "assistant", "content": "4"}))


def test_the_middleware_puts_turns_after_the_callers_system_message() -> None:
    adapter = ChatAdapter([_Demos()], ScriptedBackend(), budget_tokens=300)
    req = Request(messages=(Message("system", "Be brief."), Message("user", "3+3?")))
    out = adapter.adapt(req)
    assert [(m.role, m.text) for m in out.request.messages] == [
        ("system", "Be brief."), ("user", "2+2?"), ("assistant", "4"), ("user", "3+3?")]
    assert out.library_version == "v3" and out.meta == {"demos": {"n": 1}}
    dicts = inject_turns_dicts([{"role": "developer", "content": "d"},
                                {"role": "user", "content": "3+3?"}], out.turns)
    assert [m["role"] for m in dicts] == ["developer", "user", "assistant", "user"]
