"""A host that cannot offer a skill's learned tools does not promise them (issue 37, item 5).

Chat mode (``Engine.chat``, ``Engine.wrap``, ``whetstone serve``), the direct solver and a
LangChain call without the tools bound inject a skill's text with no tools to run: the lines
that name the skill's learned tools, and the worked examples that call them, are left out, so
the model neither writes calls nobody runs nor tells the user to use a tool. The agent, the MCP
server (it lists the tools) and a LangChain call with the library's tools bound keep them.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.evaluation.tasks import TaskRecord
from whetstone.engine.library.checks import validate_library
from whetstone.engine.types import Request
from whetstone.library_store.store import Library
from whetstone.skills.format import Example, render_examples

SKILL = textwrap.dedent("""\
    ---
    name: sum-amounts
    description: Add up a list of amounts. Use when a word problem sums several prices.
    ---
    # Sum amounts
    1. Find every amount in the problem.
    2. Call `sum_amounts` with the amounts.
    3. Give the total with its unit.
    """)
TOOL = textwrap.dedent('''\
    def sum_amounts(amounts: list[float]) -> float:
        """Add up amounts exactly.

        Args:
            amounts: the numbers to add.
        """
        return sum(amounts)
    ''')
PENS = "Pens cost 1.5, 2.25 and 3. What is the total?"
TOOL_LINE = "Call `sum_amounts` with the amounts."
CALLING = Example("t1", "Books cost 4 and 5.5. What is the total?",
                  '<tool_call>{"name": "sum_amounts", "arguments": {"amounts": [4, 5.5]}}'
                  '</tool_call>')
BY_HAND = Example("t2", "Cups cost 2 and 3. What is the total?", "2 + 3 = 5. The total is 5.")


@pytest.fixture
def library(tmp_path: Path) -> Library:
    lib = Library.open(tmp_path / "lib", create=True)
    lib.commit({"skills/sum-amounts/SKILL.md": SKILL,
                "skills/sum-amounts/scripts/sum_amounts.py": TOOL,
                "skills/sum-amounts/references/examples.md":
                    render_examples([CALLING, BY_HAND], title="Examples")},
               method="test", validate=validate_library)
    return lib


def system_of(request: Request) -> str:
    return request.messages[0].text if request.messages[0].role == "system" else ""


def assert_not_promised(system: str) -> None:
    assert "## Skill: sum-amounts" in system and "Find every amount" in system, system
    assert "sum_amounts" not in system, system  # neither the line nor the calling example
    assert "2 + 3 = 5" in system  # the example that needs no tool stays


def test_chat_mode_and_the_direct_solver_leave_the_tool_lines_out(library: Library) -> None:
    """Engine.chat injected "Call `sum_amounts`..." with no tool offered; the embedded model
    then answered "you can use the `sum_amounts` tool"."""
    backend = ScriptedBackend(responder=lambda r: "The total is 6.75.")
    with Engine(backend, library=library.root, checkpointing=False) as engine:
        engine.chat(PENS)
        assert_not_promised(system_of(backend.requests[-1]))
        solve = engine.solver(kind="direct")
        solve(TaskRecord(id="pens", question=PENS, expected="6.75"), 0)
        assert_not_promised(system_of(backend.requests[-1]))
        assert not backend.requests[-1].tools


def test_the_agent_which_offers_the_tool_keeps_its_line(library: Library) -> None:
    backend = ScriptedBackend(responder=lambda r: "Final Answer: 6.75")
    with Engine(backend, library=library.root, checkpointing=False) as engine:
        engine.run(PENS)
    system = system_of(backend.requests[0])
    assert TOOL_LINE in system and '"name": "sum_amounts"' in system  # line and example


def test_the_server_leaves_the_tool_lines_out(library: Library) -> None:
    from fastapi.testclient import TestClient

    from whetstone.engine.server.app import create_app

    backend = ScriptedBackend(responder=lambda r: "The total is 6.75.")
    # What `whetstone serve` builds (engine/commands/serve.py).
    with Engine(backend, library=library.root, checkpointing=False) as engine, \
            TestClient(create_app(backend, model_name="m", adapter=engine.chat_adapter()),
                       base_url="http://127.0.0.1"
                       ) as client:
        res = client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": PENS}]})
        assert res.status_code == 200, res.text
    assert_not_promised(system_of(backend.requests[-1]))


def test_langchain_keeps_the_lines_only_when_the_call_binds_the_tools(
        library: Library) -> None:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    from whetstone.engine.integrations.langchain import WhetstoneChatModel
    from whetstone.engine.integrations.langchain_tools import library_tools_for_langchain

    class Seen(GenericFakeChatModel):
        def bind_tools(self, tools: object, **kw: object) -> Seen:
            return self

    inner = Seen(messages=iter([AIMessage("6.75"), AIMessage("6.75")]))
    model = WhetstoneChatModel(inner=inner, library=library.root)
    try:
        plain = model.invoke(PENS)
        with_tools = model.bind_tools(library_tools_for_langchain(library.root)).invoke(PENS)
        traces = {t.id: t for t in model.engine.traces.query()}

        def system(reply: AIMessage) -> str:
            trace = traces[reply.response_metadata["whetstone_trace_id"]]
            return trace.steps[0].input["messages"][0]["content"]

        assert_not_promised(system(plain))
        assert TOOL_LINE in system(with_tools)
    finally:
        model.close()


def test_the_mcp_guidance_keeps_the_lines_of_the_tools_it_serves(library: Library) -> None:
    from whetstone.engine.integrations.mcp_server import LibraryServer

    server = LibraryServer.open(library.root)
    try:
        text = server.guidance(PENS).messages[0][1]
    finally:
        server.close()
    assert TOOL_LINE in text
