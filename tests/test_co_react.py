"""Co-ReAct on scripted models: a rubric before every decision, normalised weights, the phase
hint, one retry after a failing check, best-of-N, repairs and drops, the CLI and resume."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import ParseError
from whetstone.engine.methods.co_react.plugin import CoReAct, CoReActConfig
from whetstone.engine.methods.co_react.rubric import Rubric, parse_check, parse_rubric, phase_of
from whetstone.engine.runtime import Agent, RunConfig
from whetstone.engine.runtime.checkpoints import Checkpoints
from whetstone.engine.types import Request
from whetstone.library_store.traces import TraceStore

pytestmark = [pytest.mark.co_react]  # every test here uses it

HEADING = "Rubric for your next step"
RUBRIC = ("1. [0.5] Multiplies 17 by 23 with the calculator\n"
          "2. [0.3] Uses the exact numbers from the task\n"
          "3. [0.2] Gives the product as a single number")


def is_rubric_prompt(request: Request) -> bool:
    return request.messages[0].text.startswith("You are helping an agent choose its NEXT step")


def is_check_prompt(request: Request) -> bool:
    return "You check an agent's proposed next step" in request.messages[0].text


def generator(rubrics: list[str], checks: list[str] | None = None) -> ScriptedBackend:
    """A rubric model answering rubric prompts and check prompts from two queues."""
    rubric_q, check_q = list(rubrics), list(checks or [])

    def reply(request: Request) -> str:
        if is_rubric_prompt(request):
            return rubric_q.pop(0)
        assert is_check_prompt(request), request.messages[0].text[:200]
        return check_q.pop(0)

    return ScriptedBackend(responder=reply)


def check(scores: list[int], feedback: str = "") -> str:
    return json.dumps({"scores": scores, "weighted_score": 0.99, "pass": True,
                       "feedback": feedback})


def co_react(gen: ScriptedBackend, **options: Any) -> CoReAct:
    return CoReAct(CoReActConfig(**options), generator=gen)


def agent_steps(trace: Any) -> list[str]:
    return [s.kind for s in trace.steps]


# -- the rubric before every decision --------------------------------------------------------


def test_a_rubric_is_injected_before_every_decision_and_only_for_it(tmp_path: Path) -> None:
    gen = generator([RUBRIC] * 3)
    agent_model = ScriptedBackend([
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": "17*23"}}]},
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": "391+0"}}]},
        "Final Answer: 391",
    ], tool_calls=True)
    trace = Agent(agent_model, plugins=[co_react(gen)],
                  trace_store=TraceStore(tmp_path / "t")).run("What is 17 * 23?")
    assert trace.answer == "391"
    assert agent_steps(trace) == ["prepare", "rubric", "think", "act", "rubric", "think", "act",
                                  "rubric", "think", "finish"]
    for request in agent_model.requests:
        text = "\n".join(m.text for m in request.messages)
        assert text.count(HEADING) == 1  # this decision's rubric, none left over from before
        assert HEADING in request.messages[-1].text and request.messages[-1].role == "user"
        assert "1. [0.50] Multiplies 17 by 23 with the calculator" in request.messages[-1].text
    # The first decision: the rubric follows the task in the same user turn.
    first = agent_model.requests[0].messages
    assert len(first) == 2 and first[1].text.startswith("What is 17 * 23?")
    # The node is named co_react_rubric; its steps say what it wrote; the trace counts them.
    rubric_steps = [s for s in trace.steps if s.kind == "rubric"]
    assert {s.module for s in rubric_steps} == {"co_react_rubric"}
    assert rubric_steps[0].output["rubric"]["lines"][0] == [0.5, "Multiplies 17 by 23 with the calculator"]
    meta = trace.meta["co_react"]
    assert meta["rubrics"] == meta["injected"] == 3 and meta["dropped"] == 0
    assert meta["rubric_tokens"] == sum(s.tokens for s in rubric_steps) > 0
    # Rubric tokens count in the run's total.
    assert trace.total_tokens == sum(s.tokens for s in trace.steps)
    assert {"name": "co_react", "config": dataclasses.asdict(CoReActConfig()),
            "generator": "scripted:"} in trace.meta["methods"]


def test_in_text_mode_the_rubric_joins_the_observation_turn() -> None:
    gen = generator([RUBRIC] * 2)
    agent_model = ScriptedBackend(["Action: calculator[17*23]", "Final Answer: 391"])
    Agent(agent_model, plugins=[co_react(gen)]).run("What is 17 * 23?")
    last = agent_model.requests[1].messages[-1]
    assert last.role == "user" and last.text.startswith("Observation: 391")
    assert HEADING in last.text
    assert agent_model.requests[1].messages[-2].role == "assistant"  # no two user turns


def test_the_default_generator_is_the_agents_own_model(tmp_path: Path) -> None:
    def reply(request: Request) -> str:
        return RUBRIC if is_rubric_prompt(request) else "Final Answer: 391"

    backend = ScriptedBackend(responder=reply)
    engine = Engine(backend, library=tmp_path / "lib", create=True, methods=["co_react"],
                    checkpointing=False, skills=False)
    trace = engine.run("What is 17 * 23?")
    assert trace.answer == "391" and trace.meta["co_react"]["injected"] == 1
    assert sum(is_rubric_prompt(r) for r in backend.requests) == 1


def test_the_generator_sees_the_tried_calls_and_a_line_repeating_one_is_dropped() -> None:
    repeating = ('1. [0.5] Searches for "17*23" again\n'
                 "2. [0.3] Reads the calculator's result\n"
                 "3. [0.2] Answers with the number")
    gen = generator([RUBRIC, repeating])
    agent_model = ScriptedBackend(["Action: calculator[17*23]", "Final Answer: 391"])
    trace = Agent(agent_model, plugins=[co_react(gen)]).run("What is 17 * 23?")
    second_prompt = gen.requests[1].messages[0].text
    assert "- calculator(17*23)" in second_prompt  # listed as already tried
    assert "Calls already made" not in gen.requests[0].messages[0].text
    assert "Calls already made" in second_prompt
    second = [s for s in trace.steps if s.kind == "rubric"][1]
    assert "repeat" in second.output["repairs"]
    assert [c for _, c in second.output["rubric"]["lines"]] == [
        "Reads the calculator's result", "Answers with the number"]
    assert sum(w for w, _ in second.output["rubric"]["lines"]) == pytest.approx(1.0)
    assert trace.meta["co_react"]["repairs"] == {"repeat": 1, "short": 1, "renormalised": 1}


# -- weights and phases ----------------------------------------------------------------------


@pytest.mark.parametrize("text, weights, repairs", [
    (RUBRIC, [0.5, 0.3, 0.2], []),
    ("1. [40] a b c\n2. [40] d e f\n3. [20] g h i", [0.4, 0.4, 0.2], ["renormalised"]),
    ("1. (40%) a b c\n2. (40%) d e f\n3. (20%) g h i", [0.4, 0.4, 0.2], []),
    # A missing or zero weight gets the mean of the others (4/3 here).
    ("- [1] a b c\n- [1] d e f\n- [2] g h i\n- [0] j k l", [0.1875, 0.1875, 0.375, 0.25],
     ["weights_filled", "renormalised"]),
    ("Sure! Here it is:\n1. a b c\n2. d e f\n3. g h i\n4. j k l", [0.25] * 4,
     ["weights_filled", "renormalised"]),
    (("1. [0.1] a b c\n2. [0.3] d e f\n3. [0.1] g h i\n4. [0.2] j k l\n5. [0.2] m n o\n"
     "6. [0.1] p q r"), [0.1 / 0.9, 0.3 / 0.9, 0.1 / 0.9, 0.2 / 0.9, 0.2 / 0.9],
     ["truncated", "renormalised"]),
    ("1. [0.7] a b c\n2. [0.7] a b c\n3. [0.3] <condition>\n4. [0.3]", [1.0],
     ["duplicate", "short", "renormalised"]),
])
def test_weights_are_normalised_and_repairs_named(text: str, weights: list[float],
                                                  repairs: list[str]) -> None:
    parsed = parse_rubric(text)
    assert [w for w, _ in parsed.rubric.lines] == pytest.approx(weights)
    assert sum(w for w, _ in parsed.rubric.lines) == pytest.approx(1.0)
    assert list(parsed.repairs) == repairs


def test_a_reply_without_a_rubric_line_is_a_parse_error_with_the_raw_reply() -> None:
    with pytest.raises(ParseError, match="no rubric line") as err:
        parse_rubric("I think the agent should be careful.")
    assert err.value.raw == "I think the agent should be careful."


def test_the_phase_hint_follows_the_step_count() -> None:
    assert [phase_of(n, 6) for n in range(6)] == ["early", "early", "mid", "mid", "late", "late"]
    assert phase_of(0, 1) == "early" and phase_of(7, 8) == "late" and phase_of(9, 8) == "late"
    gen = generator([RUBRIC] * 6)
    agent_model = ScriptedBackend([f"Action: calculator[{i}+1]" for i in range(5)]
                                  + ["Final Answer: 6"])
    trace = Agent(agent_model, config=RunConfig(max_steps=6),
                  plugins=[co_react(gen)]).run("Count to six.")
    rubric_steps = [s for s in trace.steps if s.kind == "rubric"]
    assert [s.input["phase"] for s in rubric_steps] == ["early", "early", "mid", "mid", "late",
                                                        "late"]
    assert [s.input["steps_used"] for s in rubric_steps] == [0, 1, 2, 3, 4, 5]
    prompts = [r.messages[0].text for r in gen.requests]
    assert "Phase: early. Early in the run" in prompts[0]
    assert "Phase: mid. Middle of the run" in prompts[2]
    assert "Phase: late. Late in the run" in prompts[5] and "(5 of 6 used)" in prompts[5]
    # The agent sees the phase too.
    assert "(late phase)" in agent_model.requests[5].messages[-1].text


# -- verification: one retry ------------------------------------------------------------------


def test_a_failing_check_triggers_exactly_one_retry_with_the_feedback() -> None:
    gen = generator([RUBRIC] * 2, [check([0, 1, 0], "Multiply 17 by 23, not 2 by 2."),
                                   check([1, 1, 1])])
    agent_model = ScriptedBackend([
        "Action: calculator[2*2]",  # fails the check (0.3 < 0.6)
        "Action: calculator[17*23]",  # the retry: taken as it is
        "Final Answer: 391",  # passes
    ])
    trace = Agent(agent_model, plugins=[co_react(gen, rubric_verify=True)]).run("17 * 23?")
    assert trace.answer == "391"
    assert len(agent_model.requests) == 3  # one retry, no more
    retry = agent_model.requests[1].messages
    assert retry[-2].role == "assistant" and retry[-2].text == "Action: calculator[2*2]"
    assert retry[-1].role == "user" and "Multiply 17 by 23, not 2 by 2." in retry[-1].text
    assert "scored 0.30 and needs 0.60" in retry[-1].text
    acts = [s for s in trace.steps if s.kind == "act"]
    assert [a.input["arguments"] for a in acts] == ["17*23"]  # the failed proposal never ran
    checks = trace.meta["co_react"]["checks"]
    assert (checks["checked"], checks["failed"], checks["passed"], checks["retried"]) == \
        (2, 1, 1, 1)
    first, second = checks["decisions"]
    assert first["retried"] and first["check"]["score"] == pytest.approx(0.3)
    assert "score_recomputed" in first["check"]["repairs"]  # the model's 0.99 was not its sum
    assert not second["retried"] and second["check"]["pass"]
    # The first decision's usage covers the failed proposal and the check too.
    think = next(s for s in trace.steps if s.kind == "think")
    assert first["extra_agent_tokens"] > 0 and first["check_tokens"] > 0
    assert think.tokens > first["extra_agent_tokens"] + first["check_tokens"]


def test_a_retry_that_fails_again_is_not_retried_again() -> None:
    gen = generator([RUBRIC], [check([0, 0, 0], "wrong")])
    agent_model = ScriptedBackend(["Final Answer: 4", "Final Answer: 5"])
    trace = Agent(agent_model, plugins=[co_react(gen, rubric_verify=True)]).run("17 * 23?")
    assert trace.answer == "5" and len(agent_model.requests) == 2
    assert sum(is_check_prompt(r) for r in gen.requests) == 1  # the retry is not checked
    assert trace.meta["co_react"]["checks"]["retried"] == 1


def test_a_passing_check_keeps_the_step_without_a_retry() -> None:
    gen = generator([RUBRIC], [check([1, 1, 0])])
    agent_model = ScriptedBackend(["Final Answer: 391"])
    trace = Agent(agent_model, plugins=[co_react(gen, rubric_verify=True)]).run("17 * 23?")
    assert trace.answer == "391" and len(agent_model.requests) == 1
    assert trace.meta["co_react"]["checks"]["passed"] == 1


def test_best_of_n_keeps_the_candidate_the_rubric_scores_highest() -> None:
    gen = generator([RUBRIC], [check([0, 0, 1]), check([1, 1, 1]), check([1, 0, 0])])
    agent_model = ScriptedBackend(["Final Answer: 4", "Final Answer: 391", "Final Answer: 17"])
    trace = Agent(agent_model, config=RunConfig(seed=3),
                  plugins=[co_react(gen, best_of_n=3)]).run("17 * 23?")
    assert trace.answer == "391"
    first, second, third = agent_model.requests
    assert first.temperature == 0.0 and second.temperature == third.temperature == 0.7
    assert len({first.seed, second.seed, third.seed}) == 3
    decision = trace.meta["co_react"]["checks"]["decisions"][0]
    assert decision["chosen"] == 1 and decision["scores"] == [0.2, 1.0, 0.5]
    assert not decision["retried"]  # best-of-N alone never retries
    think = next(s for s in trace.steps if s.kind == "think")
    spent = sum(r for r in (decision["extra_agent_tokens"], decision["check_tokens"]))
    assert think.tokens > spent > 0


# -- malformed output: repaired or dropped, never fatal ---------------------------------------


def test_a_rubric_that_cannot_be_read_is_dropped_after_one_retry_and_the_run_goes_on() -> None:
    gen = generator(["no idea", "still no rubric here"])
    agent_model = ScriptedBackend(["Final Answer: 391"])
    trace = Agent(agent_model, plugins=[co_react(gen, rubric_verify=True)]).run("17 * 23?")
    assert trace.answer == "391" and trace.outcome == "answered"
    assert HEADING not in agent_model.requests[0].messages[-1].text
    assert "rubric line" in gen.requests[1].messages[-1].text  # the retry showed the error
    step = next(s for s in trace.steps if s.kind == "rubric")
    assert step.error and "still no rubric here" in step.error
    meta = trace.meta["co_react"]
    assert (meta["rubrics"], meta["injected"], meta["dropped"]) == (1, 0, 1)
    assert meta["generator_retries"] == 1
    assert meta["checks"]["checked"] == 0  # nothing to check against: plain ReAct


def test_a_check_that_cannot_be_read_is_dropped_and_the_step_stands() -> None:
    gen = generator([RUBRIC], ["looks fine to me", "yes, fine"])
    agent_model = ScriptedBackend(["Final Answer: 391"])
    trace = Agent(agent_model, plugins=[co_react(gen, rubric_verify=True)]).run("17 * 23?")
    assert trace.answer == "391" and len(agent_model.requests) == 1
    checks = trace.meta["co_react"]["checks"]
    assert checks["check_dropped"] == 1 and checks["checked"] == 0 and checks["retried"] == 0


@pytest.mark.parametrize("reply, score, passed, repairs", [
    ('{"scores": [1, 0, 1], "weighted_score": 0.7, "pass": true, "feedback": ""}', 0.7, True,
     []),
    ('```json\n{"weighted_score": 45, "pass": true}\n```', 0.45, False,
     ["percent_score", "pass_recomputed"]),
    ('{"pass": false, "feedback": "no"}', 0.0, False, ["score_from_pass"]),
    ('{"scores": ["yes", "no", "yes"], "feedback": "ok"}', 0.7, True, []),
    ('{"scores": [1, 1], "weighted_score": 0.6}', 0.6, True, ["scores_ignored"]),
])
def test_checks_are_read_leniently(reply: str, score: float, passed: bool,
                                   repairs: list[str]) -> None:
    rubric = Rubric(lines=((0.5, "a"), (0.3, "b"), (0.2, "c")))
    got = parse_check(reply, rubric, 0.6)
    assert got.score == pytest.approx(score) and got.passed is passed
    assert list(got.repairs) == repairs


def test_a_rubric_round_trips_through_json() -> None:
    rubric = Rubric(((0.5, "uses a tool"), (0.5, "states units")), "mid")
    assert Rubric.from_dict(json.loads(json.dumps(rubric.to_dict()))) == rubric


def test_a_check_without_any_score_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="no scores"):
        parse_check('{"feedback": "hm"}', Rubric(lines=((1.0, "a"),)), 0.6)


# -- selectable from the CLI and the API, recorded, resumable ---------------------------------


def _replies(path: Path, replies: list[Any]) -> str:
    path.write_text(json.dumps(replies))
    return f"scripted:{path}"


@pytest.mark.horizon
def test_cli_runs_co_react_with_a_rubric_model_and_records_it(tmp_path: Path) -> None:
    agent_spec = _replies(tmp_path / "agent.json", ["Action: calculator[17*23]",
                                                    "Final Answer: 391"])
    rubric_spec = _replies(tmp_path / "gen.json", [RUBRIC, RUBRIC])
    (tmp_path / "lib").mkdir()  # an empty folder: the library is made there
    res = CliRunner().invoke(cli, [
        "run", "What is 17 * 23?", "--model", agent_spec, "--library", str(tmp_path / "lib"),
        "--methods", "co_react,horizon", "--rubric-model", rubric_spec, "--json"])
    assert res.exit_code == 0, res.output
    trace = json.loads(res.stdout)
    names = {m["name"]: m for m in trace["meta"]["methods"]}
    assert names["co_react"]["config"]["rubric_model"] == rubric_spec
    assert names["co_react"]["generator"] == rubric_spec and "horizon" in names
    assert [s["kind"] for s in trace["steps"]].count("rubric") == 2
    assert trace["meta"]["horizon"]["reason"] == "no similar tasks"


def test_rubric_model_without_co_react_is_a_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["run", "x", "--model", "scripted:", "--rubric-model",
                                   "scripted:", "--library", str(tmp_path / "lib")])
    assert res.exit_code == 2 and "--rubric-model sets co_react.rubric_model, but " \
        "--methods does not list co_react" in res.output
    assert "add --methods co_react" in res.output


def test_an_interrupted_co_react_run_resumes_with_its_rubrics(tmp_path: Path) -> None:
    store, cps = TraceStore(tmp_path / "traces"), Checkpoints(tmp_path / "cp.sqlite")
    replies = iter(["Action: calculator[17*23]"])

    def ctrl_c_on_second_call(request: Request) -> str:
        try:
            return next(replies)
        except StopIteration:
            raise KeyboardInterrupt from None

    first = Agent(ScriptedBackend(responder=ctrl_c_on_second_call), trace_store=store,
                  checkpoints=cps, plugins=[co_react(generator([RUBRIC] * 2))])
    with pytest.raises(KeyboardInterrupt):
        first.run("17*23?", trace_id="run-1")
    assert agent_steps(store.get("run-1")) == ["prepare", "rubric", "think", "act", "rubric"]
    second, gen = ScriptedBackend(["Final Answer: 391"]), generator([])
    trace = Agent(second, trace_store=store, checkpoints=cps,
                  plugins=[co_react(gen)]).resume("run-1")
    assert trace.answer == "391"
    # The rubric written before the interruption is in the checkpoint: the resumed decision
    # reads it, and no new one is asked for.
    assert agent_steps(trace) == ["prepare", "rubric", "think", "act", "rubric", "think",
                                  "finish"]
    assert second.requests[0].messages[-1].text.count(HEADING) == 1
    assert gen.requests == []

