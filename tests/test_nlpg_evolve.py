"""The NLPG evolver end to end with scripted models: corrections land in their own module's
file, the update stays bounded over many steps, harmful notes retire, an interrupted evolve
resumes, the gate lands the notes as a version, and the CLI reads them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from nlpg_support import RUBRIC, analyst, think, trace

from whetstone.cli import cli
from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.evaluation.tasks import TaskRecord, TaskSet
from whetstone.engine.methods.nlpg.evolver import NLPG, NLPGConfig
from whetstone.engine.methods.nlpg.memory import Memory, estimate_tokens, note_tokens
from whetstone.engine.methods.nlpg.notes import parse_policy
from whetstone.engine.types import Request

LESSON = "Add the two quantities before answering."
TASKS = TaskSet("apples", tuple(
    TaskRecord(id=f"q{i}", question=f"Tom has {i} apples and gets {i} more. How many?",
               expected=str(2 * i), scorer="numeric") for i in range(1, 5)))


def fit(traces: list[Any], backend: ScriptedBackend, files: Mapping[str, str] | None = None,
        **config: Any) -> Any:
    return NLPG(NLPGConfig(**config)).fit(traces, dict(files or {}), backend)


def test_each_modules_correction_lands_only_in_its_own_policy_file() -> None:
    def verdict(parts: dict[str, str]) -> dict[str, Any]:
        rule = {"think": "Recompute the sum before the final answer.",
                RUBRIC: "Give the arithmetic check the highest weight."}[parts["module"]]
        return {"blame": 0.5, "correction": rule, "upstream": "the plan missed the check"}

    patch = fit([trace("t1"), trace("t2")], analyst(verdict), curator="rules", max_visits=2)
    assert set(patch.changes) == {"policies/think.md", f"policies/{RUBRIC}.md"}
    think_notes = parse_policy(patch.changes["policies/think.md"], "think")
    rubric_notes = parse_policy(patch.changes[f"policies/{RUBRIC}.md"], RUBRIC)
    assert [(n.route, n.text) for n in think_notes] == [
        ("finish", "Recompute the sum before the final answer.")]
    assert [(n.route, n.text) for n in rubric_notes] == [
        ("think", "Give the arithmetic check the highest weight.")]
    step = patch.details["steps"][0]
    assert step["groups"]["think"][0]["traces"] == ["t1", "t2"]  # folded across the batch
    assert step["modules"]["think"]["ops"][0]["op"] == "ADD"


def test_a_harmful_note_is_retired_and_a_helpful_one_kept() -> None:
    files = {"policies/think.md": "[bad] route=finish :: Answer with the first number you see.\n"
                                  "[good] route=* :: Read the question twice.\n"}
    runs = [trace("fail", shown={"think": ["bad", "good"]}),
            trace("pass", score=1.0, answer="7", shown={"think": ["good"]})]
    backend = analyst(lambda parts: {"blame": 1.0, "correction": "", "upstream": "",
                                     "misleading_notes": ["bad"]})
    patch = fit(runs, backend, files, curator="rules")
    kept = parse_policy(patch.changes["policies/think.md"], "think")
    assert [(n.id, n.helpful, n.harmful) for n in kept] == [("good", 1, 0)]
    ops = patch.details["steps"][0]["modules"]["think"]["ops"]
    assert ops == [{"op": "REMOVE", "id": "bad", "reason": "retired"}]
    assert (patch.details["steps"][0]["helpful"], patch.details["steps"][0]["harmful"]) == (1, 1)


def test_memory_stays_bounded_over_fifty_update_steps() -> None:
    """Every step proposes far more than may land; after every step each module holds at most
    ``budget_tokens`` of notes and took at most four operations."""
    budget = 60
    seen: list[tuple[int, dict[str, int], dict[str, int]]] = []
    counter = iter(range(10_000))

    def verdict(parts: dict[str, str]) -> dict[str, Any]:
        k = next(counter)
        ids = [line[1:].split("]")[0] for line in parts["notes"].splitlines()
               if line.startswith("[")]
        return {"blame": 0.6, "correction": " ".join(f"w{k}x{j}" for j in range(6)),
                "upstream": f"plan step {k} was vague", "misleading_notes": ids[:1]
                if k % 3 == 0 else []}

    def curate(request: Request) -> dict[str, Any]:
        k = next(counter)
        return {"ops": [{"op": "ADD", "route": "finish",
                         "text": " ".join(f"c{k}y{j}x{i}" for j in range(4))}
                        for i in range(6)] + [{"op": "REMOVE", "id": "nothing"}]}

    def check(report: Mapping[str, Any], memory: Memory) -> None:
        tokens = {m: note_tokens(notes, estimate_tokens) for m, notes in memory.items()}
        ops = {m: len(r["ops"]) for m, r in report["modules"].items()}
        assert all(t <= budget for t in tokens.values()), (report["step"], tokens)
        assert all(n <= 4 for n in ops.values()), (report["step"], ops)
        seen.append((report["step"], tokens, ops))

    runs = []
    for i in range(100):
        ids = [f"s{i}"] if i % 5 else []
        runs.append(trace(f"r{i}", score=0.0 if i % 4 else 1.0, answer="7" if i % 4 == 0 else "5",
                          shown={"think": ids}))
    evolver = NLPG(NLPGConfig(batch=2, steps=50, budget_tokens=budget, max_visits=2),
                   on_step=check)
    patch = evolver.fit(runs, {}, analyst(verdict, curate))
    assert [s for s, _, _ in seen] == list(range(1, 51))
    assert max(max(t.values()) for _, t, _ in seen) > budget // 2  # the budget was pressed
    report = patch.details["report"]
    assert report["curator_ops_dropped"] >= 50  # the unknown REMOVE, every step
    refused = sum(r["modules"]["think"]["refused"].get("over_ops", 0)
                  + r["modules"]["think"]["refused"].get("over_budget", 0)
                  for r in patch.details["steps"] if "think" in r["modules"])
    assert refused > 50


def test_malformed_analyst_output_is_counted_in_the_patch() -> None:
    replies = iter(['{"share": "90%", "rule": "Recompute the sum.", "critique": ""}',
                    "no json here", "still none", "garbage curator", "garbage again"])
    backend = ScriptedBackend(responder=lambda request: next(replies))
    runs = [trace("t1", steps=[think("Final Answer: 5", "finish")]),
            trace("t2", steps=[think("Final Answer: 6", "finish")])]
    patch = fit(runs, backend, workers=1)
    report = patch.details["report"]
    assert report["repairs"] >= 2  # renamed fields and a percentage
    assert report["analyst"]["dropped"] == 2 and report["analyst"]["retries"] == 2
    assert report["curator_fallbacks"] == 1  # the rules took over
    assert parse_policy(patch.changes["policies/think.md"], "think")[0].text == \
        "Recompute the sum."


# -- through Engine.evolve: rollouts, the gate, resuming -----------------------------------------


class Agent:
    """A stand-in frozen model: right only when the lesson is in its system message; it can be
    made to stop (Ctrl-C) at a given call."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.calls = 0
        self.stop_at = stop_at

    def __call__(self, request: Request) -> str:
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        n = int(request.messages[-1].text.split("has ")[1].split(" ")[0])
        wrong = n if int(n) % 2 else n + 1  # two kinds of mistakes, so two lessons
        return f"Final Answer: {2 * n if LESSON in request.messages[0].text else wrong}"


