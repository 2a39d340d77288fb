"""Core records shared by every layer: plain frozen dataclasses with a JSON round trip.

This module imports nothing of ours. Every record has ``to_dict()`` (JSON-safe) and
``from_dict()``; sequences are stored as tuples so records stay hashable and immutable.
Messages follow the OpenAI chat format so they pass through the server untouched.
"""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
# A step kind is open: the runtime writes the kinds below, and a method may record steps of its
# own kinds (it declares them, with their printers, in its ``MethodSpec.step_kinds``). A trace
# with a kind nobody knows still loads and prints (one short line).
StepKind = str
RUNTIME_STEP_KINDS: tuple[str, ...] = ("prepare", "think", "act", "observe", "finish")

# How a run ended. "running" is written when a run starts so a killed run is still listed.
# "length": the answer came from a reply cut at the length limit (finish_reason "length"): its
# text is kept and scored as written, but it is not a whole answer, and no worked example.
Outcome = Literal[
    "running", "answered", "length", "horizon", "budget", "timeout", "interrupted", "error"
]
CUT_REASON = "the reply was cut at the length limit (max tokens): the answer may be incomplete"


def _now() -> float:
    return time.time()


def _image_part_to_dict(part: Mapping[str, Any]) -> dict[str, Any]:
    """Turn an image part holding a PIL image into an OpenAI ``image_url`` data-URL part."""
    image = part.get("image")
    if image is None or isinstance(image, str):
        return dict(part)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
    return {"type": "image_url", "image_url": {"url": url}}


@dataclass(frozen=True)
class ToolCall:
    """A native tool call: ``arguments`` is the JSON text the model produced (maybe invalid)."""

    name: str
    arguments: str = "{}"
    id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolCall:
        fn = d.get("function", d)
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args)
        return cls(name=fn.get("name", ""), arguments=args, id=d.get("id", "") or "")

    def parsed_arguments(self) -> Any:
        """The arguments as JSON; raises ``json.JSONDecodeError`` when the model wrote bad JSON."""
        return json.loads(self.arguments) if self.arguments.strip() else {}


@dataclass(frozen=True)
class Message:
    """One chat message. ``content`` is text or a tuple of OpenAI content parts.

    An image part is ``{"type": "image_url", "image_url": {"url": ...}}``,
    ``{"type": "image", "image": <PIL image or path>}``, or, in a stored trace,
    ``{"type": "image_ref", "sha256": ..., "media_type": ...}``: the image kept once by its
    content hash (``TraceStore.resolve_images`` turns it back into a data URL).
    """

    role: Role
    content: str | tuple[Mapping[str, Any], ...] = ""
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    @property
    def text(self) -> str:
        """The text of the message, with image parts left out."""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.get("text", "") for p in self.content if p.get("type") == "text")

    @property
    def images(self) -> list[Any]:
        """Image parts' payloads (PIL images, paths or URLs), in order."""
        if isinstance(self.content, str):
            return []
        out: list[Any] = []
        for p in self.content:
            if p.get("type") == "image":
                out.append(p.get("image"))
            elif p.get("type") == "image_url":
                out.append(p["image_url"]["url"])
            elif p.get("type") == "image_ref":
                out.append(dict(p))
        return out

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role}
        if isinstance(self.content, str):
            d["content"] = self.content
        else:
            d["content"] = [_image_part_to_dict(p) for p in self.content]
        if self.name is not None:
            d["name"] = self.name
        if self.tool_calls:
            d["tool_calls"] = [tc.to_dict() for tc in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Message:
        content = d.get("content")
        if content is None:
            content = ""
        elif not isinstance(content, str):
            content = tuple(dict(p) for p in content)
        return cls(
            role=d["role"],
            content=content,
            name=d.get("name"),
            tool_calls=tuple(ToolCall.from_dict(t) for t in d.get("tool_calls") or ()),
            tool_call_id=d.get("tool_call_id"),
        )


def messages_from(items: Sequence[Message | Mapping[str, Any]]) -> tuple[Message, ...]:
    """Accept ``Message`` objects or OpenAI-style dicts."""
    return tuple(m if isinstance(m, Message) else Message.from_dict(m) for m in items)


# The Request fields a caller may leave unset (``Request.unset``).
UNSETTABLE = frozenset({"max_tokens", "temperature", "top_p", "n"})


@dataclass(frozen=True)
class Request:
    """A chat completion request to a backend. ``tools`` are OpenAI function schemas."""

    messages: tuple[Message, ...]
    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    tools: tuple[Mapping[str, Any], ...] = ()
    logprobs: bool = False
    timeout: float | None = None  # seconds; local backends stop generating when it passes
    # OpenAI body fields Whetstone does not interpret (tool_choice, response_format, ...; the
    # list is openai_wire.PASSTHROUGH): the openai: backend sends them as given, so a proxied
    # client gets what the upstream does with them; backends that run the model here ignore
    # them.
    passthrough: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # Sampling fields the caller left unset (of UNSETTABLE): their values above are defaults
    # for a model run here, and the openai: backend leaves them out of the upstream body, so
    # a proxied client gets the upstream's own defaults, as it would without Whetstone.
    unset: frozenset[str] = frozenset()
    # The start of the assistant's reply, written for the model, which continues it (vLLM's
    # continue_final_message, Anthropic's prefill); the Completion's text begins with it.
    # Only backends with the ``prefill`` capability take it.
    prefix: str = ""

    def __post_init__(self) -> None:
        # Accept lists and dicts from callers; keep the record immutable.
        object.__setattr__(self, "messages", messages_from(self.messages))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "unset", frozenset(self.unset))
        unknown = self.unset - UNSETTABLE
        if unknown:
            raise ValueError(f"Request.unset names {sorted(unknown)}; only "
                             f"{sorted(UNSETTABLE)} may be left unset")

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["messages"] = [m.to_dict() for m in self.messages]
        d["stop"] = list(self.stop)
        d["tools"] = [dict(t) for t in self.tools]
        d["passthrough"] = dict(self.passthrough)
        d["unset"] = sorted(self.unset)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Request:
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        kw["messages"] = messages_from(d["messages"])
        return cls(**kw)

    def with_(self, **changes: Any) -> Request:
        """A copy with ``changes``; a field given a value here is no longer unset."""
        if "unset" not in changes and self.unset & changes.keys():
            changes["unset"] = self.unset - changes.keys()
        return replace(self, **changes)


