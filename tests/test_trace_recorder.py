"""One writer of a run's trace (``TraceRecorder``) and one conversion on the way to disk.

A run writes its ``running`` record when it starts and one more when it ends (answered,
interrupted, failed); the final record is the very trace ``Agent.run`` returns, built once from
the graph's final state; the store turns a trace into a dict once, images swapped on that dict.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import BackendUnavailable, WhetstoneError
from whetstone.engine.runtime import Agent, Plugin
from whetstone.engine.runtime.checkpoints import Checkpoints
from whetstone.engine.types import Completion, Message, Request, Step, Trace
from whetstone.library_store.traces import TraceStore


class CountingStore(TraceStore):
    """A real store that keeps every trace it was handed, in order."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.handed: list[Trace] = []

    def append(self, trace: Trace) -> None:
        self.handed.append(trace)
        super().append(trace)

    def lines(self) -> int:
        return sum(len(p.read_text().splitlines()) for p in self.files())


def outcomes(store: CountingStore) -> list[str]:
    return [t.outcome for t in store.handed]


def test_a_finished_run_writes_running_then_the_trace_it_returns(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "t")
    backend = ScriptedBackend(["Action: calculator[17*23]", "Final Answer: 391"])
    trace = Agent(backend, trace_store=store).run("17*23?")
    assert outcomes(store) == ["running", "answered"] and store.lines() == 2
    # Built once and handed to the store as is: no dict round trip through the graph state.
    assert store.handed[-1] is trace
    assert [s.kind for s in trace.steps] == ["prepare", "think", "act", "think", "finish"]
    assert trace.ended is not None and trace.ended >= trace.started
    assert trace.meta["reason"] == "answered"
    # What is on disk is that trace.
    assert store.get(trace.id).to_dict() == json.loads(json.dumps(trace.to_dict()))
    # The running record had the same id and start (the id says when the run started).
    running = store.handed[0]
    assert (running.id, running.started, running.ended) == (trace.id, trace.started, None)


def test_a_failed_model_call_writes_two_records_and_keeps_its_error(tmp_path: Path) -> None:
    class Down(ScriptedBackend):
        def complete(self, request: Request) -> Completion:
            raise BackendUnavailable("cannot reach http://127.0.0.1:9/v1", hint="start it")

    store = CountingStore(tmp_path / "t")
    trace = Agent(Down(), trace_store=store).run("x")
    assert outcomes(store) == ["running", "error"] and store.lines() == 2
    assert store.handed[-1] is trace
    assert "cannot reach" in trace.meta["error"] and trace.error is not None


def test_ctrl_c_writes_two_records_and_resume_writes_one(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "t")
    cps = Checkpoints(tmp_path / "cp.sqlite")
    replies = iter(["Action: calculator[17*23]"])

    def ctrl_c_on_second_call(request: Request) -> str:
        try:
            return next(replies)
        except StopIteration:
            raise KeyboardInterrupt from None

    agent = Agent(ScriptedBackend(responder=ctrl_c_on_second_call), trace_store=store,
                  checkpoints=cps)
    with pytest.raises(KeyboardInterrupt):
        agent.run("17*23?", trace_id="run-1")
    assert outcomes(store) == ["running", "interrupted"] and store.lines() == 2
    assert store.handed[-1].meta["reason"] == "interrupted by the user"
    assert cps.resumable("run-1")
    trace = Agent(ScriptedBackend(["Final Answer: 391"]), trace_store=store,
                  checkpoints=cps).resume("run-1")
    assert outcomes(store) == ["running", "interrupted", "answered"] and store.lines() == 3
    assert store.handed[-1] is trace and trace.started == store.handed[0].started


def test_a_runtime_error_and_an_abandoned_stream_write_two_records(tmp_path: Path) -> None:
    class Refuses(Plugin):
        name = "refuses"

        def finish_meta(self, state: Any) -> dict[str, Any]:
            raise WhetstoneError("the plugin refuses", hint="none")

    store = CountingStore(tmp_path / "t")
    with pytest.raises(WhetstoneError, match="refuses"):
        Agent(ScriptedBackend(["Final Answer: 2"]), plugins=[Refuses()],
              trace_store=store).run("1+1")
    assert outcomes(store) == ["running", "error"]
    assert store.handed[-1].meta["error"] == "WhetstoneError: the plugin refuses"

    store = CountingStore(tmp_path / "u")
    events = Agent(ScriptedBackend(["Action: calculator[1+1]", "Final Answer: 2"]),
                   trace_store=store).stream("1+1")
    next(events)
    events.close()
    assert outcomes(store) == ["running", "interrupted"] and store.lines() == 2


def test_a_final_write_that_fails_leaves_a_resumable_run(tmp_path: Path) -> None:
    """The final record is written after the graph's last checkpoint and before the run is
    marked finished: a store that fails there (a full disk, a kill) loses nothing."""

    class FullOnce(CountingStore):
        full = True

        def append(self, trace: Trace) -> None:
            if trace.outcome == "answered" and self.full:
                self.full = False
                raise OSError(28, "No space left on device")
            super().append(trace)

    store = FullOnce(tmp_path / "t")
    cps = Checkpoints(tmp_path / "cp.sqlite")
    with pytest.raises(OSError):
        Agent(ScriptedBackend(["Final Answer: 2"]), trace_store=store,
              checkpoints=cps).run("1+1", trace_id="r1")
    assert outcomes(store) == ["running"] and cps.resumable("r1")
    agent = Agent(ScriptedBackend([]), trace_store=store, checkpoints=cps)
    values = agent.graph.get_state(agent._config("r1", agent.config)).values
    # The finish node settled the run in the state and wrote nothing; no trace rides along.
    assert values["outcome"] == "answered" and values["ended"] and "trace" not in values
    trace = agent.resume("r1")  # nothing left to ask the model: the run had finished
    assert trace.outcome == "answered" and trace.answer == "2"
    assert trace.ended == values["ended"] and trace.meta == {**values["meta"], "source": "agent"}
    assert outcomes(store) == ["running", "answered"] and store.get("r1").outcome == "answered"
    assert not cps.resumable("r1")


def test_encoding_turns_a_trace_into_a_dict_once(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ask = Message("user", ({"type": "image", "image": Image.new("RGB", (8, 8), "red")},
                           {"type": "text", "text": "Colour?"})).to_dict()
    trace = Trace(id="t1", task="Colour?", answer="red", outcome="answered",
                  steps=(Step("think", "think", input={"messages": [ask]}),))
    calls = {"to_dict": 0, "from_dict": 0}
    to_dict, from_dict = Trace.to_dict, Trace.from_dict.__func__  # type: ignore[attr-defined]

    def counted_to_dict(self: Trace) -> dict[str, Any]:
        calls["to_dict"] += 1
        return to_dict(self)

    def counted_from_dict(cls: type[Trace], d: Any) -> Trace:
        calls["from_dict"] += 1
        return from_dict(cls, d)

    monkeypatch.setattr(Trace, "to_dict", counted_to_dict)
    monkeypatch.setattr(Trace, "from_dict", classmethod(counted_from_dict))
    store = TraceStore(tmp_path / "t")
    store.append(trace)
    assert calls == {"to_dict": 1, "from_dict": 0}
    monkeypatch.undo()
    line = next(store.root.glob("*.jsonl")).read_text()
    assert "base64" not in line and '"image_ref"' in line  # the image still went out
    assert trace.steps[0].input["messages"][0]["content"][0]["type"] == "image_url"  # untouched
