"""Reading evidence sources and cutting them into overlapping chunks for the corpus.

A source is plain text, markdown or JSONL (one document per line, its text in a field). Text is
cut on paragraph, then sentence, then word boundaries into chunks of at most ``size``
characters; each chunk after the first starts with up to ``overlap`` characters of the end of
the one before, so a fact that straddles a boundary is whole in one of them. Markdown chunks
start with their section's heading trail, which the embedding model then sees too.

Pure functions of their input: the corpus (``library_store/corpus.py``) decides what is stored.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whetstone.engine.errors import ConfigError, LibraryError
from whetstone.library_store.fsutil import (
    NotRegular,
    is_kernel_file,
    kind_of,
    linked_part,
    read_regular,
    walk_entries,
)

TEXT_SUFFIXES = (".txt", ".text", ".md", ".markdown", ".rst")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
MARKDOWN_SUFFIXES = (".md", ".markdown")
# Fields a JSONL record's text is looked for in when no --text-field is given, in order.
TEXT_FIELDS = ("text", "content", "knowledge", "passage", "document", "body")
TITLE_FIELDS = ("title", "name", "heading")

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


@dataclass(frozen=True)
class ChunkSpec:
    """How documents are cut: chunks of at most ``size`` characters, each after the first
    repeating up to ``overlap`` characters of the previous one."""

    size: int = 800
    overlap: int = 150

    def __post_init__(self) -> None:
        if self.size < 50:
            raise ConfigError(f"chunk size must be at least 50 characters, got {self.size}",
                              hint="e.g. --chunk-size 800")
        if not 0 <= self.overlap < self.size // 2:
            raise ConfigError(f"overlap must be from 0 to less than half the chunk size "
                              f"({self.size // 2}), got {self.overlap}",
                              hint="e.g. --chunk-size 800 --overlap 150")

    @property
    def tag(self) -> str:
        return f"{self.size}/{self.overlap}"


DEFAULT_CHUNKS = ChunkSpec()


@dataclass(frozen=True)
class SourceDoc:
    """One document to add: its text, where it came from, an optional title and metadata."""

    text: str
    source: str
    title: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    markdown: bool = False


@dataclass
class ReadReport:
    """What reading a path gave: documents, and the lines or files skipped (with why).

    ``root`` is the source the read speaks for (the file or folder, resolved), None when the
    path itself was refused; ``refused`` the sources under it that were refused (a file now a
    link): a re-add drops what ``root`` no longer gives, never what was refused."""

    docs: list[SourceDoc] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    root: str | None = None
    refused: list[str] = field(default_factory=list)


# --- chunking --------------------------------------------------------------------------------

def _pieces(text: str, size: int) -> list[str]:
    """Paragraphs; a paragraph longer than ``size`` as sentences; a sentence longer than
    ``size`` as runs of words (a single word longer than ``size`` is cut)."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        para = " ".join(para.split())
        if not para:
            continue
        if len(para) <= size:
            out.append(para)
            continue
        for sentence in _SENTENCE_END.split(para):
            if len(sentence) <= size:
                out.append(sentence)
                continue
            run = ""
            for word in sentence.split(" "):
                while len(word) > size:
                    if run:
                        out.append(run)
                        run = ""
                    out.append(word[:size])
                    word = word[size:]
                if run and len(run) + 1 + len(word) > size:
                    out.append(run)
                    run = word
                else:
                    run = f"{run} {word}" if run else word
            if run:
                out.append(run)
    return out


def _tail(pieces: Sequence[str], overlap: int) -> list[str]:
    """The last pieces of a chunk whose joined length stays within ``overlap``; when even the
    last piece is longer, its last words within ``overlap``."""
    out: list[str] = []
    for piece in reversed(pieces):
        if len(" ".join([piece, *out])) > overlap:
            break
        out.insert(0, piece)
    if out or overlap == 0 or not pieces:
        return out
    kept: list[str] = []
    for word in reversed(pieces[-1].split(" ")[1:]):  # never the whole piece: it is too long
        if len(" ".join([word, *kept])) > overlap:
            break
        kept.insert(0, word)
    return [" ".join(kept)] if kept else []


