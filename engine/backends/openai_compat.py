"""``openai:<model>@<base_url>`` — any OpenAI-compatible server through the real ``openai`` client.

vLLM's ``vllm serve``, llama.cpp's server, OpenAI itself, or another ``whetstone serve``. The
client's own retries are switched off (``max_retries=0``) and replaced by ``RetryPolicy`` so the
bound and the backoff are ours to set and test. Errors become ``BackendUnavailable`` (cannot
reach it), ``BackendTimeout`` (no answer in time), ``BackendRejected`` (a 4xx: the server
refused the request, its status and message kept for a proxy to pass on) or ``BackendError``.
Fields a ``Request`` leaves unset (``Request.unset``) are not sent: the server's defaults apply.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar
from urllib.parse import urlsplit

from whetstone.engine.backends.base import Backend, Capabilities, StreamChunk
from whetstone.engine.backends.openai_http import (
    HttpFailure,
    JsonPoster,
    SseParser,
    close_on_loop,
    server_message,
    should_retry,
    split_userinfo,
    sse_events,
)
from whetstone.engine.backends.openai_wire import (
    StreamAccumulator,
    completion_from_openai,
    request_to_openai,
)
from whetstone.engine.backends.redact import (
    redact_text,
    redact_url,
    split_address,
    url_secrets,
    without_address,
)
from whetstone.engine.backends.registry import BackendOptions
from whetstone.engine.errors import (
    BackendError,
    BackendRejected,
    BackendTimeout,
    BackendUnavailable,
    ConfigError,
    WhetstoneError,
)
from whetstone.engine.types import Completion, Request

log = logging.getLogger("whetstone.backends.openai")

OFFICIAL_BASE_URL = "https://api.openai.com/v1"
# Local servers (vLLM, llama.cpp, whetstone serve) take any key, but the client insists on one.
PLACEHOLDER_KEY = "sk-no-key-required"
_RETRY_STATUS = frozenset({408, 429})  # plus every 5xx
_T = TypeVar("_T")


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff: waits ``backoff_s * 2**k``, capped.

    A server's ``Retry-After`` (seconds) is honoured up to ``max_backoff_s``.
    """

    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        if retry_after is not None and retry_after >= 0:
            return min(retry_after, self.max_backoff_s)
        return min(self.backoff_s * (2 ** retry), self.max_backoff_s)


