"""One plugin assembly for the three hosts (the agent graph, the direct solver, chat mode): a
method whose hooks a host cannot run is refused there with a ``ConfigError`` naming them, and
runs where they do; a guidance-only method runs in all three."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import ConfigError
from whetstone.engine.evaluation.tasks import TaskRecord
from whetstone.engine.runtime.graph import build_graph
from whetstone.engine.runtime.plugins import (
    HOST_FEATURES,
    Guidance,
    MethodEnv,
    Node,
    Plugin,
    check_host,
    unhonoured_features,
)
from whetstone.engine.runtime.state import AgentContext, AgentState
from whetstone.engine.types import Request


class Hint(Plugin):
    """Guidance only: a line in the system message."""

    name = "hint"

    def guidance(self, task: str, ctx: AgentContext, budget_tokens: int) -> Guidance:
        return Guidance("Hint", "Answer in one word.")


class Nudge(Plugin):
    """A node before every decision (what Co-ReAct's rubric is), counting its visits."""

    name = "nudge"
    stages = ("decide",)

    def __init__(self) -> None:
        self.visits = 0

    def nodes(self) -> list[Node]:
        def node(state: AgentState, ctx: AgentContext) -> Mapping[str, Any]:
            self.visits += 1
            return {}
        return [Node("decide", node)]


def reply(request: Request) -> str:
    return "done"


@pytest.fixture
def library(tmp_path: Path) -> Path:
    return tmp_path / "lib"


def engine_with(library: Path, *methods: Any) -> Engine:
    return Engine(ScriptedBackend(responder=reply, tool_calls=True), library=library, skills=False, tools=(),
                  methods=methods, checkpointing=False, create=True)


@pytest.fixture
def nudge_engine(library: Path) -> Iterator[tuple[Engine, Nudge]]:
    nudge = Nudge()
    e = engine_with(library, nudge)
    yield e, nudge
    e.close()


def system_text(request: Request) -> str:
    return request.messages[0].text if request.messages[0].role == "system" else ""


def test_a_decide_node_method_is_refused_by_the_direct_solver(nudge_engine: Any) -> None:
    e, _ = nudge_engine
    with pytest.raises(ConfigError) as err:
        e.solver(kind="direct")
    assert "method 'nudge' cannot run in the direct solver" in err.value.message
    assert "a node before every model decision" in err.value.message
    assert "agent loop" in err.value.message
    assert ".run(task)" in (err.value.hint or "")
    assert e.backend.requests == []  # refused before any call  # type: ignore[attr-defined]


def test_a_decide_node_method_is_refused_by_chat(nudge_engine: Any) -> None:
    e, _ = nudge_engine
    with pytest.raises(ConfigError) as err:
        e.chat("hello")
    assert "method 'nudge' cannot run in chat mode" in err.value.message
    assert "a node before every model decision" in err.value.message
    with pytest.raises(ConfigError):
        e.chat_adapter()  # what the server and the client wrapper build on


def test_a_decide_node_method_runs_in_the_agent(nudge_engine: Any) -> None:
    e, nudge = nudge_engine
    trace = e.run("What is 2 + 2?")
    assert trace.answer == "done" and nudge.visits >= 1
    solve = e.solver(kind="agent")  # the agent solver takes it too
    assert solve(TaskRecord(id="a", question="What is 3 + 3?"), 0).answer == "done"
    assert nudge.visits >= 2


def test_a_guidance_only_method_runs_in_all_three_hosts(library: Path) -> None:
    e = engine_with(library, Hint())
    try:
        sent = e.backend.requests  # type: ignore[attr-defined]
        e.run("What is 2 + 2?")
        assert "Answer in one word." in system_text(sent[-1])
        e.solver(kind="direct")(TaskRecord(id="d", question="What is 3 + 3?"), 0)
        assert "Answer in one word." in system_text(sent[-1])
        e.chat("What is 4 + 4?")
        assert "Answer in one word." in system_text(sent[-1])
        assert len(sent) == 3
    finally:
        e.close()


@pytest.mark.co_react
@pytest.mark.latent
@pytest.mark.march
@pytest.mark.parametrize("method", ["co_react", "march", "latent"])
def test_registered_loop_methods_are_refused_by_the_direct_solver(library: Path,
                                                                  method: str) -> None:
    e = engine_with(library, method)
    try:
        with pytest.raises(ConfigError, match=f"method {method!r} cannot run in the direct"):
            e.solver(kind="direct")
    finally:
        e.close()


@pytest.mark.self_consistency
def test_the_direct_solver_keeps_what_it_can_run(library: Path) -> None:
    # self-consistency wraps the whole solve and sets the sampling: the direct solver runs
    # both hooks, so it is built there; chat mode cannot, and says where it runs.
    e = engine_with(library, ("self_consistency", {"n": 3}))
    try:
        solve = e.solver(kind="direct")
        trace = solve(TaskRecord(id="s", question="What is 5 + 5?"), 0)
        assert len(e.backend.requests) == 3  # type: ignore[attr-defined]
        assert trace.answer == "done"
        with pytest.raises(ConfigError) as err:
            e.chat("hi")
        assert "the agent loop or the direct solver" in err.value.message
    finally:
        e.close()


def test_each_host_runs_a_subset_of_the_agents_features() -> None:
    assert HOST_FEATURES["chat"] <= HOST_FEATURES["direct"] <= HOST_FEATURES["agent"]
    assert unhonoured_features(Hint, "chat") == [] and unhonoured_features(Nudge, "agent") == []
    assert unhonoured_features(Nudge, "direct") == ["node:decide"]
    check_host("hint", Hint, "direct")  # nothing to refuse
    with pytest.raises(ValueError, match="unknown host 'batch'"):
        unhonoured_features(Hint, "batch")


def test_a_node_at_a_stage_its_class_does_not_declare_is_refused() -> None:
    class Sneaky(Nudge):
        name = "sneaky"
        stages = ()  # a host would not know to refuse it: the graph does

    with pytest.raises(ConfigError, match="its class does not declare in `stages`"):
        build_graph([Sneaky()])

    class Elsewhere(Nudge):
        name = "elsewhere"
        stages = ("later",)

        def nodes(self) -> list[Node]:
            return [Node("later", super().nodes()[0].fn)]

    with pytest.raises(ConfigError, match="the agent graph does not have"):
        build_graph([Elsewhere()])


def test_a_method_that_needs_a_library_says_so() -> None:
    with pytest.raises(ConfigError, match="the memory method needs a library") as err:
        MethodEnv().require_library("memory")
    assert "Engine" in (err.value.hint or "")


def test_the_method_env_gives_a_second_model_and_the_corpora_or_says_why_not(
        tmp_path: Path) -> None:
    """What a verifier's environment held (a second model, the evidence corpora) is every
    method's ``MethodEnv``: the agent's own model unless another is named, and a model built
    here is the caller's to close."""
    own = ScriptedBackend(["x"])
    env = MethodEnv(backend=own)
    assert env.model() == (own, False) and env.model(own.spec) == (own, False)
    other = ScriptedBackend(["y"])
    assert env.model(other) == (other, False)
    script = tmp_path / "analyst.json"
    script.write_text('{"replies": ["z"]}')
    built, close = env.model(f"scripted:{script}")
    assert close and built is not own and built.spec == f"scripted:{script}"
    with pytest.raises(ConfigError, match="no model was named"):
        MethodEnv().model()
    with pytest.raises(ConfigError, match="no evidence corpus is open here"):
        env.corpus("wiki")
    opened: list[str | None] = []
    env = MethodEnv(corpora=lambda name: opened.append(name) or name, corpus_name="halueval")
    assert env.corpus() == "halueval" and env.corpus("wiki") == "wiki"
    assert opened == ["halueval", "wiki"]


def test_a_plugin_written_for_the_old_hooks_is_refused_with_what_replaced_them() -> None:
    with pytest.raises(TypeError, match=r"Old defines wrap_model.*declare wraps = \('model_call',\)"):
        class Old(Plugin):
            name = "old"

            def wrap_model(self, call: Any, backend: Any) -> Any:
                return call
