"""The library folders the installed methods own, as data: what ``open_library`` takes and
``MethodRegistry.folders`` gives (light: the registry is imported by ``whetstone --help``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...library_store.validation import Validator


@dataclass(frozen=True)
class Folders:
    """The library folders the installed methods own besides ``skills/`` (``policies``,
    ``memory`` ...), and the validators of their files."""

    roots: tuple[str, ...] = ()
    validators: tuple[Validator, ...] = ()
