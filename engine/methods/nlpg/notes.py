"""The policy-note format of ``policies/<module>.md``: NLPG's memory, one file per module.

One note per line; blank lines and lines starting with ``#`` (a heading for people) are
ignored::

    # Policy notes: think
    [n3f2a1c] route=finish helpful=2 harmful=0 :: Recompute each product before answering.
    [n77e01b] :: Keep the units of every quantity.

``route`` is the edge the module takes (``Step.route``: ``act``, ``finish``, ...) the note is
about, ``*`` (the default) for every route; ``helpful``/``harmful`` count later runs the note
helped or hurt (default 0). The module is the file's name. ``read_policy`` is lenient (the
notes it can read, plus the problems); ``parse_policy`` is strict (the first problem raised as
a ``ValidationError`` with the line and what to write instead); ``render_policy`` writes the
format back, and refuses a note it could not read again. ``validate_policies`` is what a
library commit runs on the policy files a change touched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ...errors import ValidationError
from ...types import JsonRecord

if TYPE_CHECKING:
    from ....library_store.store import Snapshot

POLICIES_DIR = "policies"
MAX_NOTE_CHARS = 600
MODULE_RE = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
ROUTE_RE = re.compile(r"^(\*|[a-z][a-z0-9_-]{0,39})$")
_NOTE_RE = re.compile(r"^\[(?P<id>[^\]]*)\](?P<fields>[^:]*(?::(?!:)[^:]*)*)::(?P<text>.*)$")
_FIELDS = ("route", "helpful", "harmful")
_EXAMPLE = "[n1] route=finish helpful=0 harmful=0 :: <one short rule>"


@dataclass(frozen=True)
class PolicyNote(JsonRecord):
    """A policy note for one module: ``[id] route=… helpful=N harmful=N :: text``."""

    id: str
    module: str
    text: str
    route: str = "*"
    helpful: int = 0
    harmful: int = 0


def policy_path(module: str) -> str:
    """``policies/<module>.md``; ``ValidationError`` for a name that cannot be a module."""
    if not MODULE_RE.match(module):
        raise ValidationError(f"{POLICIES_DIR}/{module}.md", "policy-module",
                              f"{module!r} is not a module name",
                              hint="a module is a graph node name: lowercase letters, digits, "
                                   "'_' or '-' (think, co_react_rubric)")
    return f"{POLICIES_DIR}/{module}.md"


def module_of(path: str) -> str | None:
    """The module a library path holds notes for (None: not a policy file)."""
    parts = path.split("/")
    if len(parts) != 2 or parts[0] != POLICIES_DIR or not parts[1].endswith(".md"):
        return None
    return parts[1][:-3]


def _problem(path: str, line: int, rule: str, detail: str, hint: str) -> ValidationError:
    return ValidationError(path, rule, detail, line=line, hint=hint)


def _parse_fields(raw: str, path: str, lineno: int
                  ) -> tuple[dict[str, str | int], ValidationError | None]:
    out: dict[str, str | int] = {}
    for item in raw.split():
        key, eq, value = item.partition("=")
        if not eq or key not in _FIELDS:
            return out, _problem(path, lineno, "note-field", f"unknown field {item!r}",
                                 f"fields are route=, helpful=, harmful=; e.g. {_EXAMPLE}")
        if key in out:
            return out, _problem(path, lineno, "note-field", f"{key}= is given twice",
                                 "give each field once")
        if key == "route":
            if not ROUTE_RE.match(value):
                return out, _problem(path, lineno, "note-field", f"route {value!r} is not a "
                                     "route name", "a route is an edge name (act, finish, "
                                     "think) or * for every route")
            out[key] = value
        elif not value.isdigit():
            return out, _problem(path, lineno, "note-field", f"{key}={value!r} is not a "
                                 "count", f"write {key}=N with N a whole number >= 0")
        else:
            out[key] = int(value)
    return out, None


def parse_line(line: str, module: str, *, path: str = "", lineno: int = 1
               ) -> PolicyNote | ValidationError | None:
    """One line: a note, the problem with it, or None for a blank or heading line."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    m = _NOTE_RE.match(text)
    if m is None:
        return _problem(path, lineno, "note-syntax", f"not a note line: {text[:120]!r}",
                        f"write one note per line: {_EXAMPLE} (or '# ...' for a heading)")
    note_id, body = m.group("id").strip(), " ".join(m.group("text").split())
    if not ID_RE.match(note_id):
        return _problem(path, lineno, "note-id", f"[{note_id}] is not a note id",
                        "an id is 1-40 letters, digits, '_', '.' or '-', e.g. [n1]")
    fields, error = _parse_fields(m.group("fields"), path, lineno)
    if error is not None:
        return error
    if not body:
        return _problem(path, lineno, "note-empty", f"note [{note_id}] has no text",
                        "write the rule after '::', or delete the line")
    if len(body) > MAX_NOTE_CHARS:
        return _problem(path, lineno, "note-too-long", f"note [{note_id}] has {len(body)} "
                        f"characters (at most {MAX_NOTE_CHARS})", "shorten it to one rule")
    return PolicyNote(id=note_id, module=module, text=body,
                      route=str(fields.get("route", "*")), helpful=int(fields.get("helpful", 0)),
                      harmful=int(fields.get("harmful", 0)))


