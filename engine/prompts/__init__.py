"""Prompts are data: markdown and YAML files beside this module, loaded by name."""

from __future__ import annotations

from functools import cache
from importlib import resources
from string import Template
from typing import Any

from engine.errors import ConfigError


@cache
def load_prompt(name: str) -> str:
    """The text of ``engine/prompts/<name>`` (``.md`` added when no suffix is given)."""
    fname = name if "." in name else f"{name}.md"
    try:
        return resources.files(__package__).joinpath(fname).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"prompt {fname!r} not found in engine/prompts",
                          hint="check the name or add the file") from exc


def render_prompt(prompt_name: str, /, **values: Any) -> str:
    """Fill ``$placeholders`` in a prompt; unknown placeholders are left as they are."""
    return Template(load_prompt(prompt_name)).safe_substitute(**values)
