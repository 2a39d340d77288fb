"""Edits on a skill directory: the patch format Trace2Skill's analysts write, and how it is
applied.

A patch is ``{reasoning, edits: [{file, op, target_section, target_text, content}], changelog}``.
Ops work on markdown sections (a heading and the lines under it, up to the next heading of the
same or a higher level) and on anchor text, never on line numbers, so a patch written against
one version of a file still applies after unrelated edits. An anchor that is not there is an
``EditError`` (the analyst is shown it and asked again).

Files are a ``{relative path: text}`` mapping of one skill folder (``SKILL.md``,
``references/x.md``, ``scripts/t.py``); nothing here touches the disk.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from ....skills.format import SKILL_DIRS
from ...errors import WhetstoneError
from ...replies import extract_json_object

Op = Literal["insert_after", "insert_before", "append_to_section", "replace_in_section",
             "add_section", "delete_section", "create", "delete_file"]
OPS: tuple[str, ...] = ("insert_after", "insert_before", "append_to_section",
                        "replace_in_section", "add_section", "delete_section", "create",
                        "delete_file")
_NEEDS_SECTION = {"append_to_section", "replace_in_section", "delete_section", "add_section"}
_NEEDS_TEXT = {"insert_after", "insert_before", "replace_in_section"}
_NEEDS_CONTENT = {"insert_after", "insert_before", "append_to_section", "replace_in_section",
                  "add_section", "create"}
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


class EditError(WhetstoneError):
    """An edit that cannot be applied (unknown op, missing anchor, bad path)."""


@dataclass(frozen=True)
class Edit:
    """One change to one file. ``support`` holds the ids of the traces that argued for it."""

    file: str
    op: str
    target_section: str | None = None
    target_text: str | None = None
    content: str = ""
    support: tuple[str, ...] = ()
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"file": self.file, "op": self.op}
        for key in ("target_section", "target_text"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.content:
            d["content"] = self.content
        if self.support:
            d["support"] = list(self.support)
        if self.note:
            d["note"] = self.note
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Edit:
        if not isinstance(d, Mapping):
            raise EditError(f"an edit must be a JSON object, got {type(d).__name__}: {d!r}")
        op = str(d.get("op", "")).strip()
        file = str(d.get("file") or "SKILL.md").strip().lstrip("./")
        content = d.get("content", "")
        if not isinstance(content, str):
            content = "\n".join(map(str, content)) if isinstance(content, list) else str(content)
        edit = cls(
            file=file, op=op,
            target_section=_opt_str(d.get("target_section")),
            target_text=_opt_str(d.get("target_text")),
            content=content,
            support=_ids(d.get("support")),
            note=str(d.get("note") or d.get("reason") or ""),
        )
        edit.check_shape()
        return edit

    def check_shape(self) -> None:
        """Fields the op needs are present; the path stays inside the skill folder."""
        if self.op not in OPS:
            raise EditError(f"unknown op {self.op!r}", hint="ops: " + ", ".join(OPS))
        if self.file.startswith("/") or ".." in self.file.split("/"):
            raise EditError(f"file {self.file!r} is outside the skill folder",
                            hint="use paths like SKILL.md or references/<name>.md")
        parts = self.file.split("/")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] not in SKILL_DIRS):
            raise EditError(f"file {self.file!r}: bundled files live one level deep in "
                            + ", ".join(d + "/" for d in SKILL_DIRS))
        if self.op in _NEEDS_SECTION and not self.target_section:
            raise EditError(f"op {self.op} needs target_section")
        if self.op in _NEEDS_TEXT and not self.target_text:
            raise EditError(f"op {self.op} needs target_text (an exact line or phrase to anchor "
                            "on)")
        if self.op in _NEEDS_CONTENT and not self.content.strip():
            raise EditError(f"op {self.op} needs content")

    def key(self) -> tuple[str, str, str, str]:
        return (self.file, self.op, _norm(self.target_section or ""),
                _norm(self.target_text or ""))


def _ids(v: Any) -> tuple[str, ...]:
    """Trace ids as a tuple; one id written as a bare string stays one id."""
    if not v:
        return ()
    if isinstance(v, str):
        return (v,)
    return tuple(str(s) for s in v) if isinstance(v, (list, tuple)) else (str(v),)


def _opt_str(v: Any) -> str | None:
    if v is None:
        return None
    s = str(v).strip()
    return s or None


def _norm(s: str) -> str:
    return re.sub(r"[\W_]+", " ", s.lower()).strip()


@dataclass(frozen=True)
class SkillPatch:
    """A set of edits with the analyst's reasoning and a changelog line."""

    edits: tuple[Edit, ...] = ()
    reasoning: str = ""
    changelog: str = ""
    support: tuple[str, ...] = ()  # every trace behind this patch

    def to_dict(self) -> dict[str, Any]:
        return {"reasoning": self.reasoning, "edits": [e.to_dict() for e in self.edits],
                "changelog": self.changelog, "support": list(self.support)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], support: Iterable[str] = ()) -> SkillPatch:
        """A patch from JSON. ``support``: the traces an analyst read to write it; when given,
        every edit is credited to them, whatever the model wrote (it cannot know the ids). A
        saved patch is read without it and keeps its edits' own support."""
        if not isinstance(d, Mapping):
            raise EditError("the patch must be a JSON object with an 'edits' list")
        raw_edits = d.get("edits")
        if not isinstance(raw_edits, list):
            raise EditError("the patch has no 'edits' list",
                            hint='reply {"reasoning": ..., "edits": [...], "changelog": ...}')
        sup = tuple(support)
        edits = []
        for raw in raw_edits:
            edit = Edit.from_dict(raw)
            edits.append(replace(edit, support=sup) if sup else edit)
        changelog = d.get("changelog", "")
        if isinstance(changelog, list):
            changelog = "; ".join(map(str, changelog))
        return cls(edits=tuple(edits), reasoning=str(d.get("reasoning", "")),
                   changelog=str(changelog), support=sup or _ids(d.get("support")))


