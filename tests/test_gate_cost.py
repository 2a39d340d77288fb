"""The default gate rule weighs cost and power (docs/gate.md): a tie that costs more tokens is
rejected, a cheaper one accepted, a clear gain accepted at any cost, and a dev set too small to
rule out a 10-point regression is widened or says it could not tell."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import EvalError
from whetstone.engine.evaluation.benchmarks import load_tasks
from whetstone.engine.evaluation.direct import direct_solver
from whetstone.engine.evaluation.gate import (
    MARGIN,
    decide_again,
    gate,
    parse_rule,
    run_gate,
    summary,
    wider_slice,
)
from whetstone.engine.evaluation.results import EvalResult, TaskResult
from whetstone.engine.evaluation.runner import Solver
from whetstone.engine.evaluation.stats import missed_regression, unseen_share
from whetstone.engine.evaluation.tasks import TaskSet, read_jsonl
from whetstone.engine.types import Request

ARITH = Path(__file__).parent / "fixtures" / "tasks" / "arith.jsonl"


def result(label: str, scores: list[float], tokens: int | list[int], latency: float = 1.0
           ) -> EvalResult:
    per = tokens if isinstance(tokens, list) else [tokens] * len(scores)
    return EvalResult("dev", "exact", tuple(
        TaskResult(f"t{i:03d}", s, tokens=per[i], latency_s=latency)
        for i, s in enumerate(scores)), label=label, n_planned=len(scores))


def pair(n: int, wins: int, losses: int, right: int) -> tuple[list[float], list[float]]:
    """(current, candidate) scores on n tasks: the current right on the first ``right``; the
    candidate loses ``losses`` of those and wins ``wins`` of the rest."""
    current = [1.0 if i < right else 0.0 for i in range(n)]
    candidate = list(current)
    for i in range(losses):
        candidate[i] = 0.0
    for i in range(wins):
        candidate[right + i] = 1.0
    return current, candidate


# 200 tasks, 4 better and 4 worse: a tie whose interval (about +-0.03) rules out 10 points.
POWERED_TIE = pair(200, 4, 4, 80)


def test_a_tie_that_costs_more_tokens_is_rejected_with_both_figures() -> None:
    current, candidate = POWERED_TIE
    d = gate(result("cand", candidate, 690), result("cur", current, 230))
    assert not d.accepted and d.rule == "cost_aware" and d.verdict == "tie"
    assert d.difference == 0.0 and d.ci_low < 0 < d.ci_high and d.could_miss < MARGIN
    assert (d.candidate_tokens, d.current_tokens, d.token_ratio) == (690, 230, 3.0)
    assert (d.candidate_latency_s, d.current_latency_s) == (1.0, 1.0)
    assert any("more expensive on a tie (> 1.02x)" in why and "(3.00x)" in why
               for why in d.reasons)
    saved = d.to_dict()
    assert saved["token_ratio"] == 3.0 and saved["latency_ratio"] == 1.0
    assert saved["verdict"] == "tie" and saved["could_miss"] == d.could_miss
    # The old rule, by name, let it through: the regression issue 41 reports.
    assert gate(result("cand", candidate, 690), result("cur", current, 230),
                "mean_not_worse").accepted


def test_a_tie_that_costs_fewer_tokens_is_accepted() -> None:
    current, candidate = POWERED_TIE
    d = gate(result("cand", candidate, 180), result("cur", current, 230))
    assert d.accepted and d.verdict == "tie"
    assert any("not more expensive" in why for why in d.reasons)
    # Equal cost, within the 2% an unchanged library's tokens move by, is not more expensive.
    assert gate(result("cand", candidate, 234), result("cur", current, 230)).accepted
    assert not gate(result("cand", candidate, 236), result("cur", current, 230)).accepted


def test_a_cheaper_tie_that_scores_lower_is_never_accepted() -> None:
    # Issue 46: -0.032 [-0.097, +0.032] on dev, 1 better and 3 worse, accepted as a tie for
    # 0.75x the tokens. Fewer tokens can mean the model gave up sooner.
    current, candidate = pair(200, 4, 6, 80)  # a powered tie, 0.01 lower
    d = gate(result("cand", candidate, 170), result("cur", current, 230))
    assert d.verdict == "tie" and d.could_miss < MARGIN and d.difference < 0
    assert not d.accepted
    assert any("the candidate scores lower (-0.010): on a tie, cost decides only when the "
               "difference is not negative" in why for why in d.reasons)
    # The same runs at equal scores are accepted for the cost.
    assert gate(result("cand", candidate, 170), result("cur", candidate, 230)).accepted


def test_a_clear_gain_is_accepted_whatever_it_costs() -> None:
    current, candidate = pair(30, 12, 0, 10)
    d = gate(result("cand", candidate, 2000), result("cur", current, 200))
    assert d.accepted and d.verdict == "gain" and d.ci_low > 0
    assert d.token_ratio == 10.0 and "a clear gain" in d.reasons[0]
    assert any("not weighed against a clear gain" in why for why in d.reasons)
    # And a clear loss is rejected however cheap.
    loss = gate(result("cand", current, 10), result("cur", candidate, 200))
    assert not loss.accepted and loss.verdict == "loss"


def test_an_underpowered_dev_set_says_it_could_not_tell() -> None:
    # Issue 41's tracking-3 figures: 0.40 vs 0.40 on 30 tasks, 3 better and 3 worse.
    current, candidate = pair(30, 3, 3, 12)
    d = gate(result("cand", candidate, 230), result("cur", current, 230))
    assert (d.candidate_score, d.current_score) == (0.4, 0.4)
    assert not d.accepted and d.verdict == "tie" and d.needs_more
    assert d.ci_low == pytest.approx(-0.167, abs=0.034) and d.could_miss == -d.ci_low
    assert any(why.startswith("could not tell: the dev set could have missed a regression of")
               for why in d.reasons)


def test_not_worse_is_non_inferiority_with_a_margin() -> None:
    current, candidate = pair(30, 3, 3, 12)  # interval about [-0.17, +0.17]
    cand, cur = result("cand", candidate, 230), result("cur", current, 230)
    assert parse_rule("not_worse")[0].x == MARGIN
    assert not gate(cand, cur, "not_worse").accepted
    assert gate(cand, cur, "not_worse=0.3").accepted
    assert "regression of 0.1 or more is not ruled out" in gate(cand, cur, "not_worse").reasons[0]
    # tokens<=R weighs cost on a tie only.
    gain = pair(30, 12, 0, 10)
    assert gate(result("c", gain[1], 900), result("k", gain[0], 300), "tokens<=1.5").accepted
    tie = POWERED_TIE
    assert not gate(result("c", tie[1], 900), result("k", tie[0], 300), "tokens<=1.5").accepted
    assert gate(result("c", tie[1], 900), result("k", tie[0], 300), "latency<=1.5").accepted


def test_nothing_changed_on_a_few_tasks_is_not_proof() -> None:
    # On a tie, n tasks leave open a regression on 1 - 0.025 ** (1 / n) of the tasks.
    assert unseen_share(30) == pytest.approx(0.1157, abs=1e-4)
    assert unseen_share(100) == pytest.approx(0.0362, abs=1e-4)
    assert missed_regression(0.0, 30) == pytest.approx(0.1157, abs=1e-4)
    assert missed_regression(-0.2, 30) == pytest.approx(0.2)  # the interval, when wider
    assert missed_regression(0.1, 30, floor=False) == 0.0
    assert missed_regression(-0.05, 95, left_out=5) == pytest.approx(0.0975)
    same = [1.0] * 10 + [0.0] * 20
    d = gate(result("cand", same, 800), result("cur", same, 230))  # deduction-5's figures
    assert not d.accepted and d.ci_low == d.ci_high == 0.0 and d.needs_more
    # One task better and none worse: the bootstrap says [0, +0.1], which rules out nothing.
    d = gate(result("cand", [1.0] * 11 + [0.0] * 19, 230), result("cur", same, 230))
    assert d.ci_low == 0.0 and d.could_miss == pytest.approx(0.1157, abs=1e-4)
    assert not d.accepted and d.needs_more
    with pytest.raises(EvalError, match="at least one task"):
        unseen_share(0)


def failing(r: EvalResult, which: range) -> EvalResult:
    return EvalResult("dev", "exact", tuple(
        TaskResult(t.task_id, 0.0, error="RuntimeError: boom") if i in which else t
        for i, t in enumerate(r.results)), label=r.label, n_planned=r.n_planned)


def test_failed_tasks_count_as_possible_losses_in_what_the_dev_set_could_miss() -> None:
    current, candidate = POWERED_TIE
    ok = gate(result("cand", candidate, 230), result("cur", current, 230))
    # 10 of 200 failed in the candidate's run, on tasks both got wrong where they were scored.
    d = gate(failing(result("cand", candidate, 230), range(100, 110)),
             result("cur", current, 230), allow_errors=True)
    assert d.n_tasks == 190 and len(d.left_out) == 10 and d.difference == ok.difference
    assert d.could_miss == pytest.approx((10 - 190 * min(d.ci_low, -unseen_share(190))) / 200)
    assert d.could_miss > ok.could_miss + 0.04
    assert "10 task(s) failed and are left out, neither a win nor a loss" in d.reasons[-1]
    # Failures on the very tasks it lost leave a gain on the rest, but never a clear one.
    hidden = gate(failing(result("cand", candidate, 230), range(10)),
                  result("cur", current, 230), allow_errors=True)
    assert hidden.ci_low > 0 and hidden.verdict == "tie" and hidden.wins == 4
    assert hidden.losses == 0


# -- widening the dev set -------------------------------------------------------------------

DEV = load_tasks("gsm8k@dev")


def solver(wrong: set[str], calls: list[str]) -> Solver:
    """Right on every gsm8k dev task but ``wrong``; records each task it is asked."""
    by_question = {t.question: t for t in DEV}

    def respond(req: Request) -> str:
        t = by_question[req.messages[-1].text]
        calls.append(t.id)
        return f"The answer is {t.expected}{'1' if t.id in wrong else ''}."

    return direct_solver(ScriptedBackend(responder=respond), model="scripted")


def test_an_underpowered_tie_is_widened_to_a_larger_slice_before_deciding() -> None:
    ids = [t.id for t in DEV]
    # On the first 20: 2 better, 2 worse (could miss about 0.2); the same on every task after.
    cand_calls: list[str] = []
    cur_calls: list[str] = []
    d = run_gate("gsm8k@dev:0:20", solver({ids[0], ids[1]}, cand_calls),
                 solver({ids[2], ids[3]}, cur_calls))
    assert d.widened_from is not None and d.widened_from["n_tasks"] == 20
    assert d.widened_from["could_miss"] >= MARGIN
    assert d.task_set == "gsm8k@dev:0:100" and d.n_tasks == 100
    assert d.could_miss < MARGIN and d.accepted and d.verdict == "tie"
    # The first slice was not run again: each solver saw each of the 100 tasks once.
    assert sorted(cand_calls) == sorted(cur_calls) == sorted(ids[:100])
    assert any(why.startswith("widened the dev set from gsm8k@dev:0:20") for why in d.reasons)
    assert "widened from 20 tasks" in summary(d.to_dict())
    # The old rule, by name, decides on the tasks given, as it did.
    old = run_gate("gsm8k@dev:0:20", solver({ids[0], ids[1]}, []),
                   solver({ids[2], ids[3]}, []), rule="mean_not_worse")
    assert old.widened_from is None and old.n_tasks == 20 and old.accepted


def test_a_dev_set_that_cannot_grow_is_reported() -> None:
    tasks = read_jsonl(ARITH)  # a whole file: no larger slice

    def right_on(k: int) -> Solver:
        def respond(req: Request) -> str:
            t = next(t for t in tasks if t.question == req.messages[-1].text)
            return f"The answer is {t.expected if int(t.id[-2:]) < k else -1}."
        return direct_solver(ScriptedBackend(responder=respond), model="scripted")

    d = run_gate(tasks, right_on(10), right_on(11))
    assert not d.accepted and d.needs_more and d.widened_from is None
    assert d.reasons[-1] == f"could not widen the dev set: {ARITH} is already the whole of its split"
    listed = run_gate(list(tasks), right_on(10), right_on(11))
    assert listed.reasons[-1].endswith("a list of records, not a slice of a task set")
    assert wider_slice(load_tasks("gsm8k@dev:0:100"), 0.3)[1] == \
        "100 tasks is already the most the gate widens to (100)"
    got, why = wider_slice(load_tasks("gsm8k@dev:0:30"), 0.1157)
    assert why == "" and isinstance(got, TaskSet) and got.name == "gsm8k@dev:0:60"


# -- saved decisions and the command line -----------------------------------------------------

TRACKING_3 = {  # benchmarks/results/bb-tracking-3/trace2skill-examples.json, before issue 41
    "accepted": True, "rule": "not_worse", "candidate_score": 0.4, "current_score": 0.4,
    "difference": 0.0, "ci_low": -0.16666666666666666, "ci_high": 0.16666666666666666,
    "confidence": 0.95, "mcnemar_p": 1.0, "n_tasks": 30, "wins": 3, "losses": 3,
    "left_out": []}


def test_a_saved_decision_is_decided_again_from_its_figures() -> None:
    ok, reasons = decide_again(TRACKING_3)
    assert ok is False and any("could not tell" in why for why in reasons)
    assert summary(TRACKING_3) == ("a tie it could not tell: +0.00 [-0.17, +0.17] on 30 tasks, "
                                   "could have missed 0.17")
    # A powered tie needs the tokens, which older decisions did not save: undecided.
    powered = {**TRACKING_3, "n_tasks": 100, "ci_low": -0.06, "ci_high": 0.13, "wins": 13,
               "losses": 10, "difference": 0.03}
    ok, reasons = decide_again(powered)
    assert ok is None and any("cannot weigh the cost" in why for why in reasons)
    costly = {**powered, "candidate_tokens": 952.0, "current_tokens": 597.0}
    assert decide_again(costly)[0] is False
    assert summary(costly) == ("a tie, more expensive: +0.03 [-0.06, +0.13] on 100 tasks, "
                               "tokens 1.59x, could have missed 0.06")
    assert decide_again(TRACKING_3, "mean_not_worse")[0] is True


def test_whetstone_evolve_prints_the_decision_with_its_reasons(tmp_path: Path) -> None:
    from tests.test_evolve import HELD, TASKS, analyst_reply

    tasks = tmp_path / "apples.jsonl"
    tasks.write_text("\n".join(json.dumps(t.to_dict()) for t in TASKS) + "\n")
    held = tmp_path / "held.jsonl"
    held.write_text("\n".join(json.dumps(t.to_dict()) for t in HELD) + "\n")
    agent = [f"Final Answer: {i}" for i in range(1, 5)] + \
        [f"Final Answer: {i}" for i in range(11, 17)] + \
        [f"Final Answer: {2 * i}" for i in range(11, 17)]
    (tmp_path / "agent.json").write_text(json.dumps(agent))
    (tmp_path / "analyst.json").write_text(json.dumps([analyst_reply(None)] * 4))  # type: ignore[arg-type]
    (tmp_path / "lib").mkdir()  # an empty folder may become a library; a missing one may not
    res = CliRunner().invoke(cli, [
        "evolve", "trace2skill", "--tasks", str(tasks), "--skill", "adding", "--create", "-j", "1",
        "--gate-tasks", str(held), "--model", f"scripted:{tmp_path / 'agent.json'}",
        "--analyst", f"scripted:{tmp_path / 'analyst.json'}",
        "--library", str(tmp_path / "lib"), "--workers", "1"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.stdout.split())
    assert "gate accepted (cost_aware)" in out and ": a clear gain; candidate 1.000" in out
    assert "difference +1.000 [+1.000, +1.000] on 6 tasks (6 better, 0 worse)" in out
    assert "McNemar p = 0.0312" in out and "fewer than 10 paired tasks" in out
    assert "tokens" in out and "per task (" in out and "x)" in out
    assert "could have missed" not in out  # it decides a tie only
    assert "- a clear gain: difference +1.000" in out


def test_the_gate_page_example_runs() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "gate.md").read_text()
    blocks = text.split("```python\n")[1:]
    assert len(blocks) == 1 and "```" in blocks[0]
    exec(compile(blocks[0].split("```")[0], "docs/gate.md", "exec"), {})  # noqa: S102 - our docs


def test_the_gate_page_shows_what_evolve_prints_for_the_saved_tracking_decision() -> None:
    from whetstone.engine.commands.decisions import decision_lines

    repo = Path(__file__).resolve().parent.parent
    text = (repo / "docs" / "gate.md").read_text()
    shown = text.split("```text\n")[1].split("```")[0].rstrip("\n").split("\n")
    saved = json.loads((repo / "benchmarks" / "results" / "bb-tracking-3" /
                        "trace2skill-examples.json").read_text())["evolve"]["decision"]
    head, *rest = decision_lines(saved)
    assert shown == [head, *(f"  {line}" for line in rest)]
    assert not saved["accepted"] and saved["widened_from"]["n_tasks"] == 30
