"""Issue 36 (server findings 2, 3, 5, 9, 10 and the open non-loopback bind) and issue 37
(6: readiness; 9: ``n``): what a web page, a large request, a credentialed upstream URL or
an upstream's words can make ``whetstone serve`` do.

2. A page the user visits posts ``text/plain`` from ``http://evil.example`` (CSRF), or
   rebinds its name to 127.0.0.1 and reads ``/health``: refused (415, 403, 421), as
   ``whetstone mcp`` refuses them, with nothing reaching the model or the trace store.
3. Recording a large request runs off the event loop (``/health`` answers while a slow
   recording is under way), and a request holding 100k messages is a 400 before any work.
5. An upstream URL's password and query secret are never shown: ``/health``, ``/v1/models``,
   the log, the traces, the errors.
9. A streamed ``/v1/completions`` reply is cut at the 64 MiB cap, not relayed whole.
10. An upstream 400 echoing the ``Authorization`` header reaches the client without the key.
Also: ``serve``/``mcp`` on a non-loopback address without a key refuse to start.
37.6 ``/readyz`` follows the upstream (cached), ``/health`` and ``/livez`` stay cheap.
37.9 ``n`` > 1 goes to an ``openai:`` upstream, which decodes it; refused only where
     Whetstone would decode.

Servers run in this process on 127.0.0.1 (``servers.running_server``), or as ``whetstone
serve`` processes where the command line is what is tested.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from servers import Servers, free_port, running_server
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from whetstone.engine.backends import BackendOptions, get_backend
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.server import create_app
from whetstone.engine.types import Trace
from whetstone.library_store.traces import TraceStore

REPO = Path(__file__).resolve().parent.parent
USER = [{"role": "user", "content": "hi"}]
CHAT = {"model": "tiny", "messages": USER}


def ok_backend() -> ScriptedBackend:
    return ScriptedBackend(responder=lambda _: "ok")


def wait_for(store: TraceStore, trace_id: str, timeout: float = 20.0) -> Trace:
    deadline = time.monotonic() + timeout
    while (trace := store.find(trace_id)) is None:
        assert time.monotonic() < deadline, f"trace {trace_id} was never written"
        time.sleep(0.05)
    return trace


# --- 2. CSRF and DNS rebinding -----------------------------------------------------------------

@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ScriptedBackend,
                                                                      TraceStore]]:
    """A recording server with no key on 127.0.0.1 (the default set-up the attack used)."""
    store = TraceStore(tmp_path_factory.mktemp("web") / "traces")
    backend = ok_backend()
    with running_server(create_app(backend, traces=store, model_name="tiny")) as base:
        yield base, backend, store


def test_a_web_page_cannot_post_to_the_server_or_label_a_trace(
        local: tuple[str, ScriptedBackend, TraceStore]) -> None:
    base, backend, store = local
    before = len(backend.requests)
    body = json.dumps(CHAT)
    page = {"Content-Type": "text/plain", "Origin": "http://evil.example"}
    r = httpx.post(base + "/v1/chat/completions", content=body, headers=page, timeout=10)
    assert r.status_code in (403, 415), r.text  # was: 200, and a trace recorded
    for headers, status, code in (
            ({"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
            ({"Content-Type": "application/x-www-form-urlencoded"}, 415,
             "unsupported_media_type"),
            ({}, 415, "unsupported_media_type"),  # a Blob body: no Content-Type at all
            ({"Content-Type": "application/json", "Origin": "http://evil.example"}, 403,
             "origin_not_allowed"),
            ({"Content-Type": "application/json", "Origin": "null"}, 403,
             "origin_not_allowed")):
        refused = httpx.post(base + "/v1/chat/completions", content=body, headers=headers,
                             timeout=10)
        assert refused.status_code == status, (headers, refused.text)
        assert refused.json()["error"]["code"] == code
    assert "Content-Type: application/json" in refused.json()["error"]["message"] or \
        "--allowed-origin" in refused.json()["error"]["message"]
    assert len(backend.requests) == before, "a refused request reached the model"

    done = httpx.post(base + "/v1/chat/completions", json=CHAT, timeout=10)
    assert done.status_code == 200
    trace_id = done.headers["X-Whetstone-Trace-Id"]
    wait_for(store, trace_id)
    label = json.dumps({"trace_id": trace_id, "score": 1.0})
    planted = httpx.post(base + "/v1/feedback", content=label, timeout=10,
                         headers={"Content-Type": "text/plain"})
    assert planted.status_code == 415  # was: 200, "score": 1.0
    assert store.find(trace_id).score is None
    # The server's own origin (same host and port) is not a cross-site request.
    same = httpx.post(base + "/v1/chat/completions", json=CHAT, timeout=10,
                      headers={"Origin": base})
    assert same.status_code == 200, same.text


@pytest.mark.parametrize("path", ["/health", "/livez", "/readyz", "/metrics", "/v1/models"])
def test_a_rebound_name_gets_nothing(local: tuple[str, ScriptedBackend, TraceStore],
                                     path: str) -> None:
    base, _, _ = local
    port = base.rsplit(":", 1)[1]
    r = httpx.get(base + path, headers={"Host": f"evil.example:{port}"}, timeout=10)
    assert r.status_code == 421, r.text  # was: /health and chat answered in full
    assert r.json()["error"]["code"] == "host_not_allowed"
    assert "--allowed-host" in r.json()["error"]["message"]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost", f"[::1]:{port}"):
        assert httpx.get(base + path, headers={"Host": host}, timeout=10).status_code == 200


def test_a_rebound_name_cannot_chat(local: tuple[str, ScriptedBackend, TraceStore]) -> None:
    base, backend, _ = local
    before = len(backend.requests)
    r = httpx.post(base + "/v1/chat/completions", json=CHAT, timeout=10,
                   headers={"Host": "evil.example"})
    assert r.status_code == 421 and len(backend.requests) == before


def test_the_hosts_and_origins_a_bind_answers() -> None:
    from whetstone.engine.server.hosts import WebPolicy

    def host_ok(policy: Any, host: str) -> bool:
        return policy.check({"type": "http", "method": "GET",
                             "headers": [(b"host", host.encode())]}) is None

    loopback = WebPolicy.for_bind("127.0.0.1")
    assert host_ok(loopback, "127.0.0.1:8000") and host_ok(loopback, "LOCALHOST.:8000")
    assert not host_ok(loopback, "10.0.0.5:8000") and not host_ok(loopback, "evil.example")
    assert not host_ok(loopback, "")
    named = WebPolicy.for_bind("10.0.0.5", allowed_hosts=["api.internal", "gw.example:8443"])
    assert host_ok(named, "10.0.0.5:8000") and host_ok(named, "api.internal:9")
    assert host_ok(named, "gw.example:8443") and not host_ok(named, "gw.example:8000")
    assert not host_ok(named, "10.0.0.6:8000")
    wildcard = WebPolicy.for_bind("0.0.0.0")
    assert host_ok(wildcard, "10.1.2.3:8000") and host_ok(wildcard, "[fd00::1]:8000")
    assert not host_ok(wildcard, "evil.example:8000")  # a name needs --allowed-host
    assert host_ok(WebPolicy.for_bind("0.0.0.0", allowed_hosts=["*"]), "evil.example")
    app = WebPolicy.for_bind(allowed_origins=["https://app.example.com/"])
    assert app.origin_allowed("https://APP.example.com", "127.0.0.1:8000")
    assert not app.origin_allowed("https://app.example.com:444", "127.0.0.1:8000")
    assert app.origin_allowed("http://127.0.0.1:8000", "127.0.0.1:8000")
    assert not app.origin_allowed("http://127.0.0.1:9000", "127.0.0.1:8000")


def serve_process(tmp_path: Path, *args: str, env: dict[str, str] | None = None
                  ) -> contextlib.AbstractContextManager[tuple[str, Path]]:
    """``whetstone <args> --port P`` as a child process until it answers on 127.0.0.1:P;
    yields its base URL and log file."""

    @contextlib.contextmanager
    def run() -> Iterator[tuple[str, Path]]:
        port = free_port()
        log_path = tmp_path / f"server-{port}.log"
        full = {**os.environ, "WHETSTONE_API_KEY": "", "OPENAI_API_KEY": "",
                "WHETSTONE_HOME": str(tmp_path / "home"), **(env or {})}
        with open(log_path, "w") as log:
            proc = subprocess.Popen([sys.executable, str(REPO / "cli.py"), *args, "--port",
                                     str(port), "--log-level", "info"], cwd=REPO, env=full,
                                    stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    httpx.get(base + "/", timeout=2)
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the server did not start:\n{log_path.read_text()}")
                time.sleep(0.2)
            yield base, log_path
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    return run()


def init_library(tmp_path: Path) -> Path:
    lib = tmp_path / "lib"
    subprocess.run([sys.executable, str(REPO / "cli.py"), "library", "init", "--library",
                    str(lib)], check=True, capture_output=True,
                   env={**os.environ, "WHETSTONE_HOME": str(tmp_path / "home")})
    return lib


def test_the_command_lines_take_allowed_hosts_and_mcp_checks_a_wildcard_bind(
        tmp_path: Path) -> None:
    lib = init_library(tmp_path)
    with serve_process(tmp_path, "serve", "--upstream", "scripted:", "--library", str(lib),
                       "--no-library", "--no-record", "--allowed-host", "api.internal",
                       "--allowed-origin", "https://app.example") as (base, _):
        ok = httpx.get(base + "/health", headers={"Host": "api.internal"}, timeout=10)
        assert ok.status_code == 200
        assert httpx.get(base + "/health", headers={"Host": "evil.example"},
                         timeout=10).status_code == 421
        assert httpx.get(base + "/health", headers={"Origin": "https://app.example"},
                         timeout=10).status_code == 200
    # MCP on a wildcard address: the SDK's own check covered loopback binds only.
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    mcp_headers = {"Authorization": "Bearer k1", "Accept": "application/json, "
                   "text/event-stream"}
    with serve_process(tmp_path, "mcp", "--transport", "http", "--host", "0.0.0.0",
                       "--api-key", "k1", "--library", str(lib)) as (base, _):
        rebound = httpx.post(base + "/mcp", json=ping, timeout=10,
                             headers={**mcp_headers, "Host": "evil.example"})
        assert rebound.status_code == 421, rebound.text  # was: answered
        assert "DNS rebinding" in rebound.json()["error"]["message"]
        page = httpx.post(base + "/mcp", content=json.dumps(ping), timeout=10,
                          headers={**mcp_headers, "Content-Type": "text/plain"})
        assert page.status_code == 415
        foreign = httpx.post(base + "/mcp", json=ping, timeout=10,
                             headers={**mcp_headers, "Origin": "http://evil.example"})
        assert foreign.status_code == 403


# --- Also: a non-loopback bind without a key ------------------------------------------------

@pytest.mark.parametrize("args", [
    ["serve", "--host", "0.0.0.0"],
    ["serve", "--host", "10.1.2.3", "--upstream", "scripted:"],
    ["mcp", "--transport", "http", "--host", "0.0.0.0", "--allow-writes"],
    ["mcp", "--transport", "http", "--host", "::"],
])
def test_a_network_bind_without_a_key_is_refused(tmp_path: Path, args: list[str]) -> None:
    from whetstone.cli import cli

    res = CliRunner().invoke(cli, [*args, "--library", str(tmp_path / "lib")],
                             env={"WHETSTONE_API_KEY": "", "WHETSTONE_HOME": str(tmp_path)})
    assert res.exit_code == 2, res.output  # was: started, with no key and no warning
    assert "--api-key" in res.output and "--insecure" in res.output
    assert not (tmp_path / "lib").exists()  # refused before anything was made


def test_the_bind_check_passes_with_a_key_loopback_or_insecure() -> None:
    from whetstone.engine.commands.common import check_exposed_bind

    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_exposed_bind(host, frozenset(), False, "serve")
    check_exposed_bind("0.0.0.0", frozenset({"k"}), False, "serve")
    check_exposed_bind("0.0.0.0", frozenset(), True, "serve")


# --- 3. large requests are recorded off the loop, and bounded --------------------------------

class SlowStore(TraceStore):
    """A store whose encoding takes as long as a huge trace's did (17 s at worst)."""

    def encode(self, trace: Trace) -> Any:
        time.sleep(3.0)
        return super().encode(trace)


