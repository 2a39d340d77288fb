"""A scorer the user chooses (issue 45, item 2), through the command line: `--scorer` on
`evolve`, `traces import` and the gate; a gate whose paired tasks mostly score 0 on both
sides says the scorer may not fit and shows answer/label pairs; `contains` credits no hedge;
the strict `value` scorer reads the answer's one value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.evaluation.scorers import get_scorer
from whetstone.engine.evaluation.tasks import TaskRecord, split_of
from whetstone.library_store.store import Library

ROPES = range(1, 7)


def rope(i: int) -> str:
    return f"How long is rope number {i}?"


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def held_out(tmp_path: Path) -> Path:
    """Six gate tasks whose labels are bare numbers ("3.5")."""
    path = tmp_path / "held.jsonl"
    path.write_text("".join(json.dumps({"id": f"h{i}", "question": rope(i),
                                        "expected": f"{i}.5"}) + "\n" for i in ROPES))
    return path


def imported_log(tmp_path: Path, n: int, first: int = 100, **extra: Any) -> Path:
    """A team's log: the model answers with a unit ("3.5 meters"), the label is the number."""
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps({
        "id": f"req-{i}", "expected": f"{i}.5", **extra,
        "messages": [{"role": "user", "content": rope(i)},
                     {"role": "assistant", "content": f"{i}.5 meters"}]}) + "\n"
        for i in range(first, first + n)))
    return path


def evolve_memory(tmp_path: Path, answers: list[str], *args: str) -> dict[str, Any]:
    (tmp_path / "replies.json").write_text(json.dumps(
        [f"Final Answer: {a}" for a in answers * 2]))  # the gate: current, then candidate
    res = invoke("evolve", "memory", "--library", str(tmp_path / "lib"), "--model",
                 f"scripted:{tmp_path / 'replies.json'}", "--traces", "source=import",
                 "--tools", "", "-j", "1", "--json", *args)
    assert res.exit_code == 0, res.output
    return dict(json.loads(res.stdout))


def test_a_gate_on_a_scorer_that_does_not_fit_says_so_and_scorer_fixes_it(
        tmp_path: Path) -> None:
    Library.init(tmp_path / "lib")
    # a reviewer marked the logged answers right: memory keeps them, and the gate runs
    assert invoke("traces", "import", str(imported_log(tmp_path, 3, score=1)), "--library",
                  str(tmp_path / "lib")).exit_code == 0
    gate = held_out(tmp_path)
    answers = [f"{i}.5 meters" for i in ROPES]
    # The labels hold no unit: normalised exact match scores every answer 0 on both sides.
    d = evolve_memory(tmp_path, answers, "--gate-tasks", str(gate))["decision"]
    assert (d["current_score"], d["candidate_score"]) == (0.0, 0.0)
    assert d["scorer"] == "normalised" and d["scorer_fit"]["both_zero"] == 6
    assert d["scorer_fit"]["pairs"][:3] == [
        {"task": f"h{i}", "answer": f"{i}.5 meters", "label": f"{i}.5"} for i in (1, 2, 3)]
    assert any(why.startswith("the scorer (normalised) may not fit: 6 of 6 paired tasks "
                              "scored 0 on both sides; answer for label: '1.5 meters' for "
                              "'1.5'; '2.5 meters' for '2.5'; '3.5 meters' for '3.5'")
               for why in d["reasons"])
    # The team's metric, chosen: every answer is right on both sides, nothing to warn of.
    d = evolve_memory(tmp_path, answers, "--gate-tasks", str(gate), "--scorer",
                      "value")["decision"]
    assert (d["current_score"], d["candidate_score"]) == (1.0, 1.0)
    assert d["scorer"] == "value" and d["scorer_fit"] is None
    assert not any("may not fit" in why for why in d["reasons"])


