"""``whetstone models``: every model spec, installed or not, and how to install it."""

from __future__ import annotations

import click

from whetstone.engine.commands.common import console, emit_json, handle_errors, json_option


@click.command("models")
@json_option
@handle_errors
def models(as_json: bool) -> None:
    """Every model spec, installed or not, and how to install it."""
    from rich.table import Table

    from whetstone.engine.api import describe_models

    rows = describe_models()
    if as_json:
        emit_json(rows)
        return
    table = Table("spec", "installed", "white-box", "what", "install")
    for r in rows:
        table.add_row(r["spec"], "yes" if r["installed"] else "[red]no[/]",
                      "yes" if r["white_box"] else "", r["summary"],
                      "" if r["installed"] else r["install"])
    console().print(table)
