"""The OpenAI chat-completions wire format <-> Whetstone's core types, both directions.

Shared by the ``openai:`` backend (which sends requests and reads replies) and the server (which
reads requests and sends replies), so the two agree by construction and a Whetstone server can
sit behind a Whetstone backend. Plain dicts only: no ``openai`` import, no I/O.
"""

from __future__ import annotations

import base64
import logging
import math
import mimetypes
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..types import Completion, Message, Request, ToolCall

# finish_reason values an OpenAI client understands; ours map onto them.
OPENAI_FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter",
                                   "function_call"})
_ROLES = frozenset({"system", "user", "assistant", "tool"})
# Content parts a request may carry over HTTP. The ``image`` part (a local path or PIL image) is
# for the Python API only: from the wire it would let a client make the server read its files.
WIRE_PART_TYPES = ("text", "image_url")
# The most tokens one reply may report per kind: far past any context window, far below what
# would make a token counter meaningless. A count past it (or not a count) is dropped.
MAX_USAGE_TOKENS = 100_000_000

log = logging.getLogger("whetstone.backends.openai")


def new_completion_id() -> str:
    """An id in OpenAI's style: ``chatcmpl-<hex>``."""
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def new_tool_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# --- client side: Request -> request body, response body -> Completion -------------------------

def _image_path_to_url(part: Mapping[str, Any]) -> dict[str, Any]:
    """An ``{"type": "image", "image": <path>}`` part as a data-URL ``image_url`` part."""
    path = Path(str(part.get("image")))
    if not path.is_file():
        raise ConfigError(f"image part points to {str(path)!r}, which is not a file",
                          hint="pass an existing image path, a PIL image or an image_url part")
    mime = mimetypes.guess_type(path.name)[0] or "image/png"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}


def message_to_openai(message: Message) -> dict[str, Any]:
    """``Message.to_dict()``, with image paths inlined so a remote server can see them."""
    d = message.to_dict()
    if isinstance(d["content"], list) and any(p.get("type") == "image_ref" for p in d["content"]):
        raise ConfigError("a message holds a stored image reference (image_ref), which a "
                          "server cannot read", hint="resolve it first: "
                          "TraceStore.resolve_images(trace) gives the image back as a data URL")
    if isinstance(d["content"], list):
        d["content"] = [
            _image_path_to_url(p) if p.get("type") == "image" and isinstance(p.get("image"), str)
            else p
            for p in d["content"]
        ]
    if message.role == "assistant" and message.tool_calls and not message.content:
        d["content"] = None  # what OpenAI servers expect for a pure tool-call turn
    return d


def request_to_openai(request: Request, model: str) -> dict[str, Any]:
    """Keyword arguments for ``chat.completions.create`` (everything but streaming flags)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [message_to_openai(m) for m in request.messages],
    }
    # What the caller left unset is not sent: the upstream's own defaults apply, as they
    # would without Whetstone in between (a 512-token cap it never asked for cut answers).
    if "max_tokens" not in request.unset:
        # Sent under the name the client used: OpenAI's reasoning models refuse max_tokens.
        name = ("max_completion_tokens" if "max_completion_tokens" in request.passthrough
                else "max_tokens")
        body[name] = request.max_tokens
    for key in ("temperature", "top_p"):
        if key not in request.unset:
            body[key] = getattr(request, key)
    if "n" not in request.unset:
        # One Completion per Request is the backend contract; more choices are asked for only
        # by a caller that reads the upstream's reply itself (the server's n > 1 relay).
        body["n"] = request.n
    if request.stop:
        body["stop"] = list(request.stop)
    if request.seed is not None:
        body["seed"] = request.seed
    if request.tools:
        body["tools"] = [dict(t) for t in request.tools]
    if request.logprobs:
        body["logprobs"] = True
    for key, value in request.passthrough.items():
        if key in PASSTHROUGH and key not in body:
            body[key] = value
    return body


def _tool_calls_from(items: Any) -> tuple[ToolCall, ...]:
    calls = []
    for item in items or ():
        fn = item.get("function") or {}
        if "custom" in item:  # custom (free-text) tools carry their input as plain text
            fn = {"name": item["custom"].get("name", ""), "arguments": item["custom"].get("input")}
        calls.append(ToolCall.from_dict({"id": item.get("id") or "", "function": fn}))
    return tuple(calls)


def _logprobs_from(choice: Mapping[str, Any]) -> tuple[float, ...] | None:
    lp = choice.get("logprobs") or {}
    content = lp.get("content")
    if content is None:
        return None
    return tuple(float(t["logprob"]) for t in content)


def _token_count(value: Any) -> int | None:
    """``value`` as a token count: an integer (or a float holding one) from 0 to
    ``MAX_USAGE_TOKENS``; None for anything else (a bool, a string, 1e30, -5, 2.5, NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value) if 0 <= value <= MAX_USAGE_TOKENS else None