def read_policy(text: str, module: str, *, path: str | None = None
                ) -> tuple[list[PolicyNote], list[ValidationError]]:
    """Every note ``text`` holds that can be read, and the problems of the lines that cannot
    (a repeated id keeps its first note)."""
    where = path or f"{POLICIES_DIR}/{module}.md"
    notes: list[PolicyNote] = []
    problems: list[ValidationError] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        got = parse_line(line, module, path=where, lineno=lineno)
        if isinstance(got, ValidationError):
            problems.append(got)
        elif got is not None and got.id in seen:
            problems.append(_problem(where, lineno, "note-duplicate-id", f"[{got.id}] is "
                                     "used by an earlier note", "give every note its own id"))
        elif got is not None:
            seen.add(got.id)
            notes.append(got)
    return notes, problems


def parse_policy(text: str, module: str, *, path: str | None = None) -> list[PolicyNote]:
    """The notes of a policy file; ``ValidationError`` for the first malformed line."""
    notes, problems = read_policy(text, module, path=path)
    if problems:
        raise problems[0]
    return notes


def render_note(note: PolicyNote) -> str:
    """One line of the format (the text's whitespace folded to single spaces)."""
    return (f"[{note.id}] route={note.route} helpful={note.helpful} harmful={note.harmful} "
            f":: {' '.join(note.text.split())}")


def render_policy(module: str, notes: Iterable[PolicyNote]) -> str:
    """The file for ``module``'s notes, in order; ``ValidationError`` when a note could not be
    read back (bad id or route, empty or too long text, a repeated id)."""
    path = policy_path(module)
    lines = [f"# Policy notes: {module}"]
    lines += [render_note(replace(n, module=module)) for n in notes]
    text = "\n".join(lines) + "\n"
    parse_policy(text, module, path=path)  # the writer never writes what the reader refuses
    return text


def load_policies(snapshot: Snapshot) -> tuple[dict[str, list[PolicyNote]],
                                               list[ValidationError]]:
    """Every module's notes in a version (lenient), and the problems met."""
    memory: dict[str, list[PolicyNote]] = {}
    problems: list[ValidationError] = []
    for path in sorted(snapshot.files(f"{POLICIES_DIR}/")):
        module = module_of(path)
        if module is None or not MODULE_RE.match(module):
            problems.append(_misplaced(path))
            continue
        notes, bad = read_policy(snapshot.read_text(path), module, path=path)
        memory[module] = notes
        problems += bad
    return memory, problems


def _misplaced(path: str) -> ValidationError:
    return ValidationError(path, "policy-path", "policy notes live in policies/<module>.md",
                           hint="one file per module, named after it (policies/think.md)")


def validate_policies(snapshot: Snapshot, changed: Sequence[str] | None = None
                      ) -> list[ValidationError]:
    """Problems of the policy files ``changed`` touched (every one when None)."""
    paths = sorted(snapshot.files(f"{POLICIES_DIR}/")) if changed is None else [
        p for p in changed if p.split("/")[0] == POLICIES_DIR and snapshot.exists(p)]
    problems: list[ValidationError] = []
    for path in paths:
        module = module_of(path)
        if module is None or not MODULE_RE.match(module):
            problems.append(_misplaced(path))
            continue
        problems += read_policy(snapshot.read_text(path), module, path=path)[1]
    return problems


__all__ = [
    "MAX_NOTE_CHARS",
    "POLICIES_DIR",
    "load_policies",
    "module_of",
    "parse_line",
    "parse_policy",
    "policy_path",
    "read_policy",
    "render_note",
    "render_policy",
    "validate_policies",
]
