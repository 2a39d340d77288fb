"""The server as a transparent proxy, through the real ``openai`` client over 127.0.0.1, in
front of a recording upstream: what the client leaves out is not sent, an upstream's 4xx
reaches the client with its status and message (429 with ``Retry-After``), and
``/v1/embeddings`` and ``/v1/completions`` pass through."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, StreamingResponse
from servers import Servers

from whetstone.engine.backends import BackendOptions, get_backend
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.server import create_app

pytestmark = [pytest.mark.integration]  # every test here uses it

openai = pytest.importorskip("openai")

TOO_LONG = ("This model's maximum context length is 2048 tokens. However, you requested "
            "4100 tokens (100 in the messages, 4000 in the completion).")
USER = [{"role": "user", "content": "hello"}]


def _chat_reply(stream: bool) -> Any:
    if stream:
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "up",
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi there"},
                              "finish_reason": "stop"}]}
        usage = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "up",
                 "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                          "total_tokens": 5}}
        text = f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(usage)}\n\ndata: [DONE]\n\n"
        return StreamingResponse(iter([text]), media_type="text/event-stream")
    return JSONResponse({"id": "c", "object": "chat.completion", "created": 0, "model": "up",
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": "hi there"}}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                   "total_tokens": 5}})


def _refusal(text: str) -> JSONResponse | None:
    """vLLM's answers to a prompt past its context and to a rate limit."""
    if "too long" in text:
        return JSONResponse({"error": {"message": TOO_LONG, "type": "BadRequestError",
                                       "param": "messages", "code": "context_length_exceeded"}},
                            status_code=400)
    if "rate" in text:
        return JSONResponse({"error": {"message": "slow down: 3 requests per minute",
                                       "type": "rate_limit_error", "param": None,
                                       "code": "rate_limit_exceeded"}},
                            status_code=429, headers={"Retry-After": "0.05"})
    return None


