"""Import a folder of hand-written skills, export a version's skills, scaffold a new skill.

Import takes a folder (or ``.tar.gz``) holding ``<name>/SKILL.md`` skill folders, or one skill
folder itself. Each skill is validated on its own, every name and size included, before
anything is committed: a malformed skill is reported with file, line and rule and skipped, and
the others are committed as one new version. Files are copied as
bytes, so exporting what was imported gives the same bytes back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whetstone.engine.errors import ConfigError, ValidationError
from whetstone.engine.prompts import render_prompt
from whetstone.engine.types import LibraryVersion, Skill
from whetstone.library_store.fsutil import sha256_bytes
from whetstone.library_store.paths import check_path, shown
from whetstone.library_store.store import Library, Validate, rejection
from whetstone.library_store.transfer import Refused, read_folder
from whetstone.skills.format import SKILL_FILE, check_name, check_skill_files, render_skill_md
from whetstone.skills.loader import skill_path, validate_snapshot


@dataclass(frozen=True)
class ImportReport:
    """What an import did: the new version (None when nothing changed) and what it skipped.

    ``skipped`` holds every problem found, ``skipped_skills`` the names of the skills they
    kept out (a problem outside any skill folder names none)."""

    version: LibraryVersion | None
    imported: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    skipped: tuple[ValidationError, ...] = ()
    ignored: tuple[str, ...] = field(default_factory=tuple)  # files outside any skill folder
    skipped_skills: tuple[str, ...] = ()
    # With commit=False: the change to land (path -> bytes; None deletes) and its message.
    changes: Mapping[str, bytes | None] = field(default_factory=dict, repr=False)
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version.id if self.version else None,
                "imported": list(self.imported), "unchanged": list(self.unchanged),
                "skipped_skills": list(self.skipped_skills),
                "skipped": [{"path": e.path, "line": e.line, "rule": e.rule, "detail": e.detail}
                            for e in self.skipped],
                "ignored": list(self.ignored), "summary": self.summary()}

    def summary(self) -> str:
        """One line saying what happened, with every count."""
        counts = [f"{len(self.imported)} imported", f"{len(self.unchanged)} unchanged",
                  f"{len(self.skipped_skills)} skipped as malformed"]
        if self.version is not None:
            return f"imported {len(self.imported)} skill(s) as version {self.version.id} " \
                   f"({', '.join(counts)})"
        if self.unchanged and not self.skipped_skills:
            return "nothing imported: the library already holds these skills"
        return f"nothing imported ({', '.join(counts)})"


def _group(src: Path, files: Mapping[str, bytes], single: bool
           ) -> tuple[dict[str, dict[str, bytes]], list[str]]:
    """skill name -> its files (relative to the skill folder); plus files in no skill."""
    if single:  # the source is one skill folder
        return {_single_name(src): dict(files)}, []
    skills: dict[str, dict[str, bytes]] = {}
    loose: list[str] = []
    for rel, data in files.items():
        top, _, rest = rel.partition("/")
        if rest:
            skills.setdefault(top, {})[rest] = data
        else:
            loose.append(rel)
    return skills, loose


def _single_name(src: Path) -> str:
    return src.name.removesuffix(".tar.gz").removesuffix(".tgz")


def _refusals(src: Path, refused: Sequence[Refused], single: bool
              ) -> tuple[dict[str, list[ValidationError]], list[ValidationError]]:
    """What ``read_folder`` refused, as problems: per skill name, and outside any skill."""
    per_skill: dict[str, list[ValidationError]] = {}
    loose: list[ValidationError] = []
    for r in refused:
        err = ValidationError(f"{src.as_posix()}/{shown(r.path, 200)}", r.rule, r.detail)
        top, _, rest = r.path.partition("/")
        if single:
            per_skill.setdefault(_single_name(src), []).append(err)
        elif rest:
            per_skill.setdefault(top, []).append(err)
        else:
            loose.append(err)
    return per_skill, loose


def _check_unit(name: str, unit: Mapping[str, bytes], base: str,
                refused: Sequence[ValidationError]) -> list[ValidationError]:
    """Every problem of one skill folder, the library's path rules included, so the commit
    that follows cannot fail on any of its files. All are reported, the folder's name, the
    SKILL.md and each file alike; a folder whose name is no skill name is named with the
    skill its SKILL.md declares."""
    parsed, problems = check_skill_files(name, unit, base=base)
    folder = _folder_problems(name, base, parsed.name if parsed else None)
    if folder:  # said once, by the folder's problem
        problems = [e for e in problems if e.rule != "name-folder"]
    problems = [*folder, *refused, *problems]
    if not problems:
        for rel in unit:
            try:
                check_path(skill_path(name, rel))
            except ValidationError as exc:
                problems.append(exc)
    return problems


def _folder_problems(name: str, base: str, declared: str | None) -> list[ValidationError]:
    """The naming rules applied to a skill's folder, which is its name in a library."""
    found = check_name(name, path=f"{base}/", line=None, folder=None)
    usable = declared is not None and not check_name(declared, path="", line=None, folder=None)
    said = f"; its SKILL.md names the skill {shown(declared)!r}" if declared else ""
    hint = (f"rename the folder to {declared}" if usable else
            "rename the folder and the SKILL.md name to one name of a-z, 0-9 and hyphens")
    return [ValidationError(e.path, e.rule, e.detail.replace("'name' ", "the folder name ", 1)
                            + said, hint=hint) for e in found]


