"""MARCH: a solver, a proposer and a checker with information asymmetry against hallucination.

    Solver    answers the question from the top-k passages of an evidence corpus (or is any
              answer handed in: ``whetstone verify --answer``, the agent's final answer).
    Proposer  sees only the question and the answer; cuts the answer into atomic claims, each
              a question with the answer the solver implied: ``- Question: … [Answer: …]``.
    Checker   sees only the evidence and the claims' questions — never the answer, nor any
              claimed answer — and answers each from the evidence or says it cannot:
              ``k. Evidence: … [Answer: … | Cannot answer]``. ``samples`` samples (3), and a
              claim's verdict is their majority vote (``engine/methods/march/format.py``).

A claim is flagged when the checker's majority answer disagrees with the claimed one or the
evidence cannot settle it. Policy ``report`` returns the answer with the hallucination report;
``revise`` has the solver rewrite the answer from the flagged claims and the checker's evidence
and checks again, at most ``rounds`` times.

The asymmetry is structural: the checker's prompt is built by ``checker_messages`` from a
``CheckRequest`` (``records.py``), a record with no field for an answer; no code path
hands the checker anything else (tests/test_march.py asserts the answer never reaches it).
Claim agreement is a normalised match, documented in ``march_format``.

Faces: ``MarchVerifier`` behind the ``verify`` endpoint (``Engine.endpoint("verify", ...)``,
``whetstone verify``, the server's ``{"whetstone": {"endpoints": ["verify"]}}``) and ``March``, the runtime method ``march`` whose
``verify`` node checks the agent's answer before the run finishes.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ....library_store.trace_build import make_trace
from ...backends.base import Backend
from ...errors import ConfigError, ParseError, WhetstoneError
from ...runtime.plugins import MethodEnv, Node, Plugin
from ...types import Completion, Passage, Request, Step, Trace
from ..base import knob, make_config
from . import PROMPTS
from .format import (
    CheckLine,
    FormatStats,
    parse_checks,
    parse_claims,
    verdict,
)
from .records import CheckRequest, Claim, Verdict

if TYPE_CHECKING:
    from ....tools.search import Retriever
    from ...runtime.state import AgentContext, AgentState

ROLES = ("solver", "proposer", "checker", "reviser")
# An answer that only says the evidence holds no answer makes no claim to check.
_ABSTAINS = re.compile(r"^\W*(?:i (?:do not|don't) know|unknown|(?:the )?evidence (?:does not|"
                       r"doesn't) say|(?:it )?cannot be (?:determined|answered)|no answer)\b",
                       re.IGNORECASE)


@dataclass(frozen=True)
class MarchConfig:
    """MARCH's knobs (``--method-config march.KEY=VALUE``, ``whetstone verify`` options)."""

    k: int = knob(4, help="Evidence passages retrieved for the question.", min=1)
    samples: int = knob(3, help="Checker samples per claim set; a claim's verdict is their "
                                "majority vote.", min=1)
    checker_temperature: float = knob(0.7, help="Sampling temperature of the checker samples "
                                                "(0 when samples=1).", min=0)
    policy: str = knob("report", help="report: return the answer with the hallucination "
                                      "report; revise: rewrite flagged answers.",
                       choices=("report", "revise"))
    rounds: int = knob(1, help="Most revisions under policy=revise.", min=0)
    max_claims: int = knob(6, help="Most claims the proposer may make.", min=1)
    flag_unanswerable: bool = knob(True, help="Flag claims the evidence cannot settle (not "
                                              "only contradicted ones).")
    corpus: str = knob("default", help="The library corpus evidence comes from.")
    evidence: str = knob("corpus", help="In a run: 'corpus' retrieves for the task; 'task' "
                                        "uses the run's first user message.",
                         choices=("corpus", "task"))
    analyst: str | None = knob(None, help="Model spec of the proposer and the checker "
                                          "(default: the agent's model).")
    max_tokens: int = knob(384, help="Most tokens per proposer, checker or solver reply.",
                           min=16)
    seed: int = knob(0, help="Seed of the first call; later calls count up from it.")


# --- prompts: each role's messages are built from what that role may see ------------------------

def _passages_text(passages: Sequence[Passage]) -> str:
    return "\n".join(PROMPTS.render("parts.yaml#passage", number=i, text=p.text.strip())
                     for i, p in enumerate(passages, start=1)) or "(no evidence)"


