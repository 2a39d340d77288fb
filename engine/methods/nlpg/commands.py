"""``whetstone policies ls | show MODULE``: the NLPG policy notes of a library version.

Notes live in ``policies/<module>.md`` (format: ``whetstone.engine.methods.nlpg.notes``);
``whetstone evolve nlpg`` learns them and ``--methods nlpg`` shows each module its own. The
commands are built with the command line's kit (``MethodSpec.commands``): this package imports
no face.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ...errors import NotFound, ValidationError
from ..base import CommandKit
from .memory import estimate_tokens, note_tokens
from .notes import PolicyNote, load_policies

version_option = click.option("--version", "version", default=None,
                              help="Library version to read (default: current).")


def _tokens(notes: list[PolicyNote]) -> int:
    return note_tokens(notes, estimate_tokens)


def commands(kit: CommandKit) -> list[click.Command]:
    """What NLPG adds to the ``whetstone`` command line (its ``MethodSpec.commands``)."""

    def read(library_path: Path | None, version: str | None
             ) -> tuple[str, dict[str, list[PolicyNote]], list[ValidationError]]:
        snap = kit.open_library(library_path).snapshot(version)
        memory, problems = load_policies(snap)
        return snap.id, memory, problems

    def warn(problems: list[ValidationError]) -> None:
        err = kit.console(stderr=True)
        for p in problems:
            err.print(f"[yellow]warning:[/] {escape(str(p))} (line skipped)", markup=True,
                      soft_wrap=True)

    @click.group("policies")
    def policies_group() -> None:
        """NLPG policy notes: per module, shown only in that module's prompt."""

    @policies_group.command("ls")
    @version_option
    @kit.library_option
    @kit.json_option
    @kit.handle_errors
    def ls_cmd(version: str | None, library_path: Path | None, as_json: bool) -> None:
        """List the modules that have notes, with their size and use counts."""
        vid, memory, problems = read(library_path, version)
        rows: list[dict[str, Any]] = [
            {"module": m, "notes": len(notes), "routes": sorted({n.route for n in notes}),
             "tokens": _tokens(notes), "helpful": sum(n.helpful for n in notes),
             "harmful": sum(n.harmful for n in notes)} for m, notes in sorted(memory.items())]
        if as_json:
            kit.emit_json({"version": vid, "modules": rows,
                           "problems": [str(p) for p in problems]})
            return
        warn(problems)
        if not rows:
            kit.console().print(f"no policy notes in {vid}: `whetstone evolve nlpg --tasks "
                                "SET` learns them", markup=False)
            return
        table = Table(title=f"policy notes in {vid}")
        for col in ("module", "notes", "routes", "~tokens", "helpful", "harmful"):
            table.add_column(col, justify="left" if col in ("module", "routes") else "right")
        for r in rows:
            table.add_row(r["module"], str(r["notes"]), ", ".join(r["routes"]),
                          str(r["tokens"]), str(r["helpful"]), str(r["harmful"]))
        kit.console().print(table)

    @policies_group.command("show")
    @click.argument("module")
    @version_option
    @kit.library_option
    @kit.json_option
    @kit.handle_errors
    def show_cmd(module: str, version: str | None, library_path: Path | None,
                 as_json: bool) -> None:
        """Show one module's notes, in the order its prompt shows them."""
        vid, memory, problems = read(library_path, version)
        problems = [p for p in problems if p.path == f"policies/{module}.md"]
        if module not in memory:
            known = ", ".join(sorted(memory)) or "none yet"
            raise NotFound(f"no policy notes for module {module!r} in {vid}",
                           hint=f"modules with notes: {known} (`whetstone policies ls`)")
        notes = memory[module]
        if as_json:
            kit.emit_json({"version": vid, "module": module,
                           "notes": [n.to_dict() for n in notes],
                           "problems": [str(p) for p in problems]})
            return
        warn(problems)
        table = Table(title=f"{module} in {vid}: {len(notes)} notes, ~{_tokens(notes)} tokens")
        for col in ("id", "route", "helpful", "harmful", "text"):
            table.add_column(col, justify="right" if col in ("helpful", "harmful") else "left",
                             overflow="fold")
        for n in notes:
            table.add_row(n.id, n.route, str(n.helpful), str(n.harmful), escape(n.text))
        kit.console().print(table)

    return [policies_group]
