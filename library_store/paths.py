"""Library paths and change contents: the rules every writer (commits, candidates) checks.

Kept apart from ``store.py`` so ``candidates.py`` can use them without importing the store.
"""

from __future__ import annotations

from engine.errors import ValidationError

ROOTS = ("skills", "policies")  # top-level folders a version may hold

Content = str | bytes | None


def to_bytes(path: str, value: Content) -> bytes | None:
    """A change's content as bytes (None deletes); anything else is a ``ValidationError``."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise ValidationError(path, "content-type", f"content must be str, bytes or None, "
                          f"not {type(value).__name__}")


def check_path(path: str, *, deleting: bool = False) -> str:
    """A library path: relative, '/'-separated, inside one of ``ROOTS``, no '.' or '..'.

    Hidden parts (``.env.example``) and ``__pycache__`` are refused too: the view, export and
    import all skip them, so such a file would show as deleted and be lost on a round trip.
    ``deleting`` allows them, so a library that holds one from before can still drop it."""
    parts = path.split("/") if isinstance(path, str) else []
    bad = (not parts or "\\" in path or path.startswith("/")
           or any(p in ("", ".", "..") for p in parts))
    if bad or len(parts) < 2 or parts[0] not in ROOTS:
        raise ValidationError(
            str(path), "path", "a library path is relative, uses '/', has no '.' or '..' parts "
            f"and starts with one of {', '.join(r + '/' for r in ROOTS)}",
            hint="e.g. skills/<name>/SKILL.md or policies/<module>.md")
    hidden = next((p for p in parts if p.startswith(".") or p == "__pycache__"), None)
    if hidden is not None and not deleting:
        raise ValidationError(
            path, "path-hidden", f"{hidden!r} is a hidden or cache name; the library does not "
            "keep such files (the view, export and import skip them)",
            hint=f"rename it without the leading '.' (e.g. {hidden.lstrip('.') or 'name'}) "
                 "or leave it out" if hidden != "__pycache__" else "leave __pycache__ out")
    return path
