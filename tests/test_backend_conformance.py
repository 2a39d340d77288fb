"""One conformance suite that every backend passes, as LangGraph runs one checkpointer suite
against every saver. Parametrised over:

- ``scripted`` and ``openai>scripted`` (the openai backend, through a real Whetstone server on
  127.0.0.1, in front of the scripted double): the contract checks, in the fast unit run;
- ``transformers`` (``embedded@transformers``), ``onnx`` (``embedded``, the default engine),
  ``openai>onnx`` (the real model behind a real local server) and ``llamacpp`` (skipped, with
  the reason, when llama-cpp-python is not installed): the contract checks plus the model
  behaviour checks (stop strings, lengths, exact token counts, seeds, timeouts, logprobs,
  batching, the context check), marked slow.

A check that does not apply to a backend says so through ``Subject`` flags, never by a
silent pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from servers import Servers

from whetstone.engine.backends import Backend, BackendOptions, get_backend
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import BackendError, ConfigError
from whetstone.engine.server import create_app
from whetstone.engine.types import Completion, Message, Request

pytestmark = [pytest.mark.integration]  # every test here uses it

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression, e.g. 2 * (3 + 4).",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}
TOOL_ASK = Request(messages=[Message("user", "What is 17 * 23? Use the calculator.")],
                   max_tokens=48, tools=[CALC])
HELLO = Request(messages=[Message("user", "Say hello in five words.")], max_tokens=16)
CAPITALS = [("France", "paris"), ("Japan", "tokyo"), ("Italy", "rome"), ("Germany", "berlin")]
HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None


@dataclass
class Subject:
    """A backend under test and what applies to it."""

    name: str
    backend: Backend
    real: bool = False  # a real model: the behaviour checks run
    local: bool = False  # in process: timeouts cut generation, count_tokens is exact
    batched: bool = False  # concurrent requests share decode steps (stats["peak_batch"])


def _scripted_model(request: Request) -> Any:
    """A scripted stand-in that behaves like a model where the contract needs it."""
    question = request.messages[-1].text
    if request.tools:
        numbers = re.findall(r"\d+", question)
        return {"tool_calls": [{"name": "calculator",
                                "arguments": {"expression": " * ".join(numbers)}}]}
    return f"Answer to: {question}"


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    with Servers() as s:
        yield s


@pytest.fixture(scope="module")
def transformers_backend() -> Iterator[Backend]:
    from conftest import SHARED_CACHE

    backend = get_backend("embedded@transformers", BackendOptions(cache_dir=SHARED_CACHE))
    yield backend
    backend.close()


def _make(name: str, request: pytest.FixtureRequest, servers: Servers) -> Subject:
    if name == "scripted":
        return Subject(name, ScriptedBackend(responder=_scripted_model, tool_calls=True))
    if name == "openai>scripted":
        upstream = ScriptedBackend(responder=_scripted_model, tool_calls=True)
        url = servers.start(create_app(upstream, model_name="tiny"))
        return Subject(name, get_backend(f"openai:tiny@{url}/v1"))
    if name == "transformers":
        return Subject(name, request.getfixturevalue("transformers_backend"), real=True,
                       local=True)
    if name == "onnx":
        return Subject(name, request.getfixturevalue("embedded_backend"), real=True,
                       local=True, batched=True)
    if name == "openai>onnx":
        url = servers.start(create_app(request.getfixturevalue("embedded_backend"),
                                       model_name="embedded"))
        return Subject(name, get_backend(f"openai:embedded@{url}",
                                         BackendOptions(timeout_s=600)), real=True)
    if name == "llamacpp":
        return Subject(name, get_backend("llamacpp:embedded"), real=True, local=True)
    raise AssertionError(name)


SLOW = pytest.mark.slow
SUBJECTS = [
    pytest.param("scripted"),
    pytest.param("openai>scripted"),
    pytest.param("transformers", marks=SLOW),
    pytest.param("onnx", marks=SLOW),
    pytest.param("openai>onnx", marks=SLOW),
    pytest.param("llamacpp", marks=[SLOW, pytest.mark.skipif(
        not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed (an optional extra that "
                                  "compiles for ~14 min; pip install 'whetstone-engine[llamacpp]')"
    )]),
]


@pytest.fixture(scope="module", params=SUBJECTS)
def subject(request: pytest.FixtureRequest, servers: Servers) -> Subject:
    return _make(request.param, request, servers)


def real(subject: Subject) -> Subject:
    if not subject.real:
        pytest.skip(f"{subject.name} replays scripted replies: no model behaviour to check")
    return subject


def qwen_prompt_tokens(request: Request) -> int:
    """Prompt tokens of ``request`` as the embedded model's own tokenizer counts them."""
    from conftest import SHARED_CACHE
    from transformers import AutoTokenizer

    from whetstone.engine.backends.chat_template import template_messages
    from whetstone.engine.backends.model_cache import dequantized_packaged

    tok = AutoTokenizer.from_pretrained(str(dequantized_packaged("qwen-0.5b", SHARED_CACHE)))
    text = tok.apply_chat_template(template_messages(request.messages, True),
                                   tools=[dict(t) for t in request.tools] or None,
                                   add_generation_prompt=True, tokenize=False)
    return len(tok(text, add_special_tokens=False)["input_ids"])


