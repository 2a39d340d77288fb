"""Prompts are data: markdown and YAML files, loaded by name.

``load_prompt("agent_system")`` reads ``agent_system.md`` beside this module (the core's
prompts); ``load_prompt("x.yaml#key")`` reads one entry of a YAML table of short templates.
A method keeps its own prompts in its package's ``prompts/`` folder: the qualified name
``"<package>:<file>"`` reads one of them, and ``Prompts(package)`` (what a method package
declares) loads its files by their short names. ``render_prompt`` fills ``$placeholders`` and
refuses to leave one unfilled: a prompt that silently kept ``$skill`` would reach the model.
A ``$`` that does not start a name (``$1.50``) is plain text.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from string import Template
from typing import Any

from ..errors import ConfigError


@cache
def _read(package: str, fname: str) -> str:
    where = "engine/prompts" if package == __package__ else f"{package}'s prompts/ folder"
    try:
        folder = resources.files(package)
        if package != __package__:
            folder = folder.joinpath("prompts")
        return folder.joinpath(fname).read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        raise ConfigError(f"prompt {fname!r} not found in {where}",
                          hint="check the name or add the file") from exc


@cache
def load_prompt(name: str) -> str:
    """The text of ``engine/prompts/<name>`` (``.md`` added when no suffix is given), of one
    entry of a YAML table (``"<file>.yaml#<key>"``), or, qualified as ``"<package>:<file>"``,
    of a file in that package's ``prompts/`` folder."""
    path, _, key = name.partition("#")
    package, _, fname = path.rpartition(":")
    fname = fname if "." in fname else f"{fname}.md"
    text = _read(package or __package__, fname)
    if not key:
        return text
    import yaml  # lazy: yaml (~20 ms), only when a .yaml table is read

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


@dataclass(frozen=True)
class Prompts:
    """The prompt files of one package, in its ``prompts/`` folder. A method package declares
    ``PROMPTS = Prompts(__name__)`` and its modules load their prompts by short name
    (``PROMPTS.render("backward", ...)``); a name that is already qualified
    (``"other.package:file"``) is read as it is."""

    package: str

    def qualify(self, name: str) -> str:
        return name if ":" in name else f"{self.package}:{name}"

    def load(self, name: str) -> str:
        return load_prompt(self.qualify(name))

    def render(self, name: str, /, **values: Any) -> str:
        return render_prompt(self.qualify(name), **values)

    def names(self) -> list[str]:
        """The package's prompt files, by file name."""
        folder = resources.files(self.package).joinpath("prompts")
        if not folder.is_dir():
            return []
        return sorted(f.name for f in folder.iterdir() if f.name.endswith((".md", ".yaml")))