def chunk_text(text: str, spec: ChunkSpec = DEFAULT_CHUNKS, prefix: str = "") -> list[str]:
    """``text`` as chunks of at most ``spec.size`` characters (``prefix`` not counted), each
    after the first starting with up to ``spec.overlap`` characters of the previous one."""
    chunks: list[str] = []
    current: list[str] = []
    length = 0
    for piece in _pieces(text, spec.size):
        if current and length + 1 + len(piece) > spec.size:
            chunks.append(" ".join(current))
            current = _tail(current, spec.overlap)
            length = len(" ".join(current))
            while current and length + 1 + len(piece) > spec.size:
                current.pop(0)
                length = len(" ".join(current))
        current.append(piece)
        length = len(" ".join(current))
    if current:
        chunks.append(" ".join(current))
    return [f"{prefix}{c}" for c in chunks]


def markdown_sections(text: str) -> Iterator[tuple[str, str]]:
    """``(heading trail, body)`` for each section of a markdown text; text before the first
    heading has an empty trail. Headings inside code fences are not headings."""
    trail: list[tuple[int, str]] = []
    body: list[str] = []
    fenced = False

    def emit() -> tuple[str, str]:
        return " > ".join(t for _, t in trail), "\n".join(body)

    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        m = None if fenced else _HEADING.match(line)
        if m is None:
            body.append(line)
            continue
        if any(b.strip() for b in body):
            yield emit()
        body = []
        level = len(m.group(1))
        trail = [(lvl, t) for lvl, t in trail if lvl < level] + [(level, m.group(2))]
    if any(b.strip() for b in body):
        yield emit()


def chunk_document(doc: SourceDoc, spec: ChunkSpec) -> list[str]:
    """The chunks of one document; markdown sections are cut apart, each chunk headed by its
    section's heading trail (and a plain document's chunks by its title, when it has one)."""
    if not doc.markdown:
        prefix = f"{doc.title}: " if doc.title else ""
        return chunk_text(doc.text, spec, prefix)
    out: list[str] = []
    for trail, body in markdown_sections(doc.text):
        head = " > ".join(p for p in (doc.title, trail) if p)
        out += chunk_text(body, spec, f"{head}\n" if head else "")
    return out


# --- reading sources -------------------------------------------------------------------------

# The most bytes one source file may hold (a JSONL of a whole benchmark is a few hundred MB
# at most); past it the file is skipped, not read into memory.
MAX_SOURCE_BYTES = 1 << 30


class _Refused(Exception):
    """A file the corpus does not read (a link, a FIFO, a device, a kernel file)."""

    def __init__(self, message: str, source: Path) -> None:
        super().__init__(message)
        self.source = str(source)


def _read_text(name: str | Path, shown_as: Path, dir_fd: int | None = None) -> str:
    """The UTF-8 text of one regular file, read through the descriptor that was checked
    (``read_regular``): links are not followed, FIFOs, devices and /proc are not read."""
    try:
        data = read_regular(name, MAX_SOURCE_BYTES, dir_fd=dir_fd)
    except NotRegular as exc:
        raise _Refused(f"{shown_as}: {exc.kind}; only regular files are read",
                       shown_as) from None
    except OSError as exc:
        raise LibraryError(f"cannot read {shown_as}: {exc.strerror or exc}",
                           hint="check the path and its permissions") from exc
    if len(data) > MAX_SOURCE_BYTES:
        raise _Refused(f"{shown_as}: more than {MAX_SOURCE_BYTES} bytes; split it", shown_as)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LibraryError(f"{shown_as} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                           hint="convert it to UTF-8 (e.g. iconv -t utf-8), or pass text, "
                                "markdown or JSONL files") from exc


def _field(record: dict[str, Any], names: Sequence[str]) -> str | None:
    for name in names:
        value = record.get(name)
        if isinstance(value, str) and value.strip():
            return value
    return None


