"""The files the memory method owns: ``memory/<name>.md``, the verified runs of one task family
kept as demonstrations, in the worked-examples format of ``whetstone.skills.format``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ....skills.format import NAME_RE, parse_examples
from ...errors import ValidationError

if TYPE_CHECKING:
    from ....library_store.store import Snapshot

MEMORY_DIR = "memory"


def validate_memory(snapshot: Snapshot, changed: Sequence[str] | None = None
                    ) -> list[ValidationError]:
    """Problems of the memory files ``changed`` touched (every one when None): each is
    ``memory/<name>.md`` in the worked-examples format (``parse_examples``)."""
    paths = sorted(snapshot.files(f"{MEMORY_DIR}/")) if changed is None else [
        p for p in changed if p.split("/")[0] == MEMORY_DIR and snapshot.exists(p)]
    problems: list[ValidationError] = []
    for path in paths:
        parts = path.split("/")
        if len(parts) != 2 or not parts[1].endswith(".md") \
                or not NAME_RE.fullmatch(parts[1][:-3]):
            problems.append(ValidationError(path, "layout", "a memory file is memory/<name>.md "
                                            "(lower-case letters, digits, hyphens)"))
            continue
        problems += parse_examples(snapshot.read_text(path), path=path)[1]
    return problems
