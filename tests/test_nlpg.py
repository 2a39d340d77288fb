"""NLPG's parts with scripted analysts: the policy file format, the backward pass, the bounded
update, retirement, repairs of malformed analyst output, and the runtime method."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest
from nlpg_support import RUBRIC, analyst, trace

from whetstone.engine.api import open_library
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import ValidationError
from whetstone.engine.methods.nlpg.backward import (
    Correction,
    WalkSettings,
    aggregate,
    parse_blame,
    visits_of,
    walk_trace,
)
from whetstone.engine.methods.nlpg.curator import curate, parse_ops
from whetstone.engine.methods.nlpg.memory import (
    Op,
    apply_ops,
    count_uses,
    estimate_tokens,
    note_tokens,
    retire_ops,
    rules_curator,
)
from whetstone.engine.methods.nlpg.notes import PolicyNote, parse_policy, read_policy, render_policy
from whetstone.engine.methods.nlpg.plugin import NLPGPlugin, policy_notes
from whetstone.engine.runtime.state import AgentContext
from whetstone.tools.base import Toolbox

# -- the file format ---------------------------------------------------------------------------

GOOD = """# Policy notes: think
[n1] route=finish helpful=2 harmful=1 :: Recompute each product before answering.

[n2] :: Keep the units: apples stay apples.
[n3] route=act harmful=0 :: Write the whole expression in one calculator call; a::b is fine.
"""


@pytest.mark.nlpg
def test_a_policy_file_reads_and_writes_back() -> None:
    notes = parse_policy(GOOD, "think")
    assert [(n.id, n.route, n.helpful, n.harmful) for n in notes] == [
        ("n1", "finish", 2, 1), ("n2", "*", 0, 0), ("n3", "act", 0, 0)]
    assert notes[2].text.endswith("a::b is fine.") and notes[0].module == "think"
    text = render_policy("think", notes)
    assert "[n2] route=* helpful=0 harmful=0 :: Keep the units" in text
    assert parse_policy(text, "think") == notes


@pytest.mark.nlpg
def test_a_policy_note_round_trips_through_json() -> None:
    note = PolicyNote("n1", "think", "Check units", "act", 2, 1)
    assert PolicyNote.from_dict(json.loads(json.dumps(note.to_dict()))) == note


@pytest.mark.nlpg
@pytest.mark.parametrize(("line", "rule", "advice"), [
    ("Recompute before answering.", "note-syntax", "one note per line"),
    ("[n 1] :: text", "note-id", "an id is"),
    ("[n1] colour=red :: text", "note-field", "fields are route="),
    ("[n1] helpful=two :: text", "note-field", "whole number"),
    ("[n1] helpful=1 helpful=2 :: text", "note-field", "each field once"),
    ("[n1] route=Final! :: text", "note-field", "a route is"),
    ("[n1] route=act ::   ", "note-empty", "write the rule"),
    ("[n1] :: " + "x" * 700, "note-too-long", "shorten"),
])
def test_a_malformed_line_is_a_clear_error_with_its_line(line: str, rule: str,
                                                         advice: str) -> None:
    text = "# Policy notes: think\n[n0] :: fine\n" + line + "\n"
    with pytest.raises(ValidationError) as err:
        parse_policy(text, "think")
    assert (err.value.rule, err.value.line, err.value.path) == (rule, 3, "policies/think.md")
    assert advice in (err.value.hint or "")
    notes, problems = read_policy(text, "think")  # lenient: the good note survives
    assert [n.id for n in notes] == ["n0"] and len(problems) == 1


@pytest.mark.nlpg
def test_a_repeated_id_is_refused_and_the_writer_never_writes_what_the_reader_refuses() -> None:
    _, problems = read_policy("[n1] :: a\n[n1] :: b\n", "think")
    assert [p.rule for p in problems] == ["note-duplicate-id"]
    with pytest.raises(ValidationError, match="note-id"):
        render_policy("think", [PolicyNote(id="bad id", module="think", text="x")])
    with pytest.raises(ValidationError, match="policy-module"):
        render_policy("Think!", [])


@pytest.mark.nlpg
def test_a_commit_with_a_malformed_policy_file_is_refused(tmp_path: Path) -> None:
    lib = open_library(tmp_path / "lib", create=True)
    with pytest.raises(ValidationError, match="note-syntax") as err:
        lib.commit({"policies/think.md": "[n1] :: ok\njust prose\n"}, method="hand",
                   validate=True)
    assert err.value.line == 2
    with pytest.raises(ValidationError, match="policy-path"):
        lib.commit({"policies/deep/think.md": "[n1] :: ok\n"}, method="hand",
                   validate=True)
    v = lib.commit({"policies/think.md": GOOD}, method="hand", validate=True)
    assert v.id == "v2"


# -- the backward pass -------------------------------------------------------------------------


@pytest.mark.nlpg
def test_blame_flows_from_the_last_module_backwards_with_rewritten_feedback() -> None:
    asked: list[dict[str, str]] = []

    def verdict(parts: dict[str, str]) -> dict[str, object]:
        asked.append(parts)
        n = len(asked)
        return {"blame": 0.5, "correction": f"rule {n} for {parts['module']}",
                "upstream": f"critique {n} from {parts['module']}", "misleading_notes": []}

    t = trace("t1")  # rubric, think->act, act, rubric, think->finish
    assert [(v.module, v.route) for v in visits_of(t)] == [
        (RUBRIC, "think"), ("think", "act"), (RUBRIC, "think"), ("think", "finish")]
    walk = asyncio.run(walk_trace(t, analyst(verdict), {}, expected="7", success=False,
                                  settings=WalkSettings(max_visits=4, min_weight=0.2)))
    # Last module first, then upstream, one visit at a time.
    assert [(p["module"], p["route"]) for p in asked] == [
        ("think", "finish"), (RUBRIC, "think"), ("think", "act")]
    # The outcome starts the walk; upstream visits see the analyst's critique, not the outcome.
    assert "The run failed" in asked[0]["feedback"] and "Expected answer: 7" in asked[0]["text"]
    assert asked[1]["feedback"].strip() == "critique 1 from think"
    assert asked[2]["feedback"].strip() == f"critique 2 from {RUBRIC}"
    assert all("Expected answer" not in p["text"] for p in asked[1:])
    # Each share is the blame times the weight left: 0.5, 0.25, 0.125; what is left then
    # (0.125) is below min_weight, so the first visit is not asked.
    assert [(c.module, c.route, c.weight) for c in walk.corrections] == [
        ("think", "finish", 0.5), (RUBRIC, "think", 0.25), ("think", "act", 0.125)]
    # What happened after each visit is what the analyst reads (the tool's result here).
    assert "tool calculator returned: 7" in asked[2]["text"]


@pytest.mark.nlpg
def test_the_walk_stops_where_the_problem_started() -> None:
    replies = iter([{"blame": 1.0, "correction": "Add, do not subtract.", "upstream": ""}])
    backend = analyst(lambda parts: next(replies))
    walk = asyncio.run(walk_trace(trace("t1"), backend, {}, expected="7", success=False,
                                  settings=WalkSettings()))
    assert len(backend.requests) == 1 and len(walk.corrections) == 1
    assert walk.corrections[0].weight == 1.0


@pytest.mark.nlpg
def test_malformed_verdicts_are_repaired_or_dropped_with_a_count() -> None:
    got = parse_blame('Sure! ```json\n{"share": "70%", "rule": ["Check units", "twice"], '
                      '"feedback": 3, "misleading_notes": "n1"}\n```', shown={"n1"})
    assert (got.blame, got.correction, got.upstream, got.misleading) == (
        0.7, "Check units; twice", "3", ("n1",))
    assert len(got.repairs) >= 5
    assert parse_blame('{"blame": 80, "correction": "x"}').blame == 0.8
    assert parse_blame('{"blame": "high", "correction": "x"}').blame == 0.75
    assert parse_blame('{"correction": "x", "misleading_notes": ["n9"]}').misleading == ()
    # Unreadable twice: asked once more with the error, then dropped and counted; the walk
    # stops there (there is no critique to pass upstream).
    backend = analyst(lambda parts: "I think the model was wrong.")
    walk = asyncio.run(walk_trace(trace("t1"), backend, {}, expected="7", success=False,
                                  settings=WalkSettings()))
    assert (walk.stats.calls, walk.stats.retries, walk.stats.dropped) == (2, 1, 1)
    assert "I think the model was wrong" in walk.stats.errors[0]
    assert walk.corrections == [] and walk.visits[0]["dropped"] is True


@pytest.mark.nlpg
def test_corrections_fold_per_module_and_route() -> None:
    groups = aggregate([
        Correction("think", "finish", "Check the units before answering.", 0.5, "a"),
        Correction("think", "finish", "Check the units before you answer.", 0.25, "b"),
        Correction("think", "act", "Check the units before answering.", 0.3, "c"),
        Correction(RUBRIC, "think", "Weight the arithmetic check highest.", 0.9, "d")])
    assert [(g.route, round(g.support, 2), g.traces) for g in groups["think"]] == [
        ("finish", 0.75, ["a", "b"]), ("act", 0.3, ["c"])]
    assert [g.text for g in groups[RUBRIC]] == ["Weight the arithmetic check highest."]


# -- the bounded update ------------------------------------------------------------------------


def distinct(k: int, words: int = 8) -> str:
    """A rule that shares no word with any other ``distinct`` rule."""
    return " ".join(f"w{k}x{j}" for j in range(words))


def note(i: int, text: str | None = None, **kw: object) -> PolicyNote:
    return PolicyNote(id=f"n{i}", module="think", text=text or distinct(100 + i, 6),
                      **kw)  # type: ignore[arg-type]


@pytest.mark.nlpg
def test_the_update_never_applies_more_than_four_ops_nor_goes_over_budget() -> None:
    notes = [note(1), note(2)]
    ops = [Op("ADD", text=distinct(k)) for k in range(10)]
    kept, rep = apply_ops("think", notes, ops, max_ops=4, budget=10_000, count=estimate_tokens)
    assert len(rep.applied) == 4 and rep.refused["over_ops"] == 6 and len(kept) == 6
    small = 40
    kept, rep = apply_ops("think", notes, ops, max_ops=4, budget=small, count=estimate_tokens)
    assert note_tokens(kept, estimate_tokens) <= small and rep.refused["over_budget"] > 0
    # An ADD that restates a note folds into AGREE on it: the note moves to the front.
    kept, rep = apply_ops("think", [note(1), note(2, "Check the units twice.")],
                          [Op("ADD", text="check the units twice")], max_ops=4, budget=500,
                          count=estimate_tokens)
    assert [o.kind for o in rep.applied] == ["AGREE"] and kept[0].id == "n2"


@pytest.mark.nlpg
def test_edit_remove_and_unknown_ids() -> None:
    ops = [Op("EDIT", id="n1", text="A better rule."), Op("REMOVE", id="n2"),
           Op("REMOVE", id="n9"), Op("EDIT", id="n3", text="")]
    kept, rep = apply_ops("think", [note(1), note(2), note(3)], ops, max_ops=4, budget=500,
                          count=estimate_tokens)
    assert [(n.id, n.text) for n in kept][:1] == [("n1", "A better rule.")]
    assert [n.id for n in kept] == ["n1", "n3"]
    assert rep.refused == Counter({"unknown_id": 1, "invalid": 1})


@pytest.mark.nlpg
def test_a_library_over_budget_is_trimmed_lowest_value_first() -> None:
    notes = [note(1, helpful=3), note(2), note(3, harmful=1)]
    kept, rep = apply_ops("think", notes, [], max_ops=4, budget=12, count=estimate_tokens)
    assert note_tokens(kept, estimate_tokens) <= 12
    assert [o.id for o in rep.applied] == ["n3", "n2"] and [n.id for n in kept] == ["n1"]


@pytest.mark.nlpg
def test_a_module_far_over_budget_is_trimmed_past_the_bound_and_says_so() -> None:
    notes = [note(i) for i in range(8)]
    kept, rep = apply_ops("think", notes, [Op("ADD", text=distinct(50))], max_ops=4,
                          budget=25, count=estimate_tokens)
    assert note_tokens(kept, estimate_tokens) <= 25  # the budget wins over the bound
    assert len(rep.applied) == 4 and rep.refused["trim_past_bound"] == 2
    assert rep.refused["over_ops"] == 1  # nothing else lands in that step


@pytest.mark.nlpg
def test_a_harmful_note_is_retired() -> None:
    notes = [note(1), note(2), note(3, helpful=2)]
    counted = count_uses({"think": notes}, Counter({("think", "n3"): 1}),
                         Counter({("think", "n1"): 1, ("think", "n3"): 2}))["think"]
    assert [(n.helpful, n.harmful) for n in counted] == [(0, 1), (0, 0), (3, 2)]
    ops = retire_ops(counted)
    assert [(o.kind, o.id, o.reason) for o in ops] == [("REMOVE", "n1", "retired")]
    kept, _ = apply_ops("think", counted, ops, max_ops=4, budget=500, count=estimate_tokens)
    assert [n.id for n in kept] == ["n2", "n3"]


@pytest.mark.nlpg
def test_the_rules_curator_makes_room_only_from_unproven_notes() -> None:
    groups = aggregate([Correction("think", "finish", "Say the unit with the number.", 1.0,
                                   "a")])["think"]
    full = [note(1, helpful=2), note(2)]
    budget = note_tokens(full, estimate_tokens) + 2
    ops = rules_curator(full, groups, max_ops=4, budget=budget, count=estimate_tokens)
    assert [(o.kind, o.id) for o in ops] == [("REMOVE", "n2"), ("ADD", "")]
    proven = [note(1, helpful=2), note(2, helpful=1)]
    assert rules_curator(proven, groups, max_ops=4, budget=budget, count=estimate_tokens) == []


@pytest.mark.nlpg
def test_curator_replies_are_repaired_or_dropped_with_a_count() -> None:
    got = parse_ops('[{"op": "add", "route": "nowhere", "text": "- Check the sign."}, '
                    '{"op": "AGREE", "id": "[n1]"}, {"op": "EDIT", "id": "n7", "text": "x"}, '
                    '{"op": "SHOUT"}, "not an op"]', ids={"n1"}, routes={"*", "finish"})
    assert [(o.kind, o.id, o.route, o.text) for o in got.ops] == [
        ("ADD", "", "*", "Check the sign."), ("AGREE", "n1", "*", "")]
    assert got.dropped == 3 and len(got.repairs) == 3
    groups = aggregate([Correction("think", "finish", "Say the unit.", 1.0, "a")])["think"]
    backend = ScriptedBackend(["no idea", "still no idea"])
    result = asyncio.run(curate("think", [], groups, analyst=backend, max_ops=4, budget=100,
                                count=estimate_tokens))
    assert result.fallback and result.stats.dropped == 1
    assert [o.kind for o in result.ops] == ["ADD"]  # the rules took over


# -- the runtime method ------------------------------------------------------------------------


def _ctx(plugin: NLPGPlugin) -> AgentContext:
    return AgentContext(backend=ScriptedBackend(), toolbox=Toolbox([]), plugins=[plugin])


@pytest.mark.nlpg
def test_each_module_sees_only_its_own_notes_and_only_for_its_route() -> None:
    memory = {"think": [note(1, "Use the calculator for every product.", route="act"),
                        note(2, "State the number alone.", route="finish"),
                        note(3, "Read the question twice.")],
              RUBRIC: [PolicyNote(id="r1", module=RUBRIC, text="Weight arithmetic highest.",
                                  route="think"),
                       PolicyNote(id="r2", module=RUBRIC, text="Only before answers.",
                                  route="finish")]}
    plugin = NLPGPlugin(memory=memory)
    g = plugin.guidance("task", _ctx(plugin), 1000)
    assert g is not None and g.meta["shown"] == {"think": ["n1", "n2", "n3"]}
    assert "Weight arithmetic" not in g.text  # the rubric's notes stay out of think's prompt
    assert g.text.index("Always:") < g.text.index("When you call a tool:\n- Use the "
                                                  "calculator") < g.text.index(
        "When you give the final answer:\n- State the number alone.")
    node = policy_notes(_ctx(plugin), RUBRIC, "think")
    assert node.ids == ("r1",) and "Only before answers" not in node.text
    assert policy_notes(AgentContext(backend=ScriptedBackend(), toolbox=Toolbox([])),
                        RUBRIC).ids == ()  # no nlpg method in the run: no notes
    tight = plugin.module_notes("think", None, estimate_tokens, budget_tokens=12)
    assert tight.ids == ("n1",)  # front first, within the budget
    state = {"meta": {"nlpg": {"shown": {"think": ["n1"]}}},
             "steps": [{"module": RUBRIC, "meta": {"policy_notes": ["r1"]}}]}
    assert plugin.finish_meta(state) == {"shown": {"think": ["n1"], RUBRIC: ["r1"]}}  # type: ignore[arg-type]
