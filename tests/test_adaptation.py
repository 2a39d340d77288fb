"""Issue 20, adaptation a small model can use: worked examples verified by the scorer, their
nearest-first retrieval within a budget, the memory baseline (evolver + runtime method) and
self-consistency, all with scripted models."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.evaluation.examples import (
    ExampleStats,
    example_from_trace,
    examples_from_traces,
)
from whetstone.engine.evaluation.runner import evaluate
from whetstone.engine.evaluation.tasks import TaskRecord, tasks_from_traces
from whetstone.engine.evolution.pipeline import gate_and_apply
from whetstone.engine.methods.memory.method import Memory, MemoryConfig
from whetstone.engine.methods.registry import default_registry
from whetstone.engine.methods.self_consistency.plugin import (
    SelfConsistency,
    SelfConsistencyConfig,
    vote_of,
)
from whetstone.engine.types import Request, Step, Trace
from whetstone.skills.examples import ExampleRetriever
from whetstone.skills.format import Example, parse_examples, render_examples
from whetstone.skills.retrieval import approx_tokens


class WordEmbedder:
    """A deterministic bag-of-words embedder (hashed words), standing in for MiniLM."""

    name = "words"
    dim = 64

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"[a-z]+", text.lower()):
                out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def code_trace(tid: str, task: str, answer: str, *, label: str, score: float,
               scorer: str = "numeric") -> Trace:
    """A run in the agent's program form: a reply with a program, its output, the answer."""
    reply = f"Compute it.\n```python\nprint({answer})\n```"
    return Trace(
        id=tid, task=task, answer=answer, label=label, score=score, outcome="answered",
        steps=(Step(kind="think", module="think", output={"completion": {"text": reply}}),
               Step(kind="act", module="act", input={"tool": "python", "arguments": {}},
                    output={"observation": f"{answer}\n", "form": "code"})),
        meta={"scorer": scorer, "task_id": tid})


# -- the examples format -----------------------------------------------------------------------


def test_examples_round_trip_with_fenced_code_inside() -> None:
    exs = [Example("t1", "What is 2 + 2?", "```python\nprint(2 + 2)\n```\n```output\n4\n```"),
           Example("t2", "Say hi", "hi")]
    text = render_examples(exs, intro="From verified runs.")
    parsed, problems = parse_examples(text)
    assert problems == [] and parsed == exs


def test_a_broken_example_is_a_problem_with_a_line() -> None:
    text = "# Examples\n\n## Example t1\n\nno task line\n\n````\nx\n````\n\n## Example t2\n\n" \
           "Task: q\n\n````\nunclosed\n"
    parsed, problems = parse_examples(text)
    assert parsed == [] and [p.line for p in problems] == [3, 11]


def test_a_library_refuses_a_malformed_memory_file(tmp_path: Path) -> None:
    lib = default_registry().open_library(tmp_path / "lib", create=True)
    good = render_examples([Example("t1", "q", "a")])
    lib.commit({"memory/gsm8k.md": good}, method="test", validate=True)
    preview = lib.preview({"memory/Bad_Name.md": good, "memory/x.md": "## Example t\n\nTask: q\n"})
    rules = sorted(p.rule for p in lib.validator(preview, ["memory/Bad_Name.md",
                                                               "memory/x.md"]))
    assert rules == ["example", "layout"]


# -- extraction, verified by the scorer --------------------------------------------------------


def test_only_runs_the_scorer_passes_become_examples() -> None:
    stats = ExampleStats()
    good = code_trace("good", "Tom has 3 apples and 4 more. How many?", "7", label="7", score=1.0)
    wrong = code_trace("wrong", "Ann has 2 pens and 2 more. How many?", "5", label="4", score=0.0)
    # A stored score the scorer does not confirm (stale, or set by hand) is not trusted.
    stale = code_trace("stale", "Bo has 1 cat and 1 more. How many?", "3", label="2", score=1.0)
    exs = examples_from_traces([good, wrong, stale], stats=stats)
    assert [e.trace_id for e in exs] == ["good"]
    assert stats.to_dict() == {"taken": 1, "not_success": 1, "rescored_failed": 1,
                               "unusable": 0, "too_long": 0}
    # In the model's own output format: its reply, then the program's output as it saw it.
    assert exs[0].solution == "Compute it.\n```python\nprint(7)\n```\n```output\n7\n```"


