"""Dynamo's tool maker: the analyst writes tools that read a task and answer it, and only
those that answer held-in training tasks correctly enter the library (LATM: the strong model
writes, verification on labels picks).

    WRITE    the analyst is shown a few training tasks WITH their expected answers and asked
             for the code alone, in one ```python block: a function
             ``f(question: Annotated[str, "task"]) -> Annotated[str, "answer"]``. A reply with
             no usable function is sent back once with a message saying what was missing.
             ``maker_samples`` candidates are sampled at ``maker_temperature``, plus one greedy.
    VERIFY   each candidate runs in the sandbox on ``maker_probe`` training tasks (the search's
             signal: accuracy, then how close its answers come to the labels); one that
             reaches ``maker_accuracy`` there is checked on up to ``maker_check`` others that no
             prompt ever showed, each output scored by the task's own scorer, and admitted when
             it reaches ``maker_accuracy`` on them too. A crash, a time-out or a wrong answer is
             recorded with the reason.
    SEARCH   while none is admitted (``maker_rounds``, ``maker_seconds``), the ``maker_beam``
             best candidates so far are each shown the probe tasks they fail (their output or
             error beside the label) and asked for a fix; the fixes join the pool and are
             verified the same way (self-debugging from execution feedback, as a beam).
    SKILL    the analyst names the kind of task and says when to call the tool; the skill says
             to call it with no arguments, that its result is the answer, how it was verified
             (``metadata``: accuracy, tasks checked, analyst, date) and carries verified calls
             on training tasks in ``references/examples.md``.

Nothing here knows a task family: what a tool does is learned from the tasks and their labels.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ....skills.format import MAX_DESCRIPTION
from ....tools.learned import ToolDefinition, answer_text, define_tool
from ...backends.base import Backend
from ...errors import ToolError
from ..analyst import AnalystReply, AnalystStats, AskAgain, ask_parsed
from . import PROMPTS
from .maker_checks import closeness, crash_lines, expected_text, spread, why_not_admitted
from .maker_code import FALLBACK_DOC, parse_made, parse_naming, renamed
from .parts import (
    Cluster,
    Proposal,
    Repairs,
    ToolTest,
)
from .sandbox import allowed_modules

if TYPE_CHECKING:
    from ...evaluation.tasks import TaskRecord

T = TypeVar("T")


@dataclass
class Candidate:
    """One tool the analyst wrote, and what verification made of it."""

    sample: str  # "greedy", "sample 2", "repair 1 of sample 2"
    tool: str = ""
    source: str = ""
    accuracy: float = 0.0  # on the check tasks (the ones no prompt showed)
    checked: int = 0
    admitted: bool = False
    reason: str = ""  # why it was not admitted
    tests: list[ToolTest] = field(default_factory=list)
    probe: list[ToolTest] = field(default_factory=list)  # the search's signal
    probe_accuracy: float = 0.0
    closeness: float = 0.0  # mean similarity of its probe answers to the labels
    repaired: int = 0  # how often it was the base of a repair
    seen: frozenset[str] = frozenset()  # signal tasks its repairs were shown

    @property
    def rank(self) -> tuple[float, float, bool]:
        """Search order: probe accuracy, then closeness, then not crashing."""
        return (self.probe_accuracy, self.closeness, all(t.ok for t in self.probe))

    def report(self) -> dict[str, Any]:
        return {"sample": self.sample, "tool": self.tool, "accuracy": round(self.accuracy, 4),
                "checked": self.checked, "admitted": self.admitted, "reason": self.reason,
                "probe_accuracy": round(self.probe_accuracy, 4),
                "closeness": round(self.closeness, 4), "source": self.source[:3000]}


class ToolMaker:
    """Write task tools with the analyst, verify them on labels, and keep the best."""

    def __init__(self, cfg: Any, analyst: Backend, stats: AnalystStats, repairs: Repairs, *,
                 call_tool: Callable[[ToolDefinition, dict[str, Any]], Any],
                 taken: set[str]) -> None:
        self.cfg = cfg
        self.analyst = analyst
        self.stats = stats
        self.repairs = repairs
        self.call_tool = call_tool  # (definition, arguments) -> ToolResult, in the sandbox
        self.taken = taken

    async def make_for(self, tasks: Mapping[str, TaskRecord], attempts: Mapping[str, Any]
                       ) -> Proposal:
        """Make a tool for the failed training tasks: ``maker_shown`` of them are shown with
        their answers, ``maker_probe`` others guide the search, and up to ``maker_check`` more
        (failed or not, never in a prompt) admit it."""
        failing = [i for i, a in attempts.items() if not a.correct]
        shown = spread(failing, self.cfg.maker_shown)
        rest = [i for i in tasks if i not in shown]
        # Half the rest at most: the check tasks, never in a prompt, are what admits a tool.
        probe = spread(rest, min(self.cfg.maker_probe, len(rest) // 2))
        check = spread([i for i in rest if i not in probe], self.cfg.maker_check)
        cluster = Cluster("computational", failing, PROMPTS.load(
            "parts.yaml#maker_diagnosis"), PROMPTS.load("parts.yaml#maker_fix"))
        return await self.make(cluster, [tasks[i] for i in shown], [tasks[i] for i in probe],
                               [tasks[i] for i in check])

    async def make(self, cluster: Cluster, shown: Sequence[TaskRecord],
                   probe: Sequence[TaskRecord], check: Sequence[TaskRecord]) -> Proposal:
        """Write, search and verify; name the best admitted candidate: a ``task_tool``
        proposal, kept or dropped with each candidate's reason in ``candidates``."""
        start = time.monotonic()
        # Tests in Python (MBPP's form): a coder model reads a literal's escapes exactly.
        examples = "\n".join(PROMPTS.render("parts.yaml#maker_example", task=repr(
            t.prompt), expected=repr(expected_text(t))) for t in shown)
        user = PROMPTS.render("maker", examples=examples, modules=allowed_modules())
        plan = [("greedy", 0.0)] + [(f"sample {i}", self.cfg.maker_temperature)
                                    for i in range(1, self.cfg.maker_samples + 1)]
        sem = asyncio.Semaphore(self.cfg.workers)

        async def one(n: int, label: str, temperature: float) -> Candidate:
            async with sem:
                return await self._write(label, user, temperature, self.cfg.seed + 7 * n)

        cands = list(await asyncio.gather(*(one(n, lb, t) for n, (lb, t) in enumerate(plan))))
        # With no probe tasks the check tasks guide the search; a repair then never counts
        # the tasks its prompt showed.
        signal = list(probe) or list(check)
        await asyncio.to_thread(self._judge_all, cands, cands, probe, check)
        for round_no in range(1, self.cfg.maker_rounds + 1):
            if (self._best(cands) is not None or time.monotonic() - start > self.cfg.maker_seconds
                    or self.stats.calls >= self.cfg.max_analyst_calls):
                break
            beam = self._beam(cands)
            if not beam:
                break

            async def fix(n: int, base: Candidate, r: int) -> Candidate:
                async with sem:
                    return await self._repair(base, signal, r, n)

            new = list(await asyncio.gather(*(fix(n, b, round_no)
                                              for n, b in enumerate(beam))))
            await asyncio.to_thread(self._judge_all, new, cands + new, probe, check)
            cands += new
        best = self._best(cands)
        proposal = Proposal("task_tool", cluster, candidates=[c.report() for c in cands])
        if best is None:
            tried = sorted((c for c in cands if c.reason), key=lambda c: c.rank, reverse=True)
            proposal.reason = "no tool reached the training accuracy needed (" + "; ".join(
                f"{c.sample}: {c.reason}" for c in tried[:4]) + ")"
            return proposal
        await self._name(proposal, best, shown)
        return proposal

    # -- writing ----------------------------------------------------------------------------

    async def _ask(self, messages: list[dict[str, str]], parse: Callable[[str], T],
                   temperature: float, seed: int, **kwargs: Any) -> AnalystReply[T]:
        """One analyst exchange (``analyst.ask_parsed``: the shared ask-parse-retry loop),
        its costs added to the maker's."""
        reply = await ask_parsed(self.analyst, messages, parse, temperature=temperature,
                                 max_tokens=self.cfg.max_tokens, seed=seed, **kwargs)
        self.stats.add(reply.stats)
        return reply

    async def _write(self, label: str, user: str, temperature: float, seed: int,
                     unchanged: str = "") -> Candidate:
        """One candidate: ask for the code; a reply without a usable function is sent back
        once with ``maker_retry`` saying what was missing, and a repair that returns
        ``unchanged`` (the code it was asked to fix) once with ``maker_unchanged``."""
        asked = 0

        def parse(raw: str) -> ToolDefinition:
            nonlocal asked
            asked += 1
            definition = parse_made(raw, self.taken, self.repairs)
            if asked == 1 and unchanged and definition.source == unchanged:
                # A small analyst often answers "fix this" with the code as it was.
                self.repairs.add("maker-unchanged-retry")
                raise AskAgain(PROMPTS.load("maker_unchanged"), definition)
            return definition

        reply = await self._ask(
            [{"role": "system", "content": PROMPTS.load("system")},
             {"role": "user", "content": user}], parse, temperature, seed,
            retry_prompt=lambda exc: PROMPTS.render("maker_retry", missing=exc.message).strip())
        cand = Candidate(label)
        if reply.value is None:
            cand.reason = f"no usable function: {reply.error or 'the analyst call failed'}"
        else:
            cand.tool, cand.source = reply.value.name, reply.value.source
        return cand

    # -- verifying --------------------------------------------------------------------------

    def _judge_all(self, new: list[Candidate], pool: Sequence[Candidate],
                   probe: Sequence[TaskRecord], check: Sequence[TaskRecord]) -> None:
        """Run each new candidate on the probe tasks and, if it does well there, on the
        check tasks; code already in ``pool`` is not run twice."""
        for c in new:
            if not c.source:
                continue
            twin = next((o for o in pool if o is not c and o.source == c.source and
                         (o.probe or o.tests or o.reason)), None)
            if twin is not None:  # the same code twice (greedy and a sample often agree)
                c.accuracy, c.checked, c.tests, c.probe = (twin.accuracy, twin.checked,
                                                           twin.tests, twin.probe)
                c.probe_accuracy, c.closeness = twin.probe_accuracy, twin.closeness
                c.repaired = 1_000_000  # never a base again: its twin already is one
                c.reason = f"the same code as {twin.sample}"
                continue
            self._judge(c, probe, check)

    def _judge(self, c: Candidate, probe: Sequence[TaskRecord],
               check: Sequence[TaskRecord]) -> None:
        definition, problems = define_tool(c.source, name=c.tool, skill="dynamo-draft")
        if definition is None:
            c.reason = problems[0].message if problems else "the code breaks the tool rules"
            return
        if probe:
            c.probe = [self._run(definition, t) for t in probe]
            c.probe_accuracy = sum(t.matched for t in c.probe) / len(c.probe)
            c.closeness = closeness(c.probe, {t.id: t for t in probe})
            if c.probe_accuracy < self.cfg.maker_accuracy:
                c.reason = "on the probe tasks: " + why_not_admitted(
                    c.probe, [t for t in c.probe if not t.matched], {t.id: t for t in probe})
                return
        self._verify(c, definition, [t for t in check if t.id not in c.seen])
        if not probe:  # the check tasks were the signal
            c.probe, c.probe_accuracy = c.tests, c.accuracy
            c.closeness = closeness(c.tests, {t.id: t for t in check})

    def _run(self, definition: ToolDefinition, task: TaskRecord) -> ToolTest:
        """One sandboxed call of the tool on ``task``, scored by the task's own scorer."""
        # lazy: loads filelock and 41 more of our modules
        from ...evaluation.scorers import get_scorer

        test = ToolTest(task.id, {})
        try:
            res = self.call_tool(definition, {k: task.prompt for k in definition.spec.inject})
            test.ok, test.output, test.error = res.ok, res.output[:2000], res.error
            test.seconds = round(res.duration_s, 3)
        except ToolError as exc:
            test.error = exc.message
        if test.ok:
            try:
                test.matched = get_scorer(task.scorer)(answer_text(test.output), task) >= 1.0
            except Exception:  # noqa: BLE001 -- a scorer that cannot read the output: a miss
                test.matched = False
        return test

    def _verify(self, c: Candidate, definition: ToolDefinition,
                check: Sequence[TaskRecord]) -> None:
        """Run ``c`` on ``check``; stop as soon as the misses rule the threshold out (a wrong
        tool costs a few sandbox runs, not all)."""
        if not check:
            c.reason = "no training task left to check on"
            return
        allowed = math.floor((1 - self.cfg.maker_accuracy) * len(check) + 1e-9)
        misses: list[ToolTest] = []
        for task in check:
            test = self._run(definition, task)
            c.tests.append(test)
            if not test.matched:
                misses.append(test)
                if len(misses) > allowed:
                    break
        c.checked = len(c.tests)
        c.accuracy = sum(t.matched for t in c.tests) / c.checked
        c.admitted = c.checked == len(check) and c.accuracy >= self.cfg.maker_accuracy
        if not c.admitted:
            c.reason = why_not_admitted(c.tests, misses, {t.id: t for t in check})

    def _best(self, cands: Sequence[Candidate]) -> Candidate | None:
        admitted = [c for c in cands if c.admitted]
        # Most accurate first; on a tie, the shorter code (it guessed less).
        return min(admitted, key=lambda c: (-c.accuracy, len(c.source)), default=None)

    def _beam(self, cands: Sequence[Candidate]) -> list[Candidate]:
        """The ``maker_beam`` best candidates that ran, the least repaired first on a tie;
        on equal rank the earliest (greedy first): a short sampled guess that hard-codes a
        shown answer is the worst base to repair."""
        ran = [c for c in cands if c.probe and c.repaired < 1_000_000]
        order = sorted(ran, key=lambda c: (c.rank, -c.repaired, -cands.index(c)), reverse=True)
        return order[:self.cfg.maker_beam]

    async def _repair(self, base: Candidate, signal: Sequence[TaskRecord], round_no: int,
                      n: int) -> Candidate:
        """``base`` sees up to three signal tasks it got wrong and is asked for a fix (greedy
        the first time, sampled after: the same prompt twice would give the same fix; a small
        analyst often answers a greedy repair with the code unchanged, so ``maker_beam``
        repairs of one base differ)."""
        by_id = {t.id: t for t in signal}
        wrong = [t for t in base.probe if not t.matched][:3]
        failures = "\n".join(PROMPTS.render(
            "parts.yaml#maker_failure", task=repr(by_id[t.task_id].prompt),
            output=repr(answer_text(t.output))[:300] if t.ok else
            "an error:\n# " + "\n# ".join(crash_lines(t)),
            expected=repr(expected_text(by_id[t.task_id]))) for t in wrong)
        user = PROMPTS.render("maker_repair", code=base.source.strip(), failures=failures)
        temperature = 0.0 if base.repaired == 0 else self.cfg.maker_temperature
        base.repaired += 1
        fixed = await self._write(f"repair {round_no} of {base.sample}", user, temperature,
                                  self.cfg.seed + 97 * round_no + 13 * n + base.repaired,
                                  unchanged=base.source)
        fixed.seen = base.seen | {t.task_id for t in wrong}
        return fixed

    # -- the skill --------------------------------------------------------------------------

    async def _name(self, p: Proposal, best: Candidate, shown: Sequence[TaskRecord]) -> None:
        """Fill ``p`` from the admitted candidate; the analyst names the skill (a reply it
        cannot use falls back to the tool's name and docstring)."""
        definition, _ = define_tool(best.source, name=best.tool, skill="dynamo-draft")
        summary = definition.spec.description if definition is not None else FALLBACK_DOC
        examples = "\n\n".join(f"Task: {t.prompt.strip()}" for t in shown[:2])
        reply = await self._ask([{"role": "system", "content": PROMPTS.load("system")},
                                 {"role": "user", "content": PROMPTS.render(
                                     "maker_skill", tool=best.tool, examples=examples)}],
                                str, 0.0, self.cfg.seed + 131, retries=0)
        name, when = parse_naming(reply.raw, self.repairs)
        if not when:
            self.repairs.add("maker-naming-fallback")
            first = shown[0].prompt.strip().splitlines()[0] if shown else ""
            when = PROMPTS.render("parts.yaml#maker_when", task=first[:160])
        p.skill = name or best.tool.replace("_", "-")
        if name:  # the code says `solve`: the tool is named after what it does, like its skill
            best.tool, best.source = renamed(best.tool, best.source, name.replace("-", "_"),
                                              self.taken)
        when = re.sub(r"^(?:use it |call it |use |call )?when\s+", "", when, flags=re.IGNORECASE)
        when = when[:1].lower() + when[1:].rstrip(".") + "."
        p.when = PROMPTS.render("parts.yaml#maker_use_when", when=when)
        p.description = PROMPTS.render("parts.yaml#maker_description", when=when,
                                       summary=summary.rstrip("."))[:MAX_DESCRIPTION]
        p.tool, p.source, p.tests = best.tool, best.source, best.tests
        p.accuracy, p.checked, p.kept = best.accuracy, best.checked, True
        p.analyst = self.analyst.spec
        p.date = dt.datetime.now(dt.UTC).date().isoformat()

