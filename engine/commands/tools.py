"""``whetstone tools ls | show NAME | test NAME INPUT``: the tools a run may call.

    whetstone tools ls                        built-in, visual and the library's learned tools
    whetstone tools ls --mcp 'shop=mcp-server-sqlite --db-path shop.db'   and a server's
    whetstone tools show count_red            its schema, its skill, its code and provenance
    whetstone tools test count_red '{"image": "shapes/3.png"}' --allow shapes

A learned tool runs only in the sandbox (``tools/learned_run.py``), here as in a run; the
sandbox's mode (and any warning about a weak one) is printed with the result.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table

from ...library_store.store import Library, Snapshot
from ...tools.learned import PROVENANCE_FILE
from ..errors import NotFound, ToolError
from ..types import ToolSpec
from .common import (
    console,
    default_library_path,
    emit_json,
    handle_errors,
    json_option,
    library_option,
)
from .tool_options import tool_options


@dataclass(frozen=True)
class ToolEntry:
    """One tool by name: where it comes from and its spec (a learned tool's definition)."""

    name: str
    kind: str  # builtin | visual | learned
    spec: ToolSpec
    definition: Any = None  # whetstone.tools.learned.ToolDefinition for learned tools


def _catalog(snap: Snapshot) -> tuple[list[ToolEntry], list[Any]]:
    """Every tool a run may be given, and the learned tools that failed their checks."""
    # lazy: yaml, `whetstone --help` imports every command module
    from ...tools.builtin import CALCULATOR_SPEC, PYTHON_SPEC
    from ...tools.images import ImageFiles
    from ...tools.visual import visual_tools
    from ..runtime.library_tools import load_library_tools
    from ..runtime.skills_plugin import READ_SKILL_SPEC

    entries = [ToolEntry(s.name, "builtin", s) for s in (CALCULATOR_SPEC, PYTHON_SPEC,
                                                          READ_SKILL_SPEC)]
    entries += [ToolEntry(t.name, "visual", t.spec)
                for t in visual_tools(ImageFiles(Path("unused")))]
    found = load_library_tools(snap)
    entries += [ToolEntry(d.name, "learned", d.spec, d) for d in found.definitions]
    return entries, found.loaded.problems


def _find(snap: Snapshot, name: str) -> ToolEntry:
    entries, problems = _catalog(snap)
    for e in entries:
        if e.name == name:
            return e
    bad = [p for p in problems if p.path.endswith(f"/scripts/{name}.py")]
    if bad:
        raise ToolError(f"the learned tool {name!r} fails its checks: {bad[0].detail}",
                        hint=f"`whetstone library validate` lists every problem ({bad[0].path})")
    raise NotFound(f"no tool named {name!r} in library version {snap.id}",
                   hint="tools: " + ", ".join(e.name for e in entries))


def _library(path: Path | None) -> Library:
    from ..api import open_library  # lazy: loads numpy and 62 more of our modules

    # The default library is made on first use; a mistyped --library is an error.
    return open_library(path or default_library_path())


@click.group("tools")
def tools_group() -> None:
    """The tools a run may call: built-in, visual, and the library's learned tools."""


def _mcp_rows(agent_tools: list[Any]) -> list[dict[str, Any]]:
    """The tools of the MCP servers the options name, each with whether a run would be
    offered it (the servers start, are listed, and stop)."""
    # lazy: `whetstone --help` imports every command module
    from ...tools.mcp_client import McpSessions
    from ...tools.mcp_config import McpServer

    servers = [s for s in agent_tools if isinstance(s, McpServer)]
    if not servers:
        return []
    with McpSessions(servers) as sessions:
        return sessions.listing()


def _print_mcp(out: Any, rows: list[dict[str, Any]]) -> None:
    table = Table(title="MCP servers' tools")
    table.add_column("name", no_wrap=True, min_width=max(len(r["name"]) for r in rows))
    for col in ("hints", "offered", "what"):
        table.add_column(col)
    for r in rows:
        hints = ", ".join(h for h, on in (("read-only", r["read_only"]),
                                          ("destructive", r["destructive"])) if on)
        offered = "yes" if r["allowed"] else f"no: {r['why']}"
        desc = r["description"]
        table.add_row(escape(r["name"]), hints, escape(offered),
                      escape(desc if len(desc) <= 80 else desc[:79] + "…"))
    out.print(table)


@tools_group.command("ls")
@click.option("--version", "version", default=None, help="Library version (default: current).")
@library_option
@json_option
@handle_errors
@tool_options(with_tools=False)
def ls_cmd(version: str | None, library_path: Path | None, as_json: bool,
           agent_tools: list[Any]) -> None:
    """List the tools, and how code runs in the sandbox on this machine; with --mcp,
    --mcp-url or --mcp-config also each server's tools, their hints, and whether a run
    would be offered them (--allow-tool as a run takes it)."""
    # lazy: `whetstone --help` imports every command module
    from ...tools.sandbox import default_sandbox

    snap = _library(library_path).snapshot(version)
    entries, problems = _catalog(snap)
    mcp = _mcp_rows(agent_tools)
    status = default_sandbox().status
    if as_json:
        emit_json({"version": snap.id, "sandbox": status.describe(),
                   "tools": [{"name": e.name, "kind": e.kind, "skill": e.spec.skill,
                              "description": e.spec.description} for e in entries],
                   "mcp": mcp,
                   "problems": [{"path": p.path, "line": p.line, "rule": p.rule,
                                 "detail": p.detail} for p in problems]})
        return
    table = Table(title=f"tools (library {snap.id})")
    for col in ("name", "kind", "skill", "what"):
        table.add_column(col)
    for e in entries:
        desc = " ".join(e.spec.description.split())
        table.add_row(e.name, e.kind, e.spec.skill or "",
                      desc if len(desc) <= 80 else desc[:79] + "…")
    out = console()
    out.print(table)
    if mcp:
        _print_mcp(out, mcp)
    for p in problems:
        where = f"{p.path}:{p.line}" if p.line is not None else p.path
        out.print(f"[red]left out[/] {escape(where)}: \\[{escape(p.rule)}] {escape(p.detail)}",
                  markup=True, soft_wrap=True)
    out.print(f"sandbox: {escape(status.describe())}", markup=True, soft_wrap=True)


@tools_group.command("show")
@click.argument("name")
@click.option("--version", "version", default=None, help="Library version (default: current).")
@library_option
@json_option
@handle_errors
def show_cmd(name: str, version: str | None, library_path: Path | None, as_json: bool) -> None:
    """A tool's schema; for a learned tool also its skill, code and provenance."""
    snap = _library(library_path).snapshot(version)
    entry = _find(snap, name)
    provenance = None
    if entry.definition is not None:
        # the tool maker's record; older libraries kept it under another assets/*.json name
        base = f"skills/{entry.definition.skill}/"
        found = [base + PROVENANCE_FILE] if snap.exists(base + PROVENANCE_FILE) else sorted(
            p for p in snap.files(base + "assets/") if p.endswith(".json"))
        if found:
            provenance = json.loads(snap.read_text(found[0]))
    if as_json:
        emit_json({"name": entry.name, "kind": entry.kind, "spec": entry.spec.to_dict(),
                   "source": entry.definition.source if entry.definition else None,
                   "provenance": provenance})
        return
    out = console()
    out.print(f"[bold]{escape(entry.name)}[/] ({entry.kind}"
              + (f", skill [bold]{escape(entry.spec.skill)}[/]" if entry.spec.skill else "")
              + ")", markup=True)
    out.print(escape(entry.spec.description), markup=True, soft_wrap=True)
    out.print(Syntax(json.dumps(entry.spec.parameters, indent=2), "json"))
    if entry.definition is not None:
        out.print(f"[dim]{escape(entry.definition.path)}[/]", markup=True)
        out.print(Syntax(entry.definition.source, "python"))
    if provenance is not None:
        out.print("provenance:", markup=False)
        out.print(Syntax(json.dumps(provenance, indent=2), "json", word_wrap=True))


def _arguments(text: str, entry: ToolEntry) -> dict[str, Any]:
    """INPUT as arguments: a JSON object, ``-`` (read stdin), ``@file``, or plain text for the
    tool's first parameter."""
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        text = Path(text[1:]).read_text(encoding="utf-8")
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ToolError(f"INPUT is not a JSON object: {exc.msg}",
                            hint='e.g. \'{"expression": "17*23"}\'') from exc
        if isinstance(value, dict):
            return value
    params = entry.spec.parameters
    first = ([*params.get("required", [])] or list(params.get("properties", {})) or [None])[0]
    if first is None:
        return {}
    return {first: text}


def _run(entry: ToolEntry, args: dict[str, Any], snap: Snapshot, library: Library,
         roots: tuple[Path, ...], timeout_s: float | None) -> Any:
    # lazy: `whetstone --help` imports every command module
    from ...tools.base import Toolbox
    from ...tools.builtin import builtin_tools
    from ...tools.images import ImageFiles
    from ...tools.learned_run import run_learned
    from ...tools.visual import visual_tools
    from ..runtime.skills_plugin import SkillsPlugin

    images = ImageFiles(library.scratch("tool-images"), roots)
    if entry.kind == "learned":
        try:
            return run_learned(entry.definition, args, images=images, timeout_s=timeout_s)
        except ToolError as exc:
            # lazy: `whetstone --help` imports every command module
            from ...tools.base import ToolResult

            return ToolResult(error=exc.message)
    if entry.kind == "visual":
        tools = visual_tools(images, (entry.name,))
    elif entry.name == "read_skill":
        tools = SkillsPlugin(library, snapshot=snap, learned_tools=False).tools()
    else:
        tools = builtin_tools((entry.name,))
    return Toolbox.of(tools).call(entry.name, args)


@tools_group.command("test")
@click.argument("name")
@click.argument("input_text", metavar="INPUT")
@click.option("--allow", "allow", multiple=True, type=click.Path(path_type=Path),
              help="A folder image arguments may be read from (repeatable; default: the "
                   "current folder).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=None,
              help="Seconds before the call is stopped (default: the tool's own).")
@click.option("--version", "version", default=None, help="Library version (default: current).")
@library_option
@json_option
@handle_errors
def test_cmd(name: str, input_text: str, allow: tuple[Path, ...], timeout_s: float | None,
             version: str | None, library_path: Path | None, as_json: bool) -> None:
    """Call one tool once with INPUT (a JSON object of arguments, plain text for its first
    parameter, @FILE or - for stdin). Exit 1 when the call fails."""
    library = _library(library_path)
    snap = library.snapshot(version)
    entry = _find(snap, name)
    args = _arguments(input_text, entry)
    roots = tuple(p.resolve() for p in (allow or (Path.cwd(),)))
    result = _run(entry, args, snap, library, roots, timeout_s)
    if as_json:
        emit_json({"tool": name, "arguments": args, "ok": result.ok, "output": result.output,
                   "error": result.error, "duration_s": round(result.duration_s, 3),
                   "timed_out": result.timed_out, "metadata": dict(result.metadata)})
    else:
        out = console()
        if result.output.strip():
            out.print(escape(result.output), markup=True, soft_wrap=True)
        if result.error:
            out.print(f"[bold red]error:[/] {escape(result.error)}", markup=True,
                      soft_wrap=True)
        sandbox = dict(result.metadata).get("sandbox")
        if sandbox:
            out.print(f"[dim]sandbox: {escape(str(sandbox.get('isolation')))} · "
                      f"{result.duration_s:.2f} s[/]", markup=True)
            for w in sandbox.get("warnings", []):
                out.print(f"[yellow]warning:[/] {escape(w)}", markup=True, soft_wrap=True)
    if not result.ok:
        raise SystemExit(1)