def test_a_bfcl_run_is_taken_on_its_stored_score() -> None:
    """The bfcl scorer needs the task's function definitions, which a trace does not keep: the
    run cannot be scored again, so its stored verdict stands (before, it was scored 0 against
    no functions and every BFCL run was refused)."""
    call = '{"name": "area", "arguments": {"base": 10}}'
    t = Trace(id="b", task="Area of a base-10 triangle?", answer=call, score=1.0,
              label='[{"area": {"base": [10]}}]', outcome="answered",
              steps=(Step(kind="think", module="think",
                          output={"completion": {"text": f"<tool_call>{call}</tool_call>"}}),),
              meta={"scorer": "bfcl", "task_id": "b"})
    stats = ExampleStats()
    assert example_from_trace(t, stats=stats) is not None and stats.rescored_failed == 0


def test_a_run_with_a_failed_step_is_not_an_example() -> None:
    t = code_trace("t", "q 1", "1", label="1", score=1.0)
    broken = t.with_(steps=(*t.steps, Step(kind="observe", module="think", error="bad call")))
    stats = ExampleStats()
    assert example_from_trace(broken, stats=stats) is None and stats.unusable == 1


def program_trace(tid: str, prose: str, code: str, printed: str, answer: str) -> Trace:
    """A run whose reply wraps its program in prose (as the 0.5B often writes)."""
    reply = f"{prose}\n```python\n{code}\n```"
    return Trace(
        id=tid, task=f"task {tid}", answer=answer, label="30", score=1.0, outcome="answered",
        steps=(Step(kind="think", module="think", output={"completion": {"text": reply}}),
               Step(kind="act", module="act", input={"tool": "python",
                                                     "arguments": {"code": code}},
                    output={"observation": printed, "form": "code"})),
        meta={"scorer": "numeric", "task_id": tid})


def test_the_program_form_keeps_only_the_program_that_printed_the_answer() -> None:
    wrong_prose = "3/4 of 120 is 180, so 120 - 180 = 40 are empty."
    code = "total = 15 * 8\nprint(total - total * 3 / 4)"
    t = program_trace("p", wrong_prose, code, "30.0\n", "30.0")
    full = example_from_trace(t)
    assert full is not None and wrong_prose in full.solution
    ex = example_from_trace(t, form="program")
    assert ex is not None and wrong_prose not in ex.solution
    assert ex.solution == f"```python\n{code}\n```\n```output\n30.0\n```"
    # A run whose answer is not what its program printed (answered in prose after it) gives
    # no program example: the program is not what the scorer verified.
    prose_answer = program_trace("q", "", "print(29)", "29\n", "30")
    stats = ExampleStats()
    assert example_from_trace(prose_answer, stats=stats, form="program") is None
    assert stats.unusable == 1
    # A run with no program (a prose answer) gives none either; the default form keeps it.
    plain = Trace(id="r", task="task r", answer="30", label="30", score=1.0,
                  outcome="answered", meta={"scorer": "numeric", "task_id": "r"},
                  steps=(Step(kind="think", module="think",
                              output={"completion": {"text": "15 * 2 = 30"}}),))
    assert example_from_trace(plain, form="program") is None
    assert example_from_trace(plain) is not None
    with pytest.raises(ValueError, match="form"):
        example_from_trace(t, form="programs")


# -- nearest examples within the budget --------------------------------------------------------


EXAMPLES = [Example("apples", "Tom buys apples for dollars; how many apples in total?", "a" * 40),
            Example("trains", "A train travels miles per hour; how far does it go?", "b" * 40),
            Example("apples2", "Sue sells apples for dollars; how many apples left?", "c" * 400)]


def test_nearest_examples_come_first_and_fit_the_budget() -> None:
    r = ExampleRetriever(WordEmbedder())
    task = "Ann buys apples for dollars; how many apples does she have?"
    wide = r.nearest(task, EXAMPLES, k=2, budget_tokens=10_000, count_tokens=approx_tokens)
    assert wide.trace_ids[0] in {"apples", "apples2"} and "trains" not in wide.trace_ids
    assert wide.scores == tuple(sorted(wide.scores, reverse=True))
    # A budget too small for the long one skips it for the next that fits.
    tight = r.nearest(task, EXAMPLES, k=2, budget_tokens=80, count_tokens=approx_tokens)
    assert "apples2" not in tight.trace_ids and tight.tokens <= 80 and tight.trace_ids
    assert r.nearest(task, EXAMPLES, k=2, budget_tokens=5,
                     count_tokens=approx_tokens).text == ""
    # The example of the very task asked is never shown (no answer leaks).
    same = r.nearest(EXAMPLES[0].task, EXAMPLES, k=3, budget_tokens=10_000,
                     count_tokens=approx_tokens)
    assert "apples" not in same.trace_ids


