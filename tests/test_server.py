"""The OpenAI-compatible server, through the real ``openai`` client against a real uvicorn server
on 127.0.0.1, with the scripted backend upstream (the embedded model in one slow test)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from middleware_support import WEATHER_TOOL
from servers import Servers

from whetstone.engine.backends.base import Backend, Capabilities
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.server import create_app
from whetstone.engine.types import Completion, Request

pytestmark = [pytest.mark.integration]  # every test here uses it

USER = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
def serve() -> Iterator[Callable[..., str]]:
    """``serve(backend, **create_app_options)`` -> base URL of a live server (``.../v1`` appended)."""
    with Servers() as servers:
        yield lambda backend, **kw: servers.start(create_app(backend, **kw)) + "/v1"


def client(url: str, **kw: Any) -> openai.OpenAI:
    # max_retries=0: a 5xx must reach the test, not be retried by the client.
    return openai.OpenAI(base_url=url, api_key="test", max_retries=0, timeout=30, **kw)


def post_raw(url: str, content: bytes | str, path: str = "/chat/completions") -> httpx.Response:
    return httpx.post(url + path, content=content, headers={"content-type": "application/json"},
                      timeout=30)


def assert_openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    assert "Traceback" not in r.text and 'File "' not in r.text
    return body["error"]


# --- plain chat ------------------------------------------------------------------------------

def test_plain_chat_returns_an_openai_chat_completion(serve: Callable[..., str]) -> None:
    backend = ScriptedBackend(["Hello, world!"])
    url = serve(backend, model_name="tiny")
    r = client(url).chat.completions.create(model="tiny", messages=USER)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == "tiny" and r.created > 0
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == "Hello, world!"
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason == "stop"
    assert r.usage is not None and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert [m.text for m in backend.requests[0].messages] == ["Say hello."]


def test_sampling_parameters_reach_the_backend(serve: Callable[..., str]) -> None:
    backend = ScriptedBackend(["ok", "ok"])
    url = serve(backend, model_name="tiny", default_max_tokens=77)
    c = client(url)
    c.chat.completions.create(
        model="tiny", max_tokens=12, temperature=0.7, top_p=0.9, stop=["\n\n", "END"], seed=42,
        messages=[{"role": "developer", "content": "Be brief."}, *USER],
    )
    c.chat.completions.create(model="tiny", messages=USER, stop="X", logprobs=True)
    first, second = backend.requests
    assert (first.max_tokens, first.temperature, first.top_p) == (12, 0.7, 0.9)
    assert first.stop == ("\n\n", "END") and first.seed == 42
    assert first.messages[0].role == "system"  # "developer" is the newer name for it
    assert second.max_tokens == 77 and second.stop == ("X",) and second.logprobs
    assert second.seed is None and second.tools == ()


def test_max_completion_tokens_wins_over_max_tokens(serve: Callable[..., str]) -> None:
    backend = ScriptedBackend(["ok"])
    url = serve(backend, model_name="tiny")
    client(url).chat.completions.create(model="tiny", messages=USER, max_tokens=5,
                                        max_completion_tokens=9)
    assert backend.requests[0].max_tokens == 9


def test_logprobs_are_returned_when_the_backend_has_them(serve: Callable[..., str]) -> None:
    backend = ScriptedBackend([Completion(text="hi", logprobs=(-0.5, -1.25), prompt_tokens=3,
                                          completion_tokens=2)])
    url = serve(backend, model_name="tiny")
    r = client(url).chat.completions.create(model="tiny", messages=USER, logprobs=True)
    assert [t.logprob for t in r.choices[0].logprobs.content] == [-0.5, -1.25]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 2)


# --- streaming -------------------------------------------------------------------------------

def test_streaming_sends_chunks_then_usage_then_done(serve: Callable[..., str]) -> None:
    backend = ScriptedBackend(["one two three four"])
    url = serve(backend, model_name="tiny")
    chunks = list(client(url).chat.completions.create(
        model="tiny", messages=USER, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert pieces == ["one", " two", " three", " four"]  # streamed, not sent in one piece
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "stop" and all(f is None for f in finish[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_streaming_without_include_usage_sends_no_usage_chunk(serve: Callable[..., str]) -> None:
    url = serve(ScriptedBackend(["a b"]), model_name="tiny")
    r = httpx.post(url + "/chat/completions", timeout=30,
                   json={"model": "tiny", "messages": USER, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    bodies = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in b for b in bodies)
    assert "".join(b["choices"][0]["delta"].get("content") or "" for b in bodies) == "a b"


# --- tool calls ------------------------------------------------------------------------------

def test_native_tool_calls_come_back_as_tool_calls(serve: Callable[..., str]) -> None:
    backend = ScriptedBackend(
        [{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_7"}]}],
        tool_calls=True)
    url = serve(backend, model_name="tiny")
    r = client(url).chat.completions.create(model="tiny", messages=USER, tools=[WEATHER_TOOL])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert (call.id, call.type, call.function.name) == ("call_7", "function", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert backend.requests[0].tools[0]["function"]["name"] == "get_weather"


def test_tool_calls_stream_as_a_tool_call_delta(serve: Callable[..., str]) -> None:
    backend = ScriptedBackend(
        [{"tool_calls": [{"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                         {"name": "get_weather", "arguments": '{"city": "Rome"}'}]}],
        tool_calls=True)
    url = serve(backend, model_name="tiny")
    chunks = list(client(url).chat.completions.create(
        model="tiny", messages=USER, tools=[WEATHER_TOOL], stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [d.index for d in deltas] == [0, 1]
    assert [json.loads(d.function.arguments)["city"] for d in deltas] == ["Oslo", "Rome"]
    assert all(d.id for d in deltas) and len({d.id for d in deltas}) == 2
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_a_tool_result_conversation_reaches_the_backend_intact(serve: Callable[..., str]) -> None:
    backend = ScriptedBackend(["It is sunny in Paris."], tool_calls=True)
    url = serve(backend, model_name="tiny")
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    r = client(url).chat.completions.create(model="tiny", tools=[WEATHER_TOOL], messages=[
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ])
    assert r.choices[0].message.content == "It is sunny in Paris."
    _, assistant, tool = backend.requests[0].messages
    assert assistant.tool_calls[0].name == "get_weather"
    assert assistant.tool_calls[0].parsed_arguments() == {"city": "Paris"}
    assert (tool.role, tool.tool_call_id, tool.text) == ("tool", "call_1", "sunny, 21 C")


def test_tool_choice_none_withholds_the_tools(serve: Callable[..., str]) -> None:
    backend = ScriptedBackend(["no tools"], tool_calls=True)
    url = serve(backend, model_name="tiny")
    client(url).chat.completions.create(model="tiny", messages=USER, tools=[WEATHER_TOOL],
                                        tool_choice="none")
    assert backend.requests[0].tools == ()


# --- models and health -----------------------------------------------------------------------

def test_models_lists_the_served_names(serve: Callable[..., str]) -> None:
    url = serve(ScriptedBackend(), model_name="tiny", aliases=("org/tiny-v2",))
    c = client(url)
    assert [m.id for m in c.models.list()] == ["tiny", "org/tiny-v2"]
    assert c.models.retrieve("org/tiny-v2").owned_by == "whetstone"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("gpt-4o")


def test_model_name_defaults_to_the_backend_spec(serve: Callable[..., str]) -> None:
    backend = ScriptedBackend(["ok"])
    url = serve(backend)
    assert [m.id for m in client(url).models.list()] == ["scripted:"]
    assert client(url).chat.completions.create(model="scripted:", messages=USER).model == (
        "scripted:")


def test_health(serve: Callable[..., str]) -> None:
    url = serve(ScriptedBackend(), model_name="tiny")
    r = httpx.get(url.removesuffix("/v1") + "/health", timeout=10)
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "model": "tiny", "backend": "scripted:"}


# --- bad input -------------------------------------------------------------------------------

def test_malformed_json_is_a_400(serve: Callable[..., str]) -> None:
    url = serve(ScriptedBackend(), model_name="tiny")
    err = assert_openai_error(post_raw(url, '{"model": "tiny", "messages": ['), 400)
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_json"


@pytest.mark.parametrize("body, words", [
    ({"model": "tiny"}, "'messages' is required"),
    ({"model": "tiny", "messages": []}, "'messages' is required"),
    ({"model": "tiny", "messages": "hi"}, "'messages' is required"),
    ({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"model": "tiny", "messages": ["hi"]}, "messages[0]' must be an object"),
    ({"model": "tiny", "messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
    ({"model": "tiny", "messages": USER, "temperature": "hot"}, "'temperature' must be a number"),
    ({"model": "tiny", "messages": USER, "temperature": 3}, "between 0.0 and 2.0"),
    ({"model": "tiny", "messages": USER, "max_tokens": 0}, "'max_tokens'"),
    ({"model": "tiny", "messages": USER, "max_tokens": 2.5}, "must be an integer"),
    ({"model": "tiny", "messages": USER, "n": 3}, "'n' = 3 is not supported"),
    ({"model": "tiny", "messages": USER, "stop": [1]}, "'stop'"),
    ({"model": "tiny", "messages": USER, "tools": [{"type": "function"}]}, "tools[0]"),
    ([1, 2], "must be a JSON object"),
])
def test_invalid_requests_are_400_with_the_field_named(serve: Callable[..., str], body: Any,
                                                       words: str) -> None:
    backend = ScriptedBackend()
    url = serve(backend, model_name="tiny")
    err = assert_openai_error(post_raw(url, json.dumps(body)), 400)
    assert words in err["message"] and err["type"] == "invalid_request_error"
    assert backend.requests == []  # rejected before the model was called


_ASKED = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", '


@pytest.mark.parametrize("raw, words", [
    (_ASKED + '"tool_calls": [{"id": "a", "function": "x"}]}]}', "tool_calls[0].function"),
    (_ASKED + '"tool_calls": [{"id": "a", "function": null}]}]}', "tool_calls[0].function"),
    ('{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}',
     "content[0].text"),
    ('{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "finite"),
    ('{"messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}', "finite"),
    ('{"messages": [{"role": "user", "content": "hi"}], "seed": 1' + "0" * 5000 + "}",
     "not valid JSON"),
    ('{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}", "not valid JSON"),
])
def test_malformed_messages_and_numbers_are_400_not_500(serve: Callable[..., str], raw: str,
                                                        words: str) -> None:
    backend = ScriptedBackend()
    url = serve(backend, model_name="tiny")
    for stream in (False, True):
        body = raw[:-1] + ', "stream": true}' if stream else raw
        r = post_raw(url, body)
        err = assert_openai_error(r, 400)
        assert words in err["message"] and err["type"] == "invalid_request_error"
        assert r.headers["x-request-id"]  # like every other error
    assert backend.requests == []


def test_a_local_image_path_from_the_wire_is_refused(serve: Callable[..., str],
                                                     tmp_path: Any) -> None:
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"not for clients")
    backend = ScriptedBackend(["never"])
    url = serve(backend, model_name="tiny")
    parts = [{"type": "text", "text": "describe"}, {"type": "image", "image": str(secret)}]
    r = post_raw(url, json.dumps({"messages": [{"role": "user", "content": parts}]}))
    err = assert_openai_error(r, 400)
    assert "text, image_url" in err["message"] and err["type"] == "invalid_request_error"
    assert backend.requests == []  # the file was never read nor sent on


@pytest.mark.parametrize("text", ["a\\ud800b", "a\\udfffb", "\\ude00\\ud83d"])
def test_a_lone_surrogate_is_a_400(serve: Callable[..., str], text: str) -> None:
    backend = ScriptedBackend(responder=lambda r: r.messages[-1].text)
    url = serve(backend, model_name="tiny")
    for extra in ("", ', "stream": true'):
        r = post_raw(url, '{"messages": [{"role": "user", "content": "' + text + '"}]' + extra
                     + "}")
        err = assert_openai_error(r, 400)
        assert "surrogate" in err["message"] and r.headers["x-request-id"]
    assert backend.requests == []
    # A proper pair, escaped as json.dumps writes it, is fine.
    smile = "smile \U0001F600"
    r = post_raw(url, json.dumps({"messages": [{"role": "user", "content": smile}]}))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == smile


def test_a_wrong_method_keeps_the_allow_header(serve: Callable[..., str]) -> None:
    url = serve(ScriptedBackend(), model_name="tiny")
    r = httpx.get(url + "/chat/completions", timeout=10)
    assert_openai_error(r, 405)
    assert r.headers["allow"] == "POST"


def test_an_unknown_model_is_a_404_naming_the_served_ones(serve: Callable[..., str]) -> None:
    backend = ScriptedBackend()
    url = serve(backend, model_name="tiny")
    with pytest.raises(openai.NotFoundError) as info:
        client(url).chat.completions.create(model="gpt-4o", messages=USER)
    assert "gpt-4o" in info.value.message and "tiny" in info.value.message
    assert info.value.code == "model_not_found"
    assert backend.requests == []


def test_an_unknown_route_gets_an_openai_error_body(serve: Callable[..., str]) -> None:
    url = serve(ScriptedBackend(), model_name="tiny")
    assert_openai_error(httpx.post(url + "/audio/speech", json={}, timeout=10), 404)
    assert_openai_error(httpx.get(url + "/chat/completions", timeout=10), 405)


def test_a_failing_backend_is_a_502_and_the_server_keeps_serving(
        serve: Callable[..., str], caplog: pytest.LogCaptureFixture) -> None:
    backend = ScriptedBackend([])  # runs out at once: ScriptExhausted, a BackendError
    url = serve(backend, model_name="tiny")
    r = post_raw(url, json.dumps({"model": "tiny", "messages": USER}))
    err = assert_openai_error(r, 502)
    # The upstream's own words stay in the server log; the client gets the request id.
    assert "ran out of replies" not in err["message"] and err["code"] == "upstream_error"
    assert r.headers["x-request-id"] in err["message"]
    assert any("ran out of replies" in rec.getMessage() for rec in caplog.records)
    with pytest.raises(openai.APIStatusError) as info:
        client(url).chat.completions.create(model="tiny", messages=USER, stream=True)
    assert info.value.status_code == 502  # failed before the first chunk: a proper status
    assert httpx.get(url.removesuffix("/v1") + "/health", timeout=10).status_code == 200


def test_an_unexpected_crash_is_a_500_without_a_stack_trace(serve: Callable[..., str]) -> None:
    def boom(request: Request) -> str:
        raise RuntimeError("secret internal detail")

    url = serve(ScriptedBackend(responder=boom), model_name="tiny")
    err = assert_openai_error(post_raw(url, json.dumps({"model": "tiny", "messages": USER})), 500)
    assert "secret internal detail" not in err["message"]
    assert err["type"] == "server_error"


class _Crashes(Backend):
    """Fails as a GPU backend does: not with a WhetstoneError."""

    def __init__(self) -> None:
        self.spec = "crashes"
        self.capabilities = Capabilities(streaming=True)

    def complete(self, request: Request) -> Completion:
        raise RuntimeError("CUDA out of memory")

    def stream(self, request: Request) -> Iterator[Any]:
        raise RuntimeError("CUDA out of memory")
        yield  # a generator: the failure comes at the first chunk


def test_a_backend_crash_is_a_500_with_the_request_id(serve: Callable[..., str],
                                                     caplog: pytest.LogCaptureFixture) -> None:
    url = serve(_Crashes(), model_name="tiny")
    for stream in (False, True):
        caplog.clear()
        r = httpx.post(url + "/chat/completions", timeout=30, headers={"X-Request-Id": "abc-1"},
                       json={"messages": USER, "stream": stream})
        err = assert_openai_error(r, 500)
        assert err["type"] == "server_error" and "CUDA" not in err["message"]
        assert r.headers["x-request-id"] == "abc-1"
        logged = [rec for rec in caplog.records if rec.exc_info]
        assert len(logged) == 1 and "CUDA out of memory" in logged[0].getMessage()
    assert httpx.get(url.removesuffix("/v1") + "/health", timeout=10).status_code == 200


def test_a_slow_backend_is_a_504(serve: Callable[..., str]) -> None:
    url = serve(ScriptedBackend(responder=lambda r: "late", delay_s=5.0), model_name="tiny",
                request_timeout_s=0.2)
    start = time.monotonic()
    err = assert_openai_error(post_raw(url, json.dumps({"model": "tiny", "messages": USER})), 504)
    assert err["code"] == "upstream_timeout" and "0.2 s" in err["message"]
    assert time.monotonic() - start < 4.0  # answered at the deadline, not when the model finished


class _FailsMidStream(Backend):
    """Streams one piece of text, then fails."""

    def __init__(self) -> None:
        self.spec = "fails-mid-stream"
        self.capabilities = Capabilities(streaming=True)

    def complete(self, request: Request) -> Completion:
        raise AssertionError("only streamed in this test")

    def stream(self, request: Request) -> Iterator[Any]:
        from whetstone.engine.backends.base import StreamChunk
        from whetstone.engine.errors import BackendError

        yield StreamChunk(text="partial")
        raise BackendError("the model fell over", hint="restart it")


def test_a_failure_mid_stream_becomes_an_error_event(serve: Callable[..., str]) -> None:
    url = serve(_FailsMidStream(), model_name="tiny")
    got: list[str] = []
    with pytest.raises(openai.APIError) as info:
        for chunk in client(url).chat.completions.create(model="tiny", messages=USER,
                                                         stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                got.append(chunk.choices[0].delta.content)
    assert got == ["partial"]
    # An upstream failure event names the kind and the request id, not the upstream's words.
    assert "upstream model failed" in info.value.message
    assert "the model fell over" not in info.value.message


# --- off the event loop, bounded concurrency ---------------------------------------------------

class _Blocking(Backend):
    """A backend whose ``complete`` blocks its thread (like a local model generating) until
    released, and records how many calls were in flight at once."""

    def __init__(self) -> None:
        self.spec = "blocking"
        self.capabilities = Capabilities(max_concurrency=1)
        self.release = threading.Event()
        self.entered = threading.Event()
        self.in_flight = 0
        self.peak = 0
        self._lock = threading.Lock()

    def complete(self, request: Request) -> Completion:
        with self._lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        self.entered.set()
        try:
            self.release.wait(timeout=30)
            return Completion(text="done", prompt_tokens=1, completion_tokens=1)
        finally:
            with self._lock:
                self.in_flight -= 1


def test_the_server_answers_while_the_model_is_busy(serve: Callable[..., str]) -> None:
    backend = _Blocking()
    url = serve(backend, model_name="tiny")
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client(url).chat.completions.create, model="tiny", messages=USER)
        assert backend.entered.wait(timeout=10)
        # The model call is blocked in its thread; the event loop must still answer.
        r = httpx.get(url.removesuffix("/v1") + "/health", timeout=5)
        assert r.status_code == 200 and not pending.done()
        backend.release.set()
        assert pending.result(timeout=10).choices[0].message.content == "done"


@pytest.mark.parametrize("limit", [1, 3])
def test_backend_calls_in_flight_are_capped(serve: Callable[..., str], limit: int) -> None:
    backend = _Blocking()
    url = serve(backend, model_name="tiny", max_concurrency=limit)
    c = client(url)
    with ThreadPoolExecutor(5) as pool:
        pending = [pool.submit(c.chat.completions.create, model="tiny", messages=USER)
                   for _ in range(5)]
        deadline = time.monotonic() + 10
        while backend.in_flight < limit and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # room for a call past the limit to start, if the cap leaked
        assert backend.in_flight == limit
        backend.release.set()
        results = [p.result(timeout=10) for p in pending]
    assert all(r.choices[0].message.content == "done" for r in results)
    assert backend.peak == limit


def test_an_abandoned_stream_frees_its_slot(serve: Callable[..., str]) -> None:
    words = " ".join(f"w{i}" for i in range(200))
    backend = ScriptedBackend(responder=lambda r: words, max_concurrency=1)
    url = serve(backend, model_name="tiny")
    body = {"model": "tiny", "messages": USER, "stream": True}
    with httpx.stream("POST", url + "/chat/completions", json=body, timeout=10) as r:
        next(r.iter_lines())  # read a little, then hang up
    # With one slot, a leaked slot would make this request wait forever.
    r2 = client(url, ).with_options(timeout=10).chat.completions.create(model="tiny",
                                                                       messages=USER)
    assert r2.choices[0].message.content == words


# --- the real model ---------------------------------------------------------------------------

@pytest.mark.slow
def test_serving_the_embedded_model(serve: Callable[..., str], embedded_backend: Backend
                                    ) -> None:
    url = serve(embedded_backend, model_name="embedded")
    c = openai.OpenAI(base_url=url, api_key="test", max_retries=0, timeout=600)
    messages = [{"role": "user", "content": "What is the capital of France? One word."}]
    r = c.chat.completions.create(model="embedded", messages=messages, max_tokens=8,
                                  temperature=0)
    assert "paris" in r.choices[0].message.content.lower()
    assert r.usage.prompt_tokens > 5 and 0 < r.usage.completion_tokens <= 8
    chunks = list(c.chat.completions.create(model="embedded", messages=messages, max_tokens=8,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == r.choices[0].message.content  # greedy: the same answer, streamed
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