def normalize_base_url(url: str) -> str:
    """``http://host:8000`` -> ``http://host:8000/v1``; a URL with a path is kept as given."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{redact_url(url)!r} is not an http(s) URL",
                          hint="use openai:<model>@http://host:port/v1")
    path = parts.path.rstrip("/")
    return f"{parts.scheme}://{parts.netloc}{path or '/v1'}"


def parse_spec(arg: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    """``qwen@http://127.0.0.1:8000/v1`` -> (model, base_url). Without ``@url`` the base URL is
    ``$OPENAI_BASE_URL`` or the official API. The URL starts at the first ``@`` before a
    scheme (``redact.split_address``), so its userinfo never ends up in the model name."""
    env = dict(os.environ) if env is None else env
    model, address = split_address(arg.strip())
    url = address if address is not None else env.get("OPENAI_BASE_URL") or OFFICIAL_BASE_URL
    if not model or not url:
        raise ConfigError(f"openai spec needs a model name and a URL, got "
                          f"'openai:{redact_text(arg)}'",
                          hint="e.g. openai:qwen@http://127.0.0.1:8000/v1 or openai:gpt-4o-mini")
    return model, normalize_base_url(url)


def _server_message(exc: Any) -> str:
    return server_message(getattr(exc, "body", None), str(getattr(exc, "message", "") or exc))


class OpenAICompatBackend(Backend):
    """A model behind an OpenAI-compatible ``/v1/chat/completions``."""

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        api_key: str,
        timeout_s: float = 120.0,
        retry: RetryPolicy = RetryPolicy(),
        max_concurrency: int = 8,
        vision: bool = False,
    ) -> None:
        import openai  # lazily: `whetstone --help` should not pay for it

        self.model = model
        self.base_url = base_url
        # What messages and logs name: the address without its credentials (redact.py).
        self.shown_url = redact_url(base_url)
        basic = split_userinfo(base_url)[1]  # the Authorization the URL's userinfo makes
        self._secrets = tuple(s for s in (api_key, *url_secrets(base_url),
                                          basic.split()[-1] if basic else "")
                              if s and s != PLACEHOLDER_KEY)
        self.timeout_s = timeout_s
        self.retry = retry
        self.spec = f"openai:{model}@{base_url}"
        self.capabilities = Capabilities(
            vision=vision, logprobs=True, tool_calls=True, streaming=True,
            max_concurrency=max_concurrency,
        )
        self._openai = openai
        self._api_key = api_key
        self._client = openai.OpenAI(api_key=api_key, base_url=base_url, max_retries=0,
                                     timeout=timeout_s)
        # An async client's connection pool belongs to one event loop; keep one per loop.
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary())
        self._lock = threading.Lock()
        self._poster = JsonPoster(base_url, api_key)

    # --- errors and retries ------------------------------------------------------------------

    def _failure(self, exc: Exception) -> HttpFailure:
        """An ``openai`` exception as the transport-neutral ``HttpFailure``."""
        o = self._openai
        if isinstance(exc, HttpFailure):
            return exc
        if isinstance(exc, o.APITimeoutError):
            return HttpFailure("timeout", str(exc), cause=exc)
        if isinstance(exc, o.APIConnectionError):
            cause = exc.__cause__ or exc
            return HttpFailure("connection", f"{type(cause).__name__}: {cause}", cause=exc)
        if isinstance(exc, o.APIStatusError):
            return HttpFailure("status", _server_message(exc), status=exc.status_code,
                               retry_after=exc.response.headers.get("retry-after"), cause=exc,
                               should_retry=should_retry(exc.response.headers),
                               error={"type": exc.type, "param": exc.param, "code": exc.code})
        if isinstance(exc, o.APIError):  # e.g. an error event in the middle of a stream
            return HttpFailure("api", _server_message(exc), cause=exc)
        return HttpFailure("other", f"{type(exc).__name__}: {exc}", cause=exc)

    def _retry_wait(self, f: HttpFailure, retry: int) -> float | None:
        """Seconds to wait before retry number ``retry`` (0-based), or None: do not retry."""
        if retry >= self.retry.max_retries or f.kind == "timeout" or f.should_retry is False:
            # A timeout is not retried: the caller's deadline has already passed. Nor is a
            # reply that says not to (a Whetstone server upstream that already retried).
            return None
        if f.kind == "connection":
            return self.retry.delay(retry)
        if f.kind == "status" and (f.status in _RETRY_STATUS or f.status >= 500):
            try:
                retry_after = float(f.retry_after) if f.retry_after is not None else None
            except ValueError:  # an HTTP date: fall back to our own backoff
                retry_after = None
            return self.retry.delay(retry, retry_after)
        return None

    def redact(self, text: str) -> str:
        """``text`` without this backend's key, its URL's credentials or any bearer token:
        an upstream may echo the request's ``Authorization`` header in an error."""
        return redact_text(text, self._secrets)

    def _to_error(self, f: HttpFailure, attempts: int, timeout: float) -> WhetstoneError:
        """The ``WhetstoneError`` a caller sees for a failed call, whichever transport made
        it; ``no_retry`` when it was retried here already or the upstream said not to. What
        the upstream said is redacted (``redact``) before it is kept anywhere."""
        error = {k: self.redact(v) if isinstance(v, str) else v
                 for k, v in (f.error or {}).items()}
        f = replace(f, message=self.redact(f.message), error=error or None)
        err = self._make_error(f, attempts, timeout)
        if isinstance(err, BackendError):
            err.no_retry = attempts > 1 or f.should_retry is False
        return err

    def _make_error(self, f: HttpFailure, attempts: int, timeout: float) -> WhetstoneError:
        url = self.shown_url
        tries = f"after {attempts} attempt{'s' if attempts != 1 else ''}"
        if f.kind == "timeout":
            return BackendTimeout(
                f"{url} did not answer within {timeout:g} s (model {self.model!r})",
                hint="raise the timeout (BackendOptions.timeout_s or Request.timeout) "
                     "or check the server's load",
            )
        if f.kind == "connection":
            return BackendUnavailable(
                f"cannot reach the OpenAI-compatible server at {url} {tries} ({f.message})",
                hint="start the server (e.g. `whetstone serve --model embedded --port 8000` or "
                     "`vllm serve MODEL`) or fix the URL in openai:<model>@<base_url>",
            )
        if f.kind == "status":
            return self._status_error(f, tries)
        if f.kind == "api":
            return BackendError(f"{url} reported an error: {f.message}",
                                hint="check the server's log")
        return BackendError(f"unexpected reply from {url}: {f.message}",
                            hint="check that the server speaks the OpenAI chat API")

    def _status_error(self, f: HttpFailure, tries: str) -> WhetstoneError:
        """A status of 400 or more. A 4xx is a ``BackendRejected`` carrying the upstream's
        own status, error and ``Retry-After``, so a proxy can answer its client with them."""
        url, status, msg = self.shown_url, f.status, f.message
        if status >= 500:
            cls = BackendUnavailable if status in (502, 503, 504) else BackendError
            return cls(f"{url} failed with {status} {tries}: {msg}",
                       hint="check the server's log; it may be overloaded or misconfigured")
        if status == 404:
            text = f"{url} answered 404 for model {self.model!r}: {msg}"
            hint = (f"check the model name (GET {url}/models lists what it serves) and that "
                    "the base URL ends in /v1 (or whatever path the server uses)")
        elif status in (401, 403):
            text, hint = (f"{url} refused the API key ({status}): {msg}",
                          "set OPENAI_API_KEY or pass --api-key")
        elif status == 429:
            text, hint = (f"{url} is rate limiting (429) {tries}: {msg}",
                          "lower the concurrency or retry later")
        else:
            text, hint = (f"{url} rejected the request ({status}): {msg}",
                          "the server's message says what it expected")
        error = f.error or {}
        param = error.get("param")
        # What a proxy relays to its client: the upstream's words, never where it runs
        # (the operator's text above keeps the address, for the server log).
        return BackendRejected(text, hint, status=status,
                               upstream_message=without_address(msg, self.base_url),
                               error_type=error.get("type"),
                               param=without_address(param, self.base_url)
                               if isinstance(param, str) else param,
                               code=error.get("code"), retry_after=f.retry_after)

    def _timeout(self, request: Request) -> float:
        return request.timeout if request.timeout is not None else self.timeout_s

    def _call(self, fn: Callable[[], _T], timeout: float) -> _T:
        """Run ``fn`` with bounded retries, turning failures into ``WhetstoneError``."""
        for attempt in range(self.retry.max_retries + 1):
            try:
                return fn()
            except self._openai.OpenAIError as exc:
                failure = self._failure(exc)
                wait = self._retry_wait(failure, attempt)
                if wait is None:
                    raise self._to_error(failure, attempt + 1, timeout) from exc
                log.warning("%s: %s; retry %d/%d in %.2f s", self.shown_url, type(exc).__name__,
                            attempt + 1, self.retry.max_retries, wait)
                time.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _acall(self, fn: Callable[[], Any], timeout: float) -> Any:
        for attempt in range(self.retry.max_retries + 1):
            try:
                return await fn()
            except (self._openai.OpenAIError, HttpFailure) as exc:
                failure = self._failure(exc)
                wait = self._retry_wait(failure, attempt)
                if wait is None:
                    raise self._to_error(failure, attempt + 1, timeout) from exc
                log.warning("%s: %s; retry %d/%d in %.2f s", self.shown_url, type(exc).__name__,
                            attempt + 1, self.retry.max_retries, wait)
                await asyncio.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _aclient(self) -> Any:
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._aclients.get(loop)
            if client is None:
                client = self._openai.AsyncOpenAI(api_key=self._api_key, base_url=self.base_url,
                                                  max_retries=0, timeout=self.timeout_s)
                self._aclients[loop] = client
            return client

    # --- the contract ------------------------------------------------------------------------

    def _finish(self, request: Request, completion: Completion) -> Completion:
        """Fill usage when the server sent none (some llama.cpp builds): an estimate."""
        if completion.prompt_tokens or completion.completion_tokens:
            return completion
        prompt = sum(self.count_tokens(m.text) + 4 for m in request.messages)  # +4: role framing
        out = self.count_tokens(completion.text) + sum(
            self.count_tokens(c.name + c.arguments) for c in completion.tool_calls)
        return replace(completion, prompt_tokens=prompt, completion_tokens=out)

    def _parse(self, request: Request, response: Any, start: float) -> Completion:
        # The raw post gives whatever the body held: a dict for JSON objects, but a list, a
        # string (text/plain) or a number from a server that is not an OpenAI one.
        data = response.to_dict() if callable(getattr(response, "to_dict", None)) else response
        try:
            if not isinstance(data, dict):
                raise TypeError(f"a JSON object was expected, got {type(data).__name__}")
            completion = completion_from_openai(data, time.perf_counter() - start)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise BackendError(f"{self.shown_url} sent a reply that is not a chat completion "
                               f"({exc}): {self.redact(str(data)[:500])!r}",
                               hint="check that the server speaks the OpenAI chat API") from exc
        return self._finish(request, completion)

    def complete(self, request: Request) -> Completion:
        """One chat completion; latency covers retries (what the caller waited)."""
        kwargs = request_to_openai(request, self.model)
        timeout = self._timeout(request)
        start = time.perf_counter()
        response = self._call(
            lambda: self._client.post("/chat/completions", body=kwargs, cast_to=object,
                                      options={"timeout": timeout}), timeout)
        return self._parse(request, response, start)

    async def acomplete(self, request: Request) -> Completion:
        """One chat completion on an event loop: a plain JSON POST over aiohttp
        (``openai_http``; the SDK's request machinery cost ~1.4 ms of CPU a call, most of a
        proxy hop), with the same retries and errors as ``complete``."""
        kwargs = request_to_openai(request, self.model)
        timeout = self._timeout(request)
        start = time.perf_counter()
        response = await self._acall(
            lambda: self._poster.post("/chat/completions", kwargs, timeout), timeout)
        return self._parse(request, response, start)

    def _stream_kwargs(self, request: Request) -> dict[str, Any]:
        return {**request_to_openai(request, self.model), "stream": True,
                "stream_options": {"include_usage": True}}

    def _chunk(self, event: str, data: str) -> dict[str, Any] | None:
        """One server-sent event as a ``chat.completion.chunk`` dict; None for ``[DONE]``.
        An error event (``{"error": ...}``, as vLLM sends) or data that is not a JSON object
        is an ``HttpFailure``, as the SDK's stream raised them."""
        if data.startswith("[DONE]"):
            return None
        try:
            decoded = json.loads(data)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict) and (decoded.get("error") or event == "error"):
            raise HttpFailure("api", server_message(decoded, data[:500]))
        if not isinstance(decoded, dict):
            raise HttpFailure("other", f"an event of the stream is not a JSON object: "
                              f"{data[:300]!r}")
        return decoded

    def stream(self, request: Request) -> Iterator[StreamChunk]:
        """Text as it arrives, then the ``Completion``. Retries cover opening the stream only:
        once text has been handed out it cannot be taken back. Past the request's deadline the
        stream is cut and the completion ends with ``finish_reason="timeout"``. The events are
        read through ``SseParser``: one over its cap, or the stream in all over
        ``max_reply_bytes`` once decoded, is a ``BackendError``, not memory without end."""
        kwargs, timeout = self._stream_kwargs(request), self._timeout(request)
        start = time.perf_counter()
        opened = self._call(lambda: self._client.chat.completions.with_streaming_response
                            .create(**kwargs, timeout=timeout).__enter__(), timeout)
        parser = SseParser(max_total_bytes=self._poster.max_reply_bytes)
        acc, cut, done = StreamAccumulator(), False, False
        try:
            for raw in opened.iter_bytes():
                for event, data in parser.feed(raw):
                    chunk = self._chunk(event, data)
                    if done := chunk is None:
                        break
                    text = acc.feed(chunk)
                    if text:
                        yield StreamChunk(text=text)
                if done:
                    break
                if time.perf_counter() - start > timeout:
                    cut = True
                    break
        except (self._openai.OpenAIError, HttpFailure) as exc:
            raise self._to_error(self._failure(exc), 1, timeout) from exc
        except Exception as exc:  # iter_bytes raises the SDK's transport's (httpx's) own
            if not type(exc).__module__.startswith(("httpx", "httpcore")):
                raise
            if "Timeout" not in type(exc).__name__:
                raise self._to_error(HttpFailure("connection", f"{type(exc).__name__}: {exc}"),
                                     1, timeout) from exc
            cut = True  # no byte for `timeout` s: the deadline has passed, as in astream
        finally:
            opened.close()
        yield StreamChunk(completion=self._stream_result(request, acc, start, cut))

    async def astream(self, request: Request) -> AsyncIterator[StreamChunk]:
        """``stream`` on an event loop, over aiohttp (``JsonPoster.open_stream``): the same
        retries, deadline, caps and errors. A read that passes the deadline cuts the stream
        (``finish_reason="timeout"``) like the check between chunks."""
        kwargs, timeout = self._stream_kwargs(request), self._timeout(request)
        start = time.perf_counter()
        chunks = await self._acall(
            lambda: self._poster.open_stream("/chat/completions", kwargs, timeout), timeout)
        events = sse_events(chunks, SseParser(max_total_bytes=self._poster.max_reply_bytes))
        acc, cut = StreamAccumulator(), False
        try:
            async for event, data in events:
                chunk = self._chunk(event, data)
                if chunk is None:
                    break
                text = acc.feed(chunk)
                if text:
                    yield StreamChunk(text=text)
                if time.perf_counter() - start > timeout:
                    cut = True
                    break
        except HttpFailure as exc:
            if exc.kind != "timeout":
                raise self._to_error(exc, 1, timeout) from exc
            cut = True
        finally:
            await events.aclose()
            await chunks.aclose()  # type: ignore[attr-defined]
        yield StreamChunk(completion=self._stream_result(request, acc, start, cut))

    def _stream_result(self, request: Request, acc: StreamAccumulator, start: float,
                       cut: bool) -> Completion:
        completion = acc.completion(time.perf_counter() - start)
        if cut:
            completion = replace(completion, finish_reason="timeout")
        return self._finish(request, completion)

    async def aready(self, timeout: float) -> str | None:
        """Whether the upstream answers: a ``GET /models`` (vLLM, llama.cpp, OpenAI and
        Whetstone serve it; a 404 still means the server is up). None when it answers, else
        why not, without its address."""
        try:
            status = await self._poster.status("/models", timeout)
        except HttpFailure as exc:
            return ("the upstream did not answer in time" if exc.kind == "timeout"
                    else "the upstream cannot be reached")
        if status in (401, 403, 407):
            return f"the upstream refuses this server's API key ({status})"
        if status >= 500:
            return f"the upstream is failing ({status})"
        return None

    # --- other routes, passed through (the server's /v1/embeddings and /v1/completions) ----

    async def apost(self, path: str, body: Mapping[str, Any], timeout: float | None = None
                    ) -> Any:
        """POST ``body`` to ``path`` under the base URL (``/embeddings``, ``/completions``)
        with this backend's key, retries and errors; the decoded JSON reply as sent."""
        wait = self.timeout_s if timeout is None else timeout
        return await self._acall(lambda: self._poster.post(path, body, wait), wait)

    async def apost_stream(self, path: str, body: Mapping[str, Any],
                           timeout: float | None = None) -> AsyncIterator[bytes]:
        """``apost`` for ``"stream": true``: the reply's bytes as they come, at most the
        reply cap (64 MiB decoded; past it a ``BackendError``). Opening the stream is retried;
        a refusal is raised here, before any byte."""
        wait = self.timeout_s if timeout is None else timeout
        chunks = await self._acall(lambda: self._poster.open_stream(path, body, wait), wait)
        return self._relayed(chunks, wait)

    async def _relayed(self, chunks: AsyncIterator[bytes], timeout: float
                       ) -> AsyncIterator[bytes]:
        """``chunks`` with a failure while reading them (the cap, a broken connection) as the
        ``WhetstoneError`` a caller handles."""
        try:
            async for chunk in chunks:
                yield chunk
        except HttpFailure as exc:
            raise self._to_error(exc, 1, timeout) from exc
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        """Close the async client of the running loop (a server calls this as it shuts down,
        while its loop still runs)."""
        with self._lock:
            client = self._aclients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()
        await self._poster.aclose()

    def close(self) -> None:
        """Close the HTTP clients. Async clients whose loop is gone are left to the GC."""
        self._client.close()
        self._poster.close()
        with self._lock:
            clients = list(self._aclients.items())
            self._aclients.clear()
        for loop, client in clients:
            close_on_loop(loop, client.close)

def make_openai(arg: str, options: BackendOptions) -> OpenAICompatBackend:
    """Factory for ``openai:<model>[@<base_url>]``.

    ``options.extra`` may set ``max_concurrency`` (default 8), ``vision`` (default False),
    ``retry_backoff_s`` (default 0.5) and ``retry_max_backoff_s`` (default 8).
    """
    model, base_url = parse_spec(arg)
    api_key = options.api_key or os.environ.get("OPENAI_API_KEY")
    if not api_key:
        if base_url == OFFICIAL_BASE_URL:
            raise ConfigError(f"no API key for {base_url}",
                              hint="set OPENAI_API_KEY or pass --api-key")
        api_key = PLACEHOLDER_KEY
    extra = options.extra
    retry = RetryPolicy(
        max_retries=max(0, int(options.max_retries)),
        backoff_s=float(extra.get("retry_backoff_s", 0.5)),
        max_backoff_s=float(extra.get("retry_max_backoff_s", 8.0)),
    )
    return OpenAICompatBackend(
        model, base_url, api_key=api_key, timeout_s=float(options.timeout_s), retry=retry,
        max_concurrency=int(extra.get("max_concurrency", 8)), vision=bool(extra.get("vision")),
    )
