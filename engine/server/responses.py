"""The server's replies that are not answers: OpenAI-style errors, and reading request bodies.

Every error is ``{"error": {"message", "type", "param", "code"}}`` with a fitting status, never
a stack trace nor an upstream's address. An upstream's 4xx (a prompt too long for its context,
a 429) reaches the client with its status and message; a 5xx names only the request id (the
details are in the server log and the trace). Each is counted in ``/metrics`` by its code.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..backends.openai_wire import error_to_openai
from ..errors import WhetstoneError
from .guard import REQUEST_ID_HEADER, BodyTooLarge, read_body
from .metrics import Metrics
from .service import (
    client_message,
    error_headers,
    error_param,
    error_status,
    metric_code,
)

if TYPE_CHECKING:
    from fastapi import FastAPI, Request

log = logging.getLogger("whetstone.server")

# A JSON escape in the surrogate range (\ud800-\udfff). Only bodies holding one can decode to
# a lone surrogate, so only those pay for the full check in _valid_text.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def error_reply(metrics: Metrics, status: int, message: str, kind: str,
                code: str | None = None, param: str | None = None,
                headers: Mapping[str, str] | None = None, metric: str | None = None
                ) -> JSONResponse:
    """An OpenAI-style error body with ``status``, counted by ``metric`` (default: its code;
    an upstream's own codes are not label values, there is no bound on them)."""
    metrics.errors.inc(code=metric or code or kind)
    return JSONResponse(error_to_openai(message, kind, code=code, param=param),
                        status_code=status, headers=headers)


def whetstone_error_reply(metrics: Metrics, exc: WhetstoneError,
                          headers: dict[str, str] | None = None, *,
                          request_id: str = "") -> JSONResponse:
    """The reply for an error raised while answering (400, 404, 502, 504 ...). A 5xx says
    only what kind of failure it was and the request id; the details go to the log."""
    status, kind, code = error_status(exc)
    if status >= 500:
        log.warning("request %s failed (%d): %s", request_id, status, exc.message)
    return error_reply(metrics, status, client_message(exc, request_id), kind, code,
                       param=error_param(exc), headers={**(headers or {}),
                                                        **error_headers(exc)},
                       metric=metric_code(exc))


def internal_error_reply(metrics: Metrics, exc: Exception, headers: dict[str, str]
                         ) -> JSONResponse:
    """A bug or a backend failure that is not a ``WhetstoneError`` (CUDA out of memory):
    logged once with its traceback, answered as a plain 500 without the details."""
    rid = headers.get(REQUEST_ID_HEADER, "")
    log.error("request %s failed (500): %s", rid, failure_text(exc), exc_info=exc)
    return error_reply(metrics, 500, f"internal server error (request {rid}; see the server "
                       "log)", "server_error", "internal_error", headers=headers)


def failure_text(exc: BaseException) -> str:
    """What a trace says about an exception that is not a ``WhetstoneError``."""
    return f"{type(exc).__name__}: {exc}"


def request_id(given: str | None) -> str:
    """The client's ``X-Request-Id`` when it is a sane token, else a new one."""
    if given and len(given) <= 128 and all(c.isalnum() or c in "._:-" for c in given):
        return given
    return "req_" + uuid.uuid4().hex[:24]


def _valid_text(raw: bytes, body: Any) -> bool:
    """Whether every string in the parsed ``body`` encodes as UTF-8. A JSON escape can decode
    to a lone surrogate, which no backend, SSE writer or trace file can encode."""
    if not _SURROGATE_ESCAPE.search(raw):
        return True
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def json_body(request: Request, metrics: Metrics, max_body_bytes: int | None,
                    headers: dict[str, str]) -> Any:
    """The parsed body, or the error response to send instead (413, 400)."""
    try:
        raw = await read_body(request, max_body_bytes)
    except BodyTooLarge as exc:
        return error_reply(metrics, 413, str(exc), "invalid_request_error", "request_too_large",
                           headers=headers)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        # ValueError covers bad JSON, bad UTF-8 and integers too long to convert;
        # RecursionError, nesting too deep to parse.
        return error_reply(metrics, 400, f"the request body is not valid JSON: {exc}",
                           "invalid_request_error", "invalid_json", headers=headers)
    if not _valid_text(raw, body):
        return error_reply(metrics, 400, "the request body holds a lone UTF-16 surrogate "
                           "escape (\\ud800-\\udfff without its pair); send text as valid "
                           "Unicode", "invalid_request_error", "invalid_json", headers=headers)
    return body


def install_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    """Unknown routes, bad methods, validation failures and crashes as OpenAI-style errors."""

    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = "not_found" if exc.status_code == 404 else None
        # exc.headers carries what the status needs, such as Allow on a 405.
        return error_reply(metrics, exc.status_code, str(exc.detail), kind, code,
                           headers=exc.headers)

    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_reply(metrics, 400, f"invalid request: {exc.errors()}",
                           "invalid_request_error")

    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_reply(metrics, 500, "internal server error (see the server log)",
                           "server_error")

    app.add_exception_handler(HTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, unexpected)
