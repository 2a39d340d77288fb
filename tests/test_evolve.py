"""Evolve end to end with scripted models: traces -> Trace2Skill -> gate -> version/candidate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.evaluation.runner import evaluate
from whetstone.engine.evaluation.tasks import TaskRecord, tasks_from_traces
from whetstone.engine.evolution.pipeline import gate_and_apply
from whetstone.engine.methods.trace2skill.evolver import Trace2Skill, Trace2SkillConfig
from whetstone.engine.types import Request

LESSON = "- Add the two quantities before answering."
# A description a task must match to see the skill (the skills floor, SkillsConfig.min_score):
# "Lessons learned for adding tasks" scores under it against these questions.
ADDING = "Word problems where someone has some apples and gets more: add the two quantities."
TASKS = [TaskRecord(id=f"q{i}", question=f"Tom has {i} apples and gets {i} more. How many?",
                    expected=str(2 * i), scorer="numeric") for i in range(1, 5)]
# Held-out tasks for the gate: six, so six that flip are a clear gain (McNemar p = 0.03).
HELD = [TaskRecord(id=f"d{i}", question=f"Tom has {i} apples and gets {i} more. How many?",
                   expected=str(2 * i), scorer="numeric") for i in range(11, 17)]


def agent_that_needs_the_lesson(request: Request) -> str:
    """A stand-in for a frozen model: right only when the skill's lesson is in its prompt."""
    system = request.messages[0].text
    question = request.messages[-1].text
    n = int(question.split("has ")[1].split(" ")[0])
    return f"Final Answer: {2 * n if LESSON in system else n}"


def analyst_reply(request: Request) -> str:
    return json.dumps({"reasoning": "The agent forgot to add.", "changelog": "add quantities",
                       "edits": [{"file": "SKILL.md", "op": "append_to_section",
                                  "target_section": "Pitfalls", "content": LESSON}]})


def collect(engine: Engine) -> list[Any]:
    evaluate(TASKS, engine.solver(), store=engine.traces, task_set="apples")
    return [t for t in engine.traces.query() if t.outcome != "running"]


def test_a_helpful_skill_passes_the_gate_and_becomes_a_version(tmp_path: Path) -> None:
    engine = Engine(ScriptedBackend(responder=agent_that_needs_the_lesson),
                    library=tmp_path / "lib", create=True, checkpointing=False)
    traces = collect(engine)
    assert [t.score for t in traces] == [0.0] * 4
    patch = Trace2Skill(Trace2SkillConfig("adding", create=True,
                                          description="Word problems that add quantities.")).fit(
        traces, {}, ScriptedBackend(responder=analyst_reply))
    result = gate_and_apply(patch, engine.library, make_solver=lambda s: engine.solver(snapshot=s),
                            gate_tasks=HELD)
    d = result.decision
    assert d is not None and d.accepted
    assert (d.current_score, d.candidate_score) == (0.0, 1.0)
    assert result.version is not None and result.version.id == "v2"
    manifest = engine.library.manifest("v2")
    assert manifest.method == "trace2skill" and manifest.scores["gate"]["accepted"] is True
    assert manifest.costs["analyst_calls"] == 4
    assert LESSON in engine.library.snapshot().read_text("skills/adding/SKILL.md")
    # The library that opens now makes the stand-in model right.
    assert engine.run("Tom has 7 apples and gets 7 more. How many?").answer == "14"


def test_a_harmful_skill_is_rejected_and_kept_as_a_candidate(tmp_path: Path) -> None:
    def contrary(request: Request) -> str:  # right without the lesson, wrong with it
        n = int(request.messages[-1].text.split("has ")[1].split(" ")[0])
        return f"Final Answer: {-1 if LESSON in request.messages[0].text else 2 * n}"

    engine = Engine(ScriptedBackend(responder=contrary), library=tmp_path / "lib", create=True,
                    checkpointing=False)
    traces = collect(engine)
    patch = Trace2Skill(Trace2SkillConfig("adding", create=True, description=ADDING)).fit(
        traces, {}, ScriptedBackend(responder=analyst_reply))
    result = gate_and_apply(patch, engine.library, make_solver=lambda s: engine.solver(snapshot=s),
                            gate_tasks=tasks_from_traces(traces, scorer="numeric"),
                            candidate_name="adding-try")
    assert result.decision is not None and not result.decision.accepted
    assert result.version is None and result.candidate == "adding-try"
    assert engine.library.current_id() == "v1"  # nothing landed
    cand = engine.library.candidates.get("adding-try")
    assert cand.scores["gate"]["candidate_score"] == 0.0
    assert "+" + LESSON in engine.library.candidates.diff("adding-try")
    engine.library.candidates.apply("adding-try")  # by hand, later
    assert LESSON in engine.library.snapshot().read_text("skills/adding/SKILL.md")


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    engine = Engine(ScriptedBackend(responder=agent_that_needs_the_lesson),
                    library=tmp_path / "lib", create=True, checkpointing=False)
    patch = Trace2Skill(Trace2SkillConfig("adding", create=True, description=ADDING)).fit(
        collect(engine), {}, ScriptedBackend(responder=analyst_reply))
    result = gate_and_apply(patch, engine.library, make_solver=lambda s: engine.solver(snapshot=s),
                            gate_tasks=TASKS, dry_run=True)
    assert "+++ b/skills/adding/SKILL.md" in result.diff and "+" + LESSON in result.diff
    assert result.decision is None and engine.library.current_id() == "v1"