@dataclass(frozen=True)
class Completion:
    """A backend's reply, with usage and latency always filled in."""

    text: str
    finish_reason: str = "stop"  # stop | length | tool_calls | timeout
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[float, ...] | None = None
    model: str = ""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["tool_calls"] = [t.to_dict() for t in self.tool_calls]
        d["logprobs"] = list(self.logprobs) if self.logprobs is not None else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Completion:
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        kw["tool_calls"] = tuple(ToolCall.from_dict(t) for t in d.get("tool_calls") or ())
        if d.get("logprobs") is not None:
            kw["logprobs"] = tuple(d["logprobs"])
        return cls(**kw)


@dataclass(frozen=True)
class Step:
    """One thing the agent did. ``input``/``output`` are JSON-safe values.

    ``module`` is the graph node that produced it; ``route`` is the edge taken next (policy
    notes are keyed by both).
    """

    kind: StepKind
    module: str
    input: Any = None
    output: Any = None
    tokens: int = 0
    started: float = field(default_factory=_now)
    duration_s: float = 0.0
    error: str | None = None
    route: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["meta"] = dict(self.meta)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Step:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


@dataclass(frozen=True)
class Trace:
    """A whole run: the task, every step, the answer and how it ended.

    ``label`` is the expected answer when known; ``score`` is filled by a scorer or by feedback.
    """

    id: str
    task: str
    steps: tuple[Step, ...] = ()
    answer: str | None = None
    label: str | None = None
    outcome: Outcome = "running"
    score: float | None = None
    library_version: str | None = None
    model: str = ""
    started: float = field(default_factory=_now)
    ended: float | None = None
    total_tokens: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["steps"] = [s.to_dict() for s in self.steps]
        d["meta"] = dict(self.meta)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trace:
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        kw["steps"] = tuple(Step.from_dict(s) for s in d.get("steps") or ())
        return cls(**kw)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, default=str)

    @property
    def duration_s(self) -> float | None:
        return None if self.ended is None else self.ended - self.started

    @property
    def error(self) -> str | None:
        """What failed in a run whose outcome is ``error`` (``meta["error"]``, "Type:
        message"; older traces: the reason it stopped); None for every other outcome. Such a
        run has no answer to score: it is a failed run, not a wrong one."""
        if self.outcome != "error":
            return None
        return str(self.meta.get("error") or self.meta.get("reason") or "the run failed")

    def with_(self, **changes: Any) -> Trace:
        return replace(self, **changes)


class JsonRecord:
    """``to_dict``/``from_dict`` for a frozen dataclass whose fields are JSON values or tuples
    of them: the base of the core's records and of those a method keeps in its own package."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else (
                dict(v) if isinstance(v, Mapping) else v
            )
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Any:
        kw: dict[str, Any] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name in d:
                v = d[f.name]
                kw[f.name] = tuple(v) if isinstance(v, list) else v
        return cls(**kw)


@dataclass(frozen=True)
class Skill(JsonRecord):
    """An Agent Skills skill: ``SKILL.md`` front matter plus body, and its bundled files.

    ``files`` maps paths relative to the skill folder (``scripts/x.py``,
    ``references/y.md``) to their text.
    """

    name: str
    description: str
    body: str = ""
    license: str | None = None
    compatibility: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    allowed_tools: str | None = None
    files: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolSpec(JsonRecord):
    """A tool the agent can call: an OpenAI function schema plus where its code lives.

    ``source`` is ``builtin:<name>`` for built-in tools or a path to a script in a skill.
    """

    name: str
    description: str
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    source: str = ""
    skill: str | None = None
    timeout_s: float = 10.0
    # Parameters the runtime fills, not the model (LangChain's InjectedToolArg): name ->
    # source; "task" is the run's task text. They are not in ``parameters``.
    inject: Mapping[str, str] = field(default_factory=dict)
    # The tool's output is the task's answer (LangChain's return_direct): a run that calls it
    # successfully ends with that output.
    returns_answer: bool = False

    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


@dataclass(frozen=True)
class Passage(JsonRecord):
    """A piece of evidence: a chunk of a corpus document (or text given by hand).

    ``source`` says where it came from (a file, ``file#line``, ``halueval:<id>``); ``score`` is
    the retrieval similarity (cosine, higher is closer; None when not retrieved); ``id`` is the
    chunk's id in its corpus.
    """

    text: str
    source: str = ""
    score: float | None = None
    id: str = ""


@dataclass(frozen=True)
class LibraryVersion(JsonRecord):
    """One version of the library: what it holds (content hashes) and how it came to be."""

    id: str
    parent: str | None
    created: float
    method: str
    message: str = ""
    files: Mapping[str, str] = field(default_factory=dict)  # path -> sha256
    scores: Mapping[str, Any] = field(default_factory=dict)
    costs: Mapping[str, Any] = field(default_factory=dict)
