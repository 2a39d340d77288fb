"""The middleware server in front of the real embedded model (Qwen2.5-Coder-0.5B-Instruct):
an adapted completion, streaming, a switch, a native tool call and feedback, through ``openai``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from middleware_support import SKILLS, make_adapter, wait_for_trace
from servers import Servers

from whetstone.engine.server import create_app
from whetstone.engine.server.guard import TRACE_HEADER, VERSION_HEADER
from whetstone.library_store.store import Library
from whetstone.library_store.traces import TraceStore

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}
CAPITALS = """---
name: capital-cities
description: Answer questions about the capital city of a country with just the city's name.
---

# Capital cities

Answer with the name of the capital city only, no sentence around it.
"""


@pytest.mark.integration
@pytest.mark.slow
def test_the_embedded_model_behind_the_middleware(embedded_backend: Any, tmp_path: Path
                                                  ) -> None:
    lib = Library.open(tmp_path / "lib", create=True)
    lib.commit({**SKILLS, "skills/capital-cities/SKILL.md": CAPITALS}, method="test",
               message="skills")
    adapter = make_adapter(lib, embedded_backend)
    store = TraceStore(tmp_path / "traces")
    app = create_app(embedded_backend, model_name="embedded", adapter=adapter, traces=store)
    ask = [{"role": "user", "content": "What is the capital of France? One word."}]
    try:
        with Servers() as servers:
            url = servers.start(app) + "/v1"
            c = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=600)
            raw = c.chat.completions.with_raw_response.create(
                model="embedded", messages=ask, max_tokens=8, temperature=0)
            answer = raw.parse().choices[0].message.content
            assert "paris" in answer.lower()
            assert raw.headers[VERSION_HEADER] == "v2"
            trace = wait_for_trace(store, raw.headers[TRACE_HEADER])
            system = trace.steps[0].input["messages"][0]["content"]
            assert "# Skills" in system and "capital-cities" in trace.meta["skills"]["shown"]
            assert trace.answer == answer and trace.steps[0].tokens > 0

            chunks = list(c.chat.completions.create(model="embedded", messages=ask,
                                                    max_tokens=8, temperature=0, stream=True))
            streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            assert streamed == answer  # greedy and the same guidance: the same answer

            off = c.chat.completions.with_raw_response.create(
                model="embedded", messages=ask, max_tokens=8, temperature=0,
                extra_body={"whetstone": {"library": False}})
            assert VERSION_HEADER not in off.headers
            assert "paris" in off.parse().choices[0].message.content.lower()

            tool = c.chat.completions.create(model="embedded", tools=[CALCULATOR], messages=[
                {"role": "user", "content": "What is 17 * 23? Use the calculator."}],
                max_tokens=64, temperature=0)
            (call,) = tool.choices[0].message.tool_calls
            assert call.function.name == "calculator" and tool.choices[0].finish_reason == (
                "tool_calls")
            assert "17" in json.loads(call.function.arguments)["expression"]

            fb = httpx.post(url + "/feedback", timeout=30, json={
                "trace_id": trace.id, "score": 1, "comment": "correct"})
            assert fb.status_code == 200
        assert store.get(trace.id).score == 1.0
    finally:
        adapter.close()
