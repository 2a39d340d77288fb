"""Paired comparison and the regression gate, with scripted solvers of known quality."""

from __future__ import annotations

from pathlib import Path

import pytest

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import EvalError
from whetstone.engine.evaluation.compare import compare
from whetstone.engine.evaluation.direct import direct_solver
from whetstone.engine.evaluation.gate import Condition, gate, gate_tasks, parse_rule, run_gate
from whetstone.engine.evaluation.results import EvalResult, TaskResult
from whetstone.engine.evaluation.runner import Solver, evaluate
from whetstone.engine.evaluation.tasks import read_jsonl, split_of
from whetstone.engine.types import Request

ARITH = Path(__file__).parent / "fixtures" / "tasks" / "arith.jsonl"
TASKS = read_jsonl(ARITH)
IDS = [t.id for t in TASKS]


def solver_right_on(indices: set[int], version: str) -> Solver:
    """A library version that answers the fixture's tasks ``indices`` right, the rest wrong."""
    by_question = {t.question: (i, t) for i, t in enumerate(TASKS)}

    def respond(req: Request) -> str:
        i, t = by_question[req.messages[-1].text]
        return f"The answer is {int(t.expected) + (0 if i in indices else 1)}."

    return direct_solver(ScriptedBackend(responder=respond), model="scripted",
                         library_version=version)


# v1 right on tasks 0-9; v2 right on 0-13 except 2: 4 wins (10-13), 1 loss (2).
V1 = set(range(10))
V2 = set(range(14)) - {2}


def run(indices: set[int], version: str) -> EvalResult:
    return evaluate(TASKS, solver_right_on(indices, version), seed=0)


def test_compare_reports_the_paired_difference() -> None:
    a, b = run(V1, "v1"), run(V2, "v2")
    c = compare(a, b)
    assert (c.score_a, c.score_b) == (0.5, 0.65)
    assert c.difference == pytest.approx(0.15)
    assert c.wins == ("add-10", "add-11", "add-12", "add-13") and c.losses == ("add-02",)
    assert c.ties == 15 and c.n == 20
    # McNemar: 1 vs 4 discordant, p = 2 * (1 + 5) / 32 = 0.375.
    assert c.p_value == pytest.approx(0.375)
    assert c.ci_low <= 0.15 <= c.ci_high and c.ci_low < 0 < c.ci_high  # not significant
    assert (c.a_name, c.b_name) == ("v1", "v2")
    d = c.to_dict()
    assert d["difference"] == pytest.approx(0.15) and d["mcnemar_p"] == pytest.approx(0.375)


def test_compare_pairs_by_task_id_and_lists_the_unpaired() -> None:
    a = EvalResult("s", "exact", (TaskResult("x", 1.0), TaskResult("y", 0.0)), label="a")
    b = EvalResult("s", "exact", (TaskResult("y", 1.0), TaskResult("z", 1.0)), label="b")
    c = compare(a, b)
    assert c.task_ids == ("y",) and c.difference == 1.0
    assert c.only_in_a == ("x",) and c.only_in_b == ("z",)
    with pytest.raises(EvalError, match="share no task"):
        compare(a, EvalResult("s", "exact", (TaskResult("q", 1.0),)))


def test_continuous_scores_get_no_mcnemar_p() -> None:
    a = EvalResult("s", "f1", (TaskResult("x", 0.5), TaskResult("y", 0.25)))
    b = EvalResult("s", "f1", (TaskResult("x", 1.0), TaskResult("y", 0.75)))
    c = compare(a, b)
    assert c.p_value is None and c.difference == pytest.approx(0.5)
    assert c.ci_low == pytest.approx(0.5) and c.ci_high == pytest.approx(0.5)


def test_gate_accepts_a_better_library_and_rejects_a_worse_one() -> None:
    v1, v2 = run(V1, "v1"), run(V2, "v2")
    better = gate(candidate=v2, current=v1, rule="mean_not_worse")
    assert better.accepted and better.rule == "mean_not_worse"
    assert (better.candidate_score, better.current_score) == (0.65, 0.5)
    assert better.difference == pytest.approx(0.15)
    assert (better.wins, better.losses) == (4, 1)
    worse = gate(candidate=v1, current=v2, rule="mean_not_worse")
    assert not worse.accepted and worse.difference == pytest.approx(-0.15)
    assert "difference -0.1500 < 0" in worse.reasons[0]
    # The default: +0.15 on 20 tasks is a tie 20 tasks cannot tell; a clear gain passes.
    assert not gate(candidate=v2, current=v1).accepted
    assert any("could not tell" in why for why in gate(candidate=v1, current=v2).reasons)
    clear = gate(candidate=run(set(range(20)), "v3"), current=v1)
    assert clear.accepted and clear.rule == "cost_aware" and clear.verdict == "gain"