def solver_messages(question: str, passages: Sequence[Passage]) -> list[dict[str, str]]:
    """The solver's prompt: the evidence and the question."""
    return [{"role": "user", "content": PROMPTS.render(
        "solver", evidence=_passages_text(passages), question=question).strip()}]


def proposer_messages(question: str, answer: str, max_claims: int) -> list[dict[str, str]]:
    """The proposer's prompt: the question and the answer, no evidence."""
    return [{"role": "user", "content": PROMPTS.render(
        "proposer", question=question, answer=answer, max_claims=max_claims).strip()}]


def checker_messages(request: CheckRequest) -> list[dict[str, str]]:
    """The checker's prompt, built from a ``CheckRequest`` alone: evidence and questions."""
    questions = "\n".join(PROMPTS.render("parts.yaml#question", number=i, question=q)
                          for i, q in enumerate(request.questions, start=1))
    evidence = "\n".join(PROMPTS.render("parts.yaml#passage", number=i, text=t.strip())
                         for i, t in enumerate(request.evidence, start=1)) or "(no evidence)"
    return [{"role": "user", "content": PROMPTS.render(
        "checker", evidence=evidence, questions=questions).strip()}]


def revise_messages(question: str, answer: str, passages: Sequence[Passage],
                    flagged: Sequence[Verdict]) -> list[dict[str, str]]:
    """The solver's second try: its answer, the flagged claims and what the checker found."""
    lines = [PROMPTS.render("parts.yaml#flagged_disagrees", question=v.claim, claimed=v.claimed,
                            checked=v.checked, evidence=v.evidence or "no quote")
             if v.supported is False else
             PROMPTS.render("parts.yaml#flagged_unsupported", question=v.claim,
                            claimed=v.claimed) for v in flagged]
    return [{"role": "user", "content": PROMPTS.render(
        "revise", flagged="\n".join(lines), evidence=_passages_text(passages),
        question=question, answer=answer).strip()}]


# --- results -----------------------------------------------------------------------------------

@dataclass
class Usage:
    """Calls and tokens by role (solver, proposer, checker, reviser)."""

    calls: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)

    def add(self, role: str, completion: Completion) -> None:
        self.calls[role] = self.calls.get(role, 0) + 1
        self.tokens[role] = self.tokens.get(role, 0) + completion.total_tokens

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens.values())

    def to_dict(self) -> dict[str, Any]:
        return {"calls": dict(self.calls), "tokens": dict(self.tokens),
                "total_tokens": self.total_tokens}


@dataclass(frozen=True)
class MarchRound:
    """One check of one answer: its claims, their verdicts, and how the replies parsed."""

    answer: str
    claims: tuple[Claim, ...]
    verdicts: tuple[Verdict, ...]
    flag_unanswerable: bool = True
    proposer: Mapping[str, Any] = field(default_factory=dict)
    checker: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""

    def is_flagged(self, v: Verdict) -> bool:
        return v.supported is False or (self.flag_unanswerable and v.supported is None)

    @property
    def flagged(self) -> bool:
        """Whether any claim is flagged: the answer is reported as a hallucination."""
        return any(self.is_flagged(v) for v in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        return {"answer": self.answer, "flagged": self.flagged, "note": self.note,
                "claims": [{**v.to_dict(), "flagged": self.is_flagged(v)}
                           for v in self.verdicts],
                "proposer": dict(self.proposer), "checker": dict(self.checker)}


@dataclass(frozen=True)
class MarchResult:
    """A verified answer: the final ``answer`` (revised under policy=revise), the
    ``original`` one, the evidence, each round's check, and the cost."""

    question: str
    answer: str
    original: str
    evidence: tuple[Passage, ...]
    rounds: tuple[MarchRound, ...]
    policy: str
    usage: Usage
    seconds: float = 0.0

    @property
    def flagged(self) -> bool:
        """The final answer is still flagged."""
        return bool(self.rounds) and self.rounds[-1].flagged

    @property
    def revised(self) -> bool:
        return self.answer != self.original

    def report(self) -> dict[str, Any]:
        """The hallucination report: the last round's claims, and a summary."""
        last = self.rounds[-1] if self.rounds else None
        claims = last.to_dict()["claims"] if last else []
        return {"flagged": self.flagged, "answer": self.answer, "revised": self.revised,
                "claims": claims, "flagged_claims": sum(c["flagged"] for c in claims),
                "rounds": len(self.rounds), "note": last.note if last else "",
                "tokens": self.usage.total_tokens}

    def trace(self, *, model: str = "") -> Trace:
        """This verification as a ``verify`` trace (``result_trace``)."""
        return result_trace(self, model=model)

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.question, "answer": self.answer, "original": self.original,
                "flagged": self.flagged, "revised": self.revised, "policy": self.policy,
                "evidence": [p.to_dict() for p in self.evidence],
                "rounds": [r.to_dict() for r in self.rounds], "usage": self.usage.to_dict(),
                "seconds": round(self.seconds, 3)}


