"""The ``search`` tool: passages from an evidence corpus for a query.

The tool knows nothing of where passages come from: it is given a retriever, any object with
``search(query, k) -> [Passage]`` (a ``whetstone.library_store.corpus.Corpus``, or a test double), by the
face that builds the run (``Engine(tools=["search"], corpus=...)``). An empty corpus or a bad
query is a ``ToolError`` the model reads, never a crash.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from ..engine.errors import ToolError, WhetstoneError
from ..engine.types import Passage, ToolSpec
from .base import Tool

SEARCH_SPEC = ToolSpec(
    name="search",
    description="Search the evidence corpus: returns the passages most related to the query, "
                "best first, each with where it comes from. Ask about one thing at a time.",
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to look for, in plain words."},
            "k": {"type": "integer", "description": "How many passages (default 3, at most 10)."},
        },
        "required": ["query"],
    },
    source="builtin:search",
)
MAX_K = 10


class Retriever(Protocol):
    """What the tool searches: ``search(query, k)`` returns up to ``k`` passages, best first."""

    def search(self, query: str, k: int = 5) -> Sequence[Passage]: ...


def format_passages(passages: Sequence[Passage], max_chars: int = 1500) -> str:
    """Numbered passages with their sources, cut to ``max_chars`` each."""
    if not passages:
        return "No passage found."
    lines = []
    for i, p in enumerate(passages, start=1):
        text = p.text if len(p.text) <= max_chars else p.text[:max_chars] + " …"
        where = f" (source: {p.source})" if p.source else ""
        lines.append(f"[{i}]{where}\n{text}")
    return "\n\n".join(lines)


def make_search_tool(retriever: Retriever, *, k: int = 3, max_chars: int = 1500) -> Tool:
    """The ``search`` tool over ``retriever``; ``k`` passages unless the call asks for more."""

    def run(args: Mapping[str, Any]) -> str:
        query = args.get("query")
        if query is None:  # small models name the argument differently
            query = next((v for v in args.values() if isinstance(v, str)), None)
        if not isinstance(query, str) or not query.strip():
            raise ToolError("missing 'query'", hint='call search with {"query": "..."}')
        n = args.get("k", k)
        n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else k
        try:
            found = retriever.search(query.strip(), min(n, MAX_K))
        except WhetstoneError as exc:
            raise ToolError(exc.message, hint=exc.hint) from exc
        return format_passages(found, max_chars)

    return Tool(replace(SEARCH_SPEC), run)
