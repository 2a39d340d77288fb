"""Frozen models behind one contract. See ``base.Backend`` and ``registry.get_backend``."""

from .base import Backend, Capabilities, StreamChunk, auto_concurrency
from .registry import (
    BackendEntry,
    BackendOptions,
    BackendRegistry,
    get_backend,
)

__all__ = [
    "Backend", "BackendEntry", "BackendOptions", "BackendRegistry", "Capabilities",
    "StreamChunk", "auto_concurrency", "get_backend",
]
