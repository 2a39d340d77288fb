"""Messages into the shape chat templates expect, and a Jinja renderer for GGUF templates.

Hugging Face chat templates (Qwen's among them) read tool-call arguments as a mapping and tool
results as role ``tool`` messages. ``template_messages`` converts Whetstone ``Message`` records
accordingly. ``render_chat_template`` renders a template string the way transformers does, for
backends that hold the template but not a transformers tokenizer (llama.cpp).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ..errors import ConfigError, ModelLoadError
from ..types import Message
from .toolcall_format import format_tool_calls


def _arguments_value(arguments: str) -> Any:
    """Tool-call arguments as a mapping when they are a JSON object; else the raw text."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments


def template_messages(messages: Sequence[Message], native_tools: bool, *,
                      parts: bool = False) -> list[dict[str, Any]]:
    """Message records -> template dicts.

    ``native_tools``: the template renders ``tool_calls`` itself. When it does not, the calls
    are written into the assistant text in the ``<tool_call>`` format so history is not lost.
    ``parts``: a processor's template (vision-language models), which reads every content as
    a list of typed parts; each image part becomes an ``{"type": "image"}`` placeholder, in
    order (the images themselves go to the processor). Without it (text models) a message
    holding an image raises ``ConfigError``, as does an empty conversation.
    """
    if not messages:
        raise ConfigError("the request has no messages",
                          hint="send at least one user message")
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.images and not parts:
            raise ConfigError(
                "this model reads text only, but a message holds an image",
                hint="drop the image part or use a vision-language model spec",
            )
        d: dict[str, Any] = {"role": m.role, "content": m.text}
        if m.role == "assistant" and m.tool_calls:
            if native_tools:
                d["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": _arguments_value(c.arguments)}}
                    for c in m.tool_calls
                ]
            else:
                d["content"] = "\n".join(x for x in (m.text, format_tool_calls(m.tool_calls)) if x)
        if parts:
            written = d["content"][len(m.text):].strip()  # tool calls written into the text
            d["content"] = _content_parts(m) + (
                [{"type": "text", "text": written}] if written else [])
        if m.role == "tool":
            if m.name:
                d["name"] = m.name
            if m.tool_call_id:
                d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def _content_parts(message: Message) -> list[dict[str, Any]]:
    """A message's content as typed parts, an image placeholder where each image is."""
    if isinstance(message.content, str):
        return [{"type": "text", "text": message.content}] if message.content else []
    out: list[dict[str, Any]] = []
    for p in message.content:
        if p.get("type") in ("image", "image_url", "image_ref"):
            out.append({"type": "image"})
        elif p.get("type") == "text" and p.get("text"):
            out.append({"type": "text", "text": p["text"]})
    return out


def template_supports_tools(template: str | None) -> bool:
    """Whether a chat template renders a ``tools`` list (so native tool calls are offered)."""
    return template is not None and "tools" in template


def render_chat_template(template: str, messages: Sequence[Mapping[str, Any]],
                         tools: Sequence[Mapping[str, Any]] | None = None,
                         *, bos_token: str = "", eos_token: str = "",
                         add_generation_prompt: bool = True) -> str:
    """Render a Hugging Face-style Jinja chat template (same environment as transformers)."""
    # heavy: jinja2, only for chat templates
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ConfigError(f"the chat template rejected the conversation: {message}",
                          hint="check the message roles and their order")

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        # transformers overrides tojson so that non-ASCII text stays readable
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template)
    except jinja2.TemplateError as exc:
        raise ModelLoadError(f"the model's chat template does not parse: {exc}",
                             hint="use a GGUF with a valid tokenizer.chat_template") from exc
    return compiled.render(
        messages=list(messages), tools=list(tools) if tools else None,
        bos_token=bos_token, eos_token=eos_token, add_generation_prompt=add_generation_prompt,
    )
