"""The HTTP routes, at module level: each reads what it serves from ``request.app.state.server``
(a ``ServerState`` that ``create_app`` builds), so nothing here is a closure over one app.

- ``POST /v1/chat/completions`` (JSON or SSE): admit (429 past the queue), adapt with the
  library, answer with the upstream, reply once the exchange's trace is stored (spooled, before
  a remote store);
- ``POST /v1/feedback``: label a recorded exchange;
- ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health`` and ``GET /livez``
  (liveness), ``GET /readyz`` (readiness: the upstream answers, ``probes.py``),
  ``GET /metrics``.
"""

# No `from __future__ import annotations`: FastAPI reads the route functions' annotations at
# run time.
import asyncio
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ...library_store.paths import shown
from ...library_store.trace_build import new_trace_id
from ..backends.base import Backend
from ..backends.openai_wire import (
    ChatCall,
    completion_from_openai,
    completion_to_openai,
    request_to_openai,
)
from ..backends.redact import redact_spec
from ..chat.adapter import (
    ADAPTED_HEADER,
    Adapted,
    ChatAdapter,
    ChatSwitches,
    last_user_text,
)
from ..chat.exchange import chat_trace, check_feedback, check_label
from ..errors import BackendError, ConfigError, NotFound, WhetstoneError
from ..types import Completion, Trace
from .canary import CONVERSATION_HEADER, conversation_key
from .feedback import FeedbackPolicy, address_key
from .guard import (
    REQUEST_ID_HEADER,
    TRACE_HEADER,
    VERSION_HEADER,
    key_matches,
    key_owner,
)
from .metrics import CONTENT_TYPE, Metrics
from .naming import public_spec, upstream_model_name
from .pipeline import ChatPipeline
from .probes import Readiness
from .recording import OWNER_KEY, TraceWriter
from .responses import (
    error_reply,
    failure_text,
    internal_error_reply,
    json_body,
    request_id,
    whetstone_error_reply,
)
from .service import (
    ChatService,
    OpenStream,
    Relay,
    ServerSettings,
    error_message,
)

router = APIRouter()

MAX_TRACE_ID_CHARS = 128
_TRACE_ID = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_TRACE_ID_CHARS}}}")
_DRIVE = re.compile(r"[A-Za-z]:[\\/]")  # a Windows path's start


@dataclass
class ServerState:
    """Everything one app serves with: ``app.state.server``."""

    backend: Backend
    settings: ServerSettings
    service: ChatService
    metrics: Metrics
    pipeline: ChatPipeline
    writer: TraceWriter | None
    adapter: ChatAdapter | None
    started_at: int
    api_keys: frozenset[str] = frozenset()
    readiness: Readiness | None = None
    feedback_policy: FeedbackPolicy = field(default_factory=FeedbackPolicy)


def _state(request: Request) -> ServerState:
    return request.app.state.server


def _owner(request: Request, state: ServerState) -> str | None:
    """The hash of the API key the request came with (``Guard`` has checked it); None on a
    server without keys, where every client may label every exchange."""
    if not state.api_keys:
        return None
    return key_owner(request.headers.get("authorization"), state.api_keys)


