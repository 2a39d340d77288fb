"""Whetstone behind Whetstone: the ``openai:`` backend as the upstream (the proxy chain), and an
upstream that is down or slow, through the real ``openai`` client on 127.0.0.1."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from middleware_support import (
    USER,
    WEATHER_TOOL,
    SlowWhenAsked,
    echo,
    make_adapter,
    make_library,
    serving_on,
    wait_for_trace,
)
from servers import Servers, free_port

from whetstone.engine.backends.registry import BackendOptions, get_backend
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.server import create_app
from whetstone.engine.server.guard import TRACE_HEADER, VERSION_HEADER
from whetstone.library_store.store import Library
from whetstone.library_store.traces import TraceStore

pytestmark = [pytest.mark.integration]  # every test here uses it


@pytest.fixture
def library(tmp_path: Path) -> Library:
    return make_library(tmp_path / "lib")


def front(servers: Servers, library: Library, upstream_url: str, store: TraceStore,
          **kw: Any) -> tuple[str, Any]:
    """A Whetstone server with the library whose upstream is ``upstream_url`` (openai:)."""
    timeout = kw.pop("timeout_s", 30.0)
    backend = get_backend(f"openai:tiny@{upstream_url}",
                          BackendOptions(max_retries=0, timeout_s=timeout))
    adapter = make_adapter(library, backend)
    url = servers.start(create_app(backend, model_name="front", adapter=adapter, traces=store,
                                   **kw)) + "/v1"
    servers.callback(backend.close)
    servers.callback(adapter.close)
    return url, backend


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=30)


@pytest.fixture
def chain(library: Library, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """client -> front (library, traces) -> back (a Whetstone server recording its own traces,
    no library) -> scripted model."""
    model = ScriptedBackend(responder=echo, tool_calls=True)
    back_store, front_store = TraceStore(tmp_path / "back"), TraceStore(tmp_path / "front")
    with Servers() as servers:
        back = servers.start(create_app(model, model_name="tiny", traces=back_store)) + "/v1"
        url, _ = front(servers, library, back, front_store)
        yield {"url": url, "model": model, "front": front_store, "back": back_store}


def test_the_proxy_chain_applies_the_library_once_and_both_record(chain: dict[str, Any]
                                                                  ) -> None:
    raw = client(chain["url"]).chat.completions.with_raw_response.create(
        model="front", messages=USER)
    r = raw.parse()
    assert r.model == "front" and r.choices[0].message.content == (
        "echo: How many minutes are 2.5 hours?")
    assert raw.headers[VERSION_HEADER] == "v2"
    system, user = chain["model"].requests[0].messages
    assert system.text.count("# Skills") == 1 and "unit-conversion" in system.text
    assert user.text == USER[0]["content"]
    front_trace = wait_for_trace(chain["front"], raw.headers[TRACE_HEADER])
    assert front_trace.model.startswith("openai:tiny@http://127.0.0.1:")
    assert front_trace.answer == r.choices[0].message.content
    (back_trace,) = [wait_for_trace(chain["back"], t) for t in chain["back"].latest()]
    assert back_trace.steps[0].input["messages"][0]["content"] == system.text
    assert back_trace.meta["library"] is False  # the back server has no library of its own


def test_streaming_and_tool_calls_through_the_chain(chain: dict[str, Any]) -> None:
    c = client(chain["url"])
    chunks = list(c.chat.completions.create(model="front", messages=USER, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == (
        "echo: How many minutes are 2.5 hours?")
    chain["model"]._responder = lambda r: {"tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "call_9"}]}
    r = c.chat.completions.create(model="front", messages=[
        {"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER_TOOL])
    (call,) = r.choices[0].message.tool_calls
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "call_9", "get_weather", {"city": "Oslo"})
    assert r.choices[0].finish_reason == "tool_calls"
    assert chain["model"].requests[-1].tools[0]["function"]["name"] == "get_weather"


def test_switches_reach_the_front_only(chain: dict[str, Any]) -> None:
    raw = client(chain["url"]).chat.completions.with_raw_response.create(
        model="front", messages=USER, extra_body={"whetstone": {"library": False}})
    assert VERSION_HEADER not in raw.headers
    assert [m.role for m in chain["model"].requests[0].messages] == ["user"]


def test_an_upstream_that_is_down_is_a_502_until_it_comes_up(library: Library, tmp_path: Path
                                                             ) -> None:
    port = free_port()
    store = TraceStore(tmp_path / "front")
    with Servers() as servers:
        url, _ = front(servers, library, f"http://127.0.0.1:{port}/v1", store)
        r = httpx.post(url + "/chat/completions", json={"model": "front", "messages": USER},
                       timeout=30)
        assert r.status_code == 502, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["code"] == "upstream_error" and "upstream model failed" in err["message"]
        assert str(port) not in r.text  # the internal address stays in the log and the trace
        assert "Traceback" not in r.text
        failed = wait_for_trace(store, r.headers[TRACE_HEADER])
        assert failed.outcome == "error" and "cannot reach" in failed.meta["reason"]
        with serving_on(create_app(ScriptedBackend(responder=echo), model_name="tiny"), port):
            ok = client(url).chat.completions.create(model="front", messages=USER)
            assert ok.choices[0].message.content.startswith("echo:")


def test_a_slow_upstream_is_a_504_and_the_server_keeps_serving(library: Library,
                                                               tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "front")
    with Servers() as servers:
        back = servers.start(create_app(SlowWhenAsked(delay_s=5), model_name="tiny")) + "/v1"
        url, _ = front(servers, library, back, store, timeout_s=0.5, request_timeout_s=0.5)
        start = time.monotonic()
        r = httpx.post(url + "/chat/completions", timeout=30, json={
            "model": "front", "messages": [{"role": "user", "content": "slow please"}]})
        assert r.status_code == 504, r.text
        assert r.json()["error"]["code"] == "upstream_timeout"
        assert time.monotonic() - start < 4
        with pytest.raises(openai.APIStatusError) as info:
            client(url).chat.completions.create(model="front", stream=True, messages=[
                {"role": "user", "content": "slow stream"}])
        assert info.value.status_code == 504
        ok = client(url).chat.completions.create(model="front", messages=[
            {"role": "user", "content": "fast please"}])
        assert ok.choices[0].message.content == "echo: fast please"
        assert wait_for_trace(store, r.headers[TRACE_HEADER]).outcome == "error"