def test_traces_import_scorer_scores_the_log_and_the_gate_uses_it(tmp_path: Path) -> None:
    Library.init(tmp_path / "lib")
    log = imported_log(tmp_path, 30)
    res = invoke("traces", "import", str(log), "--library", str(tmp_path / "lib"),
                 "--scorer", "value", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["scorer"] == {"name": "value", "labelled": 30, "scored": 30}
    traces = Library.open(tmp_path / "lib").traces.query()
    assert {t.score for t in traces} == {1.0} and {t.meta["scorer"] for t in traces} == {
        "value"}
    # The default gate holds out the dev-split questions and scores them as recorded.
    dev = [i for i in range(100, 130) if split_of(rope(i)) == "dev"]
    d = evolve_memory(tmp_path, [f"{i}.5 meters" for i in dev])["decision"]
    assert d["scorer"] == "value" and d["n_tasks"] == len(dev) > 0
    assert d["current_score"] == 1.0
    # Without --scorer the same log is judged by normalised exact match: every answer 0.
    Library.init(tmp_path / "plain")
    res = invoke("traces", "import", str(log), "--library", str(tmp_path / "plain"))
    assert res.exit_code == 0
    assert {t.score for t in Library.open(tmp_path / "plain").traces.query()} == {None}


def test_an_unknown_scorer_fails_before_anything_loads(tmp_path: Path) -> None:
    res = invoke("evolve", "memory", "--scorer", "nosuch", "--model", "embedded",
                 "--library", str(tmp_path / "lib"))
    assert res.exit_code == 2 and "unknown scorer 'nosuch'" in res.output
    res = invoke("traces", "import", "x.jsonl", "--scorer", "missing.py:f")
    assert res.exit_code == 2 and "scorer file missing.py does not exist" in res.output


def test_contains_and_value_credit_no_hedge_through_eval(tmp_path: Path) -> None:
    tasks = tmp_path / "shop.jsonl"
    ask = "Which tool in the box is the"
    rows = [(f"{ask} priciest?", "hammer", "hammer, saw and drill"),
            (f"{ask} heaviest?", "anvil", "It could be the anvil or the vice"),
            (f"{ask} oldest?", "chisel", f"{ask} oldest?"),  # the question again
            (f"{ask} newest?", "drill", "The newest is the drill.")]
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "question": q, "expected": e})
                             + "\n" for i, (q, e, _) in enumerate(rows)))
    (tmp_path / "replies.json").write_text(json.dumps([f"Final Answer: {a}"
                                                       for _, _, a in rows]))
    Library.init(tmp_path / "lib")
    for scorer in ("contains", "value"):
        res = invoke("eval", "--tasks", str(tasks), "--model",
                     f"scripted:{tmp_path / 'replies.json'}", "--scorer", scorer, "--json",
                     "--library", str(tmp_path / "lib"), "--tools", "")
        assert res.exit_code == 0, res.output
        (result,) = json.loads(res.stdout)["results"]
        assert [r["score"] for r in result["results"]] == [0.0, 0.0, 0.0, 1.0], scorer


@pytest.mark.parametrize(("question", "expected", "answer", "score"), [
    ("How long is the rope?", "2.5", "2.5 meters", 1.0),
    ("How long is the rope?", "2.5 meters", "Final Answer: 2.5", 1.0),
    ("What is the price of item 3?", "12.50", "Item 3 costs $12.495", 1.0),  # money: 0.005
    ("What is the price of item 3?", "12.5", "12.49", 0.0),
    ("What is the weight?", "12.5", "12.5000001", 1.0),  # relative 1e-6
    ("What is the price of item 3?", "12.50", "12.50 or 13.00", 0.0),
    ("What is the total price?", "42", "30 + 12 = 42", 1.0),
    ("What is the total price?", "42", "It is 42, or maybe 43", 0.0),
    ("Which medal did she win?", "silver", "**Silver.**", 1.0),
    ("Which medal did she win?", "silver", "She won the silver medal", 1.0),
    ("Which medal did she win?", "silver", "Gold", 0.0),
    ("Who runs the shop on Main Street?", "Alice Smith", "Alice Smith, Bob Jones", 0.0),
    ("Who runs the shop on Main Street?", "Alice Smith", "Who runs the shop on Main Street?",
     0.0),
    ("How many pens are in stock?", "17", "1,700", 0.0),
])
def test_value_reads_the_one_value_of_the_answer(question: str, expected: str, answer: str,
                                                 score: float) -> None:
    task = TaskRecord(id="t", question=question, expected=expected)
    assert get_scorer("value")(answer, task) == score


def test_value_and_contains_know_the_tasks_candidates() -> None:
    task = TaskRecord(id="t", question="Which medal did she win?", expected="silver",
                      metadata={"candidates": ["gold", "silver", "bronze"]})
    for name in ("value", "contains"):
        assert get_scorer(name)("silver", task) == 1.0
        assert get_scorer(name)("not gold but silver", task) == 0.0, name
    assert get_scorer("value:0.1")("11", TaskRecord(id="t", question="q", expected="10")) == 1
