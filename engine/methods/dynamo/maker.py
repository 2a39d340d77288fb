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

import ast
import asyncio
import datetime as dt
import difflib
import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ....skills.format import MAX_DESCRIPTION, Example, render_examples, render_skill_md
from ....tools.learned import TOOL_NAME, ToolDefinition, answer_text, define_tool
from ....tools.validate import ALLOWED_MODULES
from ...backends.base import Backend
from ...errors import ParseError, ToolError
from ...prompts import render_prompt
from ...types import Skill
from ..analyst import AnalystReply, AnalystStats, AskAgain, ask_parsed
from . import PROMPTS
from .parts import (
    PROVENANCE,
    Cluster,
    Proposal,
    Repairs,
    ToolTest,
    code_block,
    skill_name,
)
from .sandbox import allowed_modules

if TYPE_CHECKING:
    from ...evaluation.tasks import TaskRecord

TASK_MARK = 'Annotated[str, "task"]'
ANSWER_MARK = 'Annotated[str, "answer"]'
FALLBACK_DOC = "Answer the task from its text."
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


# -- reading a reply --------------------------------------------------------------------------

def _entry(tree: ast.Module) -> ast.FunctionDef | None:
    """The function the tool is: the one with a task parameter, else the last top-level
    function of one parameter (helpers come first), else the last one."""
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    marked = [f for f in fns if f.args.args and f.args.args[0].annotation is not None
              and "task" in ast.unparse(f.args.args[0].annotation)]
    single = [f for f in fns if len(f.args.args) == 1]
    return (marked or single or fns or [None])[-1]


def normalise_tool(code: str, taken: set[str], repairs: Repairs) -> tuple[str, str]:
    """``(name, source)`` of a task tool from the analyst's code: the entry function gets the
    task-reading signature, a docstring and the ``Annotated`` import where it lacks them, and
    top-level statements that are not definitions (demo calls, prints) are dropped; each
    repair is counted. ``ParseError`` says what is missing."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise ParseError(f"the code does not parse: line {exc.lineno}: {exc.msg}", code) from exc
    fn = _entry(tree)
    if fn is None:
        raise ParseError("the code defines no function", code)
    if len(fn.args.args) != 1 or fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs:
        raise ParseError(f"{fn.name}() must take exactly one parameter, the task text "
                         "(question)", code)
    kept = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                                   ast.ClassDef, ast.Assign, ast.AnnAssign))]
    if len(kept) != len(tree.body):
        repairs.add("maker-statements-dropped", len(tree.body) - len(kept))
    tree.body = kept
    arg = fn.args.args[0]
    if arg.annotation is None or ast.unparse(arg.annotation) != TASK_MARK:
        arg.annotation, _ = ast.parse(TASK_MARK, mode="eval").body, repairs.add("maker-signature")
    if fn.returns is None or ast.unparse(fn.returns) != ANSWER_MARK:
        fn.returns, _ = ast.parse(ANSWER_MARK, mode="eval").body, repairs.add("maker-signature")
    if ast.get_docstring(fn) is None:
        fn.body.insert(0, ast.Expr(ast.Constant(FALLBACK_DOC)))
        repairs.add("maker-docstring")
    missing = _unimported_modules(tree)
    for module in missing:  # `re.findall(...)` with no `import re`: a NameError on every task
        tree.body.insert(0, ast.Import([ast.alias(module)]))
        repairs.add("maker-import-added")
    imports = {a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "typing"
               for a in n.names}
    if "Annotated" not in imports:
        tree.body.insert(0, ast.ImportFrom("typing", [ast.alias("Annotated")], 0))
    name = fn.name.lower()
    if not TOOL_NAME.match(name):
        name, _ = "answer_task", repairs.add("maker-renamed")
    if name in taken:
        name = next(f"{name}_{i}" for i in range(2, 999) if f"{name}_{i}" not in taken)
        repairs.add("maker-renamed")
    fn.name = name
    return name, ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def _unimported_modules(tree: ast.Module) -> list[str]:
    """Allowed modules the code uses by name (``re.sub``) but never imports or binds."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    used = {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and isinstance(n.value.ctx, ast.Load)}
    return sorted(m for m in used - bound if m in ALLOWED_MODULES)


