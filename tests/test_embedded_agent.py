"""The agent on the real embedded model (Qwen2.5-Coder-0.5B-Instruct, real weights): the
acceptance runs of issue 2, the agent through `whetstone serve` with the openai: backend, and a
skill evolved on one model's traces running unchanged on other backends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from servers import Servers

from whetstone.engine.api import Engine
from whetstone.engine.backends import BackendOptions, get_backend
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.methods.trace2skill.evolver import Trace2Skill, Trace2SkillConfig
from whetstone.engine.runtime import RunConfig
from whetstone.engine.server import create_app
from whetstone.engine.types import Trace

pytestmark = pytest.mark.slow

TASK = "Use the calculator: what is 17 * 23?"


def calculator_calls(trace: Trace) -> list[Any]:
    return [s for s in trace.steps if s.kind == "act" and s.input.get("tool") == "calculator"]


@pytest.mark.trace2skill
def test_embedded_agent_calls_the_calculator_and_answers_391(embedded_backend: Any,
                                                             tmp_path: Path) -> None:
    engine = Engine(embedded_backend, library=tmp_path / "lib", create=True, checkpointing=False)
    trace = engine.run(TASK)
    calls = calculator_calls(trace)
    assert calls, [s.to_dict() for s in trace.steps]
    assert calls[0].output["observation"] == "391"
    assert trace.outcome == "answered" and "391" in (trace.answer or "")
    stored = engine.traces.get(trace.id)
    assert calculator_calls(stored)[0].input["arguments"] == calls[0].input["arguments"]


@pytest.mark.trace2skill
@pytest.mark.integration
def test_full_agent_run_through_whetstone_serve_with_the_openai_backend(
        embedded_backend: Any, tmp_path: Path) -> None:
    with Servers() as servers:
        url = servers.start(create_app(embedded_backend, model_name="embedded"))
        remote = get_backend(f"openai:embedded@{url}", BackendOptions(timeout_s=600))
        engine = Engine(remote, library=tmp_path / "lib", create=True, checkpointing=False)
        trace = engine.run(TASK)
    calls = calculator_calls(trace)
    assert calls and calls[0].output["observation"] == "391"  # tool calls passed through
    assert "391" in (trace.answer or "")
    assert trace.model.startswith("openai:embedded@")


def _evolved_library(path: Path) -> Path:
    """A skill distilled (scripted analyst) from traces of a scripted 'model A'."""
    model_a = ScriptedBackend(["Final Answer: 400"])
    engine = Engine(model_a, library=path, create=True, checkpointing=False)
    trace = engine.run(TASK, label="391")
    analyst = ScriptedBackend([json.dumps({
        "reasoning": "multiplied in the head", "changelog": "use the calculator",
        "edits": [{"file": "SKILL.md", "op": "append_to_section", "target_section": "Pitfalls",
                   "content": "- Never multiply two-digit numbers in your head: call the "
                              "calculator."}]})])
    patch = Trace2Skill(Trace2SkillConfig("multiplication", create=True,
                                          description="Multiply numbers exactly.")).fit(
        [trace.with_(score=0.0)], {}, analyst)
    engine.library.commit(patch.changes, method="trace2skill", message=patch.message)
    return path


@pytest.mark.trace2skill
@pytest.mark.parametrize("spec", ["embedded", "embedded:smollm2"])
def test_an_evolved_skill_runs_unchanged_on_other_backends(spec: str, embedded_backend: Any,
                                                           tmp_path: Path) -> None:
    lib = _evolved_library(tmp_path / "lib")
    backend = embedded_backend if spec == "embedded" else get_backend(spec)
    engine = Engine(backend, library=lib, checkpointing=False,
                    config=RunConfig(max_steps=2, max_tokens_per_call=48))
    trace = engine.run("What is 12 * 34?")
    request_system = trace.steps[1].input["messages"][0]["content"]
    assert "multiplication" in request_system and "call the calculator" in request_system
    assert trace.meta["skills"]["shown"] == ["multiplication"]
    assert trace.library_version == "v2" and trace.outcome in {"answered", "horizon"}
