"""``whetstone methods``: the evolvers and runtime methods this installation knows."""

from __future__ import annotations

import dataclasses
from typing import Any

import click
from rich.table import Table

from ..errors import ConfigError
from .common import console, emit_json, handle_errors, json_option


@click.command("methods")
@json_option
@handle_errors
def methods_cmd(as_json: bool) -> None:
    """Evolvers (`whetstone evolve NAME`) and runtime methods (`--methods NAME`), with their
    knobs."""
    # lazy: filelock, `whetstone --help` imports every command module
    from ..methods.registry import default_registry
    from .kit import Kit

    registry, kit = default_registry(), Kit()
    specs = {spec.name: spec for spec in registry.specs()}
    # loaded once per method (a method with both kinds has two rows)
    commands: dict[str, list[str | None]] = {}
    for name, spec in specs.items():
        try:
            commands[name] = [c.name for c in registry.commands_of(spec, kit)]
        except ConfigError as exc:
            registry.skip(name, exc.message)
    rows: list[dict[str, Any]] = []
    for kind in ("evolver", "runtime"):
        for name in registry.names(kind):  # type: ignore[arg-type]
            entry = registry.entry(kind, name)  # type: ignore[arg-type]
            try:
                cls = entry.load()
                summary = entry.summary()
            except ConfigError as exc:  # a broken package is listed, never a crash
                cls, summary = None, f"unusable: {exc.message}"
            config = getattr(cls, "config_class", None)
            knobs = [f.name for f in dataclasses.fields(config)] if config else []
            owner = specs.get(name)
            rows.append({"name": name, "kind": kind, "summary": summary,
                         "options": knobs, "from": entry.target,
                         # what its package owns: library folders, commands, prompts
                         "folders": [r.name for r in owner.roots] if owner else [],
                         "commands": commands.get(name, []),
                         "step_kinds": sorted(owner.step_kinds) if owner else [],
                         "exit_codes": sorted(owner.exit_codes) if owner else [],
                         "flags": [o.flag for o in owner.options] if owner else [],
                         "prompts": owner.prompts.names() if owner and owner.prompts else []})
    rows += [{"name": name, "kind": "method", "summary": f"unusable: {why}", "options": [],
              "from": "", "folders": [], "commands": [], "step_kinds": [], "exit_codes": [],
              "flags": [], "prompts": []}
             for name, why in registry.skipped.items() if name not in specs]
    if as_json:
        emit_json(rows)
        return
    table = Table("name", "kind", "what", "options", "owns")
    for r in rows:
        owns = [f"{f}/" for f in r["folders"]] + [f"`whetstone {c}`" for c in r["commands"]]
        owns += [f"{k} steps" for k in r["step_kinds"]] + list(r["flags"])
        owns += [f"exit {c}" for c in r["exit_codes"]]
        owns += [f"{len(r['prompts'])} prompts"] if r["prompts"] else []
        table.add_row(r["name"], r["kind"], r["summary"], ", ".join(r["options"]),
                      ", ".join(owns))
    console().print(table)