def complete_all(backend: Backend, requests: Sequence[Request]) -> list[Completion]:
    """Many requests through the backend's ``batch`` (a batched engine answers them together);
    one by one when called from inside an event loop's thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return backend.batch_sync(requests)
    return [backend.complete(r) for r in requests]


# --- the verifier ------------------------------------------------------------------------------

class MarchVerifier:
    """Solver, proposer and checker over one evidence source.

    ``solver`` answers and revises; ``proposer`` and ``checker`` default to it (the analyst
    role: ``MarchConfig.analyst``). ``retriever`` supplies evidence when none is given
    (``whetstone.library_store.corpus.Corpus`` or any ``search(query, k)``).
    """

    def __init__(self, solver: Backend, *, proposer: Backend | None = None,
                 checker: Backend | None = None, retriever: Retriever | None = None,
                 config: MarchConfig | None = None) -> None:
        self.solver = solver
        self.proposer = proposer or solver
        self.checker = checker or self.proposer
        self.retriever = retriever
        self.config = config or MarchConfig()

    def evidence_for(self, question: str,
                     evidence: Sequence[str | Passage] | None = None) -> tuple[Passage, ...]:
        """The given evidence, else the top-k passages the retriever finds for ``question``."""
        if evidence:
            return tuple(p if isinstance(p, Passage) else Passage(str(p), "given")
                         for p in evidence if (p.text if isinstance(p, Passage) else str(p))
                         .strip())
        if self.retriever is None:
            raise ConfigError("MARCH has no evidence: none was given and no corpus is set",
                              hint="pass evidence, or fill a corpus: whetstone corpus add "
                                   "PATH, then --corpus NAME")
        return tuple(self.retriever.search(question, self.config.k))

    def _call(self, backend: Backend, role: str, messages: list[dict[str, str]],
              usage: Usage, *, seed: int, temperature: float = 0.0) -> Completion:
        completion = backend.complete(Request(messages=messages,  # type: ignore[arg-type]
                                              max_tokens=self.config.max_tokens,
                                              temperature=temperature, seed=seed))
        usage.add(role, completion)
        return completion

    def solve(self, question: str, evidence: Sequence[str | Passage] | None = None
              ) -> MarchResult:
        """The whole loop: the solver answers from the evidence, then ``verify``."""
        if not question.strip():
            raise ConfigError("the question is empty", hint="ask something")
        passages = self.evidence_for(question, evidence)
        usage = Usage()
        answer = self._call(self.solver, "solver", solver_messages(question, passages), usage,
                            seed=self.config.seed).text.strip()
        return self.verify(question, answer, passages, usage=usage)

    def verify(self, question: str, answer: str,
               evidence: Sequence[str | Passage] | None = None, *,
               usage: Usage | None = None) -> MarchResult:
        """Check ``answer`` to ``question``; under policy=revise, rewrite a flagged answer and
        check again, at most ``rounds`` times. Raises ``ParseError`` (with the raw reply)
        when the proposer's reply holds no claim even after one retry."""
        if not question.strip() or not answer.strip():
            raise ConfigError("verify needs a question and an answer",
                              hint='e.g. --question "Who wrote Hamlet?" --answer "Marlowe"')
        start = time.perf_counter()
        cfg = self.config
        passages = self.evidence_for(question, evidence)
        usage = usage or Usage()
        rounds: list[MarchRound] = []
        current = answer.strip()
        for r in range(cfg.rounds + 1):
            rounds.append(self.check_answer(question, current, passages, usage, r))
            if not rounds[-1].flagged or cfg.policy != "revise" or r == cfg.rounds:
                break
            flagged = [v for v in rounds[-1].verdicts if rounds[-1].is_flagged(v)]
            current = self._call(self.solver, "reviser",
                                 revise_messages(question, current, passages, flagged), usage,
                                 seed=cfg.seed + 1000 + r).text.strip() or current
        return MarchResult(question, current, answer.strip(), passages, tuple(rounds),
                           cfg.policy, usage, time.perf_counter() - start)

    def check_answer(self, question: str, answer: str, passages: Sequence[Passage],
                     usage: Usage, round_no: int = 0) -> MarchRound:
        """One round: propose claims from (question, answer), check their questions against
        the evidence (never the answer), vote."""
        cfg = self.config
        if _ABSTAINS.match(answer):
            return MarchRound(answer, (), (), cfg.flag_unanswerable,
                              note="the answer abstains: no claim to check")
        claims, proposed = self.propose(question, answer, usage, seed=cfg.seed + round_no)
        request = CheckRequest(questions=tuple(c.question for c in claims),
                               evidence=tuple(p.text for p in passages))
        samples, checked = self.check(request, usage, seed=cfg.seed + 100 * (round_no + 1))
        verdicts, with_answers = [], []
        for i, claim in enumerate(claims, start=1):
            votes = [s.get(i) for s in samples]
            verdicts.append(verdict(claim, votes))
            with_answers.append(replace(claim, checked_answers=tuple(
                (c.answer or "") if c is not None else "" for c in votes)))
        missing = sum(1 for s in samples for i in range(1, len(claims) + 1) if i not in s)
        return MarchRound(answer, tuple(with_answers), tuple(verdicts), cfg.flag_unanswerable,
                          proposer=proposed.to_dict(),
                          checker={**checked.to_dict(), "missing": missing,
                                   "samples": len(samples)})

    def propose(self, question: str, answer: str, usage: Usage, *, seed: int = 0
                ) -> tuple[list[Claim], FormatStats]:
        """The proposer's claims; one retry showing the problem, then ``ParseError``."""
        messages = proposer_messages(question, answer, self.config.max_claims)
        stats = FormatStats()
        raw = ""
        for attempt in range(2):
            raw = self._call(self.proposer, "proposer", messages, usage, seed=seed + attempt).text
            claims, got = parse_claims(raw, self.config.max_claims)
            stats.add(got)
            if claims:
                stats.retries = attempt
                return claims, stats
            error = got.problems[0] if got.problems else "no line of the form " \
                "'- Question: ... [Answer: ...]'"
            messages = [*messages, {"role": "assistant", "content": raw},
                        {"role": "user", "content": PROMPTS.render(
                            "parts.yaml#proposer_retry", error=error)}]
        raise ParseError("the proposer's reply holds no claim in the form "
                         "'- Question: ... [Answer: ...]', after one retry", raw,
                         hint="try a stronger --analyst model, or check the answer is a "
                              "statement that can be checked")

    def check(self, request: CheckRequest, usage: Usage, *, seed: int = 0
              ) -> tuple[list[dict[int, CheckLine]], FormatStats]:
        """``samples`` checker replies to ``request`` (batched), each read into answers by
        question number; unusable lines are dropped and counted, never fatal."""
        cfg = self.config
        temperature = cfg.checker_temperature if cfg.samples > 1 else 0.0
        messages = checker_messages(request)
        requests = [Request(messages=messages, max_tokens=cfg.max_tokens,  # type: ignore
                            temperature=temperature, seed=seed + i) for i in range(cfg.samples)]
        stats = FormatStats()
        samples = []
        for completion in complete_all(self.checker, requests):
            usage.add("checker", completion)
            parsed, got = parse_checks(completion.text, len(request.questions))
            stats.add(got)
            samples.append(parsed)
        return samples, stats