# -- markdown sections -----------------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    title: str
    level: int
    start: int  # index of the heading line
    end: int  # index one past the section's last line


def _body_start(lines: list[str]) -> int:
    """Index of the first line after YAML front matter (0 when there is none)."""
    if lines and lines[0].strip() == "---":
        for i in range(1, len(lines)):
            if lines[i].strip() == "---":
                return i + 1
    return 0


def sections(lines: list[str]) -> list[Section]:
    """Headings outside code fences and front matter, with their extents."""
    heads: list[tuple[int, int, str]] = []
    fenced = False
    for i in range(_body_start(lines), len(lines)):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if m:
            heads.append((i, len(m.group(1)), m.group(2).strip()))
    out = []
    for n, (i, level, title) in enumerate(heads):
        end = len(lines)
        for j, lvl, _ in heads[n + 1:]:
            if lvl <= level:
                end = j
                break
        out.append(Section(title, level, i, end))
    return out


def own_end(lines: list[str], sec: Section) -> int:
    """One past the section's own text: where its first subsection starts, else its end.
    Appending there keeps new lines out of the last subsection (which a delete of that
    subsection would take with it)."""
    for s in sections(lines):
        if sec.start < s.start < sec.end and s.level > sec.level:
            return s.start
    return sec.end


def find_section(lines: list[str], name: str) -> Section:
    """The section whose heading matches ``name`` (``## Pitfalls`` or ``pitfalls``)."""
    want = _norm(name.lstrip("#"))
    secs = sections(lines)
    exact = [s for s in secs if _norm(s.title) == want]
    if len(exact) >= 1:
        return exact[0]
    loose = [s for s in secs if want and (want in _norm(s.title) or _norm(s.title) in want)]
    if len(loose) == 1:
        return loose[0]
    titles = ", ".join(repr(s.title) for s in secs) or "(no headings)"
    raise EditError(f"section {name!r} not found", hint=f"sections in the file: {titles}")


def _find_text(lines: list[str], text: str, lo: int, hi: int) -> tuple[int, int]:
    """Line span [a, b) in lines[lo:hi] holding ``text`` (exact, then whitespace-lenient)."""
    block = "\n".join(lines[lo:hi])
    idx = block.find(text)
    if idx < 0:
        # Models drop or add spaces and list markers; match on squeezed whitespace.
        squeeze = re.sub(r"\s+", " ", text.strip())
        for a in range(lo, hi):
            for b in range(a + 1, min(hi, a + 40) + 1):
                if squeeze in re.sub(r"\s+", " ", " ".join(lines[a:b])):
                    return a, b
        raise EditError(f"target_text {text[:80]!r} not found",
                        hint="copy an exact line from the current file as the anchor")
    a = lo + block[:idx].count("\n")
    b = lo + block[:idx + len(text)].count("\n") + 1
    return a, b


def _content_lines(content: str) -> list[str]:
    return content.strip("\n").split("\n")


