"""Import a folder of hand-written skills, export a version's skills, scaffold a new skill.

Import takes a folder (or ``.tar.gz``) holding ``<name>/SKILL.md`` skill folders, or one skill
folder itself. Each skill is validated on its own: a malformed skill is reported with file, line
and rule and skipped, and the others are committed as one new version. Files are copied as
bytes, so exporting what was imported gives the same bytes back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import ConfigError, ValidationError
from engine.prompts import render_prompt
from engine.types import LibraryVersion, Skill
from library_store.fsutil import sha256_bytes
from library_store.store import Library, Validator, rejection
from library_store.transfer import read_folder
from skills.format import SKILL_FILE, check_name, check_skill_files, render_skill_md
from skills.loader import skill_path, validate_snapshot


@dataclass(frozen=True)
class ImportReport:
    """What an import did: the new version (None when nothing changed) and what it skipped."""

    version: LibraryVersion | None
    imported: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    skipped: tuple[ValidationError, ...] = ()
    ignored: tuple[str, ...] = field(default_factory=tuple)  # files outside any skill folder

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version.id if self.version else None,
                "imported": list(self.imported), "unchanged": list(self.unchanged),
                "skipped": [{"path": e.path, "line": e.line, "rule": e.rule, "detail": e.detail}
                            for e in self.skipped],
                "ignored": list(self.ignored)}


def _group(src: Path, files: dict[str, bytes]) -> tuple[dict[str, dict[str, bytes]], list[str]]:
    """skill name -> its files (relative to the skill folder); plus files in no skill."""
    if SKILL_FILE in files:  # the source is one skill folder
        name = src.name.removesuffix(".tar.gz").removesuffix(".tgz")
        return {name: files}, []
    skills: dict[str, dict[str, bytes]] = {}
    loose: list[str] = []
    for rel, data in files.items():
        top, _, rest = rel.partition("/")
        if rest:
            skills.setdefault(top, {})[rest] = data
        else:
            loose.append(rel)
    return skills, loose


# More checks for one imported skill folder: (name, files, base) -> problems. The tool
# admission check comes in this way (tools/ is a sibling this layer does not import).
UnitCheck = Callable[[str, Mapping[str, bytes], str], list[ValidationError]]


def import_skills(library: Library, src: Path | str, *, strict: bool = False,
                  message: str = "", method: str = "import", check_unit: UnitCheck | None = None,
                  validate: Validator = validate_snapshot) -> ImportReport:
    """Import the skills under ``src``; each replaces the library's skill of the same name.

    Malformed skills are skipped and reported (``strict``: the whole import is rejected);
    ``check_unit`` adds checks per skill folder, ``validate`` checks the new version.
    """
    # Resolved, so "." or "demo/.." still name the skill folder (Path(".").name is "").
    src = Path(src).expanduser().resolve()
    files = read_folder(src)
    single = SKILL_FILE in files
    groups, loose = _group(src, files)
    if not groups:
        raise ConfigError(f"no skill folders found in {src}",
                          hint="expected <name>/SKILL.md folders, or one skill folder")
    snap = library.snapshot()
    changes: dict[str, bytes | None] = {}
    imported, unchanged, skipped = [], [], []
    for name, unit in sorted(groups.items()):
        base = src.as_posix() if single else (src / name).as_posix()
        problems = check_name(name, path=f"{base}/", line=None, folder=None) or \
            check_skill_files(name, unit, base=base)[1]
        if not problems and check_unit is not None:
            problems = check_unit(name, unit, base)
        if problems:
            skipped.extend(problems)
            continue
        new = {skill_path(name, rel): data for rel, data in unit.items()}
        old = snap.unit(f"skills/{name}")
        if {p: sha256_bytes(d) for p, d in new.items()} == old:
            unchanged.append(name)
            continue
        changes.update(new)
        changes.update({p: None for p in old if p not in new})
        imported.append(name)
    if skipped and strict:
        raise rejection(skipped)
    version = None
    if changes:
        version = library.commit(
            changes, method=method, validate=validate,
            message=message or f"import {len(imported)} skill(s) from {src}")
    return ImportReport(version, tuple(imported), tuple(unchanged), tuple(skipped), tuple(loose))


def export_skills(library: Library, dest: Path | str, *, version: str | None = None,
                  overwrite: bool = False) -> tuple[Path, list[ValidationError]]:
    """Write a version's skills as plain ``<name>/SKILL.md`` folders or a ``.tar.gz``.

    Returns the path and the Agent Skills problems of the exported skills ([] when all pass).
    """
    snap = library.snapshot(version)
    problems = validate_snapshot(snap)
    return library.export(dest, version=snap.id, overwrite=overwrite), problems


def scaffold_skill(name: str, description: str | None = None) -> Skill:
    """A new skill with a template body; raises when ``name`` breaks the naming rules."""
    problems = check_name(name, path=f"skills/{name}/{SKILL_FILE}", line=None, folder=name)
    if problems:
        raise rejection(problems)
    title = name.replace("-", " ").capitalize()
    desc = description or (f"{title}. Describe what this skill does and when to use it.")
    return Skill(name=name, description=desc, body=render_prompt("skill_scaffold", title=title))


def new_skill_changes(skill: Skill) -> dict[str, str]:
    """The change set that adds a scaffolded skill."""
    return {skill_path(skill.name): render_skill_md(skill)}
