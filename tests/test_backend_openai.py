"""The ``openai:`` backend: spec parsing, the wire format, and calls through the real ``openai``
client against real servers on 127.0.0.1 (a Whetstone server with the scripted backend upstream,
and small misbehaving servers for retries, timeouts and refusals)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, PlainTextResponse
from servers import Servers, free_port

from whetstone.engine.backends import BackendOptions, get_backend
from whetstone.engine.backends.openai_compat import (
    OFFICIAL_BASE_URL,
    OpenAICompatBackend,
    RetryPolicy,
    parse_spec,
)
from whetstone.engine.backends.openai_wire import (
    StreamAccumulator,
    message_to_openai,
    request_from_openai,
    request_to_openai,
)
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import BackendError, BackendTimeout, BackendUnavailable, ConfigError
from whetstone.engine.server import create_app
from whetstone.engine.types import Completion, Message, Request, ToolCall

ASK = Request(messages=[Message("user", "Say hello.")], max_tokens=16)
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather for a city.",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
FAST_RETRY = {"retry_backoff_s": 0.01, "retry_max_backoff_s": 0.05}


@pytest.fixture
def servers() -> Iterator[Servers]:
    with Servers() as s:
        yield s


@pytest.fixture
def upstream(servers: Servers) -> Iterator[Callable[..., tuple[ScriptedBackend,
                                                                OpenAICompatBackend]]]:
    """``upstream(scripted, **options)``: serve ``scripted`` as model ``tiny`` and return it with
    an ``openai:tiny@<url>`` backend pointed at it."""
    made: list[OpenAICompatBackend] = []

    def make(scripted: ScriptedBackend, **options: Any) -> tuple[ScriptedBackend,
                                                                   OpenAICompatBackend]:
        url = servers.start(create_app(scripted, model_name="tiny"))
        backend = get_backend(f"openai:tiny@{url}/v1", BackendOptions(**options))
        assert isinstance(backend, OpenAICompatBackend)
        made.append(backend)
        return scripted, backend

    yield make
    for backend in made:
        backend.close()


# --- spec ------------------------------------------------------------------------------------

@pytest.mark.parametrize("arg, model, url", [
    ("qwen@http://127.0.0.1:8000/v1", "qwen", "http://127.0.0.1:8000/v1"),
    ("qwen@http://127.0.0.1:8000", "qwen", "http://127.0.0.1:8000/v1"),
    ("qwen@http://127.0.0.1:8000/", "qwen", "http://127.0.0.1:8000/v1"),
    ("qwen@127.0.0.1:8000", "qwen", "http://127.0.0.1:8000/v1"),
    ("Qwen/Qwen2.5-0.5B@https://host.example/api/v1/", "Qwen/Qwen2.5-0.5B",
     "https://host.example/api/v1"),
    ("me@corp/model@http://h:1/v1", "me@corp/model", "http://h:1/v1"),
])
def test_spec_parsing(arg: str, model: str, url: str) -> None:
    assert parse_spec(arg, env={}) == (model, url)


def test_a_bare_model_uses_openai_base_url_or_the_official_api() -> None:
    assert parse_spec("gpt-4o-mini", env={}) == ("gpt-4o-mini", OFFICIAL_BASE_URL)
    assert parse_spec("m", env={"OPENAI_BASE_URL": "http://10.0.0.5:9000"}) == (
        "m", "http://10.0.0.5:9000/v1")


@pytest.mark.parametrize("arg", ["", "@http://127.0.0.1:8000/v1", "qwen@", "qwen@ftp://h/v1"])
def test_bad_specs_are_config_errors(arg: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_spec(arg, env={})
    assert "openai:" in str(info.value)


def test_the_official_api_without_a_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        get_backend("openai:gpt-4o-mini")
    backend = get_backend("openai:gpt-4o-mini", BackendOptions(api_key="sk-test"))
    assert backend.base_url == OFFICIAL_BASE_URL  # type: ignore[attr-defined]
    backend.close()


def test_factory_settings_and_capabilities(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    backend = get_backend("openai:qwen@http://127.0.0.1:8000", BackendOptions(
        timeout_s=7, max_retries=5, extra={"max_concurrency": 3, "retry_backoff_s": 0.1}))
    assert isinstance(backend, OpenAICompatBackend)
    assert backend.spec == "openai:qwen@http://127.0.0.1:8000"
    assert (backend.model, backend.base_url, backend.timeout_s) == (
        "qwen", "http://127.0.0.1:8000/v1", 7)
    assert backend.retry == RetryPolicy(max_retries=5, backoff_s=0.1, max_backoff_s=8.0)
    caps = backend.capabilities
    assert caps.tool_calls and caps.streaming and caps.logprobs and not caps.white_box
    assert caps.max_concurrency == 3
    assert get_backend("openai:q@http://h:1").capabilities.max_concurrency == 8


def test_retry_backoff_doubles_and_is_capped() -> None:
    policy = RetryPolicy(max_retries=9, backoff_s=0.5, max_backoff_s=3.0)
    assert [policy.delay(k) for k in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert policy.delay(0, retry_after=2.0) == 2.0 and policy.delay(0, retry_after=60) == 3.0


# --- the wire format -------------------------------------------------------------------------

def test_a_request_survives_the_wire_both_ways() -> None:
    request = Request(
        messages=[Message("system", "Be brief."), Message("user", "Weather in Paris?"),
                  Message("assistant", "", tool_calls=(ToolCall("get_weather", '{"city":"Paris"}',
                                                                "call_1"),)),
                  Message("tool", "sunny", tool_call_id="call_1")],
        max_tokens=33, temperature=0.4, top_p=0.8, stop=("END",), seed=7, tools=(WEATHER_TOOL,),
        logprobs=True,
    )
    body = request_to_openai(request, "tiny")
    assert body["n"] == 1 and body["model"] == "tiny"
    assert body["messages"][2]["content"] is None  # a pure tool-call turn, as servers expect
    call = request_from_openai(json.loads(json.dumps(body)))
    assert call.request == request and call.model == "tiny" and not call.stream


def test_unset_options_are_not_sent() -> None:
    body = request_to_openai(ASK, "tiny")
    assert not {"stop", "seed", "tools", "logprobs"} & set(body)


def test_fields_left_unset_are_not_sent_and_a_value_given_later_is() -> None:
    call = request_from_openai({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                "top_p": 0.5}, default_max_tokens=99)
    request = call.request
    assert request.unset == {"max_tokens", "temperature", "n"}
    assert (request.max_tokens, request.temperature) == (99, 0.0)  # for a local model
    body = request_to_openai(request, "m")
    assert body["top_p"] == 0.5 and not {"max_tokens", "temperature", "n"} & set(body)
    again = request.with_(max_tokens=5)
    assert request_to_openai(again, "m")["max_tokens"] == 5 and "max_tokens" not in again.unset
    assert Request.from_dict(json.loads(json.dumps(request.to_dict()))) == request
    with pytest.raises(ValueError, match="seed"):
        Request(messages=[Message("user", "x")], unset=frozenset({"seed"}))


def test_an_image_path_is_sent_inline(tmp_path: Any) -> None:
    from PIL import Image

    path = tmp_path / "dot.png"
    Image.new("RGB", (2, 2), "red").save(path)
    msg = Message("user", ({"type": "text", "text": "What colour?"},
                           {"type": "image", "image": str(path)}))
    parts = message_to_openai(msg)["content"]
    assert parts[0] == {"type": "text", "text": "What colour?"}
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    with pytest.raises(ConfigError, match="not a file"):
        message_to_openai(Message("user", ({"type": "image", "image": str(tmp_path / "no.png")},)))


@pytest.mark.parametrize("message, words", [
    ({"role": "user", "content": [{"type": "image", "image": "/etc/hostname"}]},
     "must be one of text, image_url"),
    ({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]},
     "must be one of text, image_url"),
    ({"role": "user", "content": [{"type": "text", "text": 5}]}, "content[0].text"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": "http://x/a.png"}]},
     "content[0].image_url"),
    ({"role": "user", "content": ["hi"]}, "content[0]"),
    ({"role": "assistant", "tool_calls": [{"id": "a", "function": "x"}]},
     "tool_calls[0].function"),
    ({"role": "assistant", "tool_calls": [{"id": "a", "function": None}]},
     "tool_calls[0].function"),
    ({"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": 3}}]},
     "tool_calls[0].function.name"),
    ({"role": "assistant", "tool_calls": [{"id": 7, "function": {"name": "f"}}]},
     "tool_calls[0].id"),
    ({"role": "assistant", "tool_calls": "x"}, "tool_calls"),
    ({"role": "user", "content": "hi", "name": 5}, "name"),
])
def test_the_wire_refuses_local_images_and_malformed_messages(message: dict[str, Any],
                                                              words: str) -> None:
    # A request from the wire never reads the server's files; only the Python API takes paths.
    with pytest.raises(ConfigError) as info:
        request_from_openai({"messages": [{"role": "user", "content": "hi"}, message]})
    assert words in info.value.message


@pytest.mark.parametrize("key, value", [("temperature", float("nan")), ("top_p", float("nan")),
                                        ("temperature", float("inf")), ("top_p", float("-inf")),
                                        ("seed", float("inf")), ("max_tokens", float("nan"))])
def test_the_wire_refuses_numbers_that_are_not_finite(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"'{key}' must be"):
        request_from_openai({"messages": [{"role": "user", "content": "hi"}], key: value})


def test_the_wire_takes_huge_integers_as_integers() -> None:
    call = request_from_openai({"messages": [{"role": "user", "content": "hi"}],
                                "seed": 10 ** 400})  # float() of it would overflow
    assert call.request.seed == 10 ** 400


def test_stream_accumulator_joins_tool_call_fragments() -> None:
    acc = StreamAccumulator()
    frags = [
        {"index": 0, "id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": ""}},
        {"index": 1, "id": "call_b", "function": {"name": "get_", "arguments": '{"ci'}},
        {"index": 0, "function": {"arguments": '{"city": '}},
        {"index": 1, "function": {"name": "weather", "arguments": 'ty": "Rome"}'}},
        {"index": 0, "function": {"arguments": '"Oslo"}'}},
        # llama-cpp-python's server repeats the whole name in every fragment
        {"index": 0, "function": {"name": "get_weather", "arguments": ""}},
    ]
    for f in frags:
        acc.feed({"model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [f]}}]})
    acc.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    acc.feed({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5}})
    c = acc.completion(0.5)
    assert [(t.id, t.name, t.parsed_arguments()) for t in c.tool_calls] == [
        ("call_a", "get_weather", {"city": "Oslo"}), ("call_b", "get_weather", {"city": "Rome"})]
    assert (c.finish_reason, c.prompt_tokens, c.completion_tokens, c.model) == (
        "tool_calls", 11, 5, "m")


# --- against a live Whetstone server ---------------------------------------------------------

@pytest.mark.integration
def test_complete(upstream: Callable[..., Any]) -> None:
    scripted, backend = upstream(ScriptedBackend(["Hello there!"]))
    c = backend.complete(ASK)
    assert c.text == "Hello there!" and c.finish_reason == "stop" and c.model == "tiny"
    assert c.prompt_tokens > 0 and c.completion_tokens > 0 and c.latency_s > 0
    assert scripted.requests[0].messages == ASK.messages


@pytest.mark.integration
def test_sampling_options_and_seed_pass_through(upstream: Callable[..., Any]) -> None:
    scripted, backend = upstream(ScriptedBackend(["a"]))
    backend.complete(ASK.with_(seed=1234, temperature=0.6, top_p=0.7, stop=("###",),
                               max_tokens=21))
    seen = scripted.requests[0]
    assert (seen.seed, seen.temperature, seen.top_p, seen.stop, seen.max_tokens) == (
        1234, 0.6, 0.7, ("###",), 21)


@pytest.mark.integration
def test_native_tool_calls(upstream: Callable[..., Any]) -> None:
    scripted, backend = upstream(ScriptedBackend(
        [{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "c9"}]}],
        tool_calls=True))
    c = backend.complete(ASK.with_(tools=(WEATHER_TOOL,)))
    assert c.finish_reason == "tool_calls" and c.text == ""
    assert [(t.id, t.name, t.parsed_arguments()) for t in c.tool_calls] == [
        ("c9", "get_weather", {"city": "Paris"})]
    assert scripted.requests[0].tools == (WEATHER_TOOL,)


@pytest.mark.integration
def test_logprobs_pass_through(upstream: Callable[..., Any]) -> None:
    scripted, backend = upstream(ScriptedBackend([Completion("hi", logprobs=(-0.1, -2.0))]))
    c = backend.complete(ASK.with_(logprobs=True))
    assert c.logprobs == (-0.1, -2.0) and scripted.requests[0].logprobs


@pytest.mark.integration
def test_stream(upstream: Callable[..., Any]) -> None:
    _, backend = upstream(ScriptedBackend(["alpha beta gamma"]))
    chunks = list(backend.stream(ASK))
    assert [c.text for c in chunks[:-1]] == ["alpha", " beta", " gamma"]
    final = chunks[-1].completion
    assert final is not None and final.text == "alpha beta gamma"
    assert final.completion_tokens > 0 and final.prompt_tokens > 0  # from the usage chunk


@pytest.mark.integration
def test_stream_with_tool_calls(upstream: Callable[..., Any]) -> None:
    _, backend = upstream(ScriptedBackend(
        [{"tool_calls": [{"name": "get_weather", "arguments": '{"city": "Oslo"}'}]}],
        tool_calls=True))
    final = list(backend.stream(ASK.with_(tools=(WEATHER_TOOL,))))[-1].completion
    assert final is not None and final.finish_reason == "tool_calls"
    assert [(t.name, t.parsed_arguments()) for t in final.tool_calls] == [
        ("get_weather", {"city": "Oslo"})]


@pytest.mark.integration
def test_async_complete_stream_and_batch(upstream: Callable[..., Any]) -> None:
    _, backend = upstream(ScriptedBackend(
        responder=lambda r: f"echo {r.messages[-1].text}", delay_s=0.05))

    async def main() -> tuple[Completion, list[Any], list[Completion]]:
        one = await backend.acomplete(ASK)
        chunks = [c async for c in backend.astream(ASK)]
        many = await backend.batch(
            [Request(messages=[Message("user", f"q{i}")]) for i in range(6)], concurrency=3)
        return one, chunks, many

    one, chunks, many = asyncio.run(main())
    assert one.text == "echo Say hello."
    assert "".join(c.text for c in chunks) == "echo Say hello."
    assert chunks[-1].completion.text == "echo Say hello."
    assert [c.text for c in many] == [f"echo q{i}" for i in range(6)]  # order kept
    # A second event loop gets its own async client (pools are bound to their loop).
    assert asyncio.run(backend.acomplete(ASK)).text == "echo Say hello."
    backend.close()


@pytest.mark.integration
def test_a_whetstone_server_can_serve_an_openai_backend(servers: Servers,
                                                        upstream: Callable[..., Any]) -> None:
    import openai

    _, backend = upstream(ScriptedBackend(["proxied answer"]))
    url = servers.start(create_app(backend, model_name="front"))
    with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as front:
        r = front.chat.completions.create(model="front",
                                          messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "proxied answer"


def _recording_app(bodies: list[dict[str, Any]]) -> FastAPI:
    """An upstream that keeps each body and calls the tool ``tool_choice`` names (as vLLM
    and OpenAI do), else answers in text."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: HttpRequest) -> Any:
        body = await request.json()
        bodies.append(body)
        choice = body.get("tool_choice")
        message: dict[str, Any] = {"role": "assistant", "content": "in text"}
        if isinstance(choice, dict):
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {
                    "name": choice["function"]["name"], "arguments": '{"city": "Paris"}'}}]}
        if body.get("stream"):  # one chunk with the whole message, then usage and [DONE]
            from fastapi.responses import StreamingResponse

            delta = {k: v for k, v in message.items() if v is not None}
            for i, call in enumerate(delta.get("tool_calls") or []):
                call["index"] = i
            chunks = [{"id": "c", "object": "chat.completion.chunk", "created": 0,
                       "model": "tiny", "choices": [{"index": 0, "delta": delta,
                                                     "finish_reason": "stop"}]}]
            lines = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            return StreamingResponse(iter([lines]), media_type="text/event-stream")
        return JSONResponse({"id": "c", "object": "chat.completion", "created": 0,
                             "model": "tiny", "choices": [{"index": 0, "message": message,
                                                           "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 5, "completion_tokens": 3,
                                       "total_tokens": 8}})

    return app


@pytest.mark.integration
def test_tool_choice_and_response_format_reach_the_upstream(servers: Servers) -> None:
    """A proxy that drops ``tool_choice`` turns a forced call into "auto" (found in front of
    vLLM: the 0.5B then answered with the call as text). Fields Whetstone does not interpret
    go upstream as the client sent them, through the server and each backend call."""
    import openai

    bodies: list[dict[str, Any]] = []
    up = servers.start(_recording_app(bodies))
    backend = get_backend(f"openai:tiny@{up}/v1", BackendOptions(max_retries=0))
    front = servers.start(create_app(backend, model_name="tiny"))
    named = {"type": "function", "function": {"name": "get_weather"}}
    with backend, openai.OpenAI(base_url=front + "/v1", api_key="x", max_retries=0) as client:
        for stream in (False, True):
            kwargs: dict[str, Any] = {
                "model": "tiny", "messages": [{"role": "user", "content": "Weather in Paris?"}],
                "tools": [WEATHER_TOOL], "tool_choice": named, "parallel_tool_calls": False}
            if stream:
                list(client.chat.completions.create(**kwargs, stream=True))
            else:
                m = client.chat.completions.create(**kwargs).choices[0].message
                assert m.tool_calls and m.tool_calls[0].function.name == "get_weather"
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "JSON please"}],
            response_format={"type": "json_object"}, tool_choice="auto")
        with pytest.raises(openai.BadRequestError, match="not in 'tools'"):
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}],
                tools=[WEATHER_TOOL], tool_choice={"type": "function",
                                                   "function": {"name": "get_time"}})
        asyncio.run(backend.acomplete(ASK.with_(passthrough={"tool_choice": "required"},
                                                tools=(WEATHER_TOOL,))))
    assert [b.get("tool_choice") for b in bodies] == [named, named, None, "required"]
    assert bodies[0]["parallel_tool_calls"] is False and bodies[1]["stream"] is True
    # response_format went through; tool_choice without tools is not sent (nothing to choose)
    assert bodies[2]["response_format"] == {"type": "json_object"}


