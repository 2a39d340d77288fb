"""The product's rules for a library version: what every commit of a library the faces open
runs (docs/architecture.md, "The library").

``skills/`` (the Agent Skills format) and ``tools/`` (the tool format, the AST admission check)
are siblings that never import each other; the library layer, one floor above both, joins
them. A learned tool is ``skills/<skill>/scripts/<tool>.py`` holding a function named like the
file (see ``whetstone.tools.learned``); other scripts of a skill are plain helpers that nothing
runs, so they are listed but not checked as tools.

- ``validate_library`` is the validator every commit path takes (evolve, import, hand edits,
  candidates, rollback): the Agent Skills rules of ``whetstone.skills.loader.validate_snapshot``
  plus the admission check of every tool script a change touches, and tool names clashing with
  a built-in tool or with another skill's tool;
- ``library_validator`` adds the installed methods' folder validators to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from ...skills.loader import SKILLS_DIR, validate_snapshot
from ...tools.learned import SCRIPTS_DIR, define_tool, is_tool_script
from ...tools.visual import VISUAL_TOOL_NAMES
from ..errors import ValidationError

if TYPE_CHECKING:
    from ...library_store.store import Snapshot
    from ...library_store.validation import Validator

# Names a learned tool may not take: the tools every run may already have (``search`` is
# the corpus tool ``--tools search`` gives). The user's own tools, which a library cannot
# know, win over a learned tool of their name at run time (``Agent``).
BUILTIN_TOOL_NAMES = ("calculator", "python", "read_skill", "search")


def reserved_tool_names() -> frozenset[str]:
    """Built-in tool names (``calculator``, ``python``, ``read_skill``, ``search``, the visual
    tools)."""
    return frozenset((*BUILTIN_TOOL_NAMES, *VISUAL_TOOL_NAMES))


def script_tool_name(path: str) -> tuple[str, str] | None:
    """(skill, tool name) for ``skills/<skill>/scripts/<tool>.py``; None for other paths."""
    parts = path.split("/")
    if len(parts) == 4 and parts[0] == SKILLS_DIR and parts[2] == SCRIPTS_DIR \
            and parts[3].endswith(".py"):
        return parts[1], parts[3][:-3]
    return None


def unit_tool_problems(skill: str, files: Mapping[str, bytes], *, base: str,
                       taken: Mapping[str, str] | None = None) -> list[ValidationError]:
    """The admission check for the tool scripts of one skill folder given as relative path ->
    bytes (an import checks a folder on disk this way). ``taken``: tool name -> the skill
    that already holds it (a clash is a problem)."""
    reserved = reserved_tool_names()
    problems: list[ValidationError] = []
    for rel, data in sorted(files.items()):
        parts = rel.split("/")
        if len(parts) != 2 or parts[0] != SCRIPTS_DIR or not parts[1].endswith(".py"):
            continue
        name, where = parts[1][:-3], f"{base}/{rel}"
        try:
            source = data.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(ValidationError(where, "encoding", "a tool script must be UTF-8"))
            continue
        if not is_tool_script(source, name):
            continue  # a helper, never run by Whetstone
        problems += define_tool(source, name=name, skill=skill, path=where)[1]
        owner = (taken or {}).get(name)
        if name in reserved or (owner is not None and owner != skill):
            problems.append(ValidationError(
                where, "tool-name", f"a tool named {name!r} exists already"
                + (f" (in skill {owner!r})" if owner else " (built in)"),
                hint="rename the script and its function"))
    return problems


def _unit_bytes(snapshot: Snapshot, skill: str) -> dict[str, bytes]:
    prefix = f"{SKILLS_DIR}/{skill}/"
    return {p[len(prefix):]: snapshot.library.blobs.get(h)
            for p, h in snapshot.unit(f"{SKILLS_DIR}/{skill}").items() if p.startswith(prefix)}


def _tool_owners(snapshot: Snapshot, skip: Iterable[str]) -> dict[str, str]:
    """Tool name -> skill, for the tool scripts of every skill not in ``skip``."""
    skipped = set(skip)
    owners: dict[str, str] = {}
    for path, digest in snapshot.files(f"{SKILLS_DIR}/").items():
        found = script_tool_name(path)
        if found is None or found[0] in skipped or found[1] in owners:
            continue
        source = snapshot.library.blobs.get(digest).decode("utf-8", errors="replace")
        if is_tool_script(source, found[1]):
            owners[found[1]] = found[0]
    return owners


def tool_problems(snapshot: Snapshot, changed: Sequence[str] | None = None
                  ) -> list[ValidationError]:
    """The admission check of the tool scripts in the skills a change touched (every skill
    when ``changed`` is None)."""
    paths = list(snapshot.files(f"{SKILLS_DIR}/")) if changed is None else list(changed)
    skills = sorted({p.split("/")[1] for p in paths
                     if p.startswith(f"{SKILLS_DIR}/") and p.count("/") >= 2})
    if not skills:
        return []
    owners = _tool_owners(snapshot, skip=skills)
    problems: list[ValidationError] = []
    for skill in skills:
        files = _unit_bytes(snapshot, skill)
        problems += unit_tool_problems(skill, files, base=f"{SKILLS_DIR}/{skill}",
                                       taken=owners)
        for rel, data in files.items():  # the next changed skill may clash with these
            found = script_tool_name(f"{SKILLS_DIR}/{skill}/{rel}")
            if found and is_tool_script(data.decode("utf-8", errors="replace"), found[1]):
                owners.setdefault(found[1], skill)
    return problems


def import_check(snapshot: Snapshot) -> Callable[[str, Mapping[str, bytes], str],
                                                 list[ValidationError]]:
    """The tool check an import runs on each skill folder before it lands on ``snapshot``:
    a skill whose tool fails is skipped and reported like a malformed skill."""
    owners = _tool_owners(snapshot, skip=())

    def check(name: str, files: Mapping[str, bytes], base: str) -> list[ValidationError]:
        taken = {tool: skill for tool, skill in owners.items() if skill != name}
        return unit_tool_problems(name, files, base=base, taken=taken)

    return check


def validate_library(snapshot: Snapshot, changed: Sequence[str] | None = None
                     ) -> list[ValidationError]:
    """The validator commits take: the Agent Skills rules, then the tool admission check."""
    return validate_snapshot(snapshot, changed) + tool_problems(snapshot, changed)


def library_validator(extra: Sequence[Validator] = ()) -> Validator:
    """What every commit of a library the faces open runs: ``validate_library``, then each of
    ``extra`` (the installed methods' folder validators)."""
    checks = tuple(extra)

    def validate(snapshot: Snapshot, changed: Sequence[str] | None = None
                 ) -> list[ValidationError]:
        problems = list(validate_library(snapshot, changed))
        for check in checks:
            problems += check(snapshot, changed)
        return problems

    return validate