def probe_health(base: str, until: threading.Event, seconds: float = 12.0) -> list[float]:
    """``/health`` every 0.2 s until ``until`` is set (or ``seconds`` pass): each latency."""
    took: list[float] = []
    end = time.monotonic() + seconds
    while not until.is_set() and time.monotonic() < end:
        start = time.monotonic()
        r = httpx.get(base + "/health", timeout=2.0)  # ReadTimeout: the loop was held
        assert r.status_code == 200
        took.append(time.monotonic() - start)
        time.sleep(0.2)
    return took


def test_health_answers_while_a_big_recording_is_built(tmp_path: Path) -> None:
    store = SlowStore(tmp_path / "traces")
    with running_server(create_app(ok_backend(), traces=store, model_name="tiny")) as base:
        big = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 7_900}
                                             for _ in range(2_000)]}  # 16 MB, 2,000 messages
        done, replies = threading.Event(), []

        def post() -> None:
            replies.append(httpx.post(base + "/v1/chat/completions", json=big, timeout=60))
            done.set()

        sender = threading.Thread(target=post)
        sender.start()
        # The reply waits for its trace to be built and written (issue 44, finding 11):
        took = probe_health(base, done)  # was: a ReadTimeout, the loop held for 3 s
        sender.join(timeout=30)
    (r,) = replies
    assert r.status_code == 200, r.text[:300]
    assert done.is_set() and len(took) >= 5, took
    trace = store.find(r.headers["X-Whetstone-Trace-Id"])  # stored before the reply
    assert trace is not None and trace.task.startswith("x")


