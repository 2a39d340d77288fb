"""The files the workflows method owns: ``workflows/<name>.yaml``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from whetstone.engine.errors import ValidationError
from whetstone.engine.methods.workflows.records import WORKFLOWS_DIR, parse_workflows
from whetstone.skills.format import NAME_RE

if TYPE_CHECKING:
    from whetstone.library_store.store import Snapshot


def validate_workflows(snapshot: Snapshot, changed: Sequence[str] | None = None
                       ) -> list[ValidationError]:
    """Problems of the workflows files ``changed`` touched (every one when None): each is
    ``workflows/<name>.yaml`` and every workflow in it is well formed (``check_workflow``)."""
    paths = sorted(snapshot.files(f"{WORKFLOWS_DIR}/")) if changed is None else [
        p for p in changed if p.split("/")[0] == WORKFLOWS_DIR and snapshot.exists(p)]
    problems: list[ValidationError] = []
    for path in paths:
        parts = path.split("/")
        if len(parts) != 2 or not parts[1].endswith(".yaml") \
                or not NAME_RE.fullmatch(parts[1][:-5]):
            problems.append(ValidationError(path, "layout", "a workflows file is "
                                            "workflows/<name>.yaml (lower-case letters, digits, "
                                            "hyphens)"))
            continue
        problems += parse_workflows(snapshot.read_text(path), path=path)[1]
    return problems