# --- bad input and failures ------------------------------------------------------------------

def retries_logged(caplog: pytest.LogCaptureFixture) -> int:
    return sum("retry" in r.getMessage() for r in caplog.records
               if r.name == "whetstone.backends.openai")


def test_a_server_that_is_down_is_unavailable_after_bounded_retries(
        caplog: pytest.LogCaptureFixture) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    backend = get_backend(f"openai:tiny@{url}", BackendOptions(max_retries=2, extra=FAST_RETRY))
    caplog.set_level(logging.WARNING, "whetstone.backends.openai")
    start = time.monotonic()
    with pytest.raises(BackendUnavailable) as info:
        backend.complete(ASK)
    assert retries_logged(caplog) == 2  # 1 try + 2 retries, then give up
    assert url in info.value.message and "after 3 attempts" in info.value.message
    assert "whetstone serve" in (info.value.hint or "")
    assert time.monotonic() - start < 5
    caplog.clear()
    with pytest.raises(BackendUnavailable):
        asyncio.run(backend.acomplete(ASK))
    assert retries_logged(caplog) == 2
    with pytest.raises(BackendUnavailable):
        list(backend.stream(ASK))


def test_no_retries_when_max_retries_is_zero(caplog: pytest.LogCaptureFixture) -> None:
    backend = get_backend(f"openai:tiny@http://127.0.0.1:{free_port()}",
                          BackendOptions(max_retries=0))
    with pytest.raises(BackendUnavailable, match="after 1 attempt "):
        backend.complete(ASK)
    assert retries_logged(caplog) == 0