def test_a_request_of_a_hundred_thousand_messages_is_refused_before_any_work(
        tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "traces")
    backend = ok_backend()
    with running_server(create_app(backend, traces=store, model_name="tiny")) as base:
        many = {"model": "tiny", "messages": [{"role": "user", "content": "x"}] * 100_000}
        done, replies = threading.Event(), []

        def post() -> None:
            replies.append(httpx.post(base + "/v1/chat/completions", json=many, timeout=120))
            done.set()

        sender = threading.Thread(target=post)
        sender.start()
        probe_health(base, done)
        sender.join(timeout=120)
        # A hundred parts in one message count too.
        parts = {"model": "tiny", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "x"}] * 10_000}]}
        by_parts = httpx.post(base + "/v1/chat/completions", json=parts, timeout=60)
    (r,) = replies
    assert r.status_code == 400, r.text[:300]  # was: 200 after 5 s, and a 4 s trace encode
    assert "more than 8,192" in r.json()["error"]["message"]
    assert by_parts.status_code == 400
    assert backend.requests == [] and store.size() == 0


# --- 5 and 10. credentials ---------------------------------------------------------------------

SECRETS = ("PW", "SECRET", "admin:", "UPSTREAM_SECRET_KEY", "YWRtaW46UFc")  # base64 admin:PW


