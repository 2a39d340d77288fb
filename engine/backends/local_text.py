"""What the in-process text engines share: the prompt and the ``Completion``.

Both the transformers engine (``hf.py``) and the ONNX engine (``onnx_backend.py``) render the
prompt with the model's own chat template through its transformers tokenizer, and turn the
generated token ids into a ``Completion`` the same way: the end-of-sequence token dropped, the
text cut at the first stop string, native tool calls parsed out, the finish reason chosen. One
implementation keeps the two engines interchangeable behind the ``Backend`` contract.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ..errors import BackendError
from ..types import Completion, Request
from .base import check_local_request
from .chat_template import template_messages
from .toolcall_format import offered_tool_names, parse_tool_calls


def new_call_id(index: int) -> str:
    """A fresh id for a parsed tool call (the model does not write one)."""
    return f"call_{uuid.uuid4().hex[:12]}"


def prompt_text(tokenizer: Any, request: Request, native_tools: bool) -> str:
    """The request rendered by the model's chat template, ready for generation."""
    check_local_request(request)
    msgs = template_messages(request.messages, native_tools)
    return tokenizer.apply_chat_template(
        msgs, tools=[dict(t) for t in request.tools] or None,
        add_generation_prompt=True, tokenize=False,
    ) + request.prefix


def prompt_ids(tokenizer: Any, request: Request, native_tools: bool,
               context_length: int) -> list[int]:
    """Token ids of the rendered prompt; ``BackendError`` when they fill the context."""
    ids = tokenizer(prompt_text(tokenizer, request, native_tools),
                    add_special_tokens=False)["input_ids"]
    check_prompt_fits(len(ids), context_length)
    return list(ids)


def check_prompt_fits(n_prompt: int, context_length: int) -> None:
    """The context-length check every local engine applies before generating."""
    if context_length and n_prompt >= context_length:
        raise BackendError(
            f"the prompt has {n_prompt} tokens; the model's context holds {context_length}",
            hint="shorten the conversation or the retrieved context",
        )


def completion_from_tokens(request: Request, *, decode: Callable[[Sequence[int]], str],
                           new: Sequence[int], n_prompt: int, eos_ids: Collection[int],
                           max_new: int, elapsed: float, model: str,
                           logprobs: tuple[float, ...] | None = None,
                           ended: str | None = None) -> Completion:
    """The ``Completion`` for generated ids ``new``.

    ``decode`` turns ids into text without special tokens. ``ended`` is the engine's own reason
    for stopping when it knows one ("timeout", "length"); otherwise it is inferred. Every
    generated token counts in ``completion_tokens``, the end-of-sequence token included.
    """
    hit_eos = bool(new) and new[-1] in eos_ids
    raw = request.prefix + decode(list(new[:-1]) if hit_eos else list(new))
    cuts = [raw.find(s) for s in request.stop if s and s in raw]
    if cuts:
        raw, finish = raw[:min(cuts)], "stop"
    elif hit_eos:
        finish = "stop"
    elif ended is not None:
        finish = ended
    elif len(new) >= max_new:
        finish = "length"
    elif request.timeout is not None and elapsed >= request.timeout:
        finish = "timeout"
    else:
        finish = "stop"
    if request.tools:
        text, calls = parse_tool_calls(raw, new_call_id, offered_tool_names(request.tools))
    else:
        text, calls = raw.strip(), ()
    if calls and finish == "stop":
        finish = "tool_calls"
    return Completion(
        text=text, finish_reason=finish, prompt_tokens=n_prompt, completion_tokens=len(new),
        latency_s=elapsed, tool_calls=calls, logprobs=logprobs, model=model,
    )