def test_the_old_rule_accepts_a_tie_by_name_and_the_default_says_it_could_not_tell() -> None:
    same = run(V1, "v1")
    d = gate(candidate=run(V1, "v1b"), current=same, rule="mean_not_worse")
    assert d.accepted and d.difference == 0.0
    # Nothing changed on 20 tasks: up to 16.8% of tasks could change unseen (exact bound).
    d = gate(candidate=run(V1, "v1b"), current=same)
    assert not d.accepted and d.verdict == "tie" and d.could_miss == pytest.approx(0.168, abs=1e-3)


def test_stricter_rules() -> None:
    v1, v2 = run(V1, "v1"), run(V2, "v2")
    assert not gate(v2, v1, "ci_lower>0").accepted           # better, but not significantly
    assert gate(v2, v1, "min_delta=0.1").accepted
    assert not gate(v2, v1, "min_delta=0.2").accepted
    assert not gate(v2, v1, "mcnemar<0.05").accepted
    assert gate(v2, v1, "not_worse&min_delta=0.15").accepted
    # A clearly better version passes the significance rules too.
    strong = run(set(range(20)), "v3")
    weak = run(set(range(3)), "v0")
    d = gate(strong, weak, "ci_lower>0&mcnemar<0.05")
    assert d.accepted and d.p_value is not None and d.p_value < 0.001
    assert d.rule == "ci_lower>0&mcnemar<0.05" and len(d.reasons) == 2


@pytest.mark.parametrize("rule", ["", "better", "min_delta", "ci_lower=0", "min_delta>0.1",
                                  "not_worse>0.1", "not_worse=1.5", "not_worse=-0.1",
                                  "min_delta=abc", "mcnemar<", "tokens", "tokens<1.1",
                                  "tokens<=0", "latency=2", "cost_aware=0.1"])
def test_bad_rules_are_refused(rule: str) -> None:
    with pytest.raises(EvalError, match="gate rule"):
        parse_rule(rule)


def test_rule_parsing() -> None:
    assert parse_rule(" not_worse & ci_lower>-0.05 ") == (
        Condition("not_worse"), Condition("ci_lower", -0.05))


def test_gate_refuses_partial_or_mismatched_runs() -> None:
    v1 = run(V1, "v1")
    partial = EvalResult("s", "numeric", v1.results[:3], partial=True, n_planned=20)
    with pytest.raises(EvalError, match="partial"):
        gate(partial, v1)
    fewer = EvalResult("s", "numeric", v1.results[:10])
    with pytest.raises(EvalError, match="different tasks"):
        gate(fewer, v1)


def test_decision_to_dict_is_what_the_manifest_stores() -> None:
    d = gate(run(set(range(20)), "v2"), run(V1, "v1")).to_dict()
    for key in ("accepted", "rule", "candidate_score", "current_score", "difference", "ci_low",
                "ci_high", "mcnemar_p", "n_tasks", "task_set", "seed", "candidate", "current"):
        assert key in d
    assert d["accepted"] is True and d["candidate"] == "v2" and d["current"] == "v1"


def test_run_gate_evaluates_both_on_the_same_tasks_with_the_same_seed(tmp_path: Path) -> None:
    seeds: dict[str, list[tuple[str, int]]] = {"cand": [], "cur": []}

    def recording(indices: set[int], version: str, key: str) -> Solver:
        inner = solver_right_on(indices, version)

        def solve(task, seed):  # type: ignore[no-untyped-def]
            seeds[key].append((task.id, seed))
            return inner(task, seed)

        return solve

    d = run_gate(TASKS, recording(V2, "v2", "cand"), recording(V1, "v1", "cur"), seed=5,
                 results_dir=tmp_path, rule="mean_not_worse")
    assert d.accepted and d.n_tasks == 20 and d.seed == 5
    assert seeds["cand"] == seeds["cur"]
    assert set(d.results) == {"candidate", "current"} and all(
        Path(p).is_file() for p in d.results.values())


def test_run_gate_narrows_a_packaged_set_to_its_dev_split() -> None:
    chosen = gate_tasks("gsm8k:0:10")
    assert len(chosen) == 10 and all(split_of(t.id) == "dev" for t in chosen)
    assert len(gate_tasks(str(ARITH))) == 20  # a user's file is taken as given
    assert all(split_of(t.id) == "test" for t in gate_tasks("gsm8k@test:0:5"))


def test_run_gate_reraises_ctrl_c() -> None:
    def interrupted(task, seed):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_gate(TASKS, solver_right_on(V1, "v1"), interrupted)
