"""One writer of a run's trace (``TraceRecorder``) and one conversion on the way to disk.

A run writes its ``running`` record when it starts and one more when it ends (answered,
interrupted, failed); the final record is the very trace ``Agent.run`` returns, built once from
the graph's final state; the store turns a trace into a dict once, images swapped on that dict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from whetstone.engine.types import Message, Step, Trace
from whetstone.library_store.traces import TraceStore


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