# -- the memory baseline -----------------------------------------------------------------------

# Six: six tasks that flip are a clear gain (McNemar p = 0.03), four are not (p = 0.125).
TASKS = [TaskRecord(id=f"q{i}", question=f"Tom has {i} apples and gets {i} more. How many apples?",
                    expected=str(2 * i), scorer="numeric") for i in range(1, 7)]


def model_that_copies(request: Request) -> str:
    """A stand-in for a small model: right only when a worked example is in its prompt."""
    system = request.messages[0].text if request.messages[0].role == "system" else ""
    n = int(request.messages[-1].text.split("has ")[1].split(" ")[0])
    return f"Final Answer: {2 * n if 'Solution:' in system else n}"


def test_memory_keeps_verified_runs_and_the_runtime_shows_the_nearest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from whetstone.library_store import embeddings

    monkeypatch.setattr(embeddings, "query_embedder",
                        lambda threads=1: WordEmbedder())
    lib = default_registry().open_library(tmp_path / "lib", create=True)
    train = [code_trace(f"tr{i}", f"Ann has {i} pens and gets {i} more. How many pens?",
                        str(2 * i), label=str(2 * i), score=1.0) for i in range(1, 4)]
    train.append(code_trace("bad", "Ann has 9 pens and 9 more. How many?", "9", label="18",
                            score=0.0))
    patch = Memory(MemoryConfig(name="gsm8k")).fit(train, lib.snapshot(), ScriptedBackend())
    assert list(patch.changes) == ["memory/gsm8k.md"]
    assert patch.details["added"] == ["tr1", "tr2", "tr3"]
    assert patch.details["examples"]["not_success"] == 1
    engine = Engine(ScriptedBackend(responder=model_that_copies), library=lib.root,
                    methods=[("memory", {"k": 2})], checkpointing=False, solver="direct")
    result = gate_and_apply(patch, engine.library,
                            make_solver=lambda s: engine.solver(snapshot=s), gate_tasks=TASKS)
    assert result.decision is not None and result.decision.accepted
    assert (result.decision.current_score, result.decision.candidate_score) == (0.0, 1.0)
    trace = engine.solver()(TASKS[0], 0)
    shown = trace.meta["memory"]
    assert len(shown["shown"]) == 2 and shown["available"] == 3 and shown["tokens"] > 0
    # Refitting adds only new tasks: the memory keeps one example per task.
    again = Memory(MemoryConfig(name="gsm8k")).fit(train, engine.library.snapshot(),
                                                   ScriptedBackend())
    assert again.empty


def test_memory_is_registered_as_an_evolver_and_a_runtime_method() -> None:
    reg = default_registry()
    assert "memory" in reg.names("evolver") and "memory" in reg.names("runtime")
    assert "self_consistency" in reg.names("runtime")
    assert reg.entry("evolver", "memory").load().runtime_methods == ("memory",)


# -- self-consistency --------------------------------------------------------------------------


def test_self_consistency_answers_with_the_majority_and_counts_every_sample(
        tmp_path: Path) -> None:
    answers = iter(["The answer is 7", "Final Answer: 8", "so 7.0", "no idea at all", "8"])
    temps: list[float] = []

    def model(request: Request) -> str:
        temps.append(request.temperature)
        return next(answers)

    engine = Engine(ScriptedBackend(responder=model), library=tmp_path / "lib", create=True,
                    methods=[("self_consistency", {"n": 5, "temperature": 0.9})],
                    checkpointing=False, solver="direct")
    task = TaskRecord(id="q", question="What is 3 + 4?", expected="7", scorer="numeric")
    result = evaluate([task], engine.solver(), store=engine.traces)
    trace = engine.traces.get(result.results[0].trace_id)
    sc = trace.meta["self_consistency"]
    assert sc["answer"] == "7" and sc["votes"] == {"7": 2, "8": 2, "no idea at all": 1}
    assert sc["chosen"] == 0  # a tie goes to the answer reached first
    assert result.results[0].score == 1.0 and temps == [0.9] * 5
    assert sc["tokens"] == sum(s["tokens"] for s in sc["samples"])
    assert result.results[0].tokens == sc["tokens"] > trace.steps[0].tokens
    assert len({s["trace_id"] for s in sc["samples"]}) == 5


