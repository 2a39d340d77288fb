"""What ``whetstone evolve trace2skill`` prints of an evolve, from the patch's details (its
``MethodSpec.summary``): the map phase's analyst calls and how the reduce merged the edits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def summary(details: Mapping[str, Any]) -> list[str]:
    """One line for the map and reduce phases; none when the patch has no report."""
    report = details.get("report")
    if not isinstance(report, Mapping) or not isinstance(report.get("map"), Mapping):
        return []
    mp: Mapping[str, Any] = report["map"]
    line = (f"map: {mp.get('calls', 0)} analyst calls · {mp.get('retries', 0)} retried · "
            f"{mp.get('dropped', 0)} dropped · reduce: {report.get('folded', 0)} folded · "
            f"{report.get('conflicts_resolved', 0)} conflicts resolved")
    return [line]
