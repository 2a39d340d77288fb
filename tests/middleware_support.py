"""Helpers for the middleware tests: a small skills library, a shared embedding model, servers
on a chosen port, and upstream doubles whose replies are derived from the request."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from servers import running_server

from whetstone.engine.api import open_library
from whetstone.engine.backends.base import Backend, Capabilities, StreamChunk
from whetstone.engine.chat.adapter import ChatAdapter
from whetstone.engine.methods.base import make_config
from whetstone.engine.runtime.skills_plugin import SkillsConfig, SkillsPlugin
from whetstone.engine.types import Completion, Request, Trace
from whetstone.library_store.store import Library
from whetstone.library_store.traces import TraceStore

SKILLS = {
    "skills/unit-conversion/SKILL.md": """---
name: unit-conversion
description: Convert between units (hours, minutes, metres, kilometres) in word problems.
---

# Unit conversion

1. Write every quantity with its unit.
2. Convert to one unit before adding.
""",
    "skills/baking-recipes/SKILL.md": """---
name: baking-recipes
description: Scale baking recipes up or down by servings.
---

# Baking

Multiply every ingredient by new servings / old servings.
""",
    "skills/weather-reports/SKILL.md": """---
name: weather-reports
description: Answer questions about the weather in a city by calling the get_weather tool.
---

# Weather

Call get_weather with the city, then report the temperature in Celsius.
""",
}
USER = [{"role": "user", "content": "How many minutes are 2.5 hours?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}


def make_library(path: Path) -> Library:
    """A library at v2 holding the three skills above."""
    lib = open_library(path, create=True)
    lib.commit(SKILLS, method="test", message="three skills")
    return lib


@functools.lru_cache(maxsize=1)
def shared_embedder() -> Any:
    """One MiniLM for every test in the process (loading it takes a second or two)."""
    from whetstone.library_store.embeddings import TextEmbedder

    return TextEmbedder(threads=1)


def make_adapter(library: Library, backend: Backend, *, skills: dict[str, Any] | None = None,
                 **kw: Any) -> ChatAdapter:
    """A chat adapter over ``library``; ``skills``: the skills method's options (``k``,
    ``min_score`` ...)."""
    plugin = SkillsPlugin.for_host(library, config=make_config(SkillsConfig, skills or {},
                                                                  method="skills"),
                                   host="chat", embedder=shared_embedder())
    return ChatAdapter([plugin], backend, version_of=library.current_id, **kw)


def echo(request: Request) -> str:
    """A reply derived from the request, so a mixed-up response is detectable."""
    return "echo: " + request.messages[-1].text


def wait_for_trace(store: TraceStore, trace_id: str, timeout: float = 10.0) -> Trace:
    """The trace once the server's background writer has stored it."""
    deadline = time.monotonic() + timeout
    while True:
        traces = store.latest()
        if trace_id in traces:
            return traces[trace_id]
        if time.monotonic() > deadline:
            raise AssertionError(f"trace {trace_id} was not stored within {timeout} s")
        time.sleep(0.02)


def serving_on(app: Any, port: int) -> contextlib.AbstractContextManager[str]:
    """Serve ``app`` on a given port (an upstream that comes up after being down)."""
    return running_server(app, port=port, graceful_shutdown_s=1)


class SlowWhenAsked(Backend):
    """Echoes, but sleeps ``delay_s`` first when the last message contains "slow"."""

    def __init__(self, delay_s: float = 5.0) -> None:
        self.spec = "slow-when-asked"
        self.capabilities = Capabilities(streaming=True, max_concurrency=8)
        self.delay_s = delay_s

    def complete(self, request: Request) -> Completion:
        raise AssertionError("served through acomplete")

    async def acomplete(self, request: Request) -> Completion:
        if "slow" in request.messages[-1].text:
            await asyncio.sleep(self.delay_s)
        text = echo(request)
        return Completion(text=text, prompt_tokens=5, completion_tokens=len(text.split()))

    async def astream(self, request: Request) -> AsyncIterator[StreamChunk]:
        completion = await self.acomplete(request)
        yield StreamChunk(text=completion.text)
        yield StreamChunk(completion=completion)


class Gate(Backend):
    """Holds every call until ``release`` is set; counts calls in flight (queue tests)."""

    def __init__(self) -> None:
        self.spec = "gate"
        self.capabilities = Capabilities(max_concurrency=1)
        self.release = threading.Event()
        self.in_flight = 0
        self.entered = threading.Event()

    def complete(self, request: Request) -> Completion:
        self.in_flight += 1
        self.entered.set()
        try:
            self.release.wait(timeout=30)
            return Completion(text=echo(request), prompt_tokens=1, completion_tokens=1)
        finally:
            self.in_flight -= 1