def result_trace(result: MarchResult, trace_id: str | None = None, *, model: str = "") -> Trace:
    """A verification as a ``verify`` trace (``whetstone.library_store.trace_build.make_trace``; a new
    id when ``trace_id`` is None): one ``verify`` step holding the whole result, the final
    answer, the report in ``meta.march``."""
    end = time.time()
    step = Step(kind="verify", module="march_verify",
                input={"question": result.question, "answer": result.original},
                output=result.to_dict(), tokens=result.usage.total_tokens,
                started=end - result.seconds, duration_s=result.seconds, route="end")
    report = {k: v for k, v in result.report().items() if k != "claims"}
    return make_trace("verify", trace_id=trace_id, task=result.question, steps=(step,),
                      answer=result.answer, outcome="answered", model=model,
                      started=end - result.seconds, ended=end,
                      total_tokens=result.usage.total_tokens, meta={"march": report})


def verify_answer(env: MethodEnv, question: str, answer: str | None = None, *,
                  evidence: Sequence[str] | None = None, analyst: Any = None,
                  options: Mapping[str, Any]) -> MarchResult:
    """MARCH's ``verify`` endpoint (``Engine.endpoint("verify", question=..., answer=...)``):
    check ``answer`` against ``evidence`` (default: the top passages of the corpus
    ``options["corpus"]``); with no ``answer`` the solver answers from the evidence first."""
    options = dict(options)
    if env.corpus_name:
        options.setdefault("corpus", env.corpus_name)
    config = make_config(MarchConfig, options, method="march")
    analyst_backend, own = env.model(analyst or config.analyst)
    retriever = None if evidence else env.corpus(config.corpus)
    verifier = MarchVerifier(env.require_backend("march"), proposer=analyst_backend,
                             config=config, retriever=retriever)
    try:
        return verifier.verify(question, answer, evidence) if answer is not None \
            else verifier.solve(question, evidence)
    finally:
        if own:
            analyst_backend.close()


