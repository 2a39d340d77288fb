"""Trace2Skill: evolve one skill directory from many traces in parallel.

    MAP     one analyst call per trace (or per small batch), ``workers`` at a time; failure
            analysts name the root cause and the fix, success analysts extract what worked;
            each returns a JSON patch (see ``edits.py``), checked against the skill and
            retried once with the error shown, then dropped and counted.
    REDUCE  merge patches in groups of ``group_size``, level by level (at most ``max_levels``),
            into one patch whose edits never touch the same lines: duplicates fold (keeping
            every supporting trace id), and where edits contradict, the better-supported wins.
    APPLY   apply to the skill's files, enforce the limits (SKILL.md <= 500 lines, references
            <= 300 lines and <= 5 files, front matter valid, references kept or dropped together
            with their links) and return a ``LibraryPatch``; the caller gates and commits it.

``sequential=True`` is the baseline that edits the skill one trace at a time.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ....skills.format import EXAMPLES_FILE, Example, parse_examples
from ...backends.base import Backend
from ...errors import ConfigError
from ...evaluation.verified_examples import example_from_trace
from ...replies import extract_json_object
from ...types import Trace
from ..analyst import AnalystStats, ask_parsed, render_trace
from ..base import EvolveContext, LibraryPatch, knob, library_texts
from . import PROMPTS
from .edits import (
    Edit,
    EditError,
    SkillPatch,
    apply_patch,
    fold_follow_ups,
    patch_from_json_text,
    region_of,
    render_files,
)
from .example_edits import (
    ExampleAction,
    ExampleReport,
    actions_from_reply,
    apply_examples,
    default_adds,
    listing,
)
from .ray_map import map_on_ray
from .skill_limits import enforce_limits

if TYPE_CHECKING:
    from ....library_store.store import Snapshot

Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass(frozen=True)
class Trace2SkillConfig:
    """Knobs, with the defaults docs/architecture.md gives for Trace2Skill."""

    skill: str = knob(help="The skill to deepen (or to create with --create).")
    create: bool = knob(False, help="Start the skill from a draft if it is missing.")
    description: str = knob("", help="Front-matter description for --create.")
    workers: int = knob(4, help="Analyst calls in flight at once.", min=1)
    batch_size: int = knob(1, help="Traces per analyst call.", min=1)
    temperature: float = knob(0.3, help="The analyst's sampling temperature.", min=0)
    max_tokens: int = knob(1024, help="Most tokens per analyst reply.", min=1)
    group_size: int = knob(5, help="Patches merged per group, level by level.", min=2)
    max_levels: int = knob(5, help="Most levels of the merge tree.", min=1)
    sequential: bool = knob(False, help="Baseline: edit the skill one trace at a time.")
    executor: str = knob("asyncio", help="Where the analysts run.", choices=("asyncio", "ray"))
    seed: int = knob(0, cli=False)  # set from the shared --seed
    success_threshold: float = knob(
        1.0, help="A trace scoring at least this counts as a success.")
    examples: bool = knob(False, help="Keep worked examples (references/examples.md) taken "
                                      "from verified runs; analysts add, replace, retire them.")
    example_form: str = knob("all", help="What of a verified run an example keeps: all or "
                             "program (see engine/evaluation/verified_examples.py).",
                             choices=("all", "program"))
    max_examples: int = knob(6, help="Most worked examples the skill keeps.", min=1)


@dataclass
class Trace2SkillReport:
    """What happened, for the manifest and the closing note."""

    traces: int = 0
    map_patches: int = 0
    map: AnalystStats = field(default_factory=AnalystStats)
    levels: list[list[int]] = field(default_factory=list)
    folded: int = 0
    conflicts_resolved: int = 0
    unplaceable: int = 0
    apply_failed: list[str] = field(default_factory=list)
    limit_drops: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    examples: ExampleReport | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"examples": self.examples.to_dict() if self.examples else None,
                "traces": self.traces, "map_patches": self.map_patches,
                "map": self.map.to_dict(), "levels": self.levels, "folded": self.folded,
                "conflicts_resolved": self.conflicts_resolved, "unplaceable": self.unplaceable,
                "apply_failed": self.apply_failed, "limit_drops": self.limit_drops,
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}}


# -- the merge tree ----------------------------------------------------------------------------


def merge_tree_shape(n: int, group_size: int = 5, max_levels: int = 5) -> list[list[int]]:
    """Group sizes at each level: 6 patches -> [[5, 1], [2]]; 1 patch -> [] (nothing to merge).

    At the last allowed level everything left is merged in one group.
    """
    levels: list[list[int]] = []
    count = n
    while count > 1:
        if len(levels) == max_levels - 1:
            levels.append([count])
            break
        groups = [min(group_size, count - i) for i in range(0, count, group_size)]
        levels.append(groups)
        count = len(groups)
    return levels


def _similar(a: str, b: str) -> bool:
    wa, wb = set(a.lower().split()), set(b.lower().split())
    if not wa or not wb:
        return a.strip() == b.strip()
    return len(wa & wb) / len(wa | wb) >= 0.6


def _union(*supports: Iterable[str]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for s in supports:
        for x in s:
            seen.setdefault(x, None)
    return tuple(seen)


def merge_group(patches: Sequence[SkillPatch], base: Mapping[str, str],
                report: Trace2SkillReport | None = None) -> SkillPatch:
    """Merge patches written against ``base`` into one conflict-free patch.

    0. fold each patch's follow-ups (an edit on a section or file the patch itself adds) into
       the edit that adds it, so every edit can be placed against ``base``;
    1. fold duplicates (same place, similar content): one edit, supports united;
    2. rank by support (more traces first, then original order);
    3. accept greedily: an edit that destroys lines an accepted edit changes or anchors on (or
       whose own lines or anchor an accepted edit destroys) loses. Inserts touch no existing
       lines, so several may land at one point; they apply in order.
    """
    report = report or Trace2SkillReport()
    folded: list[Edit] = []
    for patch in patches:
        for edit in fold_follow_ups(patch).edits:
            for i, kept in enumerate(folded):
                if kept.key() == edit.key() and _similar(kept.content, edit.content):
                    content = max((kept, edit), key=lambda e: (len(e.support), len(e.content)))
                    folded[i] = replace(kept, content=content.content,
                                        support=_union(kept.support, edit.support))
                    report.folded += 1
                    break
            else:
                folded.append(edit)
    ranked = sorted(enumerate(folded), key=lambda ie: (-len(ie[1].support), ie[0]))
    accepted: list[tuple[Edit, Any]] = []
    for _, edit in ranked:
        region = region_of(base, edit)
        if region is None:
            report.unplaceable += 1
        elif any(region.conflicts(other) for _, other in accepted):
            report.conflicts_resolved += 1
        else:
            accepted.append((edit, region))
    # Keep the original order of the survivors so the result reads like the inputs.
    order = {id(e): i for i, e in enumerate(folded)}
    survivors = sorted((e for e, _ in accepted), key=lambda e: order.get(id(e), len(order)))
    return SkillPatch(
        edits=tuple(survivors),
        reasoning="\n".join(p.reasoning for p in patches if p.reasoning)[:4000],
        changelog="; ".join(dict.fromkeys(p.changelog for p in patches if p.changelog)),
        support=_union(*(p.support for p in patches)),
    )


def reduce_patches(patches: Sequence[SkillPatch], base: Mapping[str, str], *,
                   group_size: int = 5, max_levels: int = 5,
                   report: Trace2SkillReport | None = None) -> SkillPatch:
    """Hierarchical merge, level by level, per ``merge_tree_shape``."""
    report = report or Trace2SkillReport()
    report.levels = merge_tree_shape(len(patches), group_size, max_levels)
    if not patches:
        return SkillPatch()
    if len(patches) == 1:
        return merge_group(patches, base, report)  # still fold duplicates within the patch
    layer = list(patches)
    for groups in report.levels:
        nxt, i = [], 0
        for size in groups:
            nxt.append(merge_group(layer[i:i + size], base, report))
            i += size
        layer = nxt
    return layer[0]


# -- the method --------------------------------------------------------------------------------


def _label(trace: Trace, labels: Mapping[str, str] | None) -> str:
    if labels and trace.id in labels:
        return str(labels[trace.id])
    return trace.label if trace.label is not None else "(unknown)"


def _is_success(trace: Trace, threshold: float) -> bool:
    if trace.score is not None:
        return trace.score >= threshold
    return trace.outcome == "answered" and trace.label is None


def _strip_prefix(files: Mapping[str, str], prefix: str) -> dict[str, str]:
    return {k[len(prefix):]: v for k, v in files.items() if k.startswith(prefix)}


def parse_examples_of(files: Mapping[str, str]) -> list[Example]:
    """The worked examples a skill's files hold."""
    return parse_examples(files.get(EXAMPLES_FILE, ""))[0]