def usage_from_openai(usage: Any) -> tuple[int, int] | None:
    """``(prompt_tokens, completion_tokens)`` from an upstream's ``usage`` object, or None when
    it sent none or an impossible one (a warning is logged; the backend then estimates).

    The one place upstream usage is read, for replies and streams alike: whatever an upstream
    claims, a count that reaches the server's token counters is a sane integer.
    """
    if not usage:
        return None
    if not isinstance(usage, Mapping):
        log.warning("ignoring the upstream's usage: an object was expected, got %s",
                    type(usage).__name__)
        return None
    counts = []
    for key in ("prompt_tokens", "completion_tokens"):
        raw = usage.get(key)
        count = 0 if raw is None else _token_count(raw)
        if count is None:
            log.warning("ignoring the upstream's usage: %s is %.60r, not a token count from 0 "
                        "to %d", key, raw, MAX_USAGE_TOKENS)
            return None
        counts.append(count)
    return counts[0], counts[1]


def completion_from_openai(data: Mapping[str, Any], latency_s: float) -> Completion:
    """A ``chat.completion`` body as a ``Completion``. Usage is left 0 when the server sent none
    (the backend estimates it, since only it can count tokens)."""
    choices = data.get("choices") or []
    if not choices:
        raise ValueError(f"response has no choices: {str(dict(data))[:300]}")
    choice = choices[0]
    msg = choice.get("message") or {}
    prompt_tokens, completion_tokens = usage_from_openai(data.get("usage")) or (0, 0)
    calls = _tool_calls_from(msg.get("tool_calls"))
    return Completion(
        text=msg.get("content") or "",
        finish_reason=choice.get("finish_reason") or ("tool_calls" if calls else "stop"),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        latency_s=latency_s,
        tool_calls=calls,
        logprobs=_logprobs_from(choice),
        model=str(data.get("model") or ""),
    )


class StreamAccumulator:
    """Folds ``chat.completion.chunk`` bodies into one ``Completion``.

    Tool calls arrive as fragments keyed by ``index``: the first carries id and name, later ones
    append to ``arguments`` (a later fragment repeating the whole name is not appended).
    """

    def __init__(self) -> None:
        self.text_parts: list[str] = []
        self.finish_reason: str | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.model = ""
        self.logprobs: list[float] = []
        self.saw_logprobs = False
        self.got_usage = False
        self._calls: dict[int, dict[str, str]] = {}

    def feed(self, chunk: Mapping[str, Any]) -> str:
        """Take one chunk; return the new text it carries ('' when none)."""
        self.model = str(chunk.get("model") or self.model)
        usage = usage_from_openai(chunk.get("usage"))
        if usage is not None:
            self.got_usage = True
            self.prompt_tokens, self.completion_tokens = usage
        text = ""
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
            if text:
                self.text_parts.append(text)
            for frag in delta.get("tool_calls") or ():
                slot = self._calls.setdefault(int(frag.get("index", 0)),
                                              {"id": "", "name": "", "arguments": ""})
                fn = frag.get("function") or {}
                slot["id"] = frag.get("id") or slot["id"]
                name = fn.get("name") or ""
                # OpenAI sends the name in the first fragment only; llama-cpp-python's server
                # repeats it in every one (observed: "get_weatherget_weather..."), so a fragment
                # that is the whole name again adds nothing.
                if name != slot["name"]:
                    slot["name"] += name
                slot["arguments"] += fn.get("arguments") or ""
            lp = _logprobs_from(choice)
            if lp is not None:
                self.saw_logprobs = True
                self.logprobs.extend(lp)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return text

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def completion(self, latency_s: float) -> Completion:
        calls = tuple(
            ToolCall(name=c["name"], arguments=c["arguments"] or "{}", id=c["id"])
            for _, c in sorted(self._calls.items())
        )
        return Completion(
            text=self.text,
            finish_reason=self.finish_reason or ("tool_calls" if calls else "stop"),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            latency_s=latency_s,
            tool_calls=calls,
            logprobs=tuple(self.logprobs) if self.saw_logprobs else None,
            model=self.model,
        )