def recording_upstream(calls: list[tuple[str, dict[str, Any]]]) -> FastAPI:
    """An OpenAI-compatible upstream serving model ``up`` that keeps (route, body) of every
    call, refuses prompts that say "too long" (400) or "rate" (429), and serves chat,
    embeddings and completions (streamed or not)."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: HttpRequest) -> Any:
        body = await request.json()
        calls.append(("chat", body))
        refused = _refusal(body["messages"][-1]["content"])
        return refused or _chat_reply(bool(body.get("stream")))

    @app.post("/v1/embeddings")
    async def embeddings(request: HttpRequest) -> Any:
        body = await request.json()
        calls.append(("embeddings", body))
        if body["model"] not in ("up", "text-embedding-3-small"):
            return JSONResponse({"error": {"message": f"The model `{body['model']}` does "
                                           "not exist.", "type": "NotFoundError"}},
                                status_code=404)
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        vectors = [[float(len(t)), 0.5, -1.0] for t in inputs]
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(struct.pack("<3f", *v)).decode()
                 if body.get("encoding_format") == "base64" else v}
                for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": body["model"],
                "usage": {"prompt_tokens": 2, "total_tokens": 2}}

    @app.post("/v1/completions")
    async def completions(request: HttpRequest) -> Any:
        body = await request.json()
        calls.append(("completions", body))
        refused = _refusal(body["prompt"])
        if refused is not None:
            return refused
        if body.get("stream"):
            events = [{"id": "cmpl", "object": "text_completion", "created": 0, "model": "up",
                       "choices": [{"index": 0, "text": piece, "finish_reason": None,
                                    "logprobs": None}]} for piece in (" four", " five")]
            text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            return StreamingResponse(iter([text]), media_type="text/event-stream")
        return {"id": "cmpl", "object": "text_completion", "created": 0, "model": "up",
                "choices": [{"index": 0, "text": " four", "finish_reason": "stop",
                             "logprobs": None}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}

    return app


@pytest.fixture
def proxy() -> Iterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    """(Whetstone's base URL, the upstream's calls): Whetstone serves ``openai:up@<upstream>``
    as ``front``; the backend retries once, quickly."""
    calls: list[tuple[str, dict[str, Any]]] = []
    with Servers() as servers:
        up = servers.start(recording_upstream(calls))
        backend = get_backend(f"openai:up@{up}/v1", BackendOptions(
            max_retries=1, extra={"retry_backoff_s": 0.01, "retry_max_backoff_s": 0.1}))
        with backend:
            yield servers.start(create_app(backend, model_name="front", api_keys=["k"])), calls


def client(url: str, **kw: Any) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key="k", **kw)


# --- only what the client sent --------------------------------------------------------------

def test_fields_the_client_leaves_out_are_not_sent_upstream(proxy: Any) -> None:
    url, calls = proxy
    with client(url, max_retries=0) as c:
        assert c.chat.completions.create(model="front", messages=USER).choices[0].message \
            .content == "hi there"
        assert "".join(x.choices[0].delta.content or "" for x in c.chat.completions.create(
            model="front", messages=USER, stream=True) if x.choices) == "hi there"
        c.chat.completions.create(model="front", messages=USER, max_tokens=7, temperature=0.3)
        c.chat.completions.create(model="front", messages=USER, max_completion_tokens=9,
                                  top_p=0.5, n=1)
    plain, streamed, sampled, newer = (body for _, body in calls)
    for body in (plain, streamed):
        assert not {"max_tokens", "max_completion_tokens", "temperature", "top_p", "n"} & set(
            body), body
        assert body["model"] == "up"
    assert streamed["stream"] is True
    assert (sampled["max_tokens"], sampled["temperature"]) == (7, 0.3)
    assert "top_p" not in sampled
    # Sent under the name the client used (reasoning models refuse max_tokens).
    assert (newer["max_completion_tokens"], newer["top_p"], newer["n"]) == (9, 0.5, 1)
    assert "max_tokens" not in newer


# --- an upstream's refusals reach the client --------------------------------------------------

def test_an_upstream_400_reaches_the_client_as_its_400(proxy: Any) -> None:
    url, calls = proxy
    ask = [{"role": "user", "content": "this prompt is too long"}]
    with client(url) as c:  # the client's own retries on: a 400 is not retried by anyone
        with pytest.raises(openai.BadRequestError) as info:
            c.chat.completions.create(model="front", messages=ask)
        assert info.value.status_code == 400 and TOO_LONG in info.value.message
        assert info.value.body["message"] == TOO_LONG
        assert info.value.code == "context_length_exceeded"
        assert info.value.param == "messages"
        assert len(calls) == 1
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            list(c.chat.completions.create(model="front", messages=ask, stream=True))
    assert len(calls) == 2
    assert "127.0.0.1" not in info.value.body["message"]  # the upstream's address stays hidden


def test_an_upstream_429_reaches_the_client_with_retry_after(proxy: Any) -> None:
    url, calls = proxy
    ask = [{"role": "user", "content": "rate me"}]
    with client(url, max_retries=1) as c, pytest.raises(openai.RateLimitError) as info:
        c.chat.completions.create(model="front", messages=ask)
    assert info.value.response.headers["retry-after"] == "0.05"  # the upstream's own
    assert "slow down" in info.value.body["message"]
    # The backend's attempts (its retry policy: 1 retry), then `x-should-retry: false`: the
    # client does not try again (2 x 2 = 4 calls before the header).
    assert info.value.response.headers["x-should-retry"] == "false"
    assert len(calls) == 2
    with client(url, max_retries=0) as c, pytest.raises(openai.RateLimitError):
        list(c.chat.completions.create(model="front", messages=ask, stream=True))


def test_an_upstream_5xx_stays_hidden() -> None:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> JSONResponse:
        return JSONResponse({"error": {"message": "CUDA out of memory at 10.0.0.7"}},
                            status_code=500)

    with Servers() as servers:
        up = servers.start(app)
        backend = get_backend(f"openai:up@{up}/v1", BackendOptions(max_retries=0))
        with backend:
            url = servers.start(create_app(backend, model_name="front"))
            with client(url, max_retries=0) as c, pytest.raises(openai.APIStatusError) as info:
                c.chat.completions.create(model="front", messages=USER)
    assert info.value.status_code == 502
    assert "CUDA" not in info.value.message and "10.0.0.7" not in info.value.message


# --- other routes pass through ---------------------------------------------------------------

def test_embeddings_pass_through(proxy: Any) -> None:
    url, calls = proxy
    with client(url, max_retries=0) as c:
        got = c.embeddings.create(model="front", input=["abc", "hello"])
        other = c.embeddings.create(model="text-embedding-3-small", input="x",
                                    encoding_format="float")
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            c.embeddings.create(model="nope", input="x")
    assert [d.embedding for d in got.data] == [[3.0, 0.5, -1.0], [5.0, 0.5, -1.0]]
    assert other.data[0].embedding == [1.0, 0.5, -1.0]
    # A served name becomes the upstream's model; another name goes as the client sent it.
    assert [b["model"] for _, b in calls] == ["up", "text-embedding-3-small", "nope"]
    assert calls[0][1]["input"] == ["abc", "hello"]


def test_completions_pass_through_streamed_or_not(proxy: Any) -> None:
    url, calls = proxy
    with client(url, max_retries=0) as c:
        r = c.completions.create(model="front", prompt="three,", max_tokens=3)
        pieces = [e.choices[0].text for e in c.completions.create(
            model="front", prompt="three,", stream=True)]
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            c.completions.create(model="front", prompt="too long", stream=True)
        with pytest.raises(openai.RateLimitError):
            c.completions.create(model="front", prompt="rate")
    assert r.choices[0].text == " four" and r.usage.total_tokens == 4
    assert pieces == [" four", " five"]
    assert calls[0] == ("completions", {"model": "up", "prompt": "three,", "max_tokens": 3})
    assert calls[1][1]["stream"] is True


def test_passed_through_routes_keep_the_servers_auth_and_limits(proxy: Any) -> None:
    url, calls = proxy
    assert httpx.post(url + "/v1/embeddings", json={"model": "front", "input": "x"}
                      ).status_code == 401
    big = httpx.post(url + "/v1/completions", headers={"Authorization": "Bearer k"},
                     json={"model": "front", "prompt": "x" * (17 * 1024 * 1024)})
    assert big.status_code == 413
    bad = httpx.post(url + "/v1/completions", headers={"Authorization": "Bearer k"},
                     json={"model": "front", "prompt": "x", "max_tokens": 10 ** 9})
    assert bad.status_code == 400 and "'max_tokens'" in bad.json()["error"]["message"]
    assert calls == []


def test_a_local_model_says_it_cannot_pass_routes_through() -> None:
    with Servers() as servers:
        url = servers.start(create_app(ScriptedBackend(["x"]), model_name="front"))
        with client(url) as c, pytest.raises(openai.APIStatusError) as info:
            c.embeddings.create(model="front", input="x")
    assert info.value.status_code == 501
    assert "openai:<model>@<url>" in info.value.message
    assert info.value.response.headers["x-should-retry"] == "false"