def jsonl_docs(text: str, source: str, text_field: str | None = None) -> ReadReport:
    """One document per JSONL line: its text from ``text_field`` (default: the first of
    ``TEXT_FIELDS`` present), its title from ``title``/``name``, its source ``source#<id>``
    (the record's ``id``) or ``source#L<line>``. Bad lines are skipped and listed."""
    report = ReadReport()
    fields = (text_field,) if text_field else TEXT_FIELDS
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            report.skipped.append(f"{source}:{lineno}: not JSON ({exc.msg})")
            continue
        if not isinstance(record, dict):
            report.skipped.append(f"{source}:{lineno}: not a JSON object")
            continue
        body = _field(record, fields)
        if body is None:
            report.skipped.append(f"{source}:{lineno}: no text in field(s) "
                                  f"{', '.join(fields)}")
            continue
        ident = record.get("id")
        label = f"{source}#{ident}" if isinstance(ident, (str, int)) and str(ident).strip() \
            else f"{source}#L{lineno}"
        meta = {k: str(v) for k, v in record.items()
                if k not in fields and k != "id" and k not in TITLE_FIELDS
                and isinstance(v, (str, int, float, bool))}
        report.docs.append(SourceDoc(body, label, _field(record, TITLE_FIELDS) or "",
                                     {k: v[:200] for k, v in meta.items()}))
    return report


def read_path(path: Path, text_field: str | None = None) -> ReadReport:
    """The documents of a file, or of every text/markdown/JSONL file under a folder (hidden
    files and folders skipped). Sources are resolved absolute paths, so re-adding a file from
    another working directory is recognised.

    Only regular files are read: a symbolic link (to a file or a folder, named or found
    inside a folder, or any folder along the path named), a FIFO, a socket, a device or a
    file of /proc or /sys is skipped and listed in ``skipped`` with why; nothing it points at
    is read."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise LibraryError(f"{path} does not exist", hint="check the path") from None
    except OSError as exc:
        raise LibraryError(f"cannot read {path}: {exc.strerror or exc}",
                           hint="check the path and its permissions") from exc
    if is_kernel_file(st):
        why = "a kernel file or folder (/proc, /sys or /dev); only regular files are read"
        return ReadReport(skipped=[f"{path}: {why}"])
    link = linked_part(path.parent)  # the last part is opened with O_NOFOLLOW
    if link is not None:
        why = f"{link} is a symbolic link; a path through a link is not read (name the real path)"
        return ReadReport(skipped=[f"{path}: {why}"])
    if stat.S_ISDIR(st.st_mode):
        return _read_folder(path, text_field)
    source = path.parent.resolve() / path.name
    try:
        report = _file_docs(path, source, text_field)
    except _Refused as exc:  # a link named on the command line: it speaks for nothing
        return ReadReport(skipped=[str(exc)])
    report.root = str(source)
    return report


def _file_docs(name: str | Path, source: Path, text_field: str | None,
               dir_fd: int | None = None) -> ReadReport:
    """The documents of one file (``name``, relative to ``dir_fd`` when given)."""
    suffix = source.suffix.lower()
    text = _read_text(name, source, dir_fd)
    if suffix in JSONL_SUFFIXES:
        return jsonl_docs(text, str(source), text_field)
    if not text.strip():
        return ReadReport(skipped=[f"{source}: empty"])
    return ReadReport([SourceDoc(text, str(source), markdown=suffix in MARKDOWN_SUFFIXES)])


def _read_folder(path: Path, text_field: str | None) -> ReadReport:
    root = path.resolve()
    report = ReadReport(root=str(root))
    for rel, name, dir_fd, st in walk_entries(root, skip=lambda n: n.startswith(".")):
        where = root / rel
        if stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            report.skipped.append(f"{where}: {kind_of(st.st_mode)}; only regular files "
                                  "are read")
            report.refused.append(str(where))
            continue
        if where.suffix.lower() not in TEXT_SUFFIXES + JSONL_SUFFIXES:
            report.skipped.append(f"{where}: not a text, markdown or JSONL file")
            continue
        try:
            sub = _file_docs(name, where, text_field, dir_fd)
        except _Refused as exc:
            report.skipped.append(str(exc))
            report.refused.append(exc.source)
            continue
        report.docs += sub.docs
        report.skipped += sub.skipped
    if not report.docs and not report.skipped:
        raise LibraryError(f"{path} holds no file", hint="point at files or a folder of "
                           "text, markdown or JSONL files")
    return report
