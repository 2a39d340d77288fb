"""Map one spec string to a backend: ``embedded``, ``hf:<path>``, ``openai:<model>@<url>`` ...

A registry, not an if-chain: each backend family registers a prefix with a factory given as an
import path, so nothing heavy is imported until that backend is asked for. Third-party
backends register through the ``whetstone.backends`` entry-point group.

Local model families can run on more than one generation engine; a spec picks one with an
``@<engine>`` suffix (``embedded@transformers``, ``hf:/models/qwen@transformers``), and
``BackendEntry.engines`` lists them, the default first, for ``whetstone models``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, UnknownBackend
from ..paths import cache_dir as default_cache_dir
from .base import Backend
from .redact import redact_spec

# progress(message, fraction): a long first-use step (model conversion) reporting where it is;
# fraction is in [0, 1], or None while the step cannot tell. Backends never print: the CLI or
# the server decides how to show it.
ProgressFn = Callable[[str, "float | None"], None]


@dataclass(frozen=True)
class BackendOptions:
    """Settings every factory receives; each backend uses the ones that apply to it."""

    cache_dir: Path = field(default_factory=default_cache_dir)
    api_key: str | None = None
    timeout_s: float = 120.0
    max_retries: int = 3
    device: str | None = None  # "cpu", "cuda", ...; None picks the best available
    progress: ProgressFn | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineChoice:
    """A generation engine a spec family can run on; specs pick it with ``@<name>``."""

    name: str  # the suffix: "onnx", "transformers"
    summary: str  # what `whetstone models` shows
    white_box: bool = False  # hidden states and gradients reachable through it


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
    engines: tuple[EngineChoice, ...] = ()  # local engines, the default first; () = one, implied

    def installed(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.requires)

    def engine_for(self, spec: str) -> EngineChoice | None:
        """The engine a spec of this family runs on (``None`` when the family has no choice)."""
        if not self.engines:
            return None
        _, name = split_engine(split_spec(spec)[1], tuple(e.name for e in self.engines))
        return next((e for e in self.engines if e.name == name), self.engines[0])


def split_spec(spec: str) -> tuple[str, str]:
    """``"embedded:qwen-1.5b@transformers"`` -> ``("embedded", "qwen-1.5b@transformers")``;
    an engine suffix on a bare prefix (``"embedded@transformers"``) goes with the argument."""
    prefix, _, arg = spec.strip().partition(":")
    if "@" in prefix:
        prefix, at, rest = prefix.partition("@")
        arg = at + rest + (":" + arg if arg else "")
    return prefix, arg


def split_engine(arg: str, engines: tuple[str, ...]) -> tuple[str, str | None]:
    """``"qwen-1.5b@transformers"`` -> ``("qwen-1.5b", "transformers")``.

    Only a known engine name counts as a suffix (a path may contain ``@``); ``None``: the
    family's default engine.
    """
    head, at, tail = arg.rpartition("@")
    if at and tail.strip() in engines:
        return head, tail.strip()
    return arg, None


# The fast engine converts the model once (cached beside the dequantized copy) and decodes
# many sequences together; the transformers engine keeps hidden states and gradients reachable.
LOCAL_ENGINES = (
    EngineChoice("onnx", "onnxruntime int4, continuous batching (fast, not white-box)"),
    EngineChoice("transformers", "transformers fp32 (white-box: hidden states, gradients)",
                 white_box=True),
)


def engine_suffix(arg: str, family: str) -> tuple[str, str]:
    """``("qwen-1.5b@transformers", "embedded")`` -> ``("qwen-1.5b", "transformers")``; a
    word after ``@`` that names no engine is a ``ConfigError`` listing the engines (a path
    such as ``/models/me@corp/qwen`` is left alone)."""
    names = tuple(e.name for e in LOCAL_ENGINES)
    rest, engine = split_engine(arg, names)
    bad = arg.rpartition("@")[2] if "@" in arg else ""
    if engine is None and bad.isidentifier():
        shown = f"{family}:{arg}" if arg.partition("@")[0] else f"{family}{arg}"
        raise ConfigError(f"unknown engine {bad!r} in {shown}",
                          hint="engines: " + ", ".join(
                              f"@{e.name} ({e.summary})" for e in LOCAL_ENGINES))
    return rest, engine or names[0]


_BUILTINS: tuple[BackendEntry, ...] = (
    BackendEntry(
        "embedded", "whetstone.engine.backends.embedded:make_embedded",
        "Packaged GGUF models, in process, no server; @transformers for the white-box path.",
        "embedded", requires=("transformers", "gguf", "onnxruntime"),
        variants=("embedded", "embedded:smollm2", "embedded:qwen-1.5b"),
        engines=LOCAL_ENGINES,
    ),
    BackendEntry(
        "hf", "whetstone.engine.backends.hf:make_hf",
        "A local transformers model folder or GGUF file; @transformers for the white-box path."
        " A vision-language folder (images) runs on transformers: the ONNX engine is text-only.",
        "hf:/models/qwen2.5-0.5b#qwen.gguf", requires=("transformers", "onnxruntime"),
        engines=LOCAL_ENGINES,
    ),
    BackendEntry(
        "openai", "whetstone.engine.backends.openai_compat:make_openai",
        "Any OpenAI-compatible server: vLLM, llama.cpp, OpenAI, another Whetstone.",
        "openai:qwen@http://127.0.0.1:8000/v1", requires=("openai",),
    ),
    BackendEntry(
        "llamacpp", "whetstone.engine.backends.llamacpp:make_llamacpp",
        "In-process llama-cpp-python: ~6x faster than transformers on CPU, not white-box.",
        "llamacpp:/models/qwen.gguf", requires=("llama_cpp",),
        install="pip install 'whetstone-engine[llamacpp]'  (compiles for ~14 min on 2 cores)",
    ),
    BackendEntry(
        "vllm", "whetstone.engine.backends.vllm_backend:make_vllm",
        "In-process vllm.LLM for high-throughput batches on a GPU machine.",
        "vllm:Qwen/Qwen2.5-0.5B-Instruct", requires=("vllm",),
        install="pip install 'whetstone-engine[vllm]'  (needs a CUDA GPU)",
    ),
    BackendEntry(
        "scripted", "whetstone.engine.backends.scripted:make_scripted",
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

    def entry_for(self, spec: str) -> tuple[BackendEntry, str]:
        """Split ``spec`` into its registered entry and the argument after the prefix."""
        if not spec or not spec.strip():
            raise ConfigError("empty model spec", hint=self._known_hint())
        prefix, arg = split_spec(spec)
        entry = self._entries.get(prefix)
        if entry is None:
            raise UnknownBackend(f"unknown model spec {redact_spec(spec)!r}",
                                 hint=self._known_hint())
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