# -- the contract (every backend) --------------------------------------------------------


def test_a_completion_has_text_usage_and_latency(subject: Subject) -> None:
    c = subject.backend.complete(HELLO)
    assert c.text and c.finish_reason in ("stop", "length")
    assert c.prompt_tokens > 0 and 0 < c.completion_tokens <= HELLO.max_tokens
    assert c.latency_s > 0 and c.model


def test_streamed_chunks_add_up_to_the_completion(subject: Subject) -> None:
    chunks = list(subject.backend.stream(HELLO))
    final = chunks[-1].completion
    assert final is not None and all(ch.completion is None for ch in chunks[:-1])
    assert "".join(ch.text for ch in chunks[:-1]) == final.text
    assert len(chunks) > 2  # incremental, not one piece at the end


def test_a_prefilled_reply_start_is_streamed_too(subject: Subject) -> None:
    """With ``Request.prefix`` (the runtime's required tool call) the completion's text starts
    with the prefix; the streamed chunks must add up to that same text."""
    if not subject.backend.capabilities.prefill:
        pytest.skip(f"{subject.name} cannot prefill a reply")
    ask = dataclasses.replace(HELLO, prefix="Hello! My name")
    chunks = list(subject.backend.stream(ask))
    final = chunks[-1].completion
    assert final is not None and final.text.startswith("Hello! My name")
    assert "".join(ch.text for ch in chunks[:-1]) == final.text


def test_native_tool_calls_come_back_parsed(subject: Subject) -> None:
    assert subject.backend.capabilities.tool_calls
    c = subject.backend.complete(TOOL_ASK)
    assert c.finish_reason == "tool_calls", c
    (call,) = c.tool_calls
    assert call.name == "calculator" and call.id
    expression = call.parsed_arguments()["expression"]
    assert "17" in expression and "23" in expression


def test_a_streamed_tool_call_is_held_back_and_parsed(subject: Subject) -> None:
    chunks = list(subject.backend.stream(TOOL_ASK))
    final = chunks[-1].completion
    assert final is not None and final.finish_reason == "tool_calls"
    assert [t.name for t in final.tool_calls] == ["calculator"]
    streamed = "".join(ch.text for ch in chunks[:-1])
    assert streamed == final.text and "{" not in streamed


def test_async_calls_and_batches_keep_their_order(subject: Subject) -> None:
    asks = [Request(messages=[Message("user", f"What is the capital of {country}? One word.")],
                    max_tokens=8) for country, _ in CAPITALS]

    async def main() -> tuple[Completion, list[Completion]]:
        return await subject.backend.acomplete(asks[0]), await subject.backend.batch(asks)

    one, many = asyncio.run(main())
    assert one.text == many[0].text
    for (country, city), c in zip(CAPITALS, many, strict=False):
        assert (city in c.text.lower()) if subject.real else (country in c.text)