def parse_made(raw: str, taken: set[str], repairs: Repairs) -> ToolDefinition:
    """A task tool from a maker reply (``ParseError`` / ``ValidationError`` say what to fix)."""
    code = code_block(raw)
    if "def " not in code:
        raise ParseError(PROMPTS.render("parts.yaml#maker_missing_code"), raw)
    name, source = normalise_tool(code, taken, repairs)
    definition, problems = define_tool(source, name=name, skill="dynamo-draft")
    if definition is None:
        raise ParseError("the function breaks the tool rules: " + "; ".join(
            f"line {p.line}: {p.detail}" if p.line else p.detail for p in problems[:4]), raw)
    return definition


def parse_naming(raw: str, repairs: Repairs) -> tuple[str, str]:
    """``(name, use when)`` from the two-line naming reply; "" for a line it lacks."""
    found = {m.group(1).lower(): " ".join(m.group(2).split()).strip("`*\"' ") for m in
             re.finditer(r"^[\s*#-]*(name|use when)\s*[:=-]\s*(.+)$", raw, re.IGNORECASE | re.MULTILINE)}
    name = skill_name(found.get("name", ""), "", repairs)
    return name, found.get("use when", "")


# -- the maker --------------------------------------------------------------------------------

def spread(items: Sequence[Any], n: int) -> list[Any]:
    """``n`` items evenly spaced over ``items`` (all of them when there are fewer)."""
    if len(items) <= n:
        return list(items)
    return [items[math.floor(i * len(items) / n)] for i in range(n)]


