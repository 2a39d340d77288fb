"""OTLP receivers for tests, built on the maintained ``opentelemetry-proto`` package: a gRPC
``TraceService`` and an OTLP/HTTP ``/v1/traces`` endpoint on 127.0.0.1 that decode each
``ExportTraceServiceRequest`` and keep it, so a test reads back the spans it was sent."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def value_of(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [value_of(x) for x in v.array_value.values]
    return None if which is None else getattr(v, which)


@dataclass
class Got:
    """A span as the receiver decoded it."""

    name: str
    trace_id: str
    span_id: str
    parent: str
    kind: int
    attrs: dict[str, Any]
    events: list[str]
    resource: dict[str, Any]
    status_code: int


class Receiver:
    """Keeps every ExportTraceServiceRequest it is sent (over gRPC or OTLP/HTTP)."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.lock = threading.Lock()

    def keep(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self.lock:
            self.requests.append(request)

    def spans(self) -> list[Got]:
        out = []
        with self.lock:
            requests = list(self.requests)
        for request in requests:
            for rs in request.resource_spans:
                resource = {a.key: value_of(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    out += [Got(s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                                s.kind, {a.key: value_of(a.value) for a in s.attributes},
                                [e.name for e in s.events], resource, s.status.code)
                            for s in ss.spans]
        return out


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        self.receiver.keep(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@contextlib.contextmanager
def grpc_receiving() -> Iterator[tuple[Receiver, str]]:
    """A gRPC OTLP receiver: (what it received, its endpoint URL)."""
    receiver = Receiver()
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Service(receiver), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield receiver, f"http://127.0.0.1:{port}"
    finally:
        server.stop(None)


@contextlib.contextmanager
def http_receiving() -> Iterator[tuple[Receiver, str]]:
    """An OTLP/HTTP receiver: (what it received, its endpoint URL)."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/v1/traces":
                receiver.keep(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200 if self.path == "/v1/traces" else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def chat_and_feedback(base: str) -> tuple[str, dict[str, Any]]:
    """One chat exchange with the server at ``base`` (model ``tiny``), then feedback on it
    (score 0.25, comment "vague"): its trace id and the reply's usage."""
    import httpx

    r = httpx.post(base + "/v1/chat/completions", timeout=30, json={
        "model": "tiny", "messages": [{"role": "user", "content": "Capital of France?"}]})
    assert r.status_code == 200, r.text
    trace_id = r.headers["X-Whetstone-Trace-Id"]
    f = httpx.post(base + "/v1/feedback", timeout=30,
                   json={"trace_id": trace_id, "score": 0.25, "comment": "vague"})
    assert f.status_code == 200, f.text
    return trace_id, r.json()["usage"]


def serve_one_exchange(argv: list[str], *, env: dict[str, str], port: int, log: Path
                       ) -> tuple[str, dict[str, Any]]:
    """Start ``argv`` (a ``whetstone serve`` with export on, listening on ``port``), answer
    one chat and its feedback (``chat_and_feedback``), then stop it with Ctrl-C, the clean
    shutdown that flushes the exporter: the trace id and the reply's usage."""
    from servers import wait_healthy

    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=Path(__file__).resolve().parent.parent, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, log, 120)
        return chat_and_feedback(base)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