# -- model behaviour (real models) ---------------------------------------------------------


def test_stop_strings_cut_the_text_and_end_generation(subject: Subject) -> None:
    real(subject)
    r = Request(messages=[Message("user", "Count from 1 to 10, separated by commas.")],
                max_tokens=32, stop=("5",))
    c = subject.backend.complete(r)
    assert c.finish_reason == "stop" and "5" not in c.text and "4" in c.text
    assert c.completion_tokens < 20  # generation stopped at the stop string


def test_max_tokens_ends_with_length_and_exact_counts(subject: Subject) -> None:
    real(subject)
    r = Request(messages=[Message("user", "Write a long poem about the sea.")], max_tokens=4)
    c = subject.backend.complete(r)
    assert c.finish_reason == "length" and c.completion_tokens == 4
    assert c.prompt_tokens == qwen_prompt_tokens(r)  # the model's own tokenizer, exactly
    assert subject.backend.complete(TOOL_ASK).prompt_tokens == qwen_prompt_tokens(TOOL_ASK)
    if subject.local:
        assert subject.backend.count_tokens("Hello world") == 2


def test_seeds_repeat_samples_and_greedy_is_deterministic(subject: Subject) -> None:
    real(subject)
    sampled = Request(messages=[Message("user", "Name three colors.")], max_tokens=16,
                      temperature=0.8, seed=3)
    assert subject.backend.complete(sampled).text == subject.backend.complete(sampled).text
    greedy = sampled.with_(temperature=0.0, seed=None)
    assert subject.backend.complete(greedy).text == subject.backend.complete(greedy).text


def test_concurrent_requests_are_answered_together(subject: Subject) -> None:
    real(subject)
    asks = [Request(messages=[Message("user", f"What is the capital of {country}? One word.")],
                    max_tokens=8, seed=0) for country, _ in CAPITALS]
    before = dict(getattr(subject.backend, "stats", {}))
    with ThreadPoolExecutor(len(asks)) as pool:
        got = list(pool.map(subject.backend.complete, asks))
    for (_, city), c in zip(CAPITALS, got, strict=False):
        assert city in c.text.lower(), c
    if subject.batched:
        assert subject.backend.capabilities.max_concurrency > 1
        assert subject.backend.stats["steps"] > before.get("steps", 0)
        assert subject.backend.stats["peak_batch"] >= 2  # decoded in the same steps


def test_logprobs_and_timeouts_where_offered(subject: Subject) -> None:
    real(subject)
    poem = [Message("user", "Write a long poem about the sea.")]
    if subject.backend.capabilities.logprobs:
        c = subject.backend.complete(Request(messages=poem, max_tokens=4, logprobs=True))
        assert c.logprobs is not None and len(c.logprobs) == 4
        assert all(x <= 0 for x in c.logprobs)
    if subject.local:
        c = subject.backend.complete(Request(messages=poem, max_tokens=64, timeout=0.3))
        assert c.finish_reason == "timeout" and c.completion_tokens < 64


def test_bad_requests_are_refused_with_a_reason(subject: Subject) -> None:
    if not subject.local:
        pytest.skip(f"{subject.name} passes requests on; its server does the refusing")
    with pytest.raises(ConfigError, match="one completion per request"):
        subject.backend.complete(HELLO.with_(n=2))
    with pytest.raises(ConfigError, match="max_tokens"):
        subject.backend.complete(HELLO.with_(max_tokens=0))
    image = Message("user", ({"type": "image_url", "image_url": {"url": "data:,"}},))
    with pytest.raises(ConfigError, match="image"):
        subject.backend.complete(Request(messages=[image]))
    huge = Request(messages=[Message("user", "word " * 40_000)], max_tokens=4)
    with pytest.raises(BackendError, match="tokens"):
        subject.backend.complete(huge)

