"""A query-embedding cache: the same question asked again is not embedded again.

Embedding a query with MiniLM costs ~3 ms (int8 ONNX; ~20 ms with torch) on a 2-core CPU,
most of what adapting one chat request costs. Applications repeat prompts (templated requests,
retries, the turns of one tool-calling conversation whose last user message stays the same),
so a small LRU keyed by the text (whitespace normalised, which the tokenizer ignores anyway)
saves that time without changing any result: a hit returns the very vector the model produced
for that text. Batches (index syncs) pass straight through and are not cached.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .embeddings import Embedder


def normalise(text: str) -> str:
    """``text`` with runs of whitespace as one space, ends stripped: the key and the text
    embedded. MiniLM's tokenizer splits on whitespace, so this changes no token and no vector;
    it only lets "tidy  this up\n" and "tidy this up" share one entry."""
    return " ".join(text.split())


class CachedEmbedder:
    """An ``Embedder`` that remembers single-text calls in an LRU of ``maxsize`` texts.

    ``name`` is the wrapped embedder's, so an index built by either reads as the same model.
    """

    def __init__(self, inner: Embedder, maxsize: int = 1024) -> None:
        self.inner = inner
        self.name = inner.name
        self.maxsize = maxsize
        self.hits = 0
        self.misses = 0
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def size(self) -> int:
        """Texts cached now. (No ``__len__``: an empty cache must not read as false where
        callers write ``embedder or default``.)"""
        return len(self._cache)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Like the wrapped embedder's; one text is answered from the cache when seen before."""
        if len(texts) != 1 or self.maxsize <= 0:
            return self.inner.embed(texts)
        text = normalise(texts[0])
        with self._lock:
            vector = self._cache.get(text)
            if vector is not None:
                self._cache.move_to_end(text)
                self.hits += 1
                return vector[None, :].copy()  # callers may write to what they get
            self.misses += 1
        out = self.inner.embed([text])
        row = out[0].copy()
        row.setflags(write=False)
        with self._lock:
            self._cache[text] = row
            self._cache.move_to_end(text)
            while len(self._cache) > self.maxsize:
                self._cache.popitem(last=False)
        return out

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()
