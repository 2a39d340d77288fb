"""What a request body may ask for, checked before any work is done for it.

``check_ranges``: what the wire format leaves open (flags are booleans, integer and number
fields within their ranges), on chat and the passed-through routes alike. ``check_size``: how
much one chat request may hold (``MAX_REQUEST_ITEMS`` messages, content parts, tool calls,
tools, stop strings and logit-bias entries together), so the work the server does for it
(parsing, retrieval, the trace it records) is bounded whatever fits under the body cap: 480k
one-letter messages in 16 MB took 23 s of the event loop to parse and record.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ...library_store.paths import shown
from ..errors import ConfigError

MAX_TOKENS_LIMIT = 1_000_000  # more than any model's context; larger asks are typos or probes
_SEED_LIMIT = 2 ** 63
# Messages, content parts, tool calls, tools, stop strings and logit-bias entries in one chat
# request: a long agent history holds a few hundred; the most was 2048 messages of OpenAI's.
MAX_REQUEST_ITEMS = 8192


def _count(value: Any) -> int:
    return len(value) if isinstance(value, (list, dict)) else 0


def request_items(body: Mapping[str, Any], limit: int | None = None) -> int:
    """How many items a chat body holds (``MAX_REQUEST_ITEMS`` counts them): its messages,
    their content parts and tool calls, its tools, stop strings and logit-bias entries.
    With ``limit``, counting stops once past it, so the count costs at most ``limit`` steps
    (a parsed JSON body holds lists and dicts only)."""
    messages = body.get("messages")
    total = sum(_count(body.get(k)) for k in ("tools", "stop", "logit_bias"))
    if not isinstance(messages, list):
        return total
    total += len(messages)
    for m in messages:
        if limit is not None and total > limit:
            break
        if isinstance(m, dict):
            total += _count(m.get("content")) + _count(m.get("tool_calls"))
    return total


def check_size(body: Any, limit: int = MAX_REQUEST_ITEMS) -> None:
    """Refuse a chat body holding more than ``limit`` items (``request_items``) with a 400,
    before it is parsed: the counting is cheap, what the items would cost is not."""
    if not isinstance(body, Mapping):
        return  # request_from_openai says what is wrong
    items = request_items(body, limit)
    if items > limit:
        raise ConfigError(f"the request holds more than {limit:,} messages, content parts, "
                          "tool calls, tools, stop strings and logit-bias entries (the most "
                          "this server takes)",
                          hint="send fewer: drop or summarise old turns, or join text parts")


def _flag(body: Mapping[str, Any], key: str) -> None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"'{key}' must be true or false, got {shown(repr(value), 40)}")


# Every integer field a client may send (chat, completions, embeddings), with its range. A
# JSON float is refused even when it is whole (5.0, 1e300): it is not an integer on the wire,
# and int(1e300) is a 301-digit token count.
INTEGER_FIELDS: dict[str, tuple[int, int]] = {
    "max_tokens": (1, MAX_TOKENS_LIMIT),
    "max_completion_tokens": (1, MAX_TOKENS_LIMIT),
    "n": (1, 128),  # OpenAI's own bound; above 1 only where the upstream decodes (service.py)
    "best_of": (1, 128),  # /v1/completions
    "top_logprobs": (0, 20),
    "seed": (-_SEED_LIMIT, _SEED_LIMIT - 1),
    "dimensions": (1, 65_536),  # /v1/embeddings
}
# Number fields (an integer or a float), with their ranges: the passed-through routes send
# them upstream unread, so they are checked here for every route.
NUMBER_FIELDS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "frequency_penalty": (-2.0, 2.0),
    "presence_penalty": (-2.0, 2.0),
}


def _shown_number(value: Any) -> str:
    if isinstance(value, int) and abs(value) >= 10 ** 30:
        return f"a {len(str(abs(value)))}-digit number"
    return shown(repr(value), 40)


def _check_integer(key: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi:
        return
    raise ConfigError(f"'{key}' must be an integer between {lo} and {hi}, got "
                      f"{_shown_number(value)}",
                      hint='send a JSON integer: 5, not 5.0, "5" or true')


def _check_number(key: str, value: Any, lo: float, hi: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"'{key}' must be a number, got {_shown_number(value)}")
    # json.loads takes NaN and Infinity, and NaN passes every comparison below.
    if not math.isfinite(value):
        raise ConfigError(f"'{key}' must be a finite number, got {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"'{key}' must be between {lo!r} and {hi!r}, got "
                          f"{_shown_number(value)}")


def check_ranges(body: Any, route: str = "/chat/completions") -> None:
    """What the wire format leaves open: flags are booleans, every integer field
    (``INTEGER_FIELDS``) is a JSON integer within its range, every number field
    (``NUMBER_FIELDS``) a finite number within its range. A ``max_tokens`` of 10**100 or
    1e300 is refused here, never forwarded. A field that is absent or null is left out.
    ``logprobs`` depends on the ``route``: a flag for chat, but on the legacy
    ``/completions`` the number of log probabilities per token (lm-eval sends 1), or false."""
    if not isinstance(body, Mapping):
        return  # request_from_openai says what is wrong
    _flag(body, "stream")
    logprobs = body.get("logprobs")
    if route == "/completions" and logprobs is not None and logprobs is not False:
        # 0..20: OpenAI's own limit is 5, vLLM's default max_logprobs 20; the upstream
        # answers past its own.
        _check_integer("logprobs", logprobs, 0, 20)
    else:
        _flag(body, "logprobs")
    options = body.get("stream_options")
    if isinstance(options, Mapping):
        _flag(options, "include_usage")
    for key, (lo, hi) in INTEGER_FIELDS.items():
        if body.get(key) is not None:
            _check_integer(key, body[key], lo, hi)
    for key, (flo, fhi) in NUMBER_FIELDS.items():
        if body.get(key) is not None:
            _check_number(key, body[key], flo, fhi)
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, Mapping):
            raise ConfigError("'logit_bias' must be an object of token id -> bias")
        for token, value in bias.items():
            _check_number(f"logit_bias[{shown(str(token), 20)}]", value, -100.0, 100.0)
