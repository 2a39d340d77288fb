"""The Python face of chat mode: ``Engine.chat`` / ``achat`` / ``feedback`` and ``Engine.wrap``
around real ``openai`` clients talking to a server on 127.0.0.1 (scripted upstream)."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from middleware_support import USER, echo, make_library
from servers import Servers

from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.chat.adapter import ChatAdapter, ChatSwitches
from whetstone.engine.chat.client import WrappedClient, trace_id_of, wrap_client
from whetstone.engine.chat.exchange import ChatReply
from whetstone.engine.errors import ConfigError, NotFound, ScriptExhausted
from whetstone.engine.runtime.plugins import Guidance, Plugin
from whetstone.engine.server import create_app
from whetstone.library_store.store import Library
from whetstone.library_store.traces import TraceStore


@pytest.fixture
def library(tmp_path: Path) -> Library:
    return make_library(tmp_path / "lib")  # each test its own traces


@pytest.fixture
def engine(library: Library) -> Iterator[Engine]:
    e = Engine(ScriptedBackend(responder=echo), library=library.root, checkpointing=False)
    yield e
    e.close()


@pytest.fixture
def upstream() -> Iterator[tuple[str, ScriptedBackend, list[dict[str, Any]]]]:
    """A plain server (no library) and the JSON bodies it received."""
    backend = ScriptedBackend(responder=echo, tool_calls=True)
    bodies: list[dict[str, Any]] = []
    with Servers() as servers:
        yield servers.start(create_app(backend, model_name="up")) + "/v1", backend, bodies


def recording_client(url: str, bodies: list[dict[str, Any]], cls: Any = openai.OpenAI
                     ) -> Any:
    """An openai client whose HTTP layer keeps every request body it sends."""
    if cls is openai.OpenAI:
        def hook(request: httpx.Request) -> None:
            bodies.append(json.loads(request.read()))
        http = httpx.Client(event_hooks={"request": [hook]})
    else:
        async def ahook(request: httpx.Request) -> None:
            bodies.append(json.loads(await request.aread()))
        http = httpx.AsyncClient(event_hooks={"request": [ahook]})
    return cls(base_url=url, api_key="x", max_retries=0, timeout=30, http_client=http)


# --- Engine.chat ---------------------------------------------------------------------------

def test_chat_is_one_adapted_completion_and_a_stored_trace(engine: Engine) -> None:
    reply = engine.chat("How many minutes are 2.5 hours?", max_tokens=30, temperature=0.2)
    assert isinstance(reply, ChatReply) and reply.text == "echo: How many minutes are 2.5 hours?"
    assert reply.library_version == "v2"
    assert reply.guidance["skills"]["shown"][0] == "unit-conversion"
    request = engine.backend.requests[-1]  # type: ignore[attr-defined]
    assert request.max_tokens == 30 and request.temperature == 0.2
    assert request.messages[0].role == "system" and "unit-conversion" in request.messages[0].text
    trace = engine.traces.get(reply.trace_id or "")
    assert (trace.task, trace.answer, trace.outcome) == (
        "How many minutes are 2.5 hours?", reply.text, "answered")
    assert trace.meta["source"] == "chat" and trace.library_version == "v2"
    labelled = engine.feedback(trace.id, 0.5, "half right")
    assert labelled.score == 0.5 and engine.traces.get(trace.id).meta["feedback"] == "half right"


def test_chat_switches_and_messages(engine: Engine) -> None:
    plain = engine.chat([{"role": "system", "content": "Be brief."}, *USER], library=False,
                        record=False)
    assert plain.trace_id is None and plain.library_version is None
    assert engine.backend.requests[-1].messages[0].text == "Be brief."  # type: ignore[attr-defined]
    assert engine.traces.latest() == {}


@pytest.mark.parametrize("args, kwargs, words", [
    ([[]], {}, "at least one message"),
    (["hi"], {"max_token": 5}, "unknown chat parameter(s): max_token"),
    (["hi"], {"temperature": "warm"}, "'temperature' must be a number"),
    ([[{"content": "no role"}]], {}, "bad chat message"),
])
def test_chat_rejects_bad_input(engine: Engine, args: list[Any], kwargs: dict[str, Any],
                                words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        engine.chat(*args, **kwargs)


def test_a_failed_completion_is_recorded_as_an_error(library: Library) -> None:
    with Engine(ScriptedBackend([]), library=library.root, checkpointing=False) as e:
        with pytest.raises(ScriptExhausted):
            e.chat("anything")
        (trace,) = e.traces.latest().values()
        assert trace.outcome == "error" and "ran out of replies" in trace.meta["reason"]
        assert trace.steps[0].error and trace.answer is None


def test_feedback_errors(engine: Engine) -> None:
    reply = engine.chat("hello")
    with pytest.raises(ConfigError, match="from 0 to 1"):
        engine.feedback(reply.trace_id or "", 3)
    with pytest.raises(NotFound, match="exact id"):
        engine.feedback((reply.trace_id or "")[:-2], 1)


async def test_achat(engine: Engine) -> None:
    replies = await asyncio.gather(*(engine.achat(f"question {i}") for i in range(4)))
    assert [r.text for r in replies] == [f"echo: question {i}" for i in range(4)]
    stored = engine.traces.latest()
    assert {stored[r.trace_id or ""].answer for r in replies} == {r.text for r in replies}


# --- Engine.wrap -----------------------------------------------------------------------------

@pytest.mark.integration
def test_wrap_applies_the_library_and_strips_the_switches(engine: Engine, upstream: Any) -> None:
    url, backend, _ = upstream
    sent: list[dict[str, Any]] = []
    client = engine.wrap(recording_client(url, sent))
    assert isinstance(client, WrappedClient)
    r = client.chat.completions.create(model="up", messages=USER,
                                       extra_body={"whetstone": {"budget_tokens": 60}})
    assert r.choices[0].message.content == "echo: How many minutes are 2.5 hours?"
    assert "whetstone" not in sent[0] and sent[0]["messages"][0]["role"] == "system"
    assert "unit-conversion" in backend.requests[0].messages[0].text
    assert trace_id_of(r) == r.whetstone_trace_id  # type: ignore[attr-defined]
    assert "whetstone_trace_id" not in r.to_dict()  # the response itself is unchanged
    trace = engine.traces.get(r.whetstone_trace_id)  # type: ignore[attr-defined]
    assert trace.answer == r.choices[0].message.content
    assert trace.model == f"openai:up@{url}" and trace.meta["client"] == "wrap"
    off = client.chat.completions.create(model="up", messages=USER,
                                         extra_body={"whetstone": {"library": False,
                                                                   "record": False}, "x": 1})
    assert trace_id_of(off) is None and sent[1]["x"] == 1 and "whetstone" not in sent[1]
    assert [m["role"] for m in sent[1]["messages"]] == ["user"]


@pytest.mark.integration
def test_wrap_keeps_the_clients_signature_and_other_attributes(engine: Engine, upstream: Any
                                                               ) -> None:
    url, _, _ = upstream
    inner = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
    client = engine.wrap(inner)
    assert inspect.signature(client.chat.completions.create) == inspect.signature(
        inner.chat.completions.create)
    assert [m.id for m in client.models.list()] == ["up"]  # passed through
    assert client.base_url == inner.base_url
    other = client.with_options(timeout=5)
    assert isinstance(other, WrappedClient) and other.timeout == 5
    r = other.chat.completions.create(model="up", messages=USER)
    assert trace_id_of(r) is not None
    with pytest.raises(ConfigError, match="chat.completions.create"):
        engine.wrap(object())


@pytest.mark.integration
def test_wrap_streams_and_records_the_whole_reply(engine: Engine, upstream: Any) -> None:
    url, _, _ = upstream
    client = engine.wrap(openai.OpenAI(base_url=url, api_key="x", max_retries=0))
    stream = client.chat.completions.create(model="up", messages=USER, stream=True,
                                            stream_options={"include_usage": True})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "echo: How many minutes are 2.5 hours?"
    trace = engine.traces.get(trace_id_of(stream) or "")
    assert trace.answer == text and trace.outcome == "answered" and trace.total_tokens > 0
    with client.chat.completions.create(model="up", messages=USER, stream=True) as cut:
        next(iter(cut))
    assert engine.traces.get(trace_id_of(cut) or "").outcome == "interrupted"


@pytest.mark.integration
def test_wrap_passes_tool_calls_and_records_failures(engine: Engine, upstream: Any) -> None:
    url, backend, _ = upstream
    client = engine.wrap(openai.OpenAI(base_url=url, api_key="x", max_retries=0))
    backend._responder = lambda r: {"tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "call_3"}]}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    r = client.chat.completions.create(model="up", messages=USER, tools=[tool])
    (call,) = r.choices[0].message.tool_calls
    assert (call.id, call.function.name) == ("call_3", "get_weather")
    assert backend.requests[-1].tools[0]["function"]["name"] == "get_weather"
    trace = engine.traces.get(trace_id_of(r) or "")
    assert trace.answer == 'get_weather({"city": "Oslo"})'
    assert trace.steps[0].input["tools"] == ["get_weather"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="not-served", messages=USER)
    failed = [t for t in engine.traces.latest().values() if t.outcome == "error"]
    assert len(failed) == 1 and "NotFoundError" in failed[0].meta["reason"]


class _BrokenLibrary(Plugin):
    name = "broken"

    def guidance(self, task: str, ctx: Any, budget_tokens: int) -> Guidance | None:
        raise RuntimeError("embedder failed to load")


@pytest.mark.integration
def test_wrap_sends_the_request_unadapted_when_the_library_fails(
        upstream: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url, backend, _ = upstream
    store = TraceStore(tmp_path / "traces")
    adapter = ChatAdapter([_BrokenLibrary()], backend)
    sent: list[dict[str, Any]] = []
    client = wrap_client(recording_client(url, sent), adapter, store)
    r = client.chat.completions.create(model="up", messages=USER)
    assert r.choices[0].message.content == "echo: How many minutes are 2.5 hours?"
    assert [m["role"] for m in sent[0]["messages"]] == ["user"]  # as the app sent it
    trace = store.get(trace_id_of(r) or "")
    assert trace.outcome == "answered" and trace.answer == r.choices[0].message.content
    assert "embedder failed to load" in trace.meta["library_error"]
    assert "library retrieval failed" in caplog.text
    stream = client.chat.completions.create(model="up", messages=USER, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices).startswith(
        "echo:")
    assert "library_error" in store.get(trace_id_of(stream) or "").meta


@pytest.mark.integration
async def test_an_async_wrap_sends_the_request_unadapted_when_the_library_fails(
        upstream: Any, tmp_path: Path) -> None:
    url, backend, _ = upstream
    store = TraceStore(tmp_path / "traces")
    sent: list[dict[str, Any]] = []
    client = wrap_client(recording_client(url, sent, openai.AsyncOpenAI),
                         ChatAdapter([_BrokenLibrary()], backend), store)
    r = await client.chat.completions.create(model="up", messages=USER)
    assert r.choices[0].message.content == "echo: How many minutes are 2.5 hours?"
    assert [m["role"] for m in sent[0]["messages"]] == ["user"]
    trace = store.get(trace_id_of(r) or "")
    assert trace.outcome == "answered" and "embedder" in trace.meta["library_error"]
    await client.close()


@pytest.mark.integration
def test_wrap_with_raw_response(engine: Engine, upstream: Any) -> None:
    url, _, _ = upstream
    client = engine.wrap(openai.OpenAI(base_url=url, api_key="x", max_retries=0))
    raw = client.chat.completions.with_raw_response.create(model="up", messages=USER)
    assert raw.headers["content-type"] == "application/json"
    parsed = raw.parse()
    assert trace_id_of(parsed) == trace_id_of(raw) is not None
    assert engine.traces.get(trace_id_of(raw) or "").answer == parsed.choices[0].message.content


@pytest.mark.integration
async def test_wrap_an_async_client(engine: Engine, upstream: Any) -> None:
    url, _, _ = upstream
    sent: list[dict[str, Any]] = []
    client = engine.wrap(recording_client(url, sent, openai.AsyncOpenAI))
    replies = await asyncio.gather(*(client.chat.completions.create(
        model="up", messages=[{"role": "user", "content": f"how long is {i} hours"}])
        for i in range(3)))
    assert [r.choices[0].message.content for r in replies] == [
        f"echo: how long is {i} hours" for i in range(3)]
    assert all(b["messages"][0]["role"] == "system" for b in sent)
    stream = await client.chat.completions.create(model="up", messages=USER, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "echo: How many minutes are 2.5 hours?"
    await asyncio.sleep(0)  # the trace write ran in a thread when the stream ended
    ids = [trace_id_of(r) for r in replies] + [trace_id_of(stream)]
    stored = engine.traces.latest()
    assert all(i in stored for i in ids)
    assert stored[ids[-1] or ""].answer == text
    await client.close()


@pytest.mark.integration
def test_engine_app_serves_this_engines_library(engine: Engine) -> None:
    with Servers() as servers:
        url = servers.start(engine.app(model_name="tiny")) + "/v1"
        c = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=30)
        raw = c.chat.completions.with_raw_response.create(model="tiny", messages=USER)
        assert raw.headers["x-whetstone-library-version"] == "v2"
    assert raw.headers["x-whetstone-trace-id"] in engine.traces.latest()


def test_a_pinned_version_is_what_chat_uses(tmp_path: Path) -> None:
    lib = make_library(tmp_path / "lib")
    lib.commit({"skills/baking-recipes/SKILL.md": None}, method="test", message="drop")
    with Engine(ScriptedBackend(responder=echo), library=lib.root, version="v2",
                checkpointing=False) as e:
        reply = e.chat("bake bread for ten people")
        assert reply.library_version == "v2" and "baking-recipes" in reply.guidance[
            "skills"]["shown"]
        assert e.chat_adapter().library_version() == "v2"


def test_a_repeated_question_is_served_from_the_caches(engine: Engine, library: Library
                                                       ) -> None:
    from whetstone.library_store.embed_cache import CachedEmbedder

    adapter = engine.chat_adapter()
    embedder = adapter.plugins[0].retriever.index.embedder  # type: ignore[attr-defined]
    assert isinstance(embedder, CachedEmbedder)
    first = engine.chat("How many minutes are 2.5 hours?")
    misses = embedder.misses
    again = engine.chat("How many minutes are 2.5 hours?")  # same guidance, nothing computed
    assert adapter.cache_hits == 1 and (embedder.hits, embedder.misses) == (0, misses)
    assert again.guidance == first.guidance
    sent = engine.backend.requests  # type: ignore[attr-defined]
    assert sent[-1].messages[0].text == sent[-2].messages[0].text
    adapter.adapt(sent[-1].with_(messages=sent[-1].messages[1:]),
                  ChatSwitches(budget_tokens=100))  # another budget: searched again,
    assert (embedder.hits, embedder.misses) == (1, misses)  # but not embedded again
    library.commit({"skills/baking-recipes/SKILL.md": None}, method="test", message="drop")
    moved = engine.chat("How many minutes are 2.5 hours?")  # a new version: a new key
    assert adapter.cache_hits == 1 and moved.library_version == "v3"
    assert "baking-recipes" not in moved.guidance["skills"]["shown"]


@pytest.mark.horizon
@pytest.mark.co_react
@pytest.mark.self_consistency
@pytest.mark.parametrize("method", ["co_react", "self_consistency", "horizon"])
def test_chat_refuses_a_method_it_cannot_run(library: Library, method: str) -> None:
    # Chat mode applies only guidance; Co-ReAct's rubric node and the others were dropped
    # without a word. The same engine still runs the method in the agent loop.
    e = Engine(ScriptedBackend(responder=echo), library=library.root, methods=[method],
               checkpointing=False)
    try:
        with pytest.raises(ConfigError) as err:
            e.chat("hello")
        assert f"method {method!r} cannot run in chat mode" in err.value.message
        assert "agent loop" in err.value.message and ".run(task)" in (err.value.hint or "")
        assert e.agent.plugins[-1].name == method  # the agent builds it
    finally:
        e.close()


@pytest.mark.memory
def test_chat_keeps_methods_that_add_guidance(library: Library) -> None:
    e = Engine(ScriptedBackend(responder=echo), library=library.root, methods=["memory"],
               checkpointing=False)
    try:
        assert e.chat("hello").text
    finally:
        e.close()


@pytest.mark.integration
def test_a_trace_that_cannot_be_written_costs_the_trace_not_the_reply(
        engine: Engine, upstream: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A full disk under the trace store: chat and a wrapped client still return the reply
    (the model's work is done and paid for), without a trace id, and the error is logged."""
    def full(self: TraceStore, trace: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(TraceStore, "append", full)
    reply = engine.chat("hello")
    assert reply.text == "echo: hello" and reply.trace_id is None
    url, _, _ = upstream
    client = engine.wrap(openai.OpenAI(base_url=url, api_key="x", max_retries=0))
    r = client.chat.completions.create(model="up", messages=USER)
    assert r.choices[0].message.content.startswith("echo:") and trace_id_of(r) is None
    logged = [rec.getMessage() for rec in caplog.records if rec.levelname == "ERROR"]
    assert len(logged) == 2 and all("No space left on device" in m for m in logged)


def test_a_wrapped_client_refuses_endpoints_rather_than_ignore_them(tmp_path: Path) -> None:
    import openai

    from whetstone.engine.api import Engine
    from whetstone.engine.errors import ConfigError

    with Engine(ScriptedBackend([]), library=tmp_path / "lib", create=True,
                checkpointing=False) as engine:
        client = engine.wrap(openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="x",
                                           max_retries=0))
        with pytest.raises(ConfigError, match="answered by the Whetstone server") as err:
            client.chat.completions.create(model="m", messages=[{"role": "user",
                                                                 "content": "hi"}],
                                            extra_body={"whetstone": {"endpoints": ["verify"]}})
        assert "engine.endpoint" in err.value.hint
