"""A backend that counts the calls it passes on: how an evolve reports its analyst calls as
they happen (``engine/evolution/pipeline.py``), whatever the evolver does with the model."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from whetstone.engine.backends.base import Backend, StreamChunk
from whetstone.engine.types import Completion, Request


class CountedCalls(Backend):
    """``inner`` with every finished completion counted; ``on_call(calls)`` hears each new
    count (from whichever thread made the call). Closing it leaves ``inner`` open: its owner
    closes it."""

    def __init__(self, inner: Backend, on_call: Callable[[int], None]) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.capabilities = inner.capabilities
        self.calls = 0
        self._on_call = on_call
        self._lock = threading.Lock()

    def _count(self, n: int) -> None:
        with self._lock:
            self.calls += n
            calls = self.calls
        self._on_call(calls)

    def complete(self, request: Request) -> Completion:
        out = self.inner.complete(request)
        self._count(1)
        return out

    async def acomplete(self, request: Request) -> Completion:
        out = await self.inner.acomplete(request)
        self._count(1)
        return out

    async def batch(self, requests: Sequence[Request], concurrency: int | None = None
                    ) -> list[Completion]:
        out = await self.inner.batch(requests, concurrency)
        self._count(len(out))
        return out

    def stream(self, request: Request) -> Iterator[StreamChunk]:
        for chunk in self.inner.stream(request):
            if chunk.completion is not None:
                self._count(1)
            yield chunk

    async def astream(self, request: Request) -> AsyncIterator[StreamChunk]:
        async for chunk in self.inner.astream(request):
            if chunk.completion is not None:
                self._count(1)
            yield chunk

    async def aready(self, timeout: float) -> str | None:
        return await self.inner.aready(timeout)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def __getattr__(self, name: str) -> Any:
        # What a backend kind adds (a tokenizer, a model folder) reads through.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
