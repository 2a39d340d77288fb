"""``--solver direct|agent``: the direct solver (one call, the model's template, the library's
guidance) through ``Engine``, ``whetstone eval`` and the evolve gate; and answers read alike
whichever solver wrote them (``whetstone.engine.answer_text``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.answer_text import answer_span, has_answer
from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import ConfigError
from whetstone.engine.evaluation.runner import evaluate
from whetstone.engine.evaluation.scorers import get_scorer
from whetstone.engine.evaluation.tasks import TaskRecord
from whetstone.engine.types import Request
from whetstone.library_store.store import Library

ARITH = Path(__file__).parent / "fixtures" / "tasks" / "arith.jsonl"
UNITS = """---
name: unit-conversion
description: Convert between units (hours, minutes, metres, kilometres) in word problems.
---

# Unit conversion

Convert every quantity to one unit before adding.
"""
TASK = TaskRecord(id="t", question="How many minutes are 2.5 hours?", expected="150",
                  scorer="numeric")


def test_direct_on_an_empty_library_is_one_call_with_the_templates_own_system(
        tmp_path: Path) -> None:
    backend = ScriptedBackend(["2.5 hours is 150 minutes."])
    engine = Engine(backend, library=tmp_path / "lib", create=True, checkpointing=False,
                    solver="direct")
    result = evaluate([TASK], engine.solver())
    assert result.accuracy == 1.0
    [request] = backend.requests
    assert [m.role for m in request.messages] == ["user"]  # nothing injected
    trace = next(iter(result.results))
    assert trace.tokens > 0 and trace.outcome == "answered"


def test_direct_gets_the_same_skills_as_the_agent_without_read_skill(tmp_path: Path) -> None:
    lib = Library.open(tmp_path / "lib", create=True)
    lib.commit({"skills/unit-conversion/SKILL.md": UNITS}, method="test", message="units")
    direct = ScriptedBackend(["150"])
    engine = Engine(direct, library=lib.root, checkpointing=False)
    solve = engine.solver(kind="direct")
    trace = solve(TASK, 0)
    system = direct.requests[0].messages[0].text
    assert "unit-conversion" in system and "Convert every quantity" in system
    assert "read_skill" not in system
    assert trace.meta["skills"]["shown"] == ["unit-conversion"]
    assert trace.library_version == "v2" and trace.meta["solver"] == "direct"
    agent = ScriptedBackend(["150"], tool_calls=True)
    Engine(agent, library=lib.root, checkpointing=False).solver()(TASK, 0)
    assert "unit-conversion" in agent.requests[0].messages[0].text
    assert "read_skill(name, file?)" in agent.requests[0].messages[0].text  # a skill was shown


def test_an_unknown_solver_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown solver 'loop'") as err:
        Engine(ScriptedBackend(), library=tmp_path / "lib", create=True, solver="loop")
    assert "agent, direct" in (err.value.hint or "")


def test_eval_solver_direct_from_the_command_line(tmp_path: Path, whetstone_home: Path) -> None:
    replies = tmp_path / "replies.json"
    # The direct solver makes one call per task; an agent given these replies would too, but
    # its system message would be there.
    replies.write_text(json.dumps({"replies": ["The answer is 3."] * 2}))
    res = CliRunner().invoke(cli, ["eval", "--tasks", f"{ARITH}:0:2", "--model",
                                   f"scripted:{replies}", "--solver", "direct", "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    (result,) = json.loads(res.stdout)["results"]
    assert [r["score"] for r in result["results"]] == [1.0, 0.0]
    bad = CliRunner().invoke(cli, ["eval", "--tasks", str(ARITH), "--solver", "loop"])
    assert bad.exit_code == 2 and "'loop' is not one of 'agent', 'direct'" in bad.output


def test_the_evolve_gate_runs_the_solver_it_is_given(tmp_path: Path) -> None:
    roles: list[list[str]] = []

    def model(request: Request) -> str:
        roles.append([m.role for m in request.messages])
        return "Final Answer: 4"

    def analyst(request: Request) -> str:
        return json.dumps({"reasoning": "r", "changelog": "c", "edits": [
            {"file": "SKILL.md", "op": "append_to_section", "target_section": "Pitfalls",
             "content": "- Add the two numbers."}]})

    engine = Engine(ScriptedBackend(responder=model), library=tmp_path / "lib", create=True,
                    checkpointing=False)
    tasks = [TaskRecord(id="a", question="What is 2 + 2?", expected="4", scorer="numeric")]
    traces = [engine.solver(kind="direct")(tasks[0], 0).with_(score=1.0, label="4")]
    held = [TaskRecord(id="b", question="What is 1 + 3?", expected="4", scorer="numeric")]
    result = engine.evolve("trace2skill", traces=traces, gate_tasks=held, solver="direct",
                           analyst=ScriptedBackend(responder=analyst), skill="adding",
                           create=True, description="Add two numbers in a question.")
    assert result.decision is not None
    # The gate's current run (empty library) was one direct call with nothing injected.
    assert roles[1] == ["user"]
    with pytest.raises(ConfigError, match="unknown solver"):
        engine.evolve("trace2skill", traces=traces, solver="nope", skill="x", create=True)


@pytest.mark.parametrize(("text", "span"), [
    (r"So the total is \boxed{260} sheep.", "260"),
    ("Step 1 ...\nThe answer is **42**.", "42"),
    ("Final Answer:\nParis", "Paris"),
    ("Thinking...\nBlue.", "Blue"),
    ("", ""),
])
def test_answer_span_reads_boxes_cues_and_the_final_line(text: str, span: str) -> None:
    assert answer_span(text) == span


def test_has_answer_needs_a_box_or_a_cue_with_something_after_it() -> None:
    assert has_answer(r"\boxed{3}") and has_answer("the answer is 3")
    assert not has_answer("I will find the answer:") and not has_answer("Let me think.")


def test_text_scorers_read_the_answer_span_too() -> None:
    task = TaskRecord(id="c", question="Capital of France?", expected="Paris",
                      scorer="normalised")
    long = "France's capital has been the seat of power for centuries.\nThe answer is Paris."
    assert get_scorer("normalised")(long, task) == 1.0
    assert get_scorer("f1")(long, task) == 1.0
    assert get_scorer("normalised")("Lyon", task) == 0.0


def test_skills_options_reach_the_direct_solver_and_chat_mode(tmp_path: Path) -> None:
    """``whetstone.skills.examples`` and ``skills.learned_tools`` pass the config check, so every host
    must take them (the direct and chat paths raised a TypeError), and they act there."""
    lib = Library.open(tmp_path / "lib", create=True)
    lib.commit({"skills/unit-conversion/SKILL.md": UNITS}, method="test", message="units")
    options = {"examples": 3, "learned_tools": False, "min_score": 0.99}
    backend = ScriptedBackend(["150", "150"])
    engine = Engine(backend, library=lib.root, checkpointing=False, solver="direct",
                    methods=[("skills", options)])
    trace = engine.solver()(TASK, 0)
    # min_score=0.99 reached the retriever: the skill is recorded but not shown.
    assert trace.meta["skills"]["shown"] == []
    assert "Convert every quantity" not in backend.requests[0].messages[0].text
    engine.chat("How many minutes are 2.5 hours?")
    assert all(m.role != "system" or "Convert every quantity" not in m.text
               for m in backend.requests[1].messages)
    plugin = engine.chat_adapter().plugins[0]
    assert plugin.config.examples == 3 and plugin.config.learned_tools is False
    with pytest.raises(ConfigError, match="unknown option"):
        Engine(backend, library=lib.root, solver="direct", methods=[("skills", {"exampels": 3})])


def test_an_unrelated_task_gets_no_skill_by_default(tmp_path: Path) -> None:
    lib = Library.open(tmp_path / "lib", create=True)
    lib.commit({"skills/unit-conversion/SKILL.md": UNITS}, method="test", message="units")
    backend = ScriptedBackend(["Hello world!"])
    trace = Engine(backend, library=lib.root, checkpointing=False, solver="direct").solver()(
        TASK.with_(question="say hello world"), 0)
    assert [m.role for m in backend.requests[0].messages] == ["user"]  # nothing injected
    assert trace.meta["skills"]["shown"] == []
    assert trace.meta["skills"]["matches"][0][0] == "unit-conversion"  # scored, under the floor


def test_skills_options_need_no_methods_flag() -> None:
    """Skill retrieval runs by default, so ``--method-config skills.k=3`` alone sets it."""
    from whetstone.engine.commands.common import parse_methods

    assert parse_methods("", ("skills.k=3", "skills.turns=true")) == [
        ("skills", {"k": 3, "turns": True})]
    with pytest.raises(ConfigError, match="which --methods does not list"):
        parse_methods("", ("memory.k=3",))