def test_cli_evolve_collects_traces_runs_the_gate_and_prints_json(tmp_path: Path) -> None:
    tasks = tmp_path / "apples.jsonl"
    tasks.write_text("\n".join(json.dumps(t.to_dict()) for t in TASKS) + "\n")
    held = tmp_path / "held.jsonl"
    held.write_text("\n".join(json.dumps(t.to_dict()) for t in HELD) + "\n")
    # Agent: collect 4 (wrong), gate current 6 (wrong), gate candidate 6 (right). Replayed in
    # order, so one task at a time (-j auto would run the scripted backend's 64 at once).
    agent = [f"Final Answer: {i}" for i in range(1, 5)] + \
        [f"Final Answer: {i}" for i in range(11, 17)] + \
        [f"Final Answer: {2 * i}" for i in range(11, 17)]
    analyst = [analyst_reply(None)] * 4  # type: ignore[arg-type]
    (tmp_path / "agent.json").write_text(json.dumps(agent))
    (tmp_path / "analyst.json").write_text(json.dumps(analyst))
    (tmp_path / "lib").mkdir()  # an empty folder: the library is made there
    res = CliRunner().invoke(cli, [
        "evolve", "trace2skill", "--tasks", str(tasks), "--skill", "adding", "--create", "-j", "1",
        "--gate-tasks", str(held), "--model", f"scripted:{tmp_path / 'agent.json'}",
        "--analyst", f"scripted:{tmp_path / 'analyst.json'}",
        "--library", str(tmp_path / "lib"), "--workers", "1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["decision"]["accepted"] is True and out["version"] == "v2"
    assert out["decision"]["current_score"] == 0.0 and out["decision"]["candidate_score"] == 1.0
    assert out["decision"]["tasks"] == [t.id for t in HELD]  # it names the tasks it used
    assert out["changed"] == ["skills/adding/SKILL.md"]


def test_cli_dry_run_and_trace_filters(tmp_path: Path) -> None:
    engine = Engine(ScriptedBackend(responder=agent_that_needs_the_lesson),
                    library=tmp_path / "lib", create=True, checkpointing=False)
    collect(engine)
    (tmp_path / "analyst.json").write_text(json.dumps([analyst_reply(None)] * 4))  # type: ignore
    res = CliRunner().invoke(cli, [
        "evolve", "trace2skill", "--skill", "adding", "--create", "--traces", "score<1",
        "--model", "scripted:", "--analyst", f"scripted:{tmp_path / 'analyst.json'}",
        "--library", str(tmp_path / "lib"), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "+" + LESSON in res.output and "dry run" in res.output
    bad = CliRunner().invoke(cli, ["evolve", "trace2skill", "--skill", "x", "--traces",
                                   "colour=red", "--model", "scripted:",
                                   "--library", str(tmp_path / "lib")])
    assert bad.exit_code == 2 and "unknown trace filter" in bad.output
    none = CliRunner().invoke(cli, ["evolve", "trace2skill", "--skill", "x", "--traces",
                                    "outcome=timeout", "--model", "scripted:",
                                    "--library", str(tmp_path / "lib")])
    assert none.exit_code == 2 and "no traces match" in none.output


def test_a_candidate_can_be_evaluated_without_applying_it(tmp_path: Path) -> None:
    engine = Engine(ScriptedBackend(responder=agent_that_needs_the_lesson),
                    library=tmp_path / "lib", create=True, checkpointing=False)
    patch = Trace2Skill(Trace2SkillConfig("adding", create=True, description=ADDING)).fit(
        collect(engine), {}, ScriptedBackend(responder=analyst_reply))
    engine.library.candidates.save("try", patch.changes, method="trace2skill")
    cand = Engine(engine.backend, library=tmp_path / "lib", create=True, version="candidate:try",
                  checkpointing=False)
    result = evaluate(TASKS, cand.solver())
    assert result.accuracy == 1.0 and engine.library.current_id() == "v1"


def test_python_api_evolve_in_three_lines(tmp_path: Path) -> None:
    engine = Engine(ScriptedBackend(responder=agent_that_needs_the_lesson),
                    library=tmp_path / "lib", create=True, checkpointing=False)
    collect(engine)
    result = engine.evolve("trace2skill", skill="adding", create=True, description=ADDING,
                           gate_tasks=HELD, analyst=ScriptedBackend(responder=analyst_reply))
    assert result.version is not None and result.version.id == "v2"
    assert result.decision is not None and result.decision.candidate_score == 1.0


def test_the_gates_own_runs_are_not_training_traces(tmp_path: Path) -> None:
    engine = Engine(ScriptedBackend(responder=agent_that_needs_the_lesson),
                    library=tmp_path / "lib", create=True, checkpointing=False)
    collect(engine)
    held_out = HELD
    analysed: list[str] = []

    def analyst(request: Request) -> str:
        analysed.append(request.messages[-1].text)
        return analyst_reply(request)

    engine.evolve("trace2skill", skill="adding", create=True, description=ADDING,
                  gate_tasks=held_out,
                  analyst=ScriptedBackend(responder=analyst))
    stored = engine.traces.query()
    gate_runs = [t for t in stored if "gate" in t.meta]
    assert {t.meta["gate"] for t in gate_runs} == {"current", "candidate"}
    assert len(gate_runs) == 12  # six held-out tasks, each under both libraries
    analysed.clear()
    engine.evolve("trace2skill", skill="adding", create=False, gate_tasks=HELD[:1],
                  analyst=ScriptedBackend(responder=analyst))
    seen = {n for n in range(1, 17) for a in analysed if f"has {n} apples" in a}
    assert seen == {1, 2, 3, 4}  # the four training tasks, not the held-out 11 to 16