def _expected(task: TaskRecord) -> str:
    e = task.expected
    return e if isinstance(e, str) else json.dumps(e, ensure_ascii=False)


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
            t.prompt), expected=repr(_expected(t))) for t in shown)
        user = PROMPTS.render("maker", examples=examples, modules=_modules())
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
            c.closeness = _closeness(c.probe, {t.id: t for t in probe})
            if c.probe_accuracy < self.cfg.maker_accuracy:
                c.reason = "on the probe tasks: " + _why(
                    c.probe, [t for t in c.probe if not t.matched], {t.id: t for t in probe})
                return
        self._verify(c, definition, [t for t in check if t.id not in c.seen])
        if not probe:  # the check tasks were the signal
            c.probe, c.probe_accuracy = c.tests, c.accuracy
            c.closeness = _closeness(c.tests, {t.id: t for t in check})

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
            c.reason = _why(c.tests, misses, {t.id: t for t in check})

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
            "an error:\n# " + "\n# ".join(_crash_lines(t)),
            expected=repr(_expected(by_id[t.task_id]))) for t in wrong)
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
            best.tool, best.source = _renamed(best.tool, best.source, name.replace("-", "_"),
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


def _renamed(old: str, source: str, new: str, taken: set[str]) -> tuple[str, str]:
    """``(name, source)`` with the tool function renamed to ``new`` where that name is free
    and the renamed code still passes the checks; else unchanged."""
    if new == old or new in taken or not TOOL_NAME.match(new) or re.search(
            rf"\b{new}\b", source):
        return old, source
    renamed = re.sub(rf"\b{old}(?=\s*\()", new, source)
    definition, _ = define_tool(renamed, name=new, skill="dynamo-draft")
    return (new, renamed) if definition is not None else (old, source)


def _why(tests: Sequence[ToolTest], misses: Sequence[ToolTest],
         tasks: Mapping[str, TaskRecord]) -> str:
    first = misses[0] if misses else None
    head = (f"{sum(t.matched for t in tests)} of {len(tests)} checked training tasks "
            f"answered correctly")
    if first is None:
        return head
    if not first.ok:
        kind = "timed out" if "time" in (first.error or "").lower() else "crashed"
        return f"{head}; {kind} on {first.task_id}: {_last_line(first.error)[:160]}"
    return (f"{head}; on {first.task_id} it returned {answer_text(first.output)[:80]!r}, expected "
            f"{_expected(tasks[first.task_id])[:80]!r}")


def _last_line(error: str | None) -> str:
    """The line of a traceback that says what went wrong (its last non-empty one)."""
    lines = [ln.strip() for ln in (error or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _crash_lines(t: ToolTest) -> list[str]:
    """Where a tool crashed and why: the traceback's last frame (its line and the code on it)
    and the exception, so a repair can find the line; the error alone without a traceback."""
    lines = [ln.rstrip() for ln in t.output.splitlines() if ln.strip()]
    frames = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("File ")]
    if not frames:
        return [_last_line(t.error)[:200]]
    frame = lines[frames[-1]]
    where = frame[frame.find("line "):].replace(", in ", " of ") if "line " in frame else frame
    return [f"{where.strip()[:80]}: {ln.strip()[:160]}" for ln in lines[frames[-1] + 1:
                                                                       frames[-1] + 2]] + [
        _last_line(t.error)[:200]]


def _closeness(tests: Sequence[ToolTest], tasks: Mapping[str, TaskRecord]) -> float:
    """Mean similarity (difflib's ratio, 0..1) of each answer to its label; a crash is 0.
    Ranks candidates that answer nothing right yet: one that returns ``'] ('`` for
    ``'] > )'`` is a better base for a repair than one that returns a sentence."""
    def one(t: ToolTest) -> float:
        if not t.ok:
            return 0.0
        if t.matched:
            return 1.0
        got, want = answer_text(t.output).strip().lower(), _expected(tasks[t.task_id]).lower()
        return difflib.SequenceMatcher(None, got[:500], want[:500]).ratio()
    return sum(one(t) for t in tests) / len(tests) if tests else 0.0


def _modules() -> str:
    return allowed_modules()


# -- the files --------------------------------------------------------------------------------

def _tool_call(tool: str) -> str:
    return render_prompt("examples.yaml#tool_call", call=json.dumps(
        {"name": tool, "arguments": {}}))


def task_tool_files(p: Proposal, *, round_no: int, questions: Mapping[str, str]
                    ) -> dict[str, str]:
    """SKILL.md (when to call, the verified call, the measured accuracy in ``metadata``), the
    script, two verified calls on training tasks, and the provenance with every candidate."""
    correct = sum(t.matched for t in p.tests)
    body = PROMPTS.render("parts.yaml#task_tool_body", title=p.skill.replace(
        "-", " ").capitalize(), when=p.when, tool=p.tool, checked=p.checked, correct=correct)
    meta = {"source": "dynamo", "kind": "task-tool", "round": str(round_no), "tool": p.tool,
            "train-accuracy": f"{p.accuracy or 0.0:.3f}", "train-checked": str(p.checked),
            "analyst": p.analyst, "verified": p.date}
    base = f"skills/{p.skill}"
    files = {f"{base}/SKILL.md": render_skill_md(Skill(
        name=p.skill, description=p.description, body=body.rstrip() + "\n", metadata=meta)),
        f"{base}/scripts/{p.tool}.py": p.source}
    shown = [t for t in p.tests if t.matched and t.task_id in questions][:2]
    if shown:
        files[f"{base}/references/examples.md"] = render_examples(
            [Example(t.task_id, questions[t.task_id], "\n".join([
                _tool_call(p.tool),
                render_prompt("examples.yaml#tool_response", output=t.output.strip()),
                answer_text(t.output)])) for t in shown],
            title=PROMPTS.load("parts.yaml#task_tool_examples_title"),
            intro=PROMPTS.render("parts.yaml#task_tool_examples_intro", tool=p.tool))
    provenance = {"method": "dynamo", "round": round_no, "kind": "task_tool", "tool": p.tool,
                  "train_accuracy": p.accuracy, "train_checked": p.checked,
                  "analyst": p.analyst, "verified": p.date, "cluster": asdict(p.cluster),
                  "candidates": p.candidates,
                  "checks": [asdict(t) for t in p.tests]}
    files[f"{base}/{PROVENANCE}"] = json.dumps(provenance, indent=1, ensure_ascii=False) + "\n"
    return files
