"""Serving: the library in front of any model, for clients that speak the OpenAI chat API.

    app.py        create_app / serve: the FastAPI app and uvicorn
    routes.py     the routes, at module level, reading ``app.state.server``
    passthrough.py  /v1/embeddings and /v1/completions, passed to an openai: upstream as sent
    service.py    upstream calls: slots, the queue, deadlines, SSE, errors -> HTTP statuses
    guard.py      auth and limits: web checks, API keys, request metrics, the body size limit
    hosts.py      what a web page may ask: Host, Origin, Content-Type (shared with MCP)
    body_limits.py  what a request body may ask for: field ranges, the items one chat holds
    probes.py     readiness (``/readyz``): whether the upstream answers, cached
    connections.py  connection limits under uvicorn: header deadline, fair caps
    pipeline.py   around each call: adapt with the library before, record after
    recording.py  the trace writer (batched, off the response path) and feedback labels
    metrics.py    ``/metrics`` in the Prometheus text format

The chat-mode core it serves (the adapter, an exchange as a trace, ``Engine.wrap``'s client)
is ``engine/chat/``, which ``Engine``, MCP and LangChain use without the HTTP app.

``create_app`` and ``serve`` are importable from here; FastAPI is imported only when one of
them is asked for, so ``Engine.chat`` and ``Engine.wrap`` do not load it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "serve"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import app  # heavy: FastAPI, only for these two

        return getattr(app, name)
    raise AttributeError(f"module 'whetstone.engine.server' has no attribute {name!r}")