def lesson_analyst(crash_at: int | None = None) -> ScriptedBackend:
    calls = [0]

    def verdict(parts: dict[str, str]) -> dict[str, Any]:
        calls[0] += 1
        if calls[0] == crash_at:
            raise RuntimeError("power cut")
        return {"blame": 1.0, "correction": LESSON, "upstream": ""}

    return analyst(verdict)


def test_evolve_runs_rollouts_gates_and_lands_the_notes(tmp_path: Path) -> None:
    agent = Agent()
    engine = Engine(ScriptedBackend(responder=agent), library=tmp_path / "lib", create=True,
                    checkpointing=False)
    # The gate decides on other tasks than the evolver learns from: six that flip are a
    # clear gain (McNemar p = 0.03).
    held = [TaskRecord(id=f"d{i}", question=f"Tom has {i} apples and gets {i} more. How many?",
                       expected=str(2 * i), scorer="numeric") for i in range(11, 17)]
    result = engine.evolve("nlpg", tasks=TASKS, analyst=lesson_analyst(), gate_tasks=held,
                           batch=2, steps=2, curator="rules")
    steps = result.patch.details["steps"]
    assert [s["mean_score"] for s in steps] == [0.0, 1.0]  # step 2 ran over the preview
    assert result.patch.costs["agent_runs"] == 2  # step 1 reused the collected runs
    d = result.decision
    assert d is not None and d.accepted and (d.current_score, d.candidate_score) == (0.0, 1.0)
    assert result.version is not None
    notes = parse_policy(engine.library.snapshot().read_text("policies/think.md"), "think")
    assert [(n.route, n.text, n.helpful) for n in notes] == [("finish", LESSON, 2)]
    # The next run reads the note through the nlpg runtime method, and records it.
    with Engine(ScriptedBackend(responder=Agent()), library=tmp_path / "lib", create=True,
                methods=["nlpg"], checkpointing=False) as later:
        run = later.run("Tom has 7 apples and gets 7 more. How many?")
    assert run.answer == "14" and run.meta["nlpg"]["shown"] == {"think": [notes[0].id]}
    assert {"name": "nlpg", "config": {"budget_tokens": 400}} in run.meta["methods"]


