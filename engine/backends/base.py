"""The backend contract: a frozen model behind ``complete`` / ``acomplete`` / ``batch`` / ``stream``.

Backends declare what they can do with ``Capabilities`` flags; callers never guess from a name.
Subclasses implement ``complete`` (and ``stream`` when they can emit text incrementally); the
async and batch forms have sensible defaults built on it.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..types import Completion, Request
from .redact import redact_spec

if TYPE_CHECKING:
    from typing import Self


@dataclass(frozen=True)
class Capabilities:
    """What a backend offers. ``white_box``: hidden states and gradients are reachable."""

    vision: bool = False
    white_box: bool = False
    logprobs: bool = False
    tool_calls: bool = False  # native tool calls (the model's own format)
    streaming: bool = False
    max_concurrency: int = 1
    # Request.prefix is honoured: the reply continues text written for the model.
    prefill: bool = False
    # Replies follow the order of the calls, not their content (``scripted:`` replaying a
    # list): tasks must run one at a time for each to get the replies written for it.
    ordered: bool = False


@dataclass(frozen=True)
class StreamChunk:
    """A piece of a streamed completion. The last chunk carries the full ``completion``."""

    text: str = ""
    completion: Completion | None = None


def check_local_request(request: Request) -> None:
    """Reject what a local single-sequence backend (hf, llamacpp, vllm) cannot do: no tokens
    asked for, or more than one completion per request."""
    if request.max_tokens < 1:
        raise ConfigError(f"max_tokens must be at least 1 (got {request.max_tokens})",
                          hint="ask for a positive number of tokens")
    if request.n != 1:
        raise ConfigError(f"this backend returns one completion per request (n={request.n})",
                          hint="send n separate requests with different seeds")


def auto_concurrency(backend: Backend) -> int:
    """How many tasks to run at once on ``backend`` (``-j auto``): as many as it decodes
    together (the fast local engine's batch, an HTTP backend's connection limit); 1 for a
    backend that runs one sequence at a time."""
    return max(1, int(backend.capabilities.max_concurrency))


class Backend(abc.ABC):
    """Base class for frozen-model backends (one level of inheritance, no more)."""

    spec: str = ""
    capabilities: Capabilities = Capabilities()

    @property
    def shown_spec(self) -> str:
        """``spec`` as it may be shown, logged or stored in a trace: the credentials of its
        URL masked (``redact.redact_spec``). ``spec`` itself rebuilds the backend."""
        return redact_spec(self.spec)

    async def aready(self, timeout: float) -> str | None:
        """Whether the model can answer now, for a readiness probe: None when it can, else
        why not in a few words (no address). A model loaded in this process is ready; a
        remote one asks its server (``OpenAICompatBackend``). Within ``timeout`` seconds."""
        return None

    @abc.abstractmethod
    def complete(self, request: Request) -> Completion:
        """Run one chat completion. Must fill usage and latency."""

    async def acomplete(self, request: Request) -> Completion:
        """Async form; the default runs ``complete`` in a worker thread."""
        return await asyncio.to_thread(self.complete, request)

    async def batch(self, requests: Sequence[Request], concurrency: int | None = None
                    ) -> list[Completion]:
        """Complete many requests with at most ``concurrency`` in flight; order is kept."""
        limit = max(1, concurrency or self.capabilities.max_concurrency)
        sem = asyncio.Semaphore(limit)

        async def one(r: Request) -> Completion:
            async with sem:
                return await self.acomplete(r)

        return list(await asyncio.gather(*(one(r) for r in requests)))

    def batch_sync(self, requests: Sequence[Request], concurrency: int | None = None
                   ) -> list[Completion]:
        """``batch`` for callers without an event loop."""
        return asyncio.run(self.batch(requests, concurrency))

    def stream(self, request: Request) -> Iterator[StreamChunk]:
        """Yield text as it is generated, then a final chunk holding the ``Completion``.

        The default yields the whole completion at once, so every backend can be streamed.
        """
        completion = self.complete(request)
        yield StreamChunk(text=completion.text)
        yield StreamChunk(completion=completion)

    async def astream(self, request: Request) -> AsyncIterator[StreamChunk]:
        """Async form of ``stream``; the default drives the sync iterator in a thread."""
        it = self.stream(request)
        sentinel = object()
        while True:
            chunk = await asyncio.to_thread(next, it, sentinel)
            if chunk is sentinel:
                return
            yield chunk  # type: ignore[misc]

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text``; backends with a tokenizer count exactly, others estimate."""
        return max(1, len(text) // 4) if text else 0

    def close(self) -> None:  # noqa: B027 - a default for the many backends that hold nothing
        """Release resources (threads, sockets, memory). Safe to call twice."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.shown_spec!r}>"
