"""Skills in a library version: load them, validate them, and turn skills into changes.

The rules a skill folder must follow live in ``whetstone.skills.format`` (``check_skill_files``); this
module applies them to library versions. Loading never stops at a bad skill: its problems are
collected and the rest of the library loads.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..engine.errors import NotFound, ValidationError
from ..engine.types import Skill
from ..library_store.store import Snapshot, rejection
from .format import (
    SKILL_FILE,
    check_skill_files,
    render_skill_md,
)

SKILLS_DIR = "skills"  # the library folder that holds one folder per skill


@dataclass
class SkillSet:
    """The skills of one version, and the problems of the ones that could not be loaded."""

    version: str
    skills: dict[str, Skill] = field(default_factory=dict)
    problems: list[ValidationError] = field(default_factory=list)


def skill_path(name: str, rel: str = SKILL_FILE) -> str:
    """``skills/<name>/<rel>``: where a skill's file lives in the library."""
    return f"{SKILLS_DIR}/{name}/{rel}"


def _text_files(files: Mapping[str, bytes]) -> dict[str, str]:
    out = {}
    for rel, data in files.items():
        if rel == SKILL_FILE:
            continue
        try:
            out[rel] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # binary assets are opened by path, not carried as text
    return out


def _unit_files(snapshot: Snapshot, name: str) -> dict[str, bytes]:
    prefix = f"{SKILLS_DIR}/{name}/"
    return {p[len(prefix):]: snapshot.library.blobs.get(h)
            for p, h in snapshot.unit(f"{SKILLS_DIR}/{name}").items() if p.startswith(prefix)}


def skill_names(snapshot: Snapshot) -> list[str]:
    """Names of the skill folders in a version (loose files under skills/ are not skills)."""
    return sorted({p.split("/")[1] for p in snapshot.files(f"{SKILLS_DIR}/") if p.count("/") >= 2})


def load_skill(snapshot: Snapshot, name: str) -> Skill:
    """One skill with its text files; raises its first problem, or NotFound with the names."""
    files = _unit_files(snapshot, name)
    if not files:
        known = skill_names(snapshot)
        raise NotFound(f"no skill named {name!r} in library version {snapshot.id}",
                       hint=_suggest(name, known))
    parsed, problems = check_skill_files(name, files, base=f"{SKILLS_DIR}/{name}")
    if problems or parsed is None or parsed.skill is None:
        raise rejection(problems)
    return Skill(**{**parsed.skill.to_dict(), "files": _text_files(files),
                    "metadata": dict(parsed.skill.metadata)})


def _suggest(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    listing = ", ".join(known[:30]) + (" ..." if len(known) > 30 else "")
    if close:
        return f"did you mean {', '.join(close)}? skills: {listing or 'none'}"
    return f"skills: {listing or 'none'}"


def load_skills(snapshot: Snapshot) -> SkillSet:
    """Every skill of a version; malformed ones are reported in ``problems`` and skipped."""
    out = SkillSet(version=snapshot.id)
    for name in skill_names(snapshot):
        try:
            out.skills[name] = load_skill(snapshot, name)
        except ValidationError as exc:
            out.problems.extend(getattr(exc, "problems", [exc]))
    for path in snapshot.files(f"{SKILLS_DIR}/"):
        if path.count("/") == 1:
            out.problems.append(_loose_file(path))
    return out


def _loose_file(path: str) -> ValidationError:
    return ValidationError(path, "layout", "files under skills/ must be inside a skill folder",
                           hint="move it to skills/<name>/")


def validate_snapshot(snapshot: Snapshot, changed: Sequence[str] | None = None
                      ) -> list[ValidationError]:
    """Problems of the skill files a change touched (every one when ``changed`` is None). The
    folders a method owns (``policies/``, ``memory/``) are checked by that method's validator,
    which the method registry adds (``whetstone.engine.library.checks.library_validator``).

    This is the validator ``Library.commit`` takes: only touched skills are parsed, so a
    commit to a library of 100,000 skills costs what the change costs.
    """
    problems: list[ValidationError] = []
    if changed is None:
        changed = list(snapshot.files(f"{SKILLS_DIR}/"))
    names: set[str] = set()
    for path in changed:
        parts = path.split("/")
        if parts[0] != SKILLS_DIR:
            continue
        if len(parts) == 2:
            if snapshot.exists(path):
                problems.append(_loose_file(path))
            continue
        names.add(parts[1])
    for name in sorted(names):
        files = _unit_files(snapshot, name)
        if files:  # an empty unit is a deleted skill
            problems += check_skill_files(name, files, base=f"{SKILLS_DIR}/{name}")[1]
    return problems


def skill_changes(skill: Skill, snapshot: Snapshot | None = None, *,
                  replace_files: bool = True) -> dict[str, str | None]:
    """The change set that writes ``skill`` into the library.

    ``SKILL.md`` is rendered against the current text (so unchanged lines keep their bytes);
    with ``replace_files`` text files of the old skill that ``skill.files`` lacks are deleted
    (binary assets are not carried in ``Skill.files``, so they are kept).
    """
    original = None
    old_files: dict[str, str] = {}
    if snapshot is not None:
        old_files = snapshot.unit(f"{SKILLS_DIR}/{skill.name}")
        if skill_path(skill.name) in old_files:
            original = snapshot.read_text(skill_path(skill.name))
    changes: dict[str, str | None] = {
        skill_path(skill.name): render_skill_md(skill, original=original)}
    for rel, text in skill.files.items():
        changes[skill_path(skill.name, rel)] = text
    if replace_files and snapshot is not None:
        for path in old_files:
            if path in changes:
                continue
            try:
                snapshot.read_bytes(path).decode("utf-8")
            except UnicodeDecodeError:
                continue
            changes[path] = None
    return changes