# More checks for one imported skill folder: (name, files, base) -> problems. The tool
# admission check comes in this way (tools/ is a sibling this layer does not import).
UnitCheck = Callable[[str, Mapping[str, bytes], str], list[ValidationError]]


def import_skills(library: Library, src: Path | str, *, strict: bool = False,
                  message: str = "", method: str = "import", check_unit: UnitCheck | None = None,
                  validate: Validate = True, commit: bool = True) -> ImportReport:
    """Import the skills under ``src``; each replaces the library's skill of the same name.

    Every file is checked before anything is committed: malformed skills (and links, special
    files or oversized files in them) are skipped and reported, the rest are committed as one
    version (``strict``: the whole import is rejected instead). ``check_unit`` adds checks per
    skill folder; the new version is checked by the library's validator (the Agent Skills
    rules when the library has none) or by ``validate``. ``commit=False`` commits nothing:
    the report holds the change and its message, for the caller to land (through a gate).
    """
    if validate is True and library.validator is None:
        validate = validate_snapshot  # a bare Library: still the Agent Skills rules
    # Resolved, so "." or "demo/.." still name the skill folder (Path(".").name is "").
    src = Path(src).expanduser().resolve()
    contents = read_folder(src)
    single = SKILL_FILE in contents.files or any(r.path == SKILL_FILE for r in contents.refused)
    groups, loose = _group(src, contents.files, single)
    refused, loose_refused = _refusals(src, contents.refused, single)
    for name in refused:
        groups.setdefault(name, {})
    if not groups and not loose_refused:
        raise ConfigError(f"no skill folders found in {src}",
                          hint="expected <name>/SKILL.md folders, or one skill folder")
    snap = library.snapshot()
    changes: dict[str, bytes | None] = {}
    imported, unchanged, skipped_names = [], [], []
    skipped: list[ValidationError] = list(loose_refused)
    for name, unit in sorted(groups.items()):
        base = src.as_posix() if single else f"{src.as_posix()}/{shown(name, 200)}"
        problems = _check_unit(name, unit, base, refused.get(name, []))
        if check_unit is not None:
            problems += check_unit(name, unit, base)
        if problems:
            skipped.extend(problems)
            skipped_names.append(name)
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
    message = message or f"import {len(imported)} skill(s) from {src}"
    if changes and commit:
        version = library.commit(changes, method=method, validate=validate, message=message)
    # Names as a terminal can print them (a folder name need not be UTF-8).
    return ImportReport(version, tuple(imported), tuple(unchanged), tuple(skipped),
                        tuple(shown(p, 200) for p in loose),
                        tuple(shown(n, 200) for n in skipped_names),
                        changes={} if commit else changes, message=message)


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