def test_self_consistency_stops_at_its_token_budget_and_leaves_single_runs_greedy(
        tmp_path: Path) -> None:
    temps: list[float] = []

    def model(request: Request) -> str:
        temps.append(request.temperature)
        return "Final Answer: 7"

    sc = SelfConsistency(SelfConsistencyConfig(n=10, max_total_tokens=1))
    engine = Engine(ScriptedBackend(responder=model), library=tmp_path / "lib", methods=[sc],
                    checkpointing=False, create=True)
    task = TaskRecord(id="q", question="What is 3 + 4?", expected="7")
    trace = engine.solver()(task, 0)
    assert trace.meta["self_consistency"]["drawn"] == 1
    temps.clear()
    engine.run("What is 3 + 4?")
    assert temps and set(temps) == {0.0}


def test_a_tool_task_votes_with_its_calls() -> None:
    tools = ({"type": "function", "function": {"name": "area", "parameters": {}}},)
    task = TaskRecord(id="b", question="area of 3", tools=tools, expected=[], scorer="bfcl")
    call = Step(kind="act", module="act", input={"tool": "area", "arguments": {"r": 3}})
    t = Trace(id="x", task="area of 3", steps=(call,), answer="", outcome="answered")
    assert vote_of(t, task) == '[["area", {"r": 3}]]'
    assert vote_of(t.with_(steps=()), task) is None


@pytest.mark.parametrize("answer,vote", [("The answer is 1,200.", "1200"), ("", None),
                                         ("Final Answer: Paris", "paris")])
def test_votes_read_answers_like_the_scorers(answer: str, vote: str | None) -> None:
    assert vote_of(Trace(id="x", task="q", answer=answer, outcome="answered")) == vote


def test_tasks_from_traces_is_importable() -> None:
    assert callable(tasks_from_traces)


# -- Trace2Skill with examples -----------------------------------------------------------------


def _t2s_traces() -> list[Trace]:
    good = [code_trace(f"s{i}", f"Tom has {i} apples and {i} more. How many?", str(2 * i),
                       label=str(2 * i), score=1.0) for i in (1, 2, 3)]
    bad = code_trace("f", "Tom has 5 apples and 5 more. How many?", "5", label="10", score=0.0)
    return [*good, bad]


def t2s_analyst(request: Request) -> str:
    """Small-model slips on purpose: synonyms, 'this' for an id, junk, a failed run offered."""
    user = request.messages[-1].text
    user = user.split("The skill also keeps")[0]
    run = re.search(r"Tom has (\d) apples", user)
    n = run.group(1) if run else "?"
    if n == "1":
        return json.dumps({"edits": [], "examples": [{"action": "keep", "trace": "this"}]})
    if n == "2":  # examples only, no edits: still a whole reply; a bare action word
        return json.dumps({"examples": ["skip"]})
    if n == "5":
        return json.dumps({
            "edits": [{"file": "references/examples.md", "op": "create", "content": "x"},
                      {"file": "SKILL.md", "op": "append_to_section",
                       "target_section": "Pitfalls", "content": "- Add both amounts."}],
            "examples": [{"action": "add", "trace": "this"}, {"action": "frobnicate"}, 7]})
    return "not json at all"  # run 3: the reply is dropped, the run is still a default add


@pytest.mark.parametrize("sequential", [False, True])
def test_trace2skill_keeps_verified_examples_chosen_by_the_analysts(sequential: bool) -> None:
    from whetstone.engine.methods.trace2skill.evolver import Trace2Skill, Trace2SkillConfig

    t2s = Trace2Skill(Trace2SkillConfig("adding", create=True, examples=True, workers=1,
                                        sequential=sequential))
    patch = t2s.fit(_t2s_traces(), {}, ScriptedBackend(responder=t2s_analyst))
    text = patch.changes["skills/adding/references/examples.md"]
    assert [e.trace_id for e in parse_examples(text)[0]] == ["s1", "s3"]
    assert "```output\n2\n```" in text  # the run's own output, not an analyst's rewrite
    assert "references/examples.md" in patch.changes["skills/adding/SKILL.md"]
    rep = patch.details["report"]["examples"]
    assert rep["skipped"] == ["s2"] and rep["edits_dropped"] == 1
    # 'this' twice and a bare word repaired; a failed run's add, an unknown action and a
    # non-object dropped, each counted.
    assert (rep["repaired"], rep["dropped"]) == (3, 3)
    assert "- Add both amounts." in patch.changes["skills/adding/SKILL.md"]