def apply_edit(files: Mapping[str, str], edit: Edit) -> dict[str, str]:
    """A new file mapping with ``edit`` applied; raises ``EditError`` if it cannot be."""
    edit.check_shape()
    out = dict(files)
    if edit.op == "create":
        if edit.file in files and files[edit.file].strip() and edit.file == "SKILL.md":
            raise EditError("SKILL.md already exists; edit its sections instead of creating it")
        out[edit.file] = edit.content.rstrip("\n") + "\n"
        return out
    if edit.file not in files:
        raise EditError(f"file {edit.file!r} does not exist in the skill",
                        hint="files: " + ", ".join(sorted(files)) + "; use op 'create' first")
    if edit.op == "delete_file":
        if edit.file == "SKILL.md":
            raise EditError("SKILL.md cannot be deleted")
        del out[edit.file]
        return out
    lines = files[edit.file].rstrip("\n").split("\n")
    new = _content_lines(edit.content)
    lo, hi = _body_start(lines), len(lines)
    own = hi
    if edit.target_section and edit.op != "add_section":
        sec = find_section(lines, edit.target_section)
        lo, hi, own = sec.start, sec.end, own_end(lines, sec)
    if edit.op in ("insert_after", "insert_before", "append_to_section"):
        _refuse_repeats(lines[lo:hi], new, edit)
    if edit.op in ("insert_after", "insert_before"):
        a, b = _find_text(lines, edit.target_text or "", lo, hi)
        at = b if edit.op == "insert_after" else a
        lines[at:at] = new
    elif edit.op == "replace_in_section":
        a, b = _find_text(lines, edit.target_text or "", lo, hi)
        old = "\n".join(lines[a:b])
        target = edit.target_text or ""
        # Exact match: replace just the phrase; whitespace-lenient match: the matched lines.
        lines[a:b] = (old.replace(target, edit.content.strip("\n"), 1).split("\n")
                      if target in old else new)
    elif edit.op == "append_to_section":
        end = own
        while end > lo + 1 and not lines[end - 1].strip():
            end -= 1  # before the blank lines that separate it from the next heading
        lines[end:end] = new
    elif edit.op == "delete_section":
        del lines[lo:hi]
    elif edit.op == "add_section":
        title = edit.target_section.lstrip("#").strip()  # type: ignore[union-attr]
        if any(_norm(s.title) == _norm(title) for s in sections(lines)):
            raise EditError(f"section {title!r} already exists",
                            hint="use append_to_section or replace_in_section on it")
        lines += ["", *_section_text(edit).rstrip("\n").split("\n")]
    out[edit.file] = "\n".join(lines).rstrip("\n") + "\n"
    return out


def _refuse_repeats(scope: list[str], new: list[str], edit: Edit) -> None:
    """An insert whose every line the section already says adds nothing: refuse it, so an
    analyst is told (and retried) and the sequential baseline does not pile up copies."""
    said = {_norm(line) for line in scope} - {""}
    wanted = [_norm(line) for line in new if _norm(line)]
    if wanted and all(w in said for w in wanted):
        where = f"section {edit.target_section!r}" if edit.target_section else edit.file
        raise EditError(f"{where} already says this: {edit.content.strip()[:120]!r}",
                        hint="propose a lesson the skill does not state yet, or no edit")


def apply_patch(files: Mapping[str, str], patch: SkillPatch, *, strict: bool = False
                ) -> tuple[dict[str, str], list[tuple[Edit, str]]]:
    """Apply every edit in order. Returns the files and the edits that failed with why;
    ``strict`` raises on the first failure instead (used to check an analyst's reply)."""
    current = dict(files)
    failed: list[tuple[Edit, str]] = []
    for edit in patch.edits:
        try:
            current = apply_edit(current, edit)
        except EditError as exc:
            if strict:
                raise EditError(f"edit {edit.op} on {edit.file}: {exc.message}", exc.hint) \
                    from exc
            failed.append((edit, exc.message))
    return current, failed


@dataclass(frozen=True)
class Region:
    """Where an edit lands in the base file, as line ranges ``[start, end)``.

    ``anchor``: the lines that must survive for the edit to make sense (its target text or its
    section's heading); ``changed``: the lines it replaces or deletes, or the insertion point
    (``start == end``). Used to keep the merged edits disjoint.
    """

    file: str
    anchor: tuple[int, int]
    changed: tuple[int, int]
    destructive: bool
    new_section: str | None = None

    def conflicts(self, other: Region) -> bool:
        """Two edits clash when one destroys lines the other changes or depends on, or when
        both add the same new section."""
        if self.file != other.file:
            return False
        if self.new_section is not None and self.new_section == other.new_section:
            return True
        if self.destructive and (_hits(self.changed, other.changed)
                                 or _hits(self.changed, other.anchor)):
            return True
        return other.destructive and (_hits(other.changed, self.changed)
                                      or _hits(other.changed, self.anchor))


