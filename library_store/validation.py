"""What a library write is checked with, and the error that rejects it.

The rules themselves live above this layer (the Agent Skills format in ``skills/``, the tool
admission check in ``engine/runtime/library_tools.py``); a ``Library`` is given them when it is
opened and runs them on every write unless the write opts out (see ``Validate``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..engine.errors import ValidationError

if TYPE_CHECKING:
    from .store import Snapshot

# A validator sees the new version and the paths the change touched (None: check every file,
# as `whetstone library validate` does); it returns the problems.
Validator = Callable[["Snapshot", Sequence[str] | None], Sequence[ValidationError]]
# What a write takes as ``validate``: True, the library's own validator (the default); False,
# none (only for a caller that has just validated the same change itself); or a validator.
Validate = Validator | bool


def rejection(problems: Sequence[ValidationError]) -> ValidationError:
    """The error that rejects a change: the first problem, carrying all of them on ``problems``."""
    first = problems[0]
    hint = first.hint
    if len(problems) > 1:
        hint = (f"{len(problems) - 1} more problem(s): "
                + "; ".join(str(p).splitlines()[0] for p in problems[1:4])
                + (" ..." if len(problems) > 4 else ""))
    err = ValidationError(first.path, first.rule, first.detail, line=first.line, hint=hint)
    err.problems = list(problems)  # type: ignore[attr-defined]
    return err
