"""Dynamo's MAKE, WRITE and TEST phases: a tool maker for a round the agent mostly fails, one
analyst call per cluster for its skill or tool, each tool tested in the sandbox, and the
kept ones turned into checked skill files."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from ....skills.format import check_skill_files
from ....tools.base import Toolbox
from . import PROMPTS
from .maker import ToolMaker
from .maker_skill import task_tool_files
from .parts import (
    Cluster,
    Proposal,
    Round,
    dropped,
    parse_reasoning,
    parse_tool,
    parse_when,
)
from .run import RunCore
from .sandbox import (
    allowed_modules,
    image_params,
    judge_tests,
    run_tests,
    skill_files,
    source_parameters,
)


class WritePhase(RunCore):
    """Make, write and test the round's proposals (see ``evolver.py``)."""

    async def _write(self, rnd: Round) -> list[Proposal]:
        sem = asyncio.Semaphore(self.cfg.workers)
        clusters = rnd.clusters or []

        async def one(n: int, cluster: Cluster) -> Proposal:
            async with sem:
                p = await self._propose(cluster, self.cfg.seed + 100 * rnd.number + n)
            self.context.on_progress("write", n + 1, len(clusters))
            return p

        proposals = list(await asyncio.gather(*(one(n, c) for n, c in enumerate(clusters))))
        return self._finish(proposals, rnd.number)

    async def _propose(self, cluster: Cluster, seed: int) -> Proposal:
        text, labels = self._failures(cluster.failures)
        if self.cfg.toolset:
            return await self._propose_when(cluster, text, labels, seed)
        if cluster.kind == "cognitive":
            user = PROMPTS.render("skill", failures=text, diagnosis=cluster.diagnosis,
                                  fix=cluster.fix, existing=", ".join(self._skill_names())
                                 or "(none)")
            reply = await self._call(self._messages(user), lambda raw: parse_reasoning(
                raw, cluster, self.state.repairs), seed)
            return reply.value or dropped("reasoning", cluster, reply)
        user = PROMPTS.render("tool", failures=text, diagnosis=cluster.diagnosis,
                              fix=cluster.fix, modules=allowed_modules())
        taken = self._tool_taken()
        reply = await self._call(self._messages(user), lambda raw: parse_tool(
            raw, cluster, labels, taken, self.state.repairs), seed)
        if reply.value is None:
            return dropped("tool", cluster, reply)
        proposal, definition = reply.value
        self._test(proposal, lambda args: self._run_learned(definition, args),
                   definition.image_params)
        return proposal

    async def _propose_when(self, cluster: Cluster, text: str, labels: dict[str, str],
                            seed: int) -> Proposal:
        given = self._given_tools()
        lines = "\n".join(PROMPTS.render(
            "parts.yaml#tool_line", name=t.name, description=t.spec.description,
            parameters=json.dumps(t.spec.parameters.get("properties", {}))) for t in
            given.values())
        user = PROMPTS.render("when", failures=text, diagnosis=cluster.diagnosis,
                              fix=cluster.fix, tools=lines)
        reply = await self._call(self._messages(user), lambda raw: parse_when(
            raw, cluster, labels, list(given), self.state.repairs), seed)
        if reply.value is None:
            p = dropped("when", cluster, reply)
            p.reason = p.reason if reply.stats.dropped else "no given tool fits"
            return p
        proposal = reply.value
        tool = given[proposal.tool]

        box = Toolbox.of([tool])
        self._test(proposal, lambda args: box.call(tool.name, args), image_params(tool))
        return proposal

    def _wants_maker(self) -> bool:
        st = self.state
        failing = sum(not a.correct for a in st.attempts.values())
        return (not self.cfg.toolset and not any(r.maker for r in st.rounds)
                and failing >= self.cfg.maker_share * max(1, len(st.attempts)) and failing > 0)

    async def _make(self) -> Proposal:
        """The tool maker (``whetstone.engine.methods.dynamo.maker``) on the failed training tasks."""
        st = self.state
        maker = ToolMaker(self.cfg, self.analyst, st.analyst, st.repairs,
                          call_tool=self._run_learned, taken=self._tool_taken())
        return await maker.make_for(self.tasks, st.attempts)

    def _test(self, proposal: Proposal, call: Any, image_params: Sequence[str]) -> None:
        # lazy: loads filelock and 41 more of our modules
        from ...evaluation.scorers import get_scorer

        def score(output: str, task_id: str) -> float:
            task = self.tasks[task_id]
            try:
                return get_scorer(task.scorer)(output, task)
            except Exception:  # noqa: BLE001 -- a scorer that cannot read a tool's output
                return 0.0

        run_tests(proposal.tests, call, self.state.attempts, image_params, score)
        proposal.reason = judge_tests(proposal.tests, require_match=self.cfg.require_match)
        proposal.kept = not proposal.reason

    def _finish(self, proposals: list[Proposal], round_no: int) -> list[Proposal]:
        """Unique names, files for the kept ones, each checked against the skill rules."""
        taken = set(self._skill_names())
        for i, p in enumerate(proposals):
            if p.kind == "reasoning" and not p.reason:
                p.kept = True
            if not p.kept:
                continue
            base = p.skill or f"dynamo-lesson-{round_no}-{i + 1}"
            p.skill = next(n for n in [base, *(f"{base}-{k}" for k in range(2, 99))]
                           if n not in taken)
            taken.add(p.skill)
            params, source = None, None  # a given tool's schema, and where it comes from
            if p.kind == "task_tool":
                p.files = task_tool_files(p, round_no=round_no, questions={
                    i: t.prompt for i, t in self.tasks.items()})
            elif p.tool:
                given = self._given_tools().get(p.tool) if p.kind == "when" else None
                params = given.spec.parameters if given else source_parameters(p)
                source = given.spec.source if given else None
            if p.kind != "task_tool":
                p.files = skill_files(p, round_no=round_no, attempts=self.state.attempts,
                                      parameters=params, tool_source=source)
            prefix = f"skills/{p.skill}/"
            problems = check_skill_files(p.skill, {k[len(prefix):]: v.encode() for k, v in
                                                   p.files.items()}, base=prefix.rstrip("/"))[1]
            if problems:
                p.kept, p.reason, p.files = False, f"breaks the skill rules: {problems[0]}", {}
        return proposals