# --- the runtime method ------------------------------------------------------------------------

class March(Plugin):
    """MARCH: check the agent's answer claim by claim against an evidence corpus, with a
    checker that never sees the answer; report or revise hallucinations."""

    name = "march"
    config_class = MarchConfig
    stages = ("answer",)  # the answer checked before the run finishes

    def __init__(self, verifier: MarchVerifier) -> None:
        self.verifier = verifier
        self.config = verifier.config

    @classmethod
    def build(cls, config: Any, env: MethodEnv) -> March:
        cfg = config or MarchConfig()
        backend = env.require_backend("march")
        retriever = env.corpus(cfg.corpus) if cfg.evidence == "corpus" and env.library \
            is not None else None
        analyst = env.model(cfg.analyst)[0] if cfg.analyst else None
        return cls(MarchVerifier(backend, proposer=analyst, retriever=retriever, config=cfg))

    def nodes(self) -> list[Node]:
        return [Node("answer", self._verify_node)]

    def _verify_node(self, state: AgentState, ctx: AgentContext) -> dict[str, Any]:
        """Check the run's answer; under policy=revise, replace it with the revision. A
        failure (an empty corpus, an unreadable proposer reply) is recorded on the step and
        the run keeps its answer."""
        answer = state.get("answer")
        if answer is None:
            return {}
        start = time.time()
        evidence = _task_text(state) if self.config.evidence == "task" else None
        try:
            result = self.verifier.verify(state["task"], answer, evidence)
        except WhetstoneError as exc:
            step = Step(kind="verify", module="march_verify", input={"answer": answer},
                        error=str(exc), started=start, duration_s=time.time() - start,
                        route="finish")
            return {"steps": [step.to_dict()]}
        step = Step(kind="verify", module="march_verify",
                    input={"question": state["task"], "answer": answer},
                    output=result.to_dict(), tokens=result.usage.total_tokens, started=start,
                    duration_s=time.time() - start, route="finish",
                    meta={"flagged": result.flagged, "revised": result.revised})
        update: dict[str, Any] = {"steps": [step.to_dict()],
                                  "tokens": state.get("tokens", 0) + result.usage.total_tokens}
        if result.revised:
            update["answer"] = result.answer
        return update

    def finish_meta(self, state: AgentState) -> Mapping[str, Any]:
        for s in reversed(state.get("steps") or []):
            if s.get("module") == "march_verify":
                if s.get("error"):
                    return {"error": s["error"]}
                out = s.get("output") or {}
                report = {k: out.get(k) for k in ("flagged", "revised", "original")}
                last = (out.get("rounds") or [{}])[-1]
                report["claims"] = len(last.get("claims") or [])
                report["flagged_claims"] = sum(bool(c.get("flagged"))
                                               for c in last.get("claims") or [])
                report["tokens"] = (out.get("usage") or {}).get("total_tokens", 0)
                return report
        return {}


def _task_text(state: AgentState) -> list[str]:
    """The run's first user message (a task's evidence travels there), as evidence."""
    for m in state.get("messages") or []:
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return [m["content"]]
    return [state["task"]]
