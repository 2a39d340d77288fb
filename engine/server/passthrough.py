"""``POST /v1/embeddings`` and ``POST /v1/completions``, passed to the upstream as sent.

So a client can point its whole base URL at Whetstone: these routes go through the same API
keys, body limit, queue, upstream slots, deadline and error mapping as chat, but the library is
not applied and nothing is recorded (neither is a chat exchange). The body goes upstream as the
client sent it, except ``model``: a name this server serves becomes the upstream's own model
name (as for chat); any other name goes as given (an upstream such as OpenAI serves its
embedding models beside the chat one). ``"stream": true`` on ``/v1/completions`` relays the
upstream's event stream byte for byte.

Only an upstream that takes raw posts (``Relay``: the ``openai:`` backend) can serve them; a
model run here answers 501 saying so.
"""

# No `from __future__ import annotations`: FastAPI reads the route functions' annotations at
# run time.
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..backends.openai_wire import error_to_openai
from ..errors import BackendError, BackendRejected, ConfigError, WhetstoneError
from .body_limits import check_ranges
from .guard import REQUEST_ID_HEADER
from .responses import (
    error_reply,
    internal_error_reply,
    json_body,
    request_id,
    whetstone_error_reply,
)
from .routes import EventStream, ServerState
from .service import OpenStream, Relay, client_message, error_status

router = APIRouter()


@router.post("/v1/embeddings", response_model=None)
async def embeddings(request: Request) -> Response:
    return await _pass(request, "/embeddings", can_stream=False)


@router.post("/v1/completions", response_model=None)
async def completions(request: Request) -> Response:
    return await _pass(request, "/completions", can_stream=True)


def _upstream_body(state: ServerState, body: Any, relay: Relay, path: str) -> dict[str, Any]:
    """The body to send to ``path``: the client's, with a served model name mapped to the
    upstream's."""
    if not isinstance(body, dict):
        raise ConfigError("the request body must be a JSON object",
                          hint="see https://platform.openai.com/docs/api-reference")
    check_ranges(body, path)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ConfigError(f"'model' must be a string, got {type(model).__name__}")
    if model is None or model in state.settings.served:
        return {**body, "model": relay.model}
    return body


async def _pass(request: Request, path: str, *, can_stream: bool) -> Response:
    """Answer ``request`` with the upstream's reply to the same body at ``path``."""
    state: ServerState = request.app.state.server
    rid = request_id(request.headers.get(REQUEST_ID_HEADER))
    headers = {REQUEST_ID_HEADER: rid}
    body = await json_body(request, state.metrics, state.settings.max_body_bytes, headers)
    if isinstance(body, Response):
        return body
    relay = state.backend
    if not isinstance(relay, Relay):
        # x-should-retry: the openai client would otherwise retry a 501 twice.
        return error_reply(state.metrics, 501, f"/v1{path} is not served here: this "
                           f"server's model ({state.settings.model_name}) runs in-process "
                           "and answers chat completions only; serve an openai:<model>@<url> "
                           f"upstream to pass /v1{path} through", "invalid_request_error",
                           "unsupported_endpoint",
                           headers={**headers, "x-should-retry": "false"})
    try:
        sent = _upstream_body(state, body, relay, path)
    except WhetstoneError as exc:
        return whetstone_error_reply(state.metrics, exc, headers, request_id=rid)
    stream = can_stream and sent.get("stream") is True
    if not state.service.admit():
        return error_reply(state.metrics, 429, "the server is busy; retry shortly", "requests",
                           "rate_limit_exceeded", headers={**headers, "Retry-After": "1"})
    deadline, handed_off = state.service.deadline(), False
    try:
        if stream:
            opened = await state.service.open_relay(
                lambda left: relay.apost_stream(path, sent, left), deadline)
            handed_off = True  # the stream frees its queue place itself, when it ends
            return _event_stream(state, opened, headers, rid)
        reply = await state.service.relay(lambda left: relay.apost(path, sent, left), deadline)
        if not isinstance(reply, dict):
            raise BackendError(f"the upstream's {path} reply is not a JSON object: "
                               f"{str(reply)[:300]!r}", hint="check the upstream server")
        return JSONResponse(reply, headers=headers)
    except WhetstoneError as exc:
        return _refused(state, exc, path, sent, headers, rid)
    except Exception as exc:  # noqa: BLE001 - a bug: still a proper 500
        return internal_error_reply(state.metrics, exc, headers)
    finally:
        if not handed_off:
            state.service.release()


def _refused(state: ServerState, exc: WhetstoneError, path: str, sent: Mapping[str, Any],
             headers: dict[str, str], rid: str) -> Response:
    """The reply for a failed pass: as for chat, except that an upstream 404 is the client's
    here (it named the model or the route), so it is answered as a 404 saying so."""
    if isinstance(exc, BackendRejected) and exc.status == 404:
        return error_reply(state.metrics, 404, f"the upstream has no /v1{path} for model "
                           f"{str(sent.get('model'))[:80]!r}: {exc.upstream_message}",
                           "invalid_request_error", "not_found", headers=headers)
    return whetstone_error_reply(state.metrics, exc, headers, request_id=rid)


def _event_stream(state: ServerState, opened: OpenStream[bytes], headers: dict[str, str],
                  rid: str) -> Response:
    """The upstream's event stream relayed as it comes; a failure once bytes have gone out
    can only be an error event (the status is sent), then the stream ends."""

    async def relayed() -> AsyncIterator[bytes]:
        try:
            while (chunk := await opened.next()) is not None:
                yield chunk
        except WhetstoneError as exc:
            _, kind, code = error_status(exc)
            state.metrics.errors.inc(code=code or "server_error")
            event = error_to_openai(client_message(exc, rid), kind, code=code)
            yield f"\n\ndata: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()
        finally:
            await opened.close()

    return EventStream(opened, relayed(), on_close=state.service.release,
                       media_type="text/event-stream",
                       headers={**headers, "Cache-Control": "no-cache",
                                "X-Accel-Buffering": "no"})
