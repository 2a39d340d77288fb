"""A library's learned tools in the runtime: offered to the agent beside the skills that say
when to call them, each running only in the sandbox. What a version must pass to hold them (the
admission check every commit runs) is the library layer's (``engine/library/checks.py``).

- ``library_tools`` turns a version's tools into ``Tool`` objects that run only in the sandbox.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ...skills.loader import SKILLS_DIR, load_skill
from ...tools.base import ToolResult
from ...tools.learned import LoadedTools, ToolDefinition, load_learned_tools
from ...tools.learned_run import learned_tool
from ..errors import ValidationError
from ..library.checks import reserved_tool_names, script_tool_name

if TYPE_CHECKING:
    from ...library_store.store import Snapshot
    from ...tools.base import Tool
    from ...tools.images import ImageFiles
    from ...tools.sandbox import Sandbox


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
