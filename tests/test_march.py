"""MARCH (engine/methods/march/verifier.py): the checker never sees the answer, the majority vote, the
bounded revise loop, clear errors for an empty corpus and an unreadable proposer, malformed
checker lines repaired or dropped with a count; and its faces (its ``verify`` endpoint,
``whetstone verify``, the runtime ``verify`` node, the server's ``endpoints`` switch)."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from servers import Servers

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.commands.kit import Kit
from whetstone.engine.errors import EmptyCorpus, ParseError
from whetstone.engine.methods.march.commands import EXIT_FLAGGED, commands
from whetstone.engine.methods.march.format import (
    CheckLine,
    answers_agree,
    parse_checks,
    parse_claims,
    verdict,
)
from whetstone.engine.methods.march.records import CheckRequest, Claim, Verdict
from whetstone.engine.methods.march.verifier import (
    March,
    MarchConfig,
    MarchVerifier,
    checker_messages,
    result_trace,
)
from whetstone.engine.types import Request

QUESTION = "The Oberoi family is part of a hotel company that has a head office in what city?"
EVIDENCE = ["The Oberoi Group is a hotel company with its head office in Delhi.",
            "The Oberoi family is an Indian family that is famous for its hotels."]
SECRET = "Mumbai-Zx9"  # a unique string: any leak of the answer into a prompt is visible
ANSWER = f"The Oberoi family's hotel company is based in {SECRET}."
PROPOSED = (f"- Question: In what city is the head office of the Oberoi Group? "
            f"[Answer: {SECRET}]\n"
            "- Question: What kind of company is the Oberoi Group? [Answer: hotel company]")
CHECK_DELHI = ("1. Evidence: The Oberoi Group is a hotel company with its head office in Delhi. "
               "[Answer: Delhi]\n"
               "2. Evidence: The Oberoi Group is a hotel company [Answer: hotel company]")
CHECK_AGREES = CHECK_DELHI.replace("[Answer: Delhi]", f"[Answer: {SECRET}]")
CHECK_CANNOT = "1. Evidence: none [Cannot answer]\n2. Evidence: none [Cannot answer]"


def texts(requests: list[Request]) -> list[str]:
    return ["\n".join(m.text for m in r.messages) for r in requests]


def verifier(proposer: list[Any], checker: list[Any], solver: list[Any] = (), **config: Any
             ) -> tuple[MarchVerifier, ScriptedBackend, ScriptedBackend, ScriptedBackend]:
    s, p, c = ScriptedBackend(list(solver)), ScriptedBackend(proposer), ScriptedBackend(checker)
    return MarchVerifier(s, proposer=p, checker=c, config=MarchConfig(**config)), s, p, c


# --- information asymmetry ---------------------------------------------------------------------

@pytest.mark.march
def test_the_answer_never_reaches_the_checker() -> None:
    v, _, proposer, checker = verifier([PROPOSED], [CHECK_DELHI] * 3)
    result = v.verify(QUESTION, ANSWER, EVIDENCE)
    assert len(checker.requests) == 3
    for text in texts(checker.requests):
        assert SECRET not in text and ANSWER not in text
        assert EVIDENCE[0] in text and "In what city is the head office" in text
    proposer_text = texts(proposer.requests)[0]
    assert ANSWER in proposer_text and EVIDENCE[0] not in proposer_text  # no evidence either
    first, second = result.rounds[0].verdicts
    assert (first.supported, first.checked, first.claimed) == (False, "Delhi", SECRET)
    assert "head office in Delhi" in first.evidence and second.supported is True
    assert result.flagged and result.report()["flagged_claims"] == 1


@pytest.mark.march
def test_the_isolation_is_structural() -> None:
    # The checker's prompt is built from a record that has no place for an answer.
    assert [f.name for f in dataclasses.fields(CheckRequest)] == ["questions", "evidence"]
    assert list(inspect.signature(checker_messages).parameters) == ["request"]
    assert list(inspect.signature(MarchVerifier.check).parameters)[:2] == ["self", "request"]
    text = checker_messages(CheckRequest(("Q1?", "Q2?"), ("E1", "E2")))[0]["content"]
    assert "1. Q1?\n2. Q2?" in text and "[1] E1\n[2] E2" in text


# --- majority vote -----------------------------------------------------------------------------

CLAIM = Claim("Where is the head office?", "Delhi")


@pytest.mark.march
def test_the_records_round_trip_through_json() -> None:
    for record in (Claim("Who?", "Ann", ("Ann", "Bob")), Verdict("Ann wrote it", None, ("Ann",)),
                   CheckRequest(("Q1?",), ("E1",))):
        assert type(record).from_dict(json.loads(json.dumps(record.to_dict()))) == record


@pytest.mark.march
@pytest.mark.parametrize("answers, supported, votes", [
    (["Delhi", "Delhi", "Mumbai"], True, ("agree", "agree", "disagree")),
    (["Mumbai", None, "Mumbai"], False, ("disagree", "cannot", "disagree")),
    (["Delhi", "Mumbai", None], None, ("agree", "disagree", "cannot")),
    ([None, None, "Delhi"], None, ("cannot", "cannot", "agree")),
    (["Delhi", "missing", "missing"], None, ("agree", "missing", "missing")),
])
def test_a_claims_verdict_is_the_majority_of_three_samples(
        answers: list[str | None], supported: bool | None, votes: tuple[str, ...]) -> None:
    checks = [None if a == "missing" else CheckLine(a, f"quote for {a}") for a in answers]
    v = verdict(CLAIM, checks)
    assert (v.supported, v.votes) == (supported, votes)
    assert v.flagged is (supported is not True)
    if supported is False:
        assert v.checked == "Mumbai" and v.evidence == "quote for Mumbai"


@pytest.mark.march
def test_the_vote_through_the_verifier() -> None:
    v, *_ = verifier([PROPOSED], [CHECK_AGREES, CHECK_DELHI, CHECK_AGREES])
    first = v.verify(QUESTION, ANSWER, EVIDENCE).rounds[0].verdicts[0]
    assert first.supported is True and first.votes == ("agree", "disagree", "agree")
    v, *_ = verifier([PROPOSED], [CHECK_CANNOT, CHECK_CANNOT, CHECK_AGREES])
    result = v.verify(QUESTION, ANSWER, EVIDENCE)
    assert result.rounds[0].verdicts[0].supported is None and result.flagged
    v, *_ = verifier([PROPOSED], [CHECK_CANNOT, CHECK_CANNOT, CHECK_AGREES],
                     flag_unanswerable=False)
    assert not v.verify(QUESTION, ANSWER, EVIDENCE).flagged


@pytest.mark.march
def test_one_sample_is_greedy_and_three_are_sampled_with_their_own_seeds() -> None:
    v, _, _, checker = verifier([PROPOSED], [CHECK_DELHI] * 3)
    v.verify(QUESTION, ANSWER, EVIDENCE)
    assert [r.temperature for r in checker.requests] == [0.7] * 3
    assert len({r.seed for r in checker.requests}) == 3
    v, _, _, checker = verifier([PROPOSED], [CHECK_DELHI], samples=1)
    v.verify(QUESTION, ANSWER, EVIDENCE)
    assert [r.temperature for r in checker.requests] == [0.0]


# --- the revise loop ---------------------------------------------------------------------------

@pytest.mark.march
def test_revise_is_bounded_by_rounds() -> None:
    # A solver that keeps hallucinating: two revisions, three checks, then the report.
    v, solver, proposer, checker = verifier(
        [PROPOSED] * 3, [CHECK_DELHI] * 9, solver=["Revised 1 in Mumbai.", "Revised 2."],
        policy="revise", rounds=2)
    result = v.verify(QUESTION, ANSWER, EVIDENCE)
    assert (len(result.rounds), len(solver.requests), len(proposer.requests),
            len(checker.requests)) == (3, 2, 3, 9)
    assert result.answer == "Revised 2." and result.original == ANSWER
    assert result.flagged and result.revised
    revise_prompt = texts(solver.requests)[0]
    assert ANSWER in revise_prompt and '"Delhi"' in revise_prompt and EVIDENCE[0] in revise_prompt
    for text in texts(checker.requests):
        assert SECRET not in text and "Revised" not in text


@pytest.mark.march
def test_revise_stops_once_the_answer_is_supported() -> None:
    fixed = ("- Question: In what city is the head office of the Oberoi Group? [Answer: Delhi]\n"
             "- Question: What kind of company is the Oberoi Group? [Answer: hotel company]")
    v, solver, *_ = verifier([PROPOSED, fixed], [CHECK_DELHI] * 6,
                             solver=["It is based in Delhi."], policy="revise", rounds=3)
    result = v.verify(QUESTION, ANSWER, EVIDENCE)
    assert len(result.rounds) == 2 and not result.flagged
    assert result.answer == "It is based in Delhi." and len(solver.requests) == 1


@pytest.mark.march
def test_report_policy_never_revises_and_an_abstention_makes_no_claim() -> None:
    v, solver, *_ = verifier([PROPOSED], [CHECK_DELHI] * 3, policy="report", rounds=5)
    result = v.verify(QUESTION, ANSWER, EVIDENCE)
    assert result.flagged and not result.revised and solver.requests == []
    v, _, proposer, _ = verifier([], [])
    result = v.verify(QUESTION, "The evidence does not say.", EVIDENCE)
    assert not result.flagged and proposer.requests == [] and "abstains" in result.report()["note"]


@pytest.mark.march
def test_solve_answers_from_the_evidence_then_checks() -> None:
    v, solver, _, _ = verifier([PROPOSED], [CHECK_AGREES] * 3, solver=[ANSWER])
    result = v.solve(QUESTION, EVIDENCE)
    assert result.original == ANSWER and not result.flagged
    assert EVIDENCE[0] in texts(solver.requests)[0]
    assert result.usage.calls == {"solver": 1, "proposer": 1, "checker": 3}


# --- clear errors and malformed output ---------------------------------------------------------

@pytest.mark.march
def test_an_unparseable_proposer_is_retried_then_a_clear_error_with_the_raw_reply() -> None:
    v, _, proposer, checker = verifier(["Looks right to me!", "Still fine, no facts."], [])
    with pytest.raises(ParseError) as err:
        v.verify(QUESTION, ANSWER, EVIDENCE)
    assert err.value.raw == "Still fine, no facts." and "Still fine, no facts." in str(err.value)
    assert "- Question:" in err.value.message and "--analyst" in err.value.hint
    assert "could not be used" in texts(proposer.requests)[1] and checker.requests == []


@pytest.mark.march
def test_a_retry_that_works_is_counted() -> None:
    v, *_ = verifier(["no format here", PROPOSED], [CHECK_DELHI] * 3)
    result = v.verify(QUESTION, ANSWER, EVIDENCE)
    assert result.rounds[0].proposer["retries"] == 1 and len(result.rounds[0].claims) == 2


@pytest.mark.march
def test_malformed_checker_lines_are_repaired_or_dropped_with_a_count() -> None:
    unnumbered = ("Evidence: head office in Delhi [Answer: Delhi]\n"
                  "Evidence: a hotel company [Answer: hotel company]")
    garbage = "I think the answers are fine.\n7. Evidence: x [Answer: y]\n1. Answer: Delhi"
    v, *_ = verifier([PROPOSED], [CHECK_DELHI, unnumbered, garbage])
    result = v.verify(QUESTION, ANSWER, EVIDENCE)
    stats = result.rounds[0].checker
    # The prose line and the line for a 7th question are dropped; three lines are repaired.
    assert stats["repaired"] == 3 and stats["dropped"] == 2 and stats["missing"] == 1
    first, second = result.rounds[0].verdicts
    assert first.votes == ("disagree", "disagree", "disagree") and first.supported is False
    assert second.votes == ("agree", "agree", "missing") and second.supported is True


@pytest.mark.march
def test_an_empty_corpus_is_a_clear_error(tmp_path: Path) -> None:
    from whetstone.library_store.corpus import Corpus

    s = ScriptedBackend([])
    v = MarchVerifier(s, retriever=Corpus(tmp_path / "c"), config=MarchConfig())
    with pytest.raises(EmptyCorpus) as err:
        v.verify(QUESTION, ANSWER)
    assert "whetstone corpus add" in err.value.hint and s.requests == []
    with pytest.raises(Exception, match="no evidence"):
        MarchVerifier(s).verify(QUESTION, ANSWER)


# --- the formats -------------------------------------------------------------------------------

@pytest.mark.march
def test_claims_are_read_repaired_and_dropped_with_counts() -> None:
    text = ("Here you go:\n- Question: Who directed Jaws? [Answer: Steven Spielberg]\n"
            "- Question: When was Jaws released? [Answer: 1975\n"
            "Question: Where is it set? Answer: Amity Island\n"
            "2. Who wrote the score? [Answer: John Williams]\n"
            "- Question: Who directed Jaws? [Answer: Spielberg]\n"
            "- Question: Who produced it? [Answer: ]\nQuestion: what a mess")
    claims, stats = parse_claims(text, max_claims=3)
    assert [(c.question, c.answer_claimed) for c in claims] == [
        ("Who directed Jaws?", "Steven Spielberg"), ("When was Jaws released?", "1975"),
        ("Where is it set?", "Amity Island")]
    assert (stats.read, stats.repaired, stats.dropped) == (3, 2, 3)


@pytest.mark.march
def test_checker_lines_cannot_answer_in_its_forms() -> None:
    got, stats = parse_checks("1. Evidence: none [Cannot answer]\n2. Not mentioned.\n"
                              "3. Evidence: x [Answer: unknown]\n3. Evidence: y [Answer: z]", 3)
    assert got == {1: CheckLine(None), 2: CheckLine(None), 3: CheckLine(None, "x")}
    assert stats.dropped == 1


@pytest.mark.march
@pytest.mark.parametrize("claimed, checked, agree", [
    ("Steven Spielberg", "Spielberg", True), ("President Richard Nixon", "Richard Nixon", True),
    ("Paris", "Paris, France", True), ("8,849 metres", "8849 m", True),
    ("the Delhi", "delhi.", True), ("Zoë", "Zoe", True),
    ("1975", "1976", False), ("Mumbai", "Delhi", False), ("yes", "no", False),
    ("First for Women", "Arthur's Magazine", False), ("", "x", False),
])
def test_claim_agreement_is_a_normalised_match(claimed: str, checked: str, agree: bool) -> None:
    assert answers_agree(claimed, checked) is agree


# --- the faces ---------------------------------------------------------------------------------

def responder(answer: str = "Final Answer: " + ANSWER, check: str = CHECK_DELHI) -> Any:
    """One scripted model for every role, answering by what the prompt asks."""
    def reply(request: Request) -> str:
        text = "\n".join(m.text for m in request.messages)
        if "Break the answer below into its atomic facts" in text:
            return PROPOSED
        if "Answer each numbered question using only the evidence" in text:
            return check
        return answer
    return reply


@pytest.fixture
def library(tmp_path: Path) -> Path:
    from whetstone.library_store.chunking import SourceDoc
    from whetstone.library_store.corpus import Corpus
    from whetstone.library_store.embeddings import query_embedder
    from whetstone.library_store.store import Library

    lib = Library.init(tmp_path / "lib").root
    corpus = Corpus.of_library(lib, "oberoi", query_embedder(threads=1))
    corpus.add([SourceDoc(t, f"doc{i}") for i, t in enumerate(EVIDENCE)])
    corpus.close()
    return lib


@pytest.mark.march
def test_the_runtime_verify_node_checks_the_agents_answer(library: Path) -> None:
    from whetstone.engine.api import Engine

    backend = ScriptedBackend(responder=responder())
    with Engine(backend, library=library, skills=False, tools=(), checkpointing=False,
                methods=[("march", {"corpus": "oberoi", "k": 2})]) as engine:
        trace = engine.run(QUESTION)
    step = next(s for s in trace.steps if s.kind == "verify")
    assert step.module == "march_verify" and step.output["flagged"] is True
    assert trace.meta["march"] == {"flagged": True, "revised": False, "original": ANSWER,
                                   "claims": 2, "flagged_claims": 1,
                                   "tokens": step.tokens}
    assert trace.meta["methods"][-1]["name"] == "march"
    assert trace.total_tokens > step.tokens > 0
    checker_prompts = [t for t in texts(backend.requests) if "Answer each numbered" in t]
    assert len(checker_prompts) == 3 and all(SECRET not in t for t in checker_prompts)
    assert all(EVIDENCE[0] in t for t in checker_prompts)


@pytest.mark.march
def test_the_runtime_node_revises_and_records_failures(library: Path) -> None:
    from whetstone.engine.api import Engine

    revised = "Final Answer: It is in Delhi."
    calls = {"n": 0}

    def reply(request: Request) -> str:
        text = "\n".join(m.text for m in request.messages)
        if "was checked against the evidence" in text:
            calls["n"] += 1
            return "It is in Delhi."
        return responder(revised if calls["n"] else "Final Answer: " + ANSWER)(request)

    with Engine(ScriptedBackend(responder=reply), library=library, skills=False, tools=(),
                checkpointing=False, methods=[("march", {"corpus": "oberoi",
                                                         "policy": "revise"})]) as engine:
        trace = engine.run(QUESTION)
    assert trace.answer == "It is in Delhi." and trace.meta["march"]["revised"] is True
    # An empty corpus: the error is on the step, the run keeps its answer.
    with Engine(ScriptedBackend(responder=responder()), library=library, skills=False,
                tools=(), checkpointing=False,
                methods=[("march", {"corpus": "nothing"})]) as engine:
        trace = engine.run(QUESTION)
    assert trace.outcome == "answered" and trace.answer == ANSWER
    assert "is empty" in trace.meta["march"]["error"]


@pytest.mark.march
def test_engine_verify_stores_a_trace_and_uses_the_corpus(library: Path) -> None:
    from whetstone.engine.api import Engine

    with Engine(ScriptedBackend(responder=responder()), library=library, skills=False,
                checkpointing=False, corpus="oberoi") as engine:
        result = engine.endpoint("verify", question=QUESTION, answer=ANSWER,
                                 options={"k": 1})
        stored = engine.traces.get(next(iter(engine.traces.latest())))
    assert result.flagged and len(result.evidence) == 1
    assert result.evidence[0].source == "doc0"
    assert stored.meta["source"] == "verify" and stored.meta["march"]["flagged"] is True
    trace = result_trace(result, "t1", model="m")
    assert trace.steps[0].output["rounds"][0]["claims"][0]["supported"] is False


def run_verify(*args: str, replies: list[Any], tmp_path: Path) -> Any:
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(replies))
    (tmp_path / "lib").mkdir(exist_ok=True)  # an empty folder: the library is made there
    (verify,) = commands(Kit())
    return CliRunner().invoke(verify, [*args, "--model", f"scripted:{script}", "--library",
                                       str(tmp_path / "lib")], catch_exceptions=False)


@pytest.mark.march
def test_the_verify_command(tmp_path: Path) -> None:
    args = ["-q", QUESTION, "-a", ANSWER, "-e", EVIDENCE[0], "-e", EVIDENCE[1]]
    res = run_verify(*args, replies=[PROPOSED, *[CHECK_DELHI] * 3], tmp_path=tmp_path)
    assert res.exit_code == EXIT_FLAGGED, res.output
    assert "hallucination flagged: 1 of 2 claim(s)" in res.stdout and "contradicted" in res.stdout
    res = run_verify(*args, "--json", replies=[PROPOSED, *[CHECK_AGREES] * 3],
                     tmp_path=tmp_path)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["report"]["flagged"] is False and out["usage"]["calls"]["checker"] == 3
    res = run_verify(*args, replies=["no claims here", "none again"], tmp_path=tmp_path)
    assert res.exit_code == ParseError.exit_code and "none again" in res.stderr
    res = run_verify("-q", QUESTION, "-a", ANSWER, replies=[], tmp_path=tmp_path)
    assert res.exit_code == EmptyCorpus.exit_code and "corpus add" in res.stderr
    res = run_verify("-q", QUESTION, "-a", ANSWER, "-e", "@" + str(tmp_path / "none.txt"),
                     replies=[], tmp_path=tmp_path)
    assert res.exit_code == 5 and "cannot read evidence file" in res.stderr


@pytest.mark.march
def test_march_is_a_registered_runtime_method() -> None:
    from whetstone.engine.methods.registry import default_registry

    assert default_registry().entry("runtime", "march").load() is March
    assert March.config_class is MarchConfig


@pytest.mark.march
@pytest.mark.integration
def test_engine_app_verifies_against_the_library_corpus(library: Path) -> None:
    from middleware_support import wait_for_trace

    from whetstone.engine.api import Engine

    with Engine(ScriptedBackend(responder=responder(answer=ANSWER)), library=library,
                skills=False, checkpointing=False, corpus="oberoi") as engine, Servers() as s:
        url = s.start(engine.app()) + "/v1/chat/completions"
        r = httpx.post(url, json={"whetstone": {"endpoints": ["verify"]},
                                  "messages": [{"role": "user", "content": QUESTION}]},
                       timeout=60)
        report = r.json()["whetstone"]["endpoints"]["verify"]
        assert report["flagged"] is True and report["flagged_claims"] == 1
        trace = wait_for_trace(engine.traces, r.headers["x-whetstone-trace-id"])
        assert trace.meta["endpoints"]["verify"]["flagged"] is True


@pytest.mark.march
def test_a_question_line_then_an_answer_line_is_one_claim() -> None:
    """The 0.5B proposer wrote "Answer:" on the line after its question in 3 of the 4
    HaluEval answers it failed (benchmarks/results/march-halueval.json); that is a claim."""
    text = ("- Question: In which US state is McClellan Air Force Base?\n"
            "Answer: California\n"
            "- Question: Who leads the band? [Answer: John Gourley]\n"
            "Question: What year?\n\n- Question: Another?\n")
    claims, stats = parse_claims(text)
    assert [(c.question, c.answer_claimed) for c in claims] == [
        ("In which US state is McClellan Air Force Base?", "California"),
        ("Who leads the band?", "John Gourley")]
    assert stats.repaired == 1 and stats.dropped == 2  # the questions with no answer
