"""A library's learned tools in the runtime: checked whenever the library changes, offered to
the agent beside the skills that say when to call them.

``skills/`` (the Agent Skills format) and ``tools/`` (the tool format, the AST admission check,
the sandbox) are siblings that never import each other; this module, one layer above both,
joins them. A learned tool is ``skills/<skill>/scripts/<tool>.py`` holding a function named
like the file (see ``whetstone.tools.learned``); other scripts of a skill are plain helpers that nothing
runs, so they are listed but not checked as tools.

- ``validate_library`` is the validator every commit path takes (evolve, import, hand edits,
  candidates, rollback): the Agent Skills rules of ``whetstone.skills.loader.validate_snapshot`` plus the
  admission check of every tool script a change touches, and tool names clashing with a
  built-in tool or with another skill's tool.
- ``library_tools`` turns a version's tools into ``Tool`` objects that run only in the sandbox.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from whetstone.engine.errors import ValidationError
from whetstone.skills.loader import SKILLS_DIR, load_skill, validate_snapshot
from whetstone.tools.base import ToolResult
from whetstone.tools.learned import (
    SCRIPTS_DIR,
    LoadedTools,
    ToolDefinition,
    define_tool,
    is_tool_script,
    load_learned_tools,
)
from whetstone.tools.learned_run import learned_tool
from whetstone.tools.visual import VISUAL_TOOL_NAMES

if TYPE_CHECKING:
    from whetstone.library_store.store import Snapshot
    from whetstone.tools.base import Tool
    from whetstone.tools.images import ImageFiles
    from whetstone.tools.sandbox import Sandbox

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


@dataclass
class LibraryTools:
    """A version's learned tools (definitions) and what kept the others out."""

    version: str
    loaded: LoadedTools = field(default_factory=LoadedTools)

    @property
    def definitions(self) -> list[ToolDefinition]:
        return self.loaded.tools


def load_library_tools(snapshot: Snapshot) -> LibraryTools:
    """The learned tools of a version: only skills that hold a ``scripts/*.py`` are loaded; a
    skill that fails its rules brings no tools, a bad tool is reported and the rest load."""
    names = sorted({found[0] for p in snapshot.files(f"{SKILLS_DIR}/")
                    if (found := script_tool_name(p)) is not None})
    out = LibraryTools(snapshot.id)
    skills = []
    for name in names:
        try:
            skills.append(load_skill(snapshot, name))
        except ValidationError as exc:
            out.loaded.problems.extend(getattr(exc, "problems", [exc]))
    learned = load_learned_tools(skills, reserved=reserved_tool_names())
    out.loaded.tools += learned.tools
    out.loaded.problems += learned.problems
    out.loaded.skipped += learned.skipped
    return out


# A traceback frame; the sandbox runs a learned tool's script as ``tool.py`` in its own
# temporary folder (whetstone.tools.learned_run).
_FRAME = re.compile(r'File "(?P<file>[^"\n]*)", line (?P<line>\d+), in (?P<fn>[^\n]+)')
_SANDBOX_DIR = re.compile(r"""[^\s"']*whetstone-sandbox-[^/\s"']+/""")


def own_lines(definition: ToolDefinition, output: str) -> list[str]:
    """The frames of a failed call that are the tool's own code, as ``at <script>:<line> in
    <function>: <code>``: the sandbox's harness, the libraries it called and the sandbox's
    temporary paths are not the tool's, and say nothing its author or caller can act on."""
    code = definition.source.splitlines()
    out = []
    for m in _FRAME.finditer(output):
        if m["file"].replace("\\", "/").rsplit("/", 1)[-1] != "tool.py":
            continue
        n = int(m["line"])
        text = code[n - 1].strip() if 0 < n <= len(code) else ""
        out.append(f"  at {definition.path}:{n} in {m['fn'].strip()}"
                   + (f": {text}" if text else ""))
    return out


def tool_failure(definition: ToolDefinition, result: ToolResult) -> ToolResult:
    """A failed call as the caller reads it (the agent, an MCP client, a LangChain agent):
    the exception and the tool's own lines (``own_lines``); output with no traceback in it
    (a time or memory limit's) keeps its text, without the sandbox's temporary paths."""
    if result.error is None:
        return result
    lines = own_lines(definition, result.output)
    if lines or _FRAME.search(result.output):
        return replace(result, output="", error="\n".join([result.error, *lines]))
    return replace(result, output=_SANDBOX_DIR.sub("", result.output))


def agent_tool(definition: ToolDefinition, *, images: ImageFiles,
               sandbox: Sandbox | None = None) -> Tool:
    """A learned tool as the agent sees it: the docstring's summary and the skill to read for
    when to call it; it runs only in the sandbox, and a failure reads as ``tool_failure``."""
    tool = learned_tool(definition, images=images, sandbox=sandbox)

    def run(args: Mapping[str, Any]) -> str | ToolResult:
        result = tool.fn(args)
        return tool_failure(definition, result) if isinstance(result, ToolResult) else result

    note = f" (skill {definition.skill!r} says when to use it)"
    return replace(tool, fn=run,
                   spec=replace(tool.spec, description=tool.spec.description + note))


def library_tools(snapshot: Snapshot, *, images: ImageFiles, sandbox: Sandbox | None = None
                  ) -> tuple[list[Tool], LibraryTools]:
    """``Tool`` objects for a version's learned tools, and the load report."""
    found = load_library_tools(snapshot)
    return [agent_tool(d, images=images, sandbox=sandbox) for d in found.definitions], found
