"""Whetstone through ``openai:`` in front of real model servers: vLLM and llama.cpp (issue 18).

No such server runs in CI (vLLM's CPU wheel wants a virtualenv of its own and minutes to warm
up; llama-cpp-python[server] compiles for ~15 min on 2 cores), so every test is skipped, with
the reason, unless the server's spec is in the environment:

    WHETSTONE_TEST_VLLM=openai:qwen@http://127.0.0.1:8001/v1
    WHETSTONE_TEST_LLAMACPP=openai:qwen@http://127.0.0.1:8081/v1
    WHETSTONE_TEST_OPENAI=openai:MODEL@URL        (any other OpenAI-compatible server)

or, for llama.cpp, a server answers on 127.0.0.1:$LLAMACPP_PORT (default 8081, where
``scripts/real_upstreams.sh llamacpp`` and docs/middleware.md start it): ``make test-real``.

``scripts/real_upstreams.sh`` builds both servers in virtualenvs of their own, starts them on
the packaged Qwen2.5-0.5B and runs these tests against them (``pytest -m slow``).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.middleware_support import wait_for_trace
from tests.servers import running_server
from whetstone.engine.api import Engine
from whetstone.engine.backends import get_backend
from whetstone.engine.evaluation.benchmarks import load_tasks
from whetstone.engine.evaluation.runner import evaluate
from whetstone.engine.server.naming import upstream_model_name
from whetstone.library_store.store import Library

VARS = {"vllm": "WHETSTONE_TEST_VLLM", "llamacpp": "WHETSTONE_TEST_LLAMACPP",
        "openai": "WHETSTONE_TEST_OPENAI"}
SKILL = ("---\nname: unit-conversion\ndescription: Convert between units of time, length and "
         "weight, showing the factor used.\n---\n\n# Unit conversion\n\nState the factor, "
         "multiply, give the unit.\n")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}

pytestmark = pytest.mark.slow


@functools.cache  # probed once a session
def running_llamacpp() -> str:
    """``openai:<id>@<url>`` of a server answering on 127.0.0.1:$LLAMACPP_PORT, else ""."""
    url = f"http://127.0.0.1:{os.environ.get('LLAMACPP_PORT', '8081')}/v1"
    try:  # a busy llama.cpp server answers /models only between generations
        ids = [m["id"] for m in httpx.get(url + "/models", timeout=60).json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return ""
    return f"openai:{ids[0]}@{url}" if ids else ""


def upstream(name: str) -> str:
    """The spec of the ``name`` server to test against ("" when there is none)."""
    value = os.environ.get(VARS[name], "")
    if not value and name == "llamacpp":
        value = running_llamacpp()
    return value


@pytest.fixture(params=list(VARS))
def spec(request: pytest.FixtureRequest) -> str:
    value = upstream(request.param)
    if not value:
        where = " or start one on 127.0.0.1:$LLAMACPP_PORT (8081)" \
            if request.param == "llamacpp" else ""
        pytest.skip(f"no {request.param} server: set {VARS[request.param]}=openai:MODEL@URL"
                    f"{where} (scripts/real_upstreams.sh starts one)")
    return value


@pytest.fixture
def front(spec: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """``whetstone serve`` (in process) in front of the real server, a one-skill library."""
    lib = Library.open(tmp_path / "lib", create=True)
    lib.commit({"skills/unit-conversion/SKILL.md": SKILL}, method="test", message="skill")
    engine = Engine(get_backend(spec), library=lib.root, checkpointing=False)
    try:
        with running_server(engine.app()) as url:
            yield {"url": url, "spec": spec, "engine": engine,
                   "client": openai.OpenAI(base_url=url + "/v1", api_key="none",
                                           max_retries=0, timeout=300)}
    finally:
        engine.close()


@pytest.mark.integration
def test_the_served_name_is_the_upstreams_and_a_reply_is_adapted(front: dict[str, Any]
                                                                 ) -> None:
    name = upstream_model_name(front["spec"])
    models = httpx.get(front["url"] + "/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == [name]
    raw = front["client"].chat.completions.with_raw_response.create(
        model=name, max_tokens=64, temperature=0,
        messages=[{"role": "user", "content": "How many minutes are 2.5 hours?"}])
    reply = raw.parse()
    assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
    assert raw.headers["x-whetstone-library-version"] == "v2"
    trace = wait_for_trace(front["engine"].traces, raw.headers["x-whetstone-trace-id"])
    assert trace.meta["skills"]["shown"] == ["unit-conversion"]


@pytest.mark.integration
def test_a_stream_arrives_in_chunks_and_ends_with_done(front: dict[str, Any]) -> None:
    body = {"model": upstream_model_name(front["spec"]), "max_tokens": 48, "stream": True,
            "temperature": 0, "messages": [{"role": "user", "content": "Count from 1 to 8."}]}
    with httpx.stream("POST", front["url"] + "/v1/chat/completions", json=body,
                      timeout=300) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) > 3  # chunks, not one block
    text = "".join((json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get(
        "content") or "" for line in lines[:-1])
    assert text.strip()


@pytest.mark.integration
@pytest.mark.parametrize("stream", [False, True])
def test_a_named_tool_call_passes_through(front: dict[str, Any], stream: bool) -> None:
    """A forced (named) tool choice: the server must return a call, whatever the model's
    taste; Whetstone passes the definition up and the call down, unchanged."""
    args: dict[str, Any] = {
        "model": upstream_model_name(front["spec"]), "max_tokens": 64, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER], "tool_choice": {"type": "function",
                                            "function": {"name": "get_weather"}}}
    if not stream:
        message = front["client"].chat.completions.create(**args).choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    else:
        parts: dict[int, list[str]] = {}
        for chunk in front["client"].chat.completions.create(stream=True, **args):
            for c in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                entry = parts.setdefault(c.index, ["", ""])
                entry[0] += (c.function.name or "") if c.function else ""
                entry[1] += (c.function.arguments or "") if c.function else ""
        calls = [(n, a) for n, a in parts.values()]
    assert calls and calls[0][0] == "get_weather", calls
    assert "city" in json.loads(calls[0][1])


def test_an_eval_through_the_server_scores_every_task(spec: str, tmp_path: Path) -> None:
    engine = Engine(get_backend(spec), library=tmp_path / "lib", create=True, checkpointing=False,
                    solver="direct")
    try:
        report = evaluate(load_tasks("gsm8k@dev:0:3"), engine.solver(), store=engine.traces)
    finally:
        engine.close()
    assert len(report.results) == 3
    assert all(r.outcome != "error" for r in report.results), [r.outcome for r in
                                                                report.results]


def test_the_agent_answers_through_the_calculator(spec: str, tmp_path: Path) -> None:
    """Issue 27: through llama.cpp's server (no function-calling chat format) the model wrote
    its call as an object in a python fence; it ran as a program and the echoed object was
    the answer. ``whetstone run "Use the calculator: what is 17 * 23?"``, as the CLI runs it."""
    engine = Engine(get_backend(spec), library=tmp_path / "lib", create=True, checkpointing=False)
    try:
        trace = engine.run("Use the calculator: what is 17 * 23?")
    finally:
        engine.close()
    ran = [s for s in trace.steps if s.kind == "act" and s.input.get("tool") == "calculator"]
    assert ran and ran[0].output["observation"].strip() == "391", trace.to_dict()
    assert "391" in (trace.answer or "") and "calculator" not in (trace.answer or "")