class Echo:
    """An upstream that answers chat, or, for "echo", a 400 quoting the headers it got."""

    def __init__(self) -> None:
        self.received: list[tuple[str, str, dict[str, Any]]] = []

    async def handle(self, request: HttpRequest) -> Response:
        body = await request.json()
        auth = request.headers.get("authorization", "")
        self.received.append((request.url.path, auth, body))
        text = json.dumps(body)
        if "echo" in text:
            return JSONResponse({"error": {"message": f"bad request: you sent Authorization: "
                                           f"{auth}", "type": "invalid_request_error",
                                           "param": auth, "code": None}}, status_code=400)
        if request.url.path.endswith("/embeddings") and "missing" in text:
            return JSONResponse({"error": {"message": f"no model {body['model']} for {auth}"}},
                                status_code=404)
        return JSONResponse({"id": "c1", "object": "chat.completion", "created": 1,
                             "model": body.get("model"), "choices": [{
                                 "index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "ok"}}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                       "total_tokens": 2}})

    async def models(self, _: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/models", self.models, methods=["GET"]),
            *(Route(p, self.handle, methods=["POST"]) for p in (
                "/v1/chat/completions", "/v1/embeddings", "/v1/completions"))])


def assert_no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} shown in {where}: {text[:2000]}"


def test_upstream_credentials_are_never_shown(tmp_path: Path) -> None:
    echo = Echo()
    lib = init_library(tmp_path)
    with Servers() as servers:
        upstream = servers.start(echo.app())
        host = upstream.removeprefix("http://")
        spec = f"openai:m@http://admin:PW@{host}/v1?api_key=SECRET"
        with serve_process(tmp_path, "serve", "--upstream", spec, "--library", str(lib),
                           "--no-library", "--api-key", "K") as (base, log):
            key = {"Authorization": "Bearer K"}
            health = httpx.get(base + "/health", timeout=10)
            assert health.json()["backend"] == "openai:m"  # was: the URL, PW and SECRET
            keyed = httpx.get(base + "/health", headers=key, timeout=10).json()
            assert "***" in keyed["upstream"] and host in keyed["upstream"]
            models = httpx.get(base + "/v1/models", headers=key, timeout=10).json()
            assert [m["id"] for m in models["data"]] == ["m"]  # was: "m@http://admin:PW"
            chat = httpx.post(base + "/v1/chat/completions", headers=key, timeout=30,
                              json={"model": "m", "messages": USER})
            assert chat.status_code == 200, chat.text
            refused = httpx.post(base + "/v1/chat/completions", headers=key, timeout=30,
                                 json={"model": "m", "messages": [
                                     {"role": "user", "content": "echo"}]})
            assert refused.status_code == 400 and "bad request" in refused.text
            for text, where in ((health.text, "/health"), (json.dumps(keyed), "keyed /health"),
                                (json.dumps(models), "/v1/models"), (refused.text, "a 400")):
                assert_no_secret(text, where)
        _, auth, sent = echo.received[0]
        assert sent["model"] == "m" and auth.startswith("Basic ")  # the URL's user, as sent
        assert_no_secret(log.read_text(), "the server log")
        stored = "".join(p.read_text() for p in (lib / "traces").rglob("*.jsonl"))
        assert '"answer": "ok"' in stored or '"answer":"ok"' in stored
        assert_no_secret(stored, "the traces")


def test_an_upstream_echoing_its_key_is_redacted_on_every_route() -> None:
    echo = Echo()
    with Servers() as servers:
        upstream = servers.start(echo.app())
        backend = get_backend(f"openai:tiny@{upstream}/v1", BackendOptions(
            api_key="UPSTREAM_SECRET_KEY", max_retries=0))
        base = servers.start(create_app(backend, model_name="tiny"))
        asks = [("/v1/chat/completions", {"model": "tiny", "messages": [
                    {"role": "user", "content": "echo"}]}),
                ("/v1/chat/completions", {"model": "tiny", "stream": True, "messages": [
                    {"role": "user", "content": "echo"}]}),
                ("/v1/embeddings", {"model": "tiny", "input": "echo"}),
                ("/v1/embeddings", {"model": "missing-model", "input": "x"}),
                ("/v1/completions", {"model": "tiny", "prompt": "echo"}),
                ("/v1/completions", {"model": "tiny", "prompt": "echo", "stream": True})]
        for path, body in asks:
            r = httpx.post(base + path, json=body, timeout=30)
            assert r.status_code in (400, 404), (path, r.text)  # relayed, as before
            assert "bad request" in r.text or "no model" in r.text
            assert_no_secret(r.text, f"{path} {body}")  # was: Bearer UPSTREAM_SECRET_KEY
        backend.close()
    assert all(auth == "Bearer UPSTREAM_SECRET_KEY" for _, auth, _ in echo.received)


def test_redaction_masks_userinfo_query_values_and_bearer_tokens() -> None:
    from whetstone.engine.backends.openai_compat import parse_spec
    from whetstone.engine.backends.redact import redact_spec, redact_text
    from whetstone.engine.server.naming import public_spec, upstream_model_name

    spec = "openai:m@http://admin:P@W@10.0.0.5:19001/v1?api_key=SECRET&x=1"
    assert redact_spec(spec) == "openai:m@http://***@10.0.0.5:19001/v1?api_key=***&x=***"
    assert public_spec(spec) == "openai:m" and upstream_model_name(spec) == "m"
    assert parse_spec("m@http://admin:PW@h:1/v1") == ("m", "http://admin:PW@h:1/v1")
    assert parse_spec("claude@2024@h:1/v1") == ("claude@2024", "http://h:1/v1")
    said = redact_text("got Bearer sk-live-123 from http://u:p@h/v1?key=v", ["sk-live-123"])
    assert said == "got Bearer *** from http://***@h/v1?key=***"
    assert redact_text("max token 8192 of 4096 tokens") == "max token 8192 of 4096 tokens"


# --- 9. a streamed /v1/completions reply is capped -----------------------------------------

CAP = 64 * 1024 * 1024
EVENT = b'data: {"choices": [{"index": 0, "text": "zzzzzzzzzzzzzzzz"}]}\n\n'


def completions_bomb() -> Iterator[bytes]:
    """256 MiB of completion events once inflated, ~1 MB as gzip on the wire."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = EVENT * ((1 << 20) // len(EVENT))
    for _ in range(256):
        yield c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    yield c.flush(zlib.Z_FINISH)


async def bomb(request: HttpRequest) -> Response:
    await request.body()
    return StreamingResponse(completions_bomb(), media_type="text/event-stream",
                             headers={"content-encoding": "gzip"})


def test_a_streamed_completion_is_cut_at_the_reply_cap() -> None:
    with Servers() as servers:
        upstream = servers.start(Starlette(routes=[Route("/v1/completions", bomb,
                                                         methods=["POST"])]))
        backend = get_backend(f"openai:tiny@{upstream}/v1", BackendOptions(max_retries=0))
        base = servers.start(create_app(backend, model_name="tiny"))
        got, tail = 0, b""
        with httpx.stream("POST", base + "/v1/completions", timeout=60, json={
                "model": "tiny", "prompt": "hi", "stream": True}) as r:
            assert r.status_code == 200
            for chunk in r.iter_raw():
                got += len(chunk)
                tail = (tail + chunk)[-4096:]
                assert got < CAP + (1 << 20), "relayed past the cap"  # was: 256 MiB, whole
        backend.close()
    assert got > CAP // 2  # the reply up to the cap did go out
    assert b'"code": "upstream_error"' in tail and tail.rstrip().endswith(b"data: [DONE]")


# --- 37.6 liveness and readiness ------------------------------------------------------------

def test_readiness_follows_the_upstream_and_liveness_does_not() -> None:
    from whetstone.engine.server.probes import Readiness

    state = {"down": False, "calls": 0}

    async def models(_: HttpRequest) -> Response:
        state["calls"] += 1
        return JSONResponse({"data": []}, status_code=503 if state["down"] else 200)

    with Servers() as servers:
        upstream = servers.start(Starlette(routes=[Route("/v1/models", models)]))
        backend = get_backend(f"openai:tiny@{upstream}/v1", BackendOptions(max_retries=0))
        app = create_app(backend, model_name="tiny")
        base = servers.start(app)
        ready = httpx.get(base + "/readyz", timeout=10)
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}  # was: 404
        with httpx.Client(timeout=10) as client:  # a probe storm: one upstream call
            storm = [client.get(base + "/readyz").status_code for _ in range(40)]
        assert storm == [200] * 40 and state["calls"] == 1
        state["down"] = True
        app.state.server.readiness = Readiness(backend, cache_s=0.0)
        down = httpx.get(base + "/readyz", timeout=10)
        assert down.status_code == 503 and down.headers["Retry-After"]
        assert down.json() == {"status": "unavailable", "reason": "the upstream is failing (503)"}
        for live in ("/health", "/livez"):  # liveness never asks the upstream
            calls = state["calls"]
            assert httpx.get(base + live, timeout=10).status_code == 200
            assert state["calls"] == calls
        backend.close()
        gone = get_backend(f"openai:tiny@http://127.0.0.1:{free_port()}/v1",
                           BackendOptions(max_retries=0))
        nowhere = servers.start(create_app(gone, model_name="tiny"))
        r = httpx.get(nowhere + "/readyz", timeout=10)
        assert r.status_code == 503 and "cannot be reached" in r.json()["reason"]
        assert "127.0.0.1" not in r.text  # no address
        assert httpx.get(nowhere + "/health", timeout=10).json()["status"] == "ok"
        gone.close()


def test_a_model_in_this_process_is_ready_and_the_documented_probes_answer() -> None:
    import re
    import textwrap

    import yaml

    from whetstone.engine.server.hosts import WebPolicy

    doc = (REPO / "docs" / "middleware.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", doc, re.DOTALL) if "Probe" in b]
    probes = yaml.safe_load(textwrap.dedent(block))
    paths = [probes[k]["httpGet"]["path"] for k in ("livenessProbe", "readinessProbe")]
    assert paths == ["/livez", "/readyz"]
    app = create_app(ok_backend(), model_name="tiny", web=WebPolicy.for_bind("0.0.0.0"))
    with running_server(app) as base:
        for path in paths:  # as the kubelet asks: the pod's IP as Host, on a 0.0.0.0 bind
            assert httpx.get(base + path, headers={"Host": "10.1.2.3:8000"},
                             timeout=10).status_code == 200
        r = httpx.get(base + "/readyz", timeout=10)
    assert (r.status_code, r.json()) == (200, {"status": "ready"})


# --- 37.9 n -----------------------------------------------------------------------------------

def test_n_goes_to_an_upstream_that_decodes_it(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []

    async def chat(request: HttpRequest) -> Response:
        body = await request.json()
        sent.append(body)
        n = body.get("n", 1)
        return JSONResponse({"id": "c", "object": "chat.completion", "created": 1,
                             "model": "upstream-name", "choices": [{
                                 "index": i, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": f"answer {i}"}}
                                 for i in range(n)],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 2 * n,
                                       "total_tokens": 3 + 2 * n}})

    store = TraceStore(tmp_path / "traces")
    with Servers() as servers:
        upstream = servers.start(Starlette(routes=[Route("/v1/chat/completions", chat,
                                                         methods=["POST"])]))
        backend = get_backend(f"openai:qwen@{upstream}/v1", BackendOptions(max_retries=0))
        base = servers.start(create_app(backend, traces=store, model_name="tiny"))
        r = httpx.post(base + "/v1/chat/completions", timeout=30,
                       json={"model": "tiny", "messages": USER, "n": 2, "seed": 7})
        assert r.status_code == 200, r.text  # was: 400 "only one choice per request"
        out = r.json()
        assert [c["message"]["content"] for c in out["choices"]] == ["answer 0", "answer 1"]
        assert out["model"] == "tiny" and out["usage"]["completion_tokens"] == 4
        assert sent[-1]["n"] == 2 and sent[-1]["model"] == "qwen" and sent[-1]["seed"] == 7
        trace = wait_for(store, r.headers["X-Whetstone-Trace-Id"])
        assert trace.answer == "answer 0" and trace.meta["choices"] == 2
        one = httpx.post(base + "/v1/chat/completions", timeout=30, json=CHAT)
        assert one.status_code == 200 and "n" not in sent[-1]  # left to the upstream
        streamed = httpx.post(base + "/v1/chat/completions", timeout=30,
                              json={**CHAT, "n": 2, "stream": True})
        assert streamed.status_code == 400 and "stream: false" in streamed.text
        backend.close()
    with running_server(create_app(ok_backend(), model_name="tiny")) as base:
        local = httpx.post(base + "/v1/chat/completions", timeout=30, json={**CHAT, "n": 2})
        assert local.status_code == 400
        assert "one choice per request" in local.json()["error"]["message"]
