"""What ``whetstone models`` lists: every backend spec, installed or not, and how to install
it (the registry's entries, with the packaged models' installed state)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from whetstone.engine.backends import packaged
from whetstone.engine.backends.registry import default_registry


def describe_models(registry: Any = None) -> list[Mapping[str, Any]]:
    """Every backend spec, installed or not, how to install it and which engine generates
    its text (``whetstone models``). Local families list one row per engine: the default
    under the plain spec, the others as ``<spec>@<engine>``; an ``example`` spec
    (``hf:/models/...``) is made up: ``installed`` there says only that its backend is."""
    reg = registry or default_registry()
    rows: list[Mapping[str, Any]] = []
    for entry in reg.entries():
        for spec in entry.variants or (entry.example,):
            installed, install = entry.installed(), entry.install
            detail = _packaged_status(spec) if entry.prefix == "embedded" else None
            if detail is not None:
                installed, install = detail
            for i, engine in enumerate(entry.engines or (None,)):
                rows.append({
                    "spec": spec if i == 0 or engine is None else f"{spec}@{engine.name}",
                    "prefix": entry.prefix, "summary": entry.summary,
                    "installed": installed, "install": install,
                    "example": not entry.variants,
                    "white_box": engine.white_box if engine else entry.white_box,
                    "engine": engine.name if engine else entry.prefix,
                    "engine_summary": engine.summary if engine else "",
                })
    return rows


def _packaged_status(spec: str) -> tuple[bool, str] | None:
    """Installed state of one packaged model, if the packaged-model table knows it."""
    name = spec.partition(":")[2] or "qwen-0.5b"
    model = packaged.PACKAGED_MODELS.get(name)
    if model is None:
        return None
    return packaged.installed(name), model.install_hint


__all__ = ["describe_models"]
