"""``whetstone models``: every model spec, installed or not, and how to install it.

One block per backend family: its summary, then one line per spec (the engine that runs it,
installed or not, white-box; a family's example spec, such as a made-up model path, is marked
as an example), then the install command of what is missing, whole. A command
is never cut or wrapped by the table (a cut ``pip install`` cannot be copied), and every text
is printed as text, never as markup (``'whetstone-engine[llamacpp]'`` keeps its extra).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import click
from rich.text import Text

from whetstone.engine.commands.common import console, emit_json, handle_errors, json_option


def _blocks(rows: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """The rows grouped by family (``prefix``), in registry order."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        out.setdefault(str(r["prefix"]), []).append(r)
    return list(out.values())


def _state(row: Mapping[str, Any]) -> str:
    """``installed`` / ``not installed``; an example spec (a made-up path or URL: give your
    own) is ``example spec``, or ``example; not installed`` when its backend is not."""
    if row.get("example"):
        return "example spec" if row["installed"] else "example; not installed"
    return "installed" if row["installed"] else "not installed"


@click.command("models")
@json_option
@handle_errors
def models(as_json: bool) -> None:
    """Every model spec, installed or not, and how to install it."""
    # lazy: the backends' registry and the packaged models' table (the command line's start)
    from whetstone.engine.backends.catalog import describe_models

    rows = describe_models()
    if as_json:
        emit_json(rows)
        return
    out = console()
    for i, block in enumerate(_blocks(rows)):
        if i:
            out.print()
        out.print(Text(str(block[0]["prefix"]), style="bold"))
        out.print(Text(textwrap.fill(str(block[0]["summary"]), width=max(40, out.width - 1),
                                     initial_indent="  ", subsequent_indent="  ",
                                     break_on_hyphens=False)))
        width = max(len(str(r["spec"])) for r in block) + 2
        states = [_state(r) for r in block]
        pad = max(len(s) for s in states) + 2
        for r, status in zip(block, states):
            line = Text("  " + str(r["spec"]).ljust(width))
            line.append(status.ljust(pad) if r["white_box"] else status,
                        style="" if r["installed"] else "red")
            if r["white_box"]:
                line.append("white-box")
            out.print(line, no_wrap=True, overflow="ellipsis")
        shown: set[str] = set()
        for r in block:
            install = str(r["install"])
            if not r["installed"] and install not in shown:
                shown.add(install)
                out.print(Text(f"  to install {r['spec']}:"))
                # soft_wrap: the terminal folds a long command; no newline goes inside it.
                out.print(Text(f"    {install}"), soft_wrap=True)