def draft_skill(name: str, description: str) -> dict[str, str]:
    """The weak draft a created skill starts from."""
    desc = description or f"Lessons learned for {name.replace('-', ' ')} tasks."
    # A JSON string is a double-quoted YAML scalar: a description holding ": " (or starting
    # with a special character) stays one value instead of breaking the front matter.
    return {"SKILL.md": PROMPTS.render("draft", name=name, description=desc,
                                       description_yaml=json.dumps(desc, ensure_ascii=False),
                                       title=name.replace("-", " ").capitalize())}


class Trace2Skill:
    """Distil a skill from traces: parallel analysts, hierarchical merge, then the gate.

    The evolver (``whetstone.engine.methods.base.Evolver``): ``fit`` returns a ``LibraryPatch`` for
    ``skills/<skill>/``.
    """

    name = "trace2skill"
    config_class = Trace2SkillConfig

    def __init__(self, config: Trace2SkillConfig, on_progress: Progress | None = None) -> None:
        if config.workers < 1 or config.batch_size < 1:
            raise ConfigError("workers and batch size must be at least 1")
        self.config = config
        self.on_progress = on_progress or (lambda phase, done, total: None)
        self.report = Trace2SkillReport()
        self._actions: list[ExampleAction] = []  # the analysts' example choices (examples=true)
        self._runs: dict[str, Example] = {}  # verified runs, by trace id, that may be examples

    def base_files(self, library_files: Mapping[str, str]) -> dict[str, str]:
        """The skill's files relative to its folder (a draft when it is to be created)."""
        cfg = self.config
        files = _strip_prefix(library_files, f"skills/{cfg.skill}/")
        if files.get("SKILL.md"):
            return files
        if not cfg.create:
            raise ConfigError(f"skill {cfg.skill!r} is not in the library",
                              hint="pass --create to start it from a draft, or "
                                   "`whetstone library ls` to see the skills")
        return draft_skill(cfg.skill, cfg.description)

    def fit(self, traces: Sequence[Trace], library: Snapshot | Mapping[str, str],
            analyst: Backend, labels: Mapping[str, str] | None = None, *,
            context: EvolveContext | None = None) -> LibraryPatch:
        """Run MAP, REDUCE and APPLY (or the sequential baseline) and return the patch.
        ``library``: the version to learn against (or its files as ``{path: text}``);
        ``context`` supplies progress reporting (Trace2Skill never runs the agent)."""
        if context is not None:
            self.on_progress = context.on_progress
        files = library_texts(library, f"skills/{self.config.skill}/")
        return asyncio.run(self.afit(traces, files, analyst, labels))

    async def afit(self, traces: Sequence[Trace], library_files: Mapping[str, str],
                   analyst: Backend, labels: Mapping[str, str] | None = None) -> LibraryPatch:
        """``fit`` on an event loop; ``library_files`` are the library's files as
        ``{path: text}`` (those under ``skills/<skill>/`` are read)."""
        cfg = self.config
        if not traces:
            raise ConfigError("no traces to learn from",
                              hint="run `whetstone eval --tasks ...` first, or widen --traces")
        self.report = report = Trace2SkillReport(traces=len(traces))
        base = self.base_files(library_files)
        self._actions, self._runs = [], {}
        if cfg.examples:
            report.examples = ExampleReport()
            for t in traces:
                ex = example_from_trace(t.with_(label=labels[t.id]) if labels and t.id in labels
                                        else t, cfg.success_threshold, form=cfg.example_form)
                if ex is not None:
                    self._runs[t.id] = ex
        start = time.perf_counter()
        if cfg.sequential:
            files = await self._sequential(traces, base, analyst, labels)
            report.seconds["sequential"] = time.perf_counter() - start
            merged = SkillPatch(support=tuple(t.id for t in traces))
        else:
            patches = await self.map(traces, base, analyst, labels)
            report.seconds["map"] = time.perf_counter() - start
            t1 = time.perf_counter()
            merged = reduce_patches(patches, base, group_size=cfg.group_size,
                                    max_levels=cfg.max_levels, report=report)
            report.seconds["reduce"] = time.perf_counter() - t1
            t2 = time.perf_counter()
            files, failed = apply_patch(base, merged)
            report.apply_failed = [f"{e.op} {e.file}: {why}" for e, why in failed]
            files = self._with_examples(files, self._actions, self._runs)
            report.seconds["apply"] = time.perf_counter() - t2
        t3 = time.perf_counter()
        files, drops = enforce_limits(files, base, cfg.skill, merged)
        report.limit_drops = drops
        report.seconds["validate"] = time.perf_counter() - t3
        return self._library_patch(base, files, merged, library_files)

    # MAP ------------------------------------------------------------------------------------

    def _batches(self, traces: Sequence[Trace]) -> list[list[Trace]]:
        n = self.config.batch_size
        return [list(traces[i:i + n]) for i in range(0, len(traces), n)]

    def messages_for(self, batch: Sequence[Trace], files: Mapping[str, str],
                     labels: Mapping[str, str] | None) -> list[dict[str, str]]:
        """The analyst's prompt for one trace (or a small batch)."""
        # With examples on, the analyst sees them as a short listing, not the whole file.
        skill = render_files({p: t for p, t in files.items()
                              if not (self.config.examples and p == EXAMPLES_FILE)})
        if len(batch) == 1:
            t = batch[0]
            success = _is_success(t, self.config.success_threshold)
            user = PROMPTS.render(
                "success" if success else "failure",
                skill=skill, trace=render_trace(t), outcome=t.outcome,
                score="n/a" if t.score is None else f"{t.score:g}",
                expected=_label(t, labels))
        else:
            blocks = []
            for i, t in enumerate(batch, 1):
                verdict = "success" if _is_success(t, self.config.success_threshold) \
                    else "failure"
                blocks.append(PROMPTS.render(f"batch_run.yaml#{verdict}", number=i,
                                             expected=_label(t, labels),
                                             trace=render_trace(t, max_chars=2500)))
            user = PROMPTS.render("batch", skill=skill, count=len(batch),
                                  traces="\n\n".join(blocks))
        if self.config.examples:
            user += "\n\n" + listing(files)
        return [{"role": "system", "content": PROMPTS.load("system")},
                {"role": "user", "content": user}]

    def _checker(self, files: Mapping[str, str], support: Sequence[str]
                 ) -> Callable[[str], SkillPatch]:
        def parse(raw: str) -> SkillPatch:
            if self.config.examples:
                obj = extract_json_object(raw, what="a JSON patch")
                if isinstance(obj, dict) and "edits" not in obj and "examples" in obj:
                    obj["edits"] = []  # a reply about examples only is a whole reply
                patch = SkillPatch.from_dict(obj, support)
                kept = tuple(e for e in patch.edits if e.file != EXAMPLES_FILE)
                if len(kept) != len(patch.edits) and self.report.examples is not None:
                    # The examples file is written by code from verified runs, never by hand.
                    self.report.examples.edits_dropped += len(patch.edits) - len(kept)
                    patch = replace(patch, edits=kept)
            else:
                patch = patch_from_json_text(raw, support)
            apply_patch(files, patch, strict=True)  # every anchor must be in the skill
            return patch
        return parse

    async def _analyse(self, batch: Sequence[Trace], files: Mapping[str, str], analyst: Backend,
                       labels: Mapping[str, str] | None, seed: int) -> SkillPatch | None:
        reply = await ask_parsed(
            analyst, self.messages_for(batch, files, labels),
            self._checker(files, [t.id for t in batch]),
            temperature=self.config.temperature, max_tokens=self.config.max_tokens, seed=seed)
        self.report.map.add(reply.stats)
        if self.report.examples is not None:
            ids = [t.id for t in batch]
            existing = [ex.trace_id for ex in parse_examples_of(files)]
            self._actions += actions_from_reply(reply.raw, ids, existing, self.report.examples)
        return reply.value

    async def map(self, traces: Sequence[Trace], base: Mapping[str, str], analyst: Backend,
                  labels: Mapping[str, str] | None = None) -> list[SkillPatch]:
        """One analyst per batch, ``workers`` in flight; failed replies are dropped."""
        batches = self._batches(traces)
        if self.config.executor == "ray":
            results = map_on_ray(self, batches, base, analyst, labels)
        else:
            sem = asyncio.Semaphore(self.config.workers)
            done = 0

            async def one(i: int, batch: list[Trace]) -> SkillPatch | None:
                nonlocal done
                async with sem:
                    patch = await self._analyse(batch, base, analyst, labels,
                                                self.config.seed + i)
                done += 1
                self.on_progress("map", done, len(batches))
                return patch

            results = await asyncio.gather(*(one(i, b) for i, b in enumerate(batches)))
        patches = [p for p in results if p is not None]
        self.report.map_patches = len(patches)
        return patches

    # SEQUENTIAL -----------------------------------------------------------------------------

    async def _sequential(self, traces: Sequence[Trace], base: Mapping[str, str],
                          analyst: Backend, labels: Mapping[str, str] | None) -> dict[str, str]:
        files = dict(base)
        for i, batch in enumerate(self._batches(traces)):
            before = len(self._actions)
            patch = await self._analyse(batch, files, analyst, labels, self.config.seed + i)
            if patch is not None:
                self.report.map_patches += 1
                files, failed = apply_patch(files, patch)
                self.report.apply_failed += [f"{e.op} {e.file}: {why}" for e, why in failed]
            if self.config.examples:  # the next analyst sees the examples this one chose
                runs = {t.id: self._runs[t.id] for t in batch if t.id in self._runs}
                files = self._with_examples(files, self._actions[before:], runs)
            self.on_progress("sequential", i + 1, len(traces))
        return files

    # EXAMPLES -------------------------------------------------------------------------------

    def _with_examples(self, files: Mapping[str, str], actions: Sequence[ExampleAction],
                       runs: Mapping[str, Example]) -> dict[str, str]:
        """``files`` with the analysts' example choices applied (``trace2skill_examples``);
        unchanged when examples are off."""
        if self.report.examples is None:
            return dict(files)
        return apply_examples(files, [*actions, *default_adds(runs)], self._runs,
                              max_examples=self.config.max_examples,
                              report=self.report.examples)

    # RESULT ---------------------------------------------------------------------------------

    def _library_patch(self, base: Mapping[str, str], files: Mapping[str, str],
                       merged: SkillPatch, library_files: Mapping[str, str]) -> LibraryPatch:
        prefix = f"skills/{self.config.skill}/"
        existing = _strip_prefix(library_files, prefix)
        changes: dict[str, str | None] = {}
        for rel, text in files.items():
            if existing.get(rel) != text:
                changes[prefix + rel] = text
        for rel in existing:
            if rel not in files:
                changes[prefix + rel] = None
        mode = "sequential" if self.config.sequential else "parallel"
        message = (f"trace2skill ({mode}) on {self.config.skill}: "
                   f"{merged.changelog or 'lessons from ' + str(self.report.traces) + ' traces'}")
        return LibraryPatch(
            method=self.name, changes=changes, message=message[:500],
            details={"skill": self.config.skill, "mode": mode,
                     "created": not existing.get("SKILL.md"),
                     "patch": merged.to_dict(), "report": self.report.to_dict()},
            costs={"analyst_prompt_tokens": self.report.map.prompt_tokens,
                   "analyst_completion_tokens": self.report.map.completion_tokens,
                   "analyst_calls": self.report.map.calls,
                   "seconds": {k: round(v, 3) for k, v in self.report.seconds.items()}},
        )


__all__ = [
    "EditError",
    "Trace2Skill",
    "Trace2SkillConfig",
    "Trace2SkillReport",
    "draft_skill",
    "merge_group",
    "merge_tree_shape",
    "reduce_patches",
]
