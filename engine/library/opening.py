"""How every face opens a library, and which version a host reads.

``open_library`` is the one way the faces (``Engine``, the command line, ``serve``, MCP,
LangChain) open a library: the installed methods' folders shown and written, and the product's
rules (``checks.library_validator``) run on every commit. The methods' folders come as data
(``Folders``, which ``MethodRegistry.folders`` gives), so this layer, below the methods,
neither imports nor calls them. ``may_create_library`` is the rule that keeps a mistyped path
from becoming a new, empty library. ``Pin`` is a library and the version a host reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...library_store.manifest import gate_record
from ...library_store.store import Library, Snapshot
from ..errors import WhetstoneError
from ..paths import whetstone_home
from .checks import library_validator
from .folders import Folders


def may_create_library(path: Path, home: Path | None = None) -> bool:
    """Whether opening ``path`` may make a library there when there is none: the default
    library (``$WHETSTONE_HOME/library``, made on first use, however a face names it) or a
    folder that exists and is empty (made for it, as ``mktemp -d`` does). Any other missing
    path is refused: a mistyped ``--library`` must never become a new, empty library."""
    defaults = {(h / "library").absolute() for h in (home or whetstone_home(), whetstone_home())}
    if path.absolute() in defaults:
        return True
    try:
        return path.is_dir() and not any(path.iterdir())
    except OSError:
        return False


def open_library(path: str | Path | None, folders: Folders | None = None, *,
                 create: bool | None = None, home: Path | None = None,
                 **kwargs: Any) -> Library:
    """The library at ``path`` (default ``$WHETSTONE_HOME/library``) with the methods'
    ``folders`` (None: ``skills/`` alone) and the product's checks on every commit. ``create=True`` makes a missing one, ``None``
    only where ``may_create_library`` says (``False``: never); ``kwargs`` go to
    ``Library.open`` (``quiet``, ``validator`` to replace the checks)."""
    path = Path(path).expanduser() if path is not None else whetstone_home() / "library"
    if create is None:
        create = may_create_library(path, home)
    folders = folders or Folders()
    kwargs.setdefault("validator", library_validator(folders.validators))
    return Library.open(path, roots=folders.roots, create=create, **kwargs)


def version_gate(library: Library, version: str) -> dict[str, Any] | None:
    """How ``version`` came to be (``gate_record``: gated or not, by which rule), for a
    server's ``/health``; None for a candidate or a version that cannot be read."""
    try:
        return gate_record(library.manifest(version))
    except WhetstoneError:
        return None


@dataclass(frozen=True)
class Pin:
    """A library and the version a host reads: ``version`` a resolved id or
    ``candidate:NAME`` (a kept candidate, scored without applying it), or None to follow the
    current version as it moves."""

    library: Library
    version: str | None = None

    @classmethod
    def of(cls, library: Library, version: str | None) -> Pin:
        """``version`` as given (``v3``, ``HEAD~1``, ``candidate:NAME``) resolved now."""
        if version and not version.startswith("candidate:"):
            version = library.resolve(version)
        return cls(library, version or None)

    def current(self) -> str:
        """The version read now: the pinned one, or the library's current version."""
        return self.version or self.library.current_id()

    def snapshot(self) -> Snapshot | None:
        """The pinned version's snapshot (None: follow the current version)."""
        if self.version is None:
            return None
        if self.version.startswith("candidate:"):
            return self.library.candidates.snapshot(self.version.split(":", 1)[1])
        return self.library.snapshot(self.version)

    def gate(self, version: str | None = None) -> dict[str, Any] | None:
        """``version_gate`` of ``version`` (default: the one read now)."""
        return version_gate(self.library, version or self.current())
