"""Prompts are data: markdown and YAML files beside this module, loaded by name.

``load_prompt("agent_system")`` reads ``agent_system.md``; ``load_prompt("x.yaml#key")`` reads
one entry of a YAML table of short templates. ``render_prompt`` fills ``$placeholders`` and
refuses to leave one unfilled: a prompt that silently kept ``$skill`` would reach the model.
A ``$`` that does not start a name (``$1.50``) is plain text.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from string import Template
from typing import Any

from whetstone.engine.errors import ConfigError


@cache
def _read(fname: str) -> str:
    try:
        return resources.files(__package__).joinpath(fname).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"prompt {fname!r} not found in engine/prompts",
                          hint="check the name or add the file") from exc


@cache
def load_prompt(name: str) -> str:
    """The text of ``engine/prompts/<name>`` (``.md`` added when no suffix is given), or of
    one entry of a YAML table: ``"<file>.yaml#<key>"``."""
    fname, _, key = name.partition("#")
    fname = fname if "." in fname else f"{fname}.md"
    text = _read(fname)
    if not key:
        return text
    import yaml

    table = yaml.safe_load(text)
    if not isinstance(table, dict) or not isinstance(table.get(key), str):
        known = ", ".join(sorted(table)) if isinstance(table, dict) else "none"
        raise ConfigError(f"prompt table {fname!r} has no text entry {key!r}",
                          hint=f"entries: {known}")
    return table[key]


@cache
def placeholders(name: str) -> frozenset[str]:
    """The ``$name`` / ``${name}`` placeholders of a prompt."""
    found = set()
    for m in Template.pattern.finditer(load_prompt(name)):
        ident = m.group("named") or m.group("braced")
        if ident:
            found.add(ident)
    return frozenset(found)


def render_prompt(prompt_name: str, /, **values: Any) -> str:
    """Fill every placeholder of a prompt; ``ConfigError`` naming the ones not given."""
    missing = sorted(placeholders(prompt_name) - values.keys())
    if missing:
        raise ConfigError(
            f"prompt {prompt_name!r} needs {', '.join('$' + m for m in missing)}, which "
            "the caller did not give",
            hint=f"pass {', '.join(f'{m}=...' for m in missing)} to render_prompt, or remove "
                 "the placeholder from the prompt file")
    return Template(load_prompt(prompt_name)).safe_substitute(**values)
