"""Images in traces are stored once by content hash, not inline, and a trace round-trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from whetstone.engine.api import Engine
from whetstone.engine.backends.openai_wire import message_to_openai
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import ConfigError, NotFound
from whetstone.engine.types import Message, Step, Trace
from whetstone.library_store.traces import TraceStore


def vision_trace(image: Image.Image, tid: str = "t1") -> Trace:
    ask = Message("user", ({"type": "image", "image": image},
                           {"type": "text", "text": "What colour is it?"})).to_dict()
    steps = tuple(Step("think", "think", input={"messages": [ask] * (i + 1)}) for i in range(3))
    return Trace(id=tid, task="What colour is it?", steps=steps, answer="red",
                 outcome="answered")


def test_an_image_is_stored_once_by_hash_and_the_trace_round_trips(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "traces")
    trace = vision_trace(Image.new("RGB", (64, 64), "red"))
    assert sum(json.dumps(s.input).count("base64,") for s in trace.steps) == 6
    store.append(trace)
    line = next(store.root.glob("*.jsonl")).read_text()
    assert "base64" not in line and line.count('"type": "image_ref"') == 6
    stored_files = [p for p in (store.root / "images").rglob("*") if p.is_file()]
    assert len(stored_files) == 1  # six mentions, one file
    got = store.get("t1")
    part = got.steps[0].input["messages"][0]["content"][0]
    assert part["type"] == "image_ref" and part["media_type"] == "image/png"
    assert Message.from_dict(got.steps[0].input["messages"][0]).images == [part]
    assert store.resolve_images(got).to_dict() == trace.to_dict()


def test_a_path_image_part_is_stored_by_content_and_remote_urls_are_kept(tmp_path: Path) -> None:
    img = tmp_path / "blue.png"
    Image.new("RGB", (8, 8), "blue").save(img)
    store = TraceStore(tmp_path / "traces")
    remote = {"type": "image_url", "image_url": {"url": "https://example.org/a.png"}}
    msg = {"role": "user", "content": [{"type": "image", "image": str(img)}, remote]}
    store.append(Trace(id="t2", task="x", steps=(Step("think", "think",
                                                      input={"messages": [msg]}),)))
    parts = store.get("t2").steps[0].input["messages"][0]["content"]
    assert parts[0]["type"] == "image_ref" and parts[0]["path"] == str(img)
    assert store.images.get(parts[0]["sha256"]) == img.read_bytes()
    assert parts[1] == remote
    inlined = store.resolve_images(store.get("t2")).steps[0].input["messages"][0]["content"]
    assert inlined[0]["image_url"]["url"].startswith("data:image/png;base64,")


def test_a_missing_image_and_a_reference_sent_to_a_server_are_clear_errors(
        tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "traces")
    with pytest.raises(NotFound, match="is not in"):
        store.images.get("0" * 64)
    ref = store.images.put(b"\x89PNG\r\n\x1a\nfake", "image/png")
    with pytest.raises(ConfigError, match="image_ref") as err:
        message_to_openai(Message("user", (ref,)))
    assert "resolve_images" in (err.value.hint or "")


def test_an_agent_run_on_an_image_task_stores_the_image_once(tmp_path: Path) -> None:
    img = tmp_path / "red.png"
    Image.new("RGB", (32, 32), "red").save(img)
    backend = ScriptedBackend(["Thought: look\nAction: calculator[1+1]", "Final Answer: red"],
                              vision=True)
    engine = Engine(backend, library=tmp_path / "lib", create=True, checkpointing=False)
    messages = [{"role": "user", "content": [{"type": "image", "image": str(img)},
                                             {"type": "text", "text": "What colour?"}]}]
    trace = engine.agent.run("What colour?", messages=messages)
    stored = engine.traces.get(trace.id)
    thinks = [s for s in stored.steps if s.kind == "think"]
    parts = [m["content"][0] for s in thinks for m in s.input["messages"]
             if isinstance(m["content"], list)]
    assert len(parts) == 2 and all(p["type"] == "image_ref" for p in parts)
    assert len({p["sha256"] for p in parts}) == 1
    assert engine.traces.images.get(parts[0]["sha256"]) == img.read_bytes()