def test_trace2skill_retires_and_replaces_examples_and_respects_the_cap() -> None:
    from whetstone.engine.methods.trace2skill.evolver import Trace2Skill, Trace2SkillConfig

    old = render_examples([Example("o1", "Old task one", "1"), Example("o2", "Old task two", "2")])
    skill = "---\nname: adding\ndescription: Adding.\n---\n# Adding\n\n## Pitfalls\n"
    files = {"skills/adding/SKILL.md": skill, "skills/adding/references/examples.md": old}

    def analyst(request: Request) -> str:
        text = request.messages[-1].text
        if "Tom has 1 apples" in text[text.index("This run"):]:
            return json.dumps({"edits": [], "examples": [
                {"action": "replace", "trace": "this", "old": "o1"},
                {"action": "remove", "trace": "o2"}]})
        return json.dumps({"edits": []})

    t2s = Trace2Skill(Trace2SkillConfig("adding", examples=True, max_examples=2, workers=1))
    patch = t2s.fit(_t2s_traces(), files, ScriptedBackend(responder=analyst))
    kept = parse_examples(patch.changes["skills/adding/references/examples.md"])[0]
    assert [e.trace_id for e in kept] == ["s1", "s2"]  # o1 replaced, o2 retired, cap of 2
    rep = patch.details["report"]["examples"]
    assert rep["replaced"] == [["o1", "s1"]] and rep["retired"] == ["o2"]


def test_the_skills_runtime_shows_the_nearest_examples_of_a_shown_skill(tmp_path: Path) -> None:
    from whetstone.engine.runtime.skills_plugin import SkillsPlugin
    from whetstone.engine.runtime.state import AgentContext
    from whetstone.skills.index import LibraryIndex
    from whetstone.skills.retrieval import SkillRetriever
    from whetstone.tools.base import Toolbox

    lib = default_registry().open_library(tmp_path / "lib", create=True)
    skill = "---\nname: adding\ndescription: Word problems that add apples.\n---\n# Adding\n"
    exs = [Example("s1", "Tom has 1 apples and 1 more. How many?", "print(2)"),
           Example("t9", "A train goes 60 miles an hour for 2 hours. How far?", "print(120)")]
    lib.commit({"skills/adding/SKILL.md": skill,
                "skills/adding/references/examples.md": render_examples(exs)},
               method="test", validate=True)
    retriever = SkillRetriever(lib, LibraryIndex(lib, WordEmbedder()))
    plugin = SkillsPlugin(lib, retriever=retriever, examples=1)
    ctx = AgentContext(backend=ScriptedBackend(), toolbox=Toolbox())
    g = plugin.guidance("Ann has 4 apples and 3 more. How many?", ctx, 1200)
    assert g is not None and g.meta["examples"] == ["s1"] and "print(2)" in g.text
    assert "print(120)" not in g.text
    small = plugin.guidance("Ann has 4 apples and 3 more. How many?", ctx,
                            ctx.backend.count_tokens(g.text) - 5)
    assert small is not None and "examples" not in small.meta


def test_a_scoreboard_row_evolves_with_its_own_analyst(tmp_path: Path) -> None:
    from scoreboard_harness.runner import Runner, load_plan

    plan = load_plan(Path(__file__).parents[1] / "benchmarks" / "scoreboard.yaml")
    rows = {r.id: r for r in plan.rows}
    for set_ in ("gsm8k", "bfcl-simple", "bfcl-multiple"):
        for name in ("memory", "self-consistency", "trace2skill-parallel",
                     "trace2skill-sequential", "trace2skill-examples"):
            assert f"{set_}/{name}" in rows
    assert rows["gsm8k/trace2skill-examples-1.5b"].evolve.analyst == "embedded:qwen-1.5b"
    replies = tmp_path / "replies.json"
    replies.write_text('["ok"]', encoding="utf-8")
    agent, analyst = ScriptedBackend(), ScriptedBackend()
    runner = Runner(plan, agent, analyst, tmp_path)
    assert runner.analyst_for(rows["gsm8k/trace2skill-parallel"]) is analyst
    own = rows["gsm8k/trace2skill-examples"]
    from dataclasses import replace

    mine = replace(own, evolve=replace(own.evolve, analyst=f"scripted:{replies}"))
    loaded = runner.analyst_for(mine)
    assert loaded is not analyst and loaded.spec.startswith("scripted:")
    assert runner.analyst_for(mine) is loaded  # loaded once