def _flaky_app(statuses: list[int], hits: list[float], headers: dict[str, str] | None = None
               ) -> FastAPI:
    """Answers with ``statuses`` in turn, then with a real chat completion; records each hit."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> JSONResponse:
        hits.append(time.monotonic())
        if len(hits) <= len(statuses):
            status = statuses[len(hits) - 1]
            return JSONResponse({"error": {"message": f"busy ({status})", "type": "x"}},
                                status_code=status, headers=headers)
        return JSONResponse({"id": "c", "object": "chat.completion", "created": 0, "model": "tiny",
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": "ok now"}}]})

    return app


@pytest.mark.integration
def test_5xx_is_retried_then_unavailable(servers: Servers) -> None:
    hits: list[float] = []
    url = servers.start(_flaky_app([503] * 10, hits))
    backend = get_backend(f"openai:tiny@{url}", BackendOptions(max_retries=3, extra=FAST_RETRY))
    with backend, pytest.raises(BackendUnavailable) as info:
        backend.complete(ASK)
    assert len(hits) == 4  # the bound, counted by the server
    assert "503" in info.value.message and "busy (503)" in info.value.message
    assert "after 4 attempts" in info.value.message


@pytest.mark.integration
def test_429_and_500_are_retried_and_retry_after_is_honoured(servers: Servers) -> None:
    hits: list[float] = []
    url = servers.start(_flaky_app([429, 500], hits, headers={"Retry-After": "0.3"}))
    backend = get_backend(f"openai:tiny@{url}", BackendOptions(
        max_retries=3, extra={"retry_backoff_s": 0.01, "retry_max_backoff_s": 5}))
    with backend:
        c = backend.complete(ASK)
    assert c.text == "ok now" and len(hits) == 3
    assert hits[1] - hits[0] >= 0.25  # waited as the server asked, not the tiny backoff
    # The flaky server sent no usage: it is estimated, not left at zero.
    assert c.prompt_tokens > 0 and c.completion_tokens > 0


@pytest.mark.integration
def test_an_upstream_that_says_do_not_retry_is_not_retried(servers: Servers) -> None:
    """``x-should-retry: false`` (the header the ``openai`` client obeys) stops our retries
    too, on both transports, and the error says retrying will not help."""
    for call in ("complete", "acomplete"):
        hits: list[float] = []
        url = servers.start(_flaky_app([429] * 10, hits, headers={"x-should-retry": "false"}))
        backend = get_backend(f"openai:tiny@{url}",
                              BackendOptions(max_retries=3, extra=FAST_RETRY))
        with backend, pytest.raises(BackendError) as info:
            result = getattr(backend, call)(ASK)
            if asyncio.iscoroutine(result):
                asyncio.run(result)
        assert len(hits) == 1 and info.value.no_retry, call
    hits = []
    url = servers.start(_flaky_app([429] * 10, hits))  # no header: retried, then final
    backend = get_backend(f"openai:tiny@{url}", BackendOptions(max_retries=2, extra=FAST_RETRY))
    with backend, pytest.raises(BackendError) as info:
        backend.complete(ASK)
    assert len(hits) == 3 and info.value.no_retry


@pytest.mark.integration
def test_a_chain_of_whetstone_servers_makes_one_round_of_retries(servers: Servers) -> None:
    """client -> Whetstone B -> Whetstone A -> an upstream that is always rate limiting. A
    retries its upstream, then answers 429 with ``x-should-retry: false``: B does not retry A
    and the ``openai`` client does not retry B. Without the header the upstream saw
    (1 + 3) * (1 + 3) * (1 + 2) = 48 calls for one request."""
    import openai

    hits: list[float] = []
    flaky = servers.start(_flaky_app([429] * 100, hits))
    a = servers.start(create_app(get_backend(f"openai:tiny@{flaky}", BackendOptions(
        max_retries=3, extra=FAST_RETRY)), model_name="tiny"))
    b = servers.start(create_app(get_backend(f"openai:tiny@{a}", BackendOptions(
        max_retries=3, extra=FAST_RETRY)), model_name="tiny"))
    client = openai.OpenAI(base_url=f"{b}/v1", api_key="x", max_retries=2)
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert info.value.response.headers["x-should-retry"] == "false"
    assert len(hits) == 4  # A's one round: a call and three retries


@pytest.mark.integration
def test_4xx_is_not_retried_and_carries_the_servers_message(upstream: Callable[..., Any]
                                                           ) -> None:
    scripted, backend = upstream(ScriptedBackend(["never"]))
    with pytest.raises(BackendError) as info:
        backend.complete(ASK.with_(temperature=5.0))
    assert "400" in info.value.message and "'temperature' must be between" in info.value.message
    assert not isinstance(info.value, (BackendUnavailable, BackendTimeout))
    assert scripted.requests == []


@pytest.mark.integration
def test_a_wrong_model_name_is_a_404_with_a_hint(servers: Servers) -> None:
    url = servers.start(create_app(ScriptedBackend(["x"]), model_name="tiny"))
    backend = get_backend(f"openai:huge@{url}", BackendOptions(max_retries=0))
    with backend, pytest.raises(BackendError) as info:
        backend.complete(ASK)
    assert "404" in info.value.message and "'huge'" in info.value.message
    assert "/models" in (info.value.hint or "")


@pytest.mark.integration
def test_an_upstream_failure_reaches_the_caller_as_a_backend_error(
        upstream: Callable[..., Any]) -> None:
    _, backend = upstream(ScriptedBackend([]), max_retries=1, extra=FAST_RETRY)
    # The server keeps the upstream's own error text in its log; the caller gets the request id.
    with pytest.raises(BackendError, match=r"upstream model failed \(request req_"):
        backend.complete(ASK)


@pytest.mark.integration
def test_a_slow_server_is_a_timeout(upstream: Callable[..., Any],
                                    caplog: pytest.LogCaptureFixture) -> None:
    _, backend = upstream(ScriptedBackend(responder=lambda r: "late", delay_s=1.5),
                          timeout_s=0.3, max_retries=3)
    start = time.monotonic()
    with pytest.raises(BackendTimeout) as info:
        backend.complete(ASK)
    assert "0.3 s" in info.value.message
    assert time.monotonic() - start < 2.0  # one wait of 0.3 s: timeouts are not retried
    assert retries_logged(caplog) == 0
    with pytest.raises(BackendTimeout, match="0.2 s"):  # Request.timeout wins over the option
        backend.complete(ASK.with_(timeout=0.2))
    with pytest.raises(BackendTimeout):
        list(backend.stream(ASK))
    with pytest.raises(BackendTimeout):
        asyncio.run(backend.acomplete(ASK))


@pytest.mark.integration
def test_the_async_path_fails_and_retries_as_the_blocking_one(
        servers: Servers, upstream: Callable[..., Any],
        caplog: pytest.LogCaptureFixture) -> None:
    """``acomplete`` posts over aiohttp (the server's hot path), ``complete`` through the SDK:
    the same retries, the same errors with the server's message."""
    hits: list[float] = []
    url = servers.start(_flaky_app([503] * 10, hits))
    backend = get_backend(f"openai:tiny@{url}", BackendOptions(max_retries=3, extra=FAST_RETRY))
    with backend, pytest.raises(BackendUnavailable) as info:
        asyncio.run(backend.acomplete(ASK))
    assert len(hits) == 4 and "busy (503)" in info.value.message
    assert "after 4 attempts" in info.value.message

    hits = []
    url = servers.start(_flaky_app([429, 500], hits, headers={"Retry-After": "0.3"}))
    backend = get_backend(f"openai:tiny@{url}", BackendOptions(
        max_retries=3, extra={"retry_backoff_s": 0.01, "retry_max_backoff_s": 5}))
    with backend:
        c = asyncio.run(backend.acomplete(ASK))
    assert c.text == "ok now" and len(hits) == 3 and hits[1] - hits[0] >= 0.25

    _, backend = upstream(ScriptedBackend(["never"]))
    with pytest.raises(BackendError) as info:
        asyncio.run(backend.acomplete(ASK.with_(temperature=5.0)))
    assert "400" in info.value.message and "'temperature' must be between" in info.value.message
    assert not isinstance(info.value, (BackendUnavailable, BackendTimeout))

    url = servers.start(create_app(ScriptedBackend(["x"]), model_name="tiny"))
    backend = get_backend(f"openai:huge@{url}", BackendOptions(max_retries=0))
    with backend, pytest.raises(BackendError) as info:
        asyncio.run(backend.acomplete(ASK))
    assert "404" in info.value.message and "/models" in (info.value.hint or "")


@pytest.mark.integration
def test_one_event_loop_after_another_leaves_no_session_open(
        upstream: Callable[..., Any], caplog: pytest.LogCaptureFixture) -> None:
    import gc

    caplog.set_level(logging.ERROR, "asyncio")
    _, backend = upstream(ScriptedBackend(responder=lambda r: "hi"))
    for _ in range(2):  # a script calling asyncio.run(engine.achat(...)) twice, never closing
        assert asyncio.run(backend.acomplete(ASK)).text == "hi"
    gc.collect()
    assert not [r for r in caplog.records if "Unclosed" in r.getMessage()]


@pytest.mark.integration
@pytest.mark.parametrize("reply, excerpt", [
    (JSONResponse([]), "[]"),
    (PlainTextResponse("hello from nginx"), "hello from nginx"),
    (JSONResponse(42), "42"),
])
def test_a_200_that_is_not_a_json_object_is_a_backend_error(servers: Servers, reply: Any,
                                                             excerpt: str) -> None:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> Any:
        return reply

    url = servers.start(app)
    backend = get_backend(f"openai:tiny@{url}", BackendOptions(max_retries=0))
    with backend:
        for call in (backend.complete, lambda r: asyncio.run(backend.acomplete(r))):
            with pytest.raises(BackendError) as info:
                call(ASK)
            assert "not a chat completion" in info.value.message
            assert excerpt in info.value.message  # what came back, so the operator can tell
        # Behind a Whetstone server it is a 502, not a crash.
        front = servers.start(create_app(backend, model_name="tiny"))
        r = httpx.post(front + "/v1/chat/completions", timeout=30,
                       json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"