def test_an_interrupted_evolve_resumes_where_it_stopped(tmp_path: Path) -> None:
    # One rollout at a time (-j auto would run the scripted backend's 64 at once), so the
    # interrupt lands at a known rollout.
    options: dict[str, Any] = {"tasks": TASKS, "batch": 2, "steps": 3, "curator": "rules",
                               "workers": 1, "dry_run": True, "concurrency": 1}
    plain = Engine(ScriptedBackend(responder=Agent()), library=tmp_path / "plain", create=True,
                   checkpointing=False)
    expected = plain.evolve("nlpg", analyst=lesson_analyst(), **options)

    agent = Agent()
    engine = Engine(ScriptedBackend(responder=agent), library=tmp_path / "lib", create=True,
                    checkpointing=False)
    with pytest.raises(RuntimeError, match="power cut"):  # the analyst dies in step 1
        engine.evolve("nlpg", analyst=lesson_analyst(crash_at=2), **options)
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C during step 3's rollouts
        agent.stop_at = agent.calls + 4  # step 2 runs two tasks, step 3 stops at its 2nd
        engine.evolve("nlpg", analyst=lesson_analyst(), **options)
    before = agent.calls
    resumed_analyst = lesson_analyst()
    result = engine.evolve("nlpg", analyst=resumed_analyst, **options)
    assert result.patch.changes == expected.patch.changes
    assert result.patch.details["resumed"] is True
    assert agent.calls - before == 1  # only step 3's unfinished rollout ran again
    assert len(resumed_analyst.requests) == 0  # every walk was done before the stop
    checkpoints = list((tmp_path / "lib" / "state" / "nlpg").glob("*.json"))
    assert len(checkpoints) == 1 and json.loads(checkpoints[0].read_text())["finished"]


# -- the command line ---------------------------------------------------------------------------


def test_whetstone_policies_ls_and_show(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    engine = Engine(ScriptedBackend(responder=Agent()), library=lib, checkpointing=False,
                    create=True)
    engine.library.commit({"policies/think.md": "[n1] route=finish helpful=3 :: Check it.\n"
                                                "[n2] :: Read twice.\n",
                           f"policies/{RUBRIC}.md": "[r1] route=think :: Weigh the math.\n"},
                          method="hand")
    runner = CliRunner()
    res = runner.invoke(cli, ["policies", "ls", "--library", str(lib), "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["module"]: r for r in json.loads(res.stdout)["modules"]}
    assert rows["think"]["notes"] == 2 and rows["think"]["helpful"] == 3
    assert rows["think"]["routes"] == ["*", "finish"] and RUBRIC in rows
    res = runner.invoke(cli, ["policies", "show", "think", "--library", str(lib)])
    assert res.exit_code == 0 and "Check it." in res.output and "n2" in res.output
    res = runner.invoke(cli, ["policies", "show", "plan", "--library", str(lib)])
    assert res.exit_code == 6 and "no policy notes for module 'plan'" in res.output
    assert "co_react_rubric, think" in res.output
    empty = runner.invoke(cli, ["policies", "ls", "--library", str(lib), "--version", "v1"])
    assert empty.exit_code == 0 and "whetstone evolve nlpg" in empty.output


def test_whetstone_evolve_nlpg_from_the_command_line(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    engine = Engine(ScriptedBackend(responder=Agent()), library=lib, checkpointing=False,
                    create=True)
    engine.evolve("nlpg", tasks=TASKS, analyst=lesson_analyst(), batch=1, dry_run=True)
    replies = tmp_path / "analyst.json"
    replies.write_text(json.dumps([json.dumps({"blame": 1, "correction": LESSON,
                                               "upstream": ""})] * 2))
    res = CliRunner().invoke(cli, [
        "evolve", "nlpg", "--model", "scripted:", "--analyst", f"scripted:{replies}",
        "--library", str(lib), "--traces", "score<1", "--batch", "2", "--steps", "1",
        "--curator", "rules", "--workers", "1", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["method"] == "nlpg" and out["changed"] == ["policies/think.md"]
    assert f":: {LESSON}" in out["diff"] and out["costs"]["agent_runs"] == 0