def _hits(destroyed: tuple[int, int], rng: tuple[int, int]) -> bool:
    a, b = destroyed
    c, d = rng
    if c == d:  # an insertion point survives unless it lies strictly inside what is destroyed
        return a < c < b
    return a < d and c < b


def region_of(files: Mapping[str, str], edit: Edit) -> Region | None:
    """Where in the base files ``edit`` lands, or None when it cannot be placed."""
    whole = (0, 10**9)
    if edit.op in ("create", "delete_file"):
        return Region(edit.file, whole, whole, True)
    if edit.file not in files:
        return None
    lines = files[edit.file].rstrip("\n").split("\n")
    try:
        lo, hi = _body_start(lines), len(lines)
        heading, own = (lo, lo), hi
        if edit.target_section and edit.op != "add_section":
            sec = find_section(lines, edit.target_section)
            lo, hi, own = sec.start, sec.end, own_end(lines, sec)
            heading = (sec.start, sec.start + 1)
        if edit.op in ("insert_after", "insert_before"):
            a, b = _find_text(lines, edit.target_text or "", lo, hi)
            at = b if edit.op == "insert_after" else a
            return Region(edit.file, (a, b), (at, at), False)
        if edit.op == "replace_in_section":
            a, b = _find_text(lines, edit.target_text or "", lo, hi)
            return Region(edit.file, (a, b), (a, b), True)
        if edit.op == "append_to_section":
            return Region(edit.file, heading, (own, own), False)
        if edit.op == "delete_section":
            return Region(edit.file, heading, (lo, hi), True)
        if edit.op == "add_section":
            end = len(lines)
            return Region(edit.file, (end, end), (end, end), False,
                          _norm(edit.target_section or ""))
    except EditError:
        return None
    return None


def fold_follow_ups(patch: SkillPatch) -> SkillPatch:
    """Fold edits that build on something the same patch creates (a section it adds, a file
    it creates) into that edit, so every edit can be placed against the base files."""
    edits: list[Edit] = []
    for edit in patch.edits:
        parent = _parent_of(edits, edit)
        if parent is None:
            edits.append(edit)
            continue
        i, made = parent
        try:
            if made.op == "create":
                text = apply_edit({made.file: made.content}, edit)[made.file]
            else:
                text = apply_edit({made.file: _section_text(made)}, edit)[made.file]
        except EditError:
            edits.append(edit)  # left for the merge to count as unplaceable
            continue
        if not text.strip():  # the patch adds something and deletes it again
            del edits[i]
            continue
        edits[i] = replace(made, content=text.rstrip("\n"),
                           support=tuple(dict.fromkeys((*made.support, *edit.support))))
    return replace(patch, edits=tuple(edits))


def _parent_of(earlier: Sequence[Edit], edit: Edit) -> tuple[int, Edit] | None:
    for i in range(len(earlier) - 1, -1, -1):
        made = earlier[i]
        if made.file != edit.file or edit.op in ("create", "add_section"):
            continue
        if made.op == "create" and edit.op != "delete_file":
            return i, made
        if (made.op == "add_section" and edit.target_section
                and _norm(made.target_section or "") == _norm(edit.target_section)):
            return i, made
    return None


def _section_text(edit: Edit) -> str:
    """An ``add_section`` edit as the text it adds (heading included)."""
    new = _content_lines(edit.content)
    title = (edit.target_section or "").lstrip("#").strip()
    body = new if new and _HEADING.match(new[0]) else [f"## {title}", "", *new]
    return "\n".join(body) + "\n"


def render_files(files: Mapping[str, str], numbered: bool = False) -> str:
    """The skill folder as text for a prompt (SKILL.md first)."""
    order = sorted(files, key=lambda p: (p != "SKILL.md", p))
    out = []
    for path in order:
        text = files[path]
        if numbered:
            text = "\n".join(f"{i + 1:>4}| {line}" for i, line in enumerate(text.split("\n")))
        out.append(f"===== {path} =====\n{text.rstrip()}")
    return "\n\n".join(out)


def patch_from_json_text(text: str, support: Iterable[str] = ()) -> SkillPatch:
    """Parse an analyst's reply: the JSON object may sit in a ``json`` fence or in prose.
    Raises ``ParseError`` (with the raw reply) when there is none, ``EditError`` when it is
    not a patch."""
    obj = extract_json_object(text, what="a JSON patch",
                              hint='reply with one JSON object {"reasoning", "edits", "changelog"}')
    return SkillPatch.from_dict(obj, support)
