"""An evolve's summary (its patch's ``message``, what ``evolve`` prints first and the version
or candidate keeps) names only files the candidate holds.

Part of a summary is often model-written (an analyst's changelog line);
an analyst may name a file whose edit failed, was merged away or was never proposed
("added scripts/check_units.py"), and a person reading it would look for a file that is not
there. Such a clause is left out; when nothing of the summary is left, it says which files the
change touches.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

# A file name as a summary writes it: a path whose last part has a file extension.
_FILE = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w.-]*[\w-]\.(?:md|py|json|jsonl|ya?ml|txt|csv|"
                   r"tsv|sh|js|ts|toml|ini|cfg|html|xml))(?![\w/-])")
_CLAUSE = re.compile(r"(?<=;)\s+|(?<=\.)\s+(?=[A-Z])")
_SHOWN = 5


def named_files(text: str) -> list[str]:
    """The file names ``text`` mentions."""
    return _FILE.findall(text)


def _held(name: str, paths: Collection[str]) -> bool:
    """A name is held when a path is it, or ends with it (a skill's ``scripts/x.py``)."""
    return any(p == name or p.endswith("/" + name) for p in paths)


def held_summary(message: str, paths: Collection[str],
                 changes: Mapping[str, str | bytes | None]) -> str:
    """``message`` without the clauses (split at ``;`` and at sentence ends) that name a file
    none of ``paths`` (the candidate's files) is; a ``head: `` before the clauses is kept.
    When no clause is left, the files ``changes`` touches are named instead."""
    if all(_held(n, paths) for n in named_files(message)):
        return message
    head, sep, body = message.partition(": ")
    if not sep or named_files(head) or len(head) > 80:
        head, sep, body = "", "", message
    kept = [c for c in _CLAUSE.split(body)
            if c.strip() and all(_held(n, paths) for n in named_files(c))]
    if not kept:
        touched = sorted(changes)
        more = f" and {len(touched) - _SHOWN} more" if len(touched) > _SHOWN else ""
        kept = [f"changes {', '.join(touched[:_SHOWN])}{more}" if touched else "no change"]
    return head + sep + " ".join(c.strip() for c in kept).rstrip(" ;")


__all__ = ["held_summary", "named_files"]