class EventStream(StreamingResponse):
    """Closes the backend stream and frees the queue place however the response ends: done,
    failed, or the client went away before the first event (then the event generator never
    starts)."""

    def __init__(self, stream: OpenStream[Any], *args: Any,
                 on_close: Callable[[], None],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stream = stream
        self._on_close = on_close

    async def __call__(self, *args: Any) -> None:
        try:
            await super().__call__(*args)
        finally:
            try:
                await self._stream.close()
            finally:
                self._on_close()


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(request: Request) -> Response:
    state = _state(request)
    started = time.time()
    deadline = state.service.deadline()  # the queue wait and retrieval count against it too
    rid = request_id(request.headers.get(REQUEST_ID_HEADER))
    headers = {REQUEST_ID_HEADER: rid}
    body = await json_body(request, state.metrics, state.settings.max_body_bytes, headers)
    if isinstance(body, Response):
        return body
    try:
        call = state.service.parse(body)
        switches = ChatSwitches.from_body(body.get("whetstone"))
        if request.headers.get(ADAPTED_HEADER):  # a wrapped client applied its library
            switches = replace(switches, library=False)
        state.pipeline.check_endpoints(switches, call.stream, call.request.n)
    except WhetstoneError as exc:
        return whetstone_error_reply(state.metrics, exc, headers)
    except Exception as exc:  # noqa: BLE001 - a validation bug: still a proper 500
        return internal_error_reply(state.metrics, exc, headers)
    if not state.service.admit():
        return error_reply(state.metrics, 429, f"the server is busy: {state.service.admitted} "
                           "requests are being answered or are waiting, the most it takes; "
                           "retry shortly", "requests", "rate_limit_exceeded",
                           headers={**headers, "Retry-After": "1"})
    exchange = _Exchange(state, call, started, rid, headers, deadline, _owner(request, state))
    conversation = conversation_key(call.request.messages, body.get("user"),
                                    request.headers.get(CONVERSATION_HEADER)) \
        if state.pipeline.canary is not None else None
    try:
        adapted = await state.pipeline.adapt(call.request, switches, conversation)
        return await exchange.answer(adapted, switches)
    finally:
        if not exchange.handed_off:  # a stream frees its queue place itself, when it ends
            state.service.release()


def _first_choice(reply: Any, latency_s: float) -> Completion:
    """The first choice of an upstream's ``chat.completion`` (what the trace keeps)."""
    try:
        if not isinstance(reply, dict) or not isinstance(reply.get("choices"), list):
            raise TypeError("not a JSON object with a list of choices")
        return completion_from_openai(reply, latency_s)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise BackendError(f"the upstream's reply is not a chat completion ({exc})",
                           hint="check that the upstream speaks the OpenAI chat API") from exc


class _Exchange:
    """One admitted chat call: answers it (JSON or a stream) and records it once."""

    def __init__(self, state: ServerState, call: ChatCall, started: float, rid: str,
                 headers: dict[str, str], deadline: float, owner: str | None = None) -> None:
        self.state, self.call, self.started = state, call, started
        self.owner = owner  # the key's hash: only that key may label this exchange
        self.request_id, self.headers, self.deadline = rid, headers, deadline
        self.model = call.model or state.settings.model_name
        self.trace_id: str | None = None
        self.adapted: Adapted | None = None
        self.handed_off = False
        self._ended = False
        self._spooled: asyncio.Future[Any] | None = None  # the trace in the spool (remote)

    async def answer(self, adapted: Adapted, switches: ChatSwitches) -> Response:
        """Answer with the upstream; the reply goes once its trace is written (``_settle``)."""
        state = self.state
        self.adapted = adapted
        self.call = replace(self.call, request=adapted.request)
        if adapted.applied and adapted.library_version:
            self.headers[VERSION_HEADER] = adapted.library_version
        if switches.record and state.writer is not None:
            self.trace_id = new_trace_id(self.started)
            self.headers[TRACE_HEADER] = self.trace_id
        if self.call.stream:
            return await self._stream()
        if self.call.request.n > 1:
            return await self._choices()
        try:
            completion = await state.service.complete(self.call, self.deadline)
        except Exception as exc:  # noqa: BLE001 - any failure gets a reply and a trace
            return await self._failed(exc)
        body, meta = completion_to_openai(completion, model=self.model), {}
        if switches.endpoints:
            meta["endpoints"] = await state.pipeline.call_endpoints(
                switches.endpoints, last_user_text(self.call.request.messages), completion.text)
            body["whetstone"] = dict(meta)
        self._record(completion, None, **meta)
        await self._settle()
        return JSONResponse(body, headers=self.headers)

    async def _choices(self) -> Response:
        """``n`` > 1: the upstream decodes the choices (``parse`` allows it only for a
        ``Relay``), its reply goes to the client under the served name, the trace keeps the
        first choice."""
        state, relay = self.state, self.state.backend
        assert isinstance(relay, Relay)
        body = request_to_openai(self.call.request, relay.model)
        start = time.perf_counter()
        try:
            reply = await state.service.relay(
                lambda left: relay.apost("/chat/completions", body, left), self.deadline)
            completion = _first_choice(reply, time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - any failure gets a reply and a trace
            return await self._failed(exc)
        state.service.count_tokens(completion)
        reply["model"] = self.model
        self._record(completion, None, choices=len(reply["choices"]))
        await self._settle()
        return JSONResponse(reply, headers=self.headers)

    async def _stream(self) -> Response:
        state = self.state
        try:
            stream = await state.service.open_stream(self.call, self.deadline)
        except Exception as exc:  # noqa: BLE001 - any failure gets a reply and a trace
            return await self._failed(exc)

        def on_close() -> None:
            self._on_end(None, None, "")  # when the event generator never ran
            state.service.release()

        self.handed_off = True
        return EventStream(
            stream, state.service.sse_events(self.call, self.model, stream, self._on_end,
                                             self.request_id, settle=self._settle),
            on_close=on_close, media_type="text/event-stream",
            headers={**self.headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def _record(self, completion: Completion | None, failure: str | None, outcome: Any = None,
                **meta: Any) -> None:
        """Queue the exchange's trace; it is built, cut and written in the writer's threads
        (a 16 MB request costs the loop nothing here). Before a remote store, ``_spooled`` is
        then done once the trace is in this machine's spool."""
        if self.trace_id is None or self.adapted is None:
            return
        if self.owner is not None:
            meta[OWNER_KEY] = self.owner
        adapted, ended = self.adapted, time.time()
        info = {"served_as": self.model, "stream": self.call.stream, **meta}
        self._spooled = self.state.pipeline.record(self.trace_id, lambda: chat_trace(
            self.trace_id or "", adapted, model=self.state.backend.shown_spec,
            started=self.started, ended=ended, completion=completion, error=failure,
            outcome=outcome, request_id=self.request_id, meta=info))

    async def _settle(self) -> None:
        """Wait until this exchange's trace is written (the store's one ``write`` of its line,
        flushed), or, before a store across the network (``TraceWriter.durable``), spooled on
        this machine's disk: a reply that hands out a trace id goes only then, so a replica
        killed with ``kill -9`` after answering has lost no acknowledged trace, and an outage
        of the remote store does not hold the replies (docs/middleware.md has the cost). A
        wait past ``recording.SETTLE_WAIT_S`` is logged and the reply goes."""
        if self.trace_id is not None and self.state.writer is not None:
            await self.state.writer.settle(self.trace_id, self._spooled)

    async def _failed(self, exc: Exception) -> JSONResponse:
        """The error reply, sent once the exchange's trace is written."""
        if isinstance(exc, WhetstoneError):
            out = whetstone_error_reply(self.state.metrics, exc, self.headers,
                                        request_id=self.request_id)
            reason = exc.message
        else:
            out = internal_error_reply(self.state.metrics, exc, self.headers)
            reason = failure_text(exc)
        self._record(None, reason)
        await self._settle()
        return out

    def _on_end(self, completion: Completion | None, failure: str | None, text: str) -> None:
        """How a stream ended, recorded once: done, failed, or the client went away."""
        if self._ended:
            return
        self._ended = True
        if completion is None and failure is None:
            self._record(None, "the client closed the stream", outcome="interrupted",
                         partial=text)
        else:
            self._record(completion, failure)


@router.post("/v1/feedback", response_model=None)
async def feedback(request: Request) -> Response | dict[str, Any]:
    state = _state(request)
    metrics = state.metrics
    body = await json_body(request, metrics, state.settings.max_body_bytes, {})
    if isinstance(body, Response):
        return body
    if state.writer is None:
        return error_reply(metrics, 404, "this server does not record traces, so there is "
                           "nothing to label", "invalid_request_error", "not_found")
    if not isinstance(body, dict):
        return error_reply(metrics, 400, "the body must be a JSON object {trace_id, score, "
                           "comment}", "invalid_request_error")
    trace_id = body.get("trace_id")
    if not isinstance(trace_id, str) or not trace_id.strip():
        return error_reply(metrics, 400, "'trace_id' is required: the X-Whetstone-Trace-Id "
                           "header of the response being labelled", "invalid_request_error",
                           param="trace_id")
    if not _TRACE_ID.fullmatch(trace_id.strip()):  # never echo what a client sent unchecked
        return error_reply(metrics, 400, f"'trace_id' is not a trace id: at most "
                           f"{MAX_TRACE_ID_CHARS} letters, digits and '-_.:' (the "
                           f"{TRACE_HEADER} header of the response being labelled)",
                           "invalid_request_error", param="trace_id")
    try:
        score, comment = check_feedback(body.get("score"), body.get("comment"))
        label = check_label(body.get("label"))
    except ConfigError as exc:
        param = next((p for p in ("comment", "label") if f"'{p}'" in exc.message), "score")
        return error_reply(metrics, 400, error_message(exc), "invalid_request_error",
                           param=param)
    owner = _owner(request, state)
    key = owner or address_key(request.client.host if request.client else None)
    wait = state.feedback_policy.allow(key)
    if wait is not None:
        metrics.feedback_limited.inc()
        return error_reply(metrics, 429, f"too much feedback from this key: at most "
                           f"{state.feedback_policy.rate_per_min:g} labels a minute; retry in "
                           f"{math.ceil(wait)} s", "requests", "feedback_rate_limited",
                           headers={"Retry-After": str(math.ceil(wait))})
    try:
        trace: Trace = await state.writer.label(
            trace_id.strip(), score, comment, owner=owner, key=key,
            weight=state.feedback_policy.weight(key), label=label)
    except NotFound as exc:
        return error_reply(metrics, 404, error_message(exc), "invalid_request_error",
                           "trace_not_found", param="trace_id")
    except WhetstoneError as exc:  # the trace is still queued: the store is backed up
        return error_reply(metrics, 503, error_message(exc), "server_error", "trace_pending",
                           headers={"Retry-After": "1"})
    return {"object": "feedback", "trace_id": trace.id, "score": trace.score,
            "comment": comment, **({"label": label} if label is not None else {})}


def _model_card(state: ServerState, name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": state.started_at, "owned_by": "whetstone"}


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    state = _state(request)
    return {"object": "list", "data": [_model_card(state, n) for n in state.settings.served]}


@router.get("/v1/models/{model_id:path}", response_model=None)
async def get_model(request: Request, model_id: str) -> Response | dict[str, Any]:
    state = _state(request)
    if model_id not in state.settings.served:
        return error_reply(state.metrics, 404, f"the model {shown(model_id, 80)!r} is not "
                           "served here; "
                           "available: " + ", ".join(state.settings.served),
                           "invalid_request_error", "model_not_found", "model")
    return _model_card(state, model_id)


@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    """Status, the served name and the upstream's kind for anyone (a probe needs no key).
    The upstream's address and the library's state (the served version, and whether and how a
    gate accepted it) only to a client that sends one of the server's API keys (to every
    client when there are none); never a path on this host."""
    state = _state(request)
    keyed = not state.api_keys or key_matches(request.headers.get("authorization"),
                                              state.api_keys)
    spec = health_spec(state.backend.spec, with_address=keyed and bool(state.api_keys))
    out: dict[str, Any] = {"status": "ok", "model": state.settings.model_name, "backend": spec}
    if state.adapter is None and state.writer is None:
        return out
    out["upstream"] = spec
    if not keyed:
        return out
    out["recording"] = state.writer is not None
    try:
        out["library_version"] = state.pipeline.library_version()
        gate = state.pipeline.library_gate()
        if gate is not None:
            out["library_gate"] = dict(gate)
    except WhetstoneError as exc:
        out["library_version"] = None
        out["library_error"] = library_state(exc)
    return out


def health_spec(spec: str, *, with_address: bool) -> str:
    """The upstream's spec as ``/health`` shows it: its kind and model name, a local model's
    folder or file by its name only (``hf:/srv/models/qwen`` -> ``hf:qwen``), and the
    ``@<url>`` part only ``with_address``, its credentials masked (``redact_spec``)."""
    public = public_spec(spec)
    address = redact_spec(spec)[len(public):] if with_address else ""
    kind, sep, arg = public.partition(":")
    if sep and (arg.startswith(("/", "~", "./", "../", "\\")) or _DRIVE.match(arg)):
        public = f"{kind}:{upstream_model_name(spec)}"
    return public + address


def library_state(exc: WhetstoneError) -> str:
    """A state name for a library that cannot be read, for ``/health``: its message names the
    library's folder on this host, which no client is shown (the CLI says it in full)."""
    if isinstance(exc, NotFound) or isinstance(exc.__cause__, FileNotFoundError):
        return "missing"
    return "unreadable"


@router.get("/livez")
async def livez() -> dict[str, str]:
    """Liveness: the process answers HTTP. Nothing else is looked at (a probe's restart must
    not follow a slow upstream)."""
    return {"status": "ok"}


@router.get("/readyz", response_model=None)
async def readyz(request: Request) -> Response:
    """Readiness: 200 when a request would reach a model now, else 503 with the reason (the
    upstream's state, never its address); checked at most every 2 s (``probes.py``)."""
    state = _state(request)
    readiness = state.readiness or Readiness(state.backend)
    reason = await readiness.reason()
    if reason is None:
        return JSONResponse({"status": "ready", **readiness.report(state.writer)})
    return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503,
                        headers={"Retry-After": "2"})


@router.get("/metrics")
async def prometheus(request: Request) -> Response:
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE)