# --- server side: request body -> Request, Completion -> response body --------------------------

@dataclass(frozen=True)
class ChatCall:
    """A parsed ``/v1/chat/completions`` body: the backend ``Request`` plus the HTTP-level bits."""

    request: Request
    model: str | None
    stream: bool = False
    include_usage: bool = False


def _bad(detail: str, hint: str = "see https://platform.openai.com/docs/api-reference/chat"
         ) -> ConfigError:
    return ConfigError(detail, hint=hint)


def _number(body: Mapping[str, Any], key: str, kind: type, lo: float | None = None,
            hi: float | None = None) -> Any:
    value = body.get(key)
    if value is None:
        return None
    # bool is an int in Python; a JSON true is not a number here. An int is checked as an
    # int: float() of a huge one overflows.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            kind is int and isinstance(value, float) and not value.is_integer()):
        raise _bad(f"'{key}' must be {'an integer' if kind is int else 'a number'}, "
                   f"got {value!r}")
    # json.loads takes NaN and Infinity, and NaN passes every range check below.
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(f"'{key}' must be a finite number, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise _bad(f"'{key}' must be between {lo} and {hi}, got {value!r}")
    return kind(value)


def _message_from_openai(i: int, raw: Any) -> Message:
    if not isinstance(raw, Mapping):
        raise _bad(f"'messages[{i}]' must be an object, got {type(raw).__name__}")
    role = raw.get("role")
    if role == "developer":  # newer clients send system prompts under this name
        role = "system"
    if role not in _ROLES:
        raise _bad(f"'messages[{i}].role' must be one of system, user, assistant, tool "
                   f"(or developer), got {role!r}")
    content = raw.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise _bad(f"'messages[{i}].content' must be a string or a list of parts")
    if isinstance(content, list):
        for j, part in enumerate(content):
            _check_part(f"messages[{i}].content[{j}]", part)
    tool_calls = raw.get("tool_calls")
    if tool_calls is not None:
        if not isinstance(tool_calls, list):
            raise _bad(f"'messages[{i}].tool_calls' must be a list of objects")
        for j, call in enumerate(tool_calls):
            _check_tool_call(f"messages[{i}].tool_calls[{j}]", call)
    for key in ("name", "tool_call_id"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise _bad(f"'messages[{i}].{key}' must be a string, got {raw[key]!r}")
    if role == "tool" and not raw.get("tool_call_id"):
        raise _bad(f"'messages[{i}]' has role 'tool' but no 'tool_call_id'")
    return Message.from_dict({**raw, "role": role})


def _check_part(where: str, part: Any) -> None:
    """A content part from the wire: a ``text`` part with a string, or an ``image_url`` part
    with a string ``url``. Other types are refused (see ``WIRE_PART_TYPES``)."""
    if not isinstance(part, Mapping):
        raise _bad(f"'{where}' must be an object with a 'type', got {type(part).__name__}")
    kind = part.get("type")
    if kind not in WIRE_PART_TYPES:
        raise _bad(f"'{where}.type' must be one of {', '.join(WIRE_PART_TYPES)}, got {kind!r}",
                   hint='send images as {"type": "image_url", "image_url": {"url": '
                        '"data:image/png;base64,..."}}')
    if kind == "text" and not isinstance(part.get("text"), str):
        raise _bad(f"'{where}.text' must be a string, got {part.get('text')!r}")
    if kind == "image_url":
        image = part.get("image_url")
        if not isinstance(image, Mapping) or not isinstance(image.get("url"), str):
            raise _bad(f"'{where}.image_url' must be an object with a string 'url'",
                       hint='send {"type": "image_url", "image_url": {"url": "https://..."}}')


def _check_tool_call(where: str, call: Any) -> None:
    """An assistant tool call from the wire: ``{id, type, function: {name, arguments}}``."""
    if not isinstance(call, Mapping):
        raise _bad(f"'{where}' must be an object, got {type(call).__name__}")
    fn = call.get("function")
    if not isinstance(fn, Mapping):
        raise _bad(f"'{where}.function' must be an object {{name, arguments}}, got {fn!r}")
    if not isinstance(fn.get("name"), str):
        raise _bad(f"'{where}.function.name' must be a string, got {fn.get('name')!r}")
    if call.get("id") is not None and not isinstance(call["id"], str):
        raise _bad(f"'{where}.id' must be a string, got {call['id']!r}")


# Fields a chat-completions body may carry that Whetstone does not interpret: kept on the
# Request (``Request.passthrough``) and sent upstream as given by the openai: backend.
PASSTHROUGH = ("tool_choice", "parallel_tool_calls", "response_format", "frequency_penalty",
               "presence_penalty", "logit_bias", "top_logprobs", "user", "reasoning_effort")


def _passthrough_from_openai(body: Mapping[str, Any], tools: tuple[Mapping[str, Any], ...]
                             ) -> dict[str, Any]:
    out = {k: body[k] for k in PASSTHROUGH if body.get(k) is not None}
    choice = out.get("tool_choice")
    if choice is None:
        return out
    if not tools:  # no tools offered (or tool_choice "none" dropped them): nothing to choose
        del out["tool_choice"]
        return out
    if isinstance(choice, str):
        if choice not in ("auto", "required", "none"):
            raise _bad(f"'tool_choice' must be auto, required, none or "
                       f'{{"type": "function", "function": {{"name": ...}}}}, got {choice!r}')
        return out
    fn = choice.get("function") if isinstance(choice, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise _bad("'tool_choice' must be auto, required, none or "
                   f'{{"type": "function", "function": {{"name": ...}}}}, got {choice!r}')
    offered = [(t.get("function") or {}).get("name") for t in tools]
    if name not in offered:
        raise _bad(f"'tool_choice' names {name!r}, which is not in 'tools'",
                   hint="offered: " + ", ".join(map(str, offered)))
    return out


def _tools_from_openai(body: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    tools = body.get("tools")
    if tools is None or body.get("tool_choice") == "none":
        return ()
    if not isinstance(tools, list):
        raise _bad("'tools' must be a list of {type: function, function: {...}} objects")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"'tools[{i}]' must be {{type: function, function: {{name, ...}}}}")
    return tuple(tools)


def request_from_openai(body: Any, *, default_max_tokens: int = 512,
                        timeout: float | None = None, max_n: int = 1) -> ChatCall:
    """Validate a chat-completions body and turn it into a ``ChatCall``.

    Raises ``ConfigError`` naming the offending field. ``tool_choice``, ``response_format``
    and the other ``PASSTHROUGH`` fields are kept for the upstream (``Request.passthrough``);
    other fields are accepted and ignored, as OpenAI-compatible servers do. ``max_tokens``,
    ``temperature``, ``top_p`` and ``n`` the body leaves out are in ``Request.unset``: a model
    run here uses ``default_max_tokens``, 0.0 and 1.0, an upstream its own defaults.
    ``n`` may be up to ``max_n``: more than 1 only where the upstream decodes the choices.
    """
    if not isinstance(body, Mapping):
        raise _bad("the request body must be a JSON object")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise _bad("'messages' is required and must be a non-empty list",
                   hint='send {"model": ..., "messages": [{"role": "user", "content": "..."}]}')
    messages = tuple(_message_from_openai(i, m) for i, m in enumerate(raw_messages))
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("'model' must be a string")
    n = _number(body, "n", int, 1)
    if n is not None and n > max_n:
        raise _bad(f"'n' = {n} is not supported here: this model answers one choice per "
                   "request", hint="send n separate requests (with different seeds), or put "
                   "an upstream that decodes n behind Whetstone (openai:<model>@<url>)")
    max_tokens = _number(body, "max_completion_tokens", int, 1)
    token_field = "max_completion_tokens" if max_tokens is not None else "max_tokens"
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", int, 1)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise _bad("'stop' must be a string or a list of strings")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, Mapping):
        raise _bad("'stream_options' must be an object")
    temperature = _number(body, "temperature", float, 0.0, 2.0)
    top_p = _number(body, "top_p", float, 0.0, 1.0)
    tools = _tools_from_openai(body)
    passthrough = _passthrough_from_openai(body, tools)
    if token_field == "max_completion_tokens":
        passthrough[token_field] = max_tokens  # the name the upstream gets it under
    given = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "n": n}
    request = Request(
        messages=messages,
        max_tokens=max_tokens or default_max_tokens,
        temperature=0.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        n=n or 1,
        stop=tuple(stop or ()),
        seed=_number(body, "seed", int),
        tools=tools,
        logprobs=bool(body.get("logprobs")),
        timeout=timeout,
        passthrough=passthrough,
        # Left unset, a field holds the local default above and is not sent upstream.
        unset=frozenset(k for k, v in given.items() if v is None),
    )
    return ChatCall(request=request, model=model, stream=bool(body.get("stream")),
                    include_usage=bool(stream_options.get("include_usage")))


def finish_reason_to_openai(completion: Completion) -> str:
    """Ours -> OpenAI's. A generation cut by a deadline reads as ``length`` (cut short)."""
    if completion.tool_calls:
        return "tool_calls"
    if completion.finish_reason in OPENAI_FINISH_REASONS:
        return completion.finish_reason
    return "length" if completion.finish_reason == "timeout" else "stop"


def tool_calls_to_openai(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    """Tool calls with an id each (clients reply to a call by its id)."""
    return [{**c.to_dict(), "id": c.id or new_tool_call_id()} for c in calls]


def logprobs_to_openai(logprobs: tuple[float, ...] | None) -> dict[str, Any] | None:
    # Completions carry logprob values only, so the token strings are left empty.
    if logprobs is None:
        return None
    return {"content": [{"token": "", "logprob": lp, "bytes": None, "top_logprobs": []}
                        for lp in logprobs]}


def usage_to_openai(completion: Completion) -> dict[str, int]:
    return {"prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "total_tokens": completion.total_tokens}


def completion_to_openai(completion: Completion, *, model: str, id: str | None = None,
                         created: int | None = None) -> dict[str, Any]:
    """A ``Completion`` as a ``chat.completion`` body."""
    message: dict[str, Any] = {"role": "assistant",
                               "content": completion.text or (None if completion.tool_calls
                                                              else "")}
    if completion.tool_calls:
        message["tool_calls"] = tool_calls_to_openai(completion.tool_calls)
    return {
        "id": id or new_completion_id(),
        "object": "chat.completion",
        "created": int(created if created is not None else time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": finish_reason_to_openai(completion),
                     "logprobs": logprobs_to_openai(completion.logprobs)}],
        "usage": usage_to_openai(completion),
    }


def chunk_to_openai(*, id: str, created: int, model: str, delta: Mapping[str, Any] | None = None,
                    finish_reason: str | None = None, usage: Mapping[str, int] | None = None
                    ) -> dict[str, Any]:
    """One ``chat.completion.chunk``; a usage-only chunk has no choices (as OpenAI sends it)."""
    body: dict[str, Any] = {"id": id, "object": "chat.completion.chunk", "created": created,
                            "model": model, "choices": []}
    if delta is not None or finish_reason is not None:
        body["choices"] = [{"index": 0, "delta": dict(delta or {}),
                            "finish_reason": finish_reason, "logprobs": None}]
    if usage is not None:
        body["usage"] = dict(usage)
    return body


def error_to_openai(message: str, type: str, *, code: str | None = None,
                    param: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body: ``{"error": {message, type, param, code}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
