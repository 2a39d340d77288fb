"""Map one spec string to a backend: ``embedded``, ``hf:<path>``, ``openai:<model>@<url>`` ...

A registry, not an if-chain: each backend family registers a prefix with a factory given as an
import path, so nothing heavy is imported until that backend is asked for. Third-party
backends register through the ``whetstone.backends`` entry-point group.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.backends.base import Backend
from engine.errors import ConfigError, UnknownBackend
from engine.paths import cache_dir as default_cache_dir


@dataclass(frozen=True)
class BackendOptions:
    """Settings every factory receives; each backend uses the ones that apply to it."""

    cache_dir: Path = field(default_factory=default_cache_dir)
    api_key: str | None = None
    timeout_s: float = 120.0
    max_retries: int = 3
    device: str | None = None  # "cpu", "cuda", ...; None picks the best available
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BackendEntry:
    """One registered spec family, with what ``whetstone models`` shows for it."""

    prefix: str
    factory: str  # "module:function" taking (argument, BackendOptions)
    summary: str
    example: str
    install: str = "installed with whetstone-engine"
    requires: tuple[str, ...] = ()  # import names that must be present
    white_box: bool = False
    variants: tuple[str, ...] = ()  # full specs worth listing (e.g. embedded:smollm2)

    def installed(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.requires)


_BUILTINS: tuple[BackendEntry, ...] = (
    BackendEntry(
        "embedded", "engine.backends.embedded:make_embedded",
        "Packaged GGUF models loaded through transformers (white-box, no server).",
        "embedded", white_box=True, requires=("transformers", "gguf"),
        variants=("embedded", "embedded:smollm2", "embedded:qwen-1.5b"),
    ),
    BackendEntry(
        "hf", "engine.backends.hf:make_hf",
        "A local transformers model folder or GGUF file (white-box).",
        "hf:/models/qwen2.5-0.5b#qwen.gguf", white_box=True, requires=("transformers",),
    ),
    BackendEntry(
        "openai", "engine.backends.openai_compat:make_openai",
        "Any OpenAI-compatible server: vLLM, llama.cpp, OpenAI, another Whetstone.",
        "openai:qwen@http://127.0.0.1:8000/v1", requires=("openai",),
    ),
    BackendEntry(
        "llamacpp", "engine.backends.llamacpp:make_llamacpp",
        "In-process llama-cpp-python: ~6x faster than transformers on CPU, not white-box.",
        "llamacpp:/models/qwen.gguf", requires=("llama_cpp",),
        install="pip install 'whetstone-engine[llamacpp]'  (compiles for ~14 min on 2 cores)",
    ),
    BackendEntry(
        "vllm", "engine.backends.vllm_backend:make_vllm",
        "In-process vllm.LLM for high-throughput batches on a GPU machine.",
        "vllm:Qwen/Qwen2.5-0.5B-Instruct", requires=("vllm",),
        install="pip install 'whetstone-engine[vllm]'  (needs a CUDA GPU)",
    ),
    BackendEntry(
        "scripted", "engine.backends.scripted:make_scripted",
        "Test double: replays given completions, fails loudly when it runs out.",
        "scripted:replies.json",
    ),
)


class BackendRegistry:
    """Spec prefix -> ``BackendEntry``. Build one with ``default_registry()``."""

    def __init__(self, entries: tuple[BackendEntry, ...] = ()) -> None:
        self._entries: dict[str, BackendEntry] = {}
        for e in entries:
            self.register(e)

    def register(self, entry: BackendEntry) -> None:
        self._entries[entry.prefix] = entry

    def entries(self) -> list[BackendEntry]:
        return list(self._entries.values())

    def known_specs(self) -> list[str]:
        return [e.example for e in self._entries.values()]

    def entry_for(self, spec: str) -> tuple[BackendEntry, str]:
        """Split ``spec`` into its registered entry and the argument after the prefix."""
        if not spec or not spec.strip():
            raise ConfigError("empty model spec", hint=self._known_hint())
        prefix, _, arg = spec.strip().partition(":")
        entry = self._entries.get(prefix)
        if entry is None:
            raise UnknownBackend(f"unknown model spec {spec!r}", hint=self._known_hint())
        return entry, arg

    def create(self, spec: str, options: BackendOptions | None = None) -> Backend:
        """Build the backend for ``spec`` (imports its module only now)."""
        entry, arg = self.entry_for(spec)
        module_name, _, fn_name = entry.factory.partition(":")
        factory: Callable[[str, BackendOptions], Backend] = getattr(
            importlib.import_module(module_name), fn_name
        )
        backend = factory(arg, options or BackendOptions())
        backend.spec = spec.strip()
        return backend

    def _known_hint(self) -> str:
        lines = [f"{e.prefix + ':':<10} e.g. {e.example}" for e in self._entries.values()]
        return "known specs:\n    " + "\n    ".join(lines) + "\n  (`whetstone models` lists them all)"


def default_registry() -> BackendRegistry:
    """The built-in backends plus any registered under the ``whetstone.backends`` entry point.

    A plugin's entry point names a ``BackendEntry`` object.
    """
    registry = BackendRegistry(_BUILTINS)
    for ep in importlib.metadata.entry_points(group="whetstone.backends"):
        registry.register(ep.load())
    return registry


def get_backend(spec: str, options: BackendOptions | None = None,
                registry: BackendRegistry | None = None) -> Backend:
    """``get_backend("openai:qwen@http://127.0.0.1:8000/v1")`` -> a ready backend."""
    return (registry or default_registry()).create(spec, options)
