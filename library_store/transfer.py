"""Moving files in and out of the library: plain folders and ``.tar.gz`` archives, byte for byte.

Export writes the skills of a version as plain ``<name>/SKILL.md`` folders (what other Agent
Skills tools read); import reads such a folder. Contents are bytes throughout, so line endings
and encodings survive the round trip unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import os
import stat
import tarfile
import unicodedata
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..engine.errors import ConfigError, NotFound
from .fsutil import (
    NotRegular,
    atomic_write,
    kind_of,
    read_regular,
    walk_entries,
)
from .paths import MAX_FILE_BYTES, shown

SKIPPED_NAMES = {"__pycache__", ".git", ".DS_Store", ".hg", ".svn"}


@dataclass(frozen=True)
class ReadLimits:
    """How much ``read_folder`` reads at most: what is over a limit is refused, not read.

    ``max_files`` and ``max_total_bytes`` bound the whole source (past them the read stops
    with a ``ConfigError``: nothing is imported from a source that large); ``max_file_bytes``
    bounds one file (such a file is refused, the rest is read)."""

    max_file_bytes: int = MAX_FILE_BYTES
    max_files: int = 20_000
    max_total_bytes: int = 512 * 1024 * 1024


@dataclass(frozen=True)
class Refused:
    """An entry of a source that was not read: its relative path, the rule and why."""

    path: str
    rule: str
    detail: str


@dataclass
class FolderContents:
    """What ``read_folder`` found: relative path -> bytes, and the entries it refused."""

    files: dict[str, bytes] = field(default_factory=dict)
    refused: list[Refused] = field(default_factory=list)


def is_archive(path: Path) -> bool:
    return path.name.endswith((".tar.gz", ".tgz"))


def _skipped(rel: str) -> bool:
    return any(part in SKIPPED_NAMES or part.startswith(".") for part in rel.split("/"))


def _safe_rel(name: str) -> str | None:
    p = PurePosixPath(name)
    if p.is_absolute() or any(part in ("..", "") for part in p.parts):
        return None
    rel = p.as_posix().removeprefix("./")
    return rel or None


class _Reader:
    """Collects files and refusals within the limits (one per ``read_folder`` call)."""

    def __init__(self, src: Path, limits: ReadLimits) -> None:
        self.src, self.limits = src, limits
        self.out = FolderContents()
        self.total = 0
        self.entries = 0
        self.given: dict[str, str] = {}  # NFC path -> the path as the source spelled it

    def refuse(self, rel: str, rule: str, detail: str) -> None:
        self.out.refused.append(Refused(rel, rule, detail))

    def count(self, rel: str) -> None:
        """One more entry of the source (a file, a folder, a link): past ``max_files`` the
        read stops, so a million empty folders cost no more than that many files."""
        self.entries += 1
        if self.entries > self.limits.max_files:
            raise ConfigError(f"{self.src} holds more than {self.limits.max_files} entries "
                              "(files and folders)", hint="import it in smaller parts")

    def admit(self, rel: str, size: int) -> bool:
        """Whether a file of ``size`` bytes may be read; refusals and the source caps here."""
        if size > self.limits.max_file_bytes:
            self.refuse(rel, "file-size", f"{size} bytes; a library file holds at most "
                                          f"{self.limits.max_file_bytes}")
            return False
        self.total += size
        if self.total > self.limits.max_total_bytes:
            raise ConfigError(f"{self.src} holds more than {self.limits.max_total_bytes} bytes "
                              "of files", hint="import it in smaller parts")
        return True

    def add(self, rel: str, data: bytes) -> None:
        """Keep a file under its NFC name: ``café.md`` composed and decomposed is one name,
        and a source holding both is refused rather than imported as two look-alike files."""
        key = unicodedata.normalize("NFC", rel)
        if key in self.out.files:
            first = self.given[key]
            detail = "the archive holds this path more than once" if first == rel else (
                f"{shown(first, 120)!r} and {shown(rel, 120)!r} are two spellings of one "
                "name (Unicode NFC); rename one of them")
            self.refuse(rel, "duplicate", detail)
            return
        self.given[key] = rel
        self.out.files[key] = data


# The most bytes one extended header (a GNU long name or link, a pax record set) may declare:
# tarfile reads such a header whole into memory before any member is seen, so a 1.5 GB
# "long name" in a 1.5 MB archive must be refused from its declared size.
MAX_HEADER_BYTES = 64 * 1024
# tarfile parses every pax record in Python and copies the merged global records into every
# member after them, so the work per entry grows with the records, not the bytes: a 300 KB
# archive of 2,000 folders, each behind 13,000 five-byte records, took 42 s, and a million
# global keys before 19,500 folders took minutes. An entry needs a handful (path, times,
# owner, a few xattrs); these bound the records and headers in front of one entry, counted
# before tarfile parses them, and the global records every entry inherits.
MAX_PAX_RECORDS = 64
MAX_HEADERS_PER_ENTRY = 8
MAX_GLOBAL_PAX_KEYS = 64
_EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
             tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)


class _HeaderBomb(Exception):
    """An archive header declaring more than ``MAX_HEADER_BYTES`` (or a sparse file), or
    more pax records or extended headers in front of one entry than an entry needs."""


class _CountedStream:
    """The inflated stream as tarfile reads it: the read after ``expect_header`` is an
    extended header's data, whose records (one a line) are counted before tarfile parses
    them; ``next_entry`` starts the count of the next entry."""

    def __init__(self, raw: gzip.GzipFile) -> None:
        self.raw = raw
        self.header_next = False
        self.records = 0
        self.headers = 0
        self.entry_offset = 0

    def expect_header(self, offset: int) -> None:
        if not self.headers:
            self.entry_offset = offset
        self.headers += 1
        if self.headers > MAX_HEADERS_PER_ENTRY:
            raise _HeaderBomb(f"the entry at byte {self.entry_offset} has more than "
                              f"{MAX_HEADERS_PER_ENTRY} extended headers")
        self.header_next = True

    def next_entry(self) -> None:
        self.records = self.headers = 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        if self.header_next:
            self.header_next = False
            self.records += data.count(b"\n")
            if self.records > MAX_PAX_RECORDS:
                raise _HeaderBomb(f"the extended headers of the entry at byte "
                                  f"{self.entry_offset} hold more than {MAX_PAX_RECORDS} "
                                  "records")
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()


class _BoundedInfo(tarfile.TarInfo):
    """A ``TarInfo`` that refuses an extended header over ``MAX_HEADER_BYTES`` before tarfile
    reads it, more records or headers in front of one entry, or global records past
    ``MAX_GLOBAL_PAX_KEYS``, and sparse entries (their chains of headers are read whole too)."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if len(tarfile_.pax_headers) > MAX_GLOBAL_PAX_KEYS:
            raise _HeaderBomb(f"the pax global headers before byte {self.offset} set more "
                              f"than {MAX_GLOBAL_PAX_KEYS} keys")
        if self.type in _EXTENDED and self.size > MAX_HEADER_BYTES:
            raise _HeaderBomb(f"an extended header of the entry at byte {self.offset} "
                              f"declares {self.size} bytes; at most {MAX_HEADER_BYTES}")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise _HeaderBomb(f"the entry at byte {self.offset} is a sparse file")
        if self.type in _EXTENDED:
            stream = tarfile_.fileobj
            assert isinstance(stream, _CountedStream)
            stream.expect_header(self.offset)
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def _read_archive(src: Path, reader: _Reader) -> None:
    limit = reader.limits.max_total_bytes
    try:
        with gzip.open(src, "rb") as raw:
            stream = _CountedStream(raw)
            with tarfile.open(fileobj=stream, mode="r:",  # type: ignore[call-overload]
                              tarinfo=_BoundedInfo) as tar:
                for member in tar:
                    stream.next_entry()
                    reader.count(member.name)
                    # The inflated stream up to this member's end, headers included:
                    # skipping a member still inflates it, so what is read or not counts
                    # the same.
                    if member.offset_data + max(0, member.size) > limit:
                        raise ConfigError(f"{src} inflates to more than {limit} bytes",
                                          hint="import it in smaller parts")
                    tar.members.clear()  # tarfile keeps every header; nothing looks back
                    _archive_member(tar, member, reader)
    except _HeaderBomb as exc:
        raise ConfigError(f"refused the archive {src}: {exc}",
                          hint="an archive of skills needs no such header; re-create it "
                               "with `whetstone library export`") from None
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error, RecursionError) as exc:
        raise ConfigError(f"cannot read the archive {src}: {exc}",
                          hint="check that it is a complete .tar.gz (gzip -t FILE)") from exc


def _archive_member(tar: tarfile.TarFile, member: tarfile.TarInfo, reader: _Reader) -> None:
    rel = _safe_rel(member.name)
    if rel is None:
        reader.refuse(member.name, "path", "the entry's path is absolute or leaves the archive "
                                           "('..')")
        return
    if member.isdir() or _skipped(rel):
        return
    if not member.isfile():
        kind = "a link" if member.issym() or member.islnk() else "a special file"
        reader.refuse(rel, "file-type", f"{kind}; only plain files are imported")
        return
    if not reader.admit(rel, member.size):
        return
    f = tar.extractfile(member)
    if f is not None:
        reader.add(rel, f.read(member.size + 1)[:member.size])


def _read_tree(src: Path, reader: _Reader) -> None:
    # Walked by descriptor and read through the descriptor that was checked: a file swapped
    # for a link (or a FIFO) between any check and the read is refused, never read.
    for rel, name, dir_fd, st in walk_entries(src, skip=_skipped):
        reader.count(rel)
        if stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            reader.refuse(rel, "file-type", f"{kind_of(st.st_mode)}; only plain files are "
                                            "imported")
            continue
        if not reader.admit(rel, st.st_size):
            continue
        try:  # no more than the limit, whatever it grew to
            data = read_regular(name, reader.limits.max_file_bytes, dir_fd=dir_fd)
        except NotRegular as exc:
            reader.refuse(rel, "file-type", f"{exc.kind}; only plain files are imported")
            continue
        except OSError as exc:
            reader.refuse(rel, "unreadable", exc.strerror or str(exc))
            continue
        if len(data) > reader.limits.max_file_bytes:
            reader.refuse(rel, "file-size", f"more than {reader.limits.max_file_bytes} bytes")
            continue
        reader.add(rel, data)


def read_folder(src: Path, limits: ReadLimits | None = None) -> FolderContents:
    """Every file under ``src`` (a folder or a ``.tar.gz``): relative path -> bytes, plus
    what was refused (links, special files, paths escaping the archive, files over
    ``limits.max_file_bytes``), each with the reason. Hidden files, VCS folders and
    ``__pycache__`` are skipped. A source over the whole-source limits, or an archive that
    cannot be read, is a ``ConfigError``.
    """
    src = Path(src).expanduser()
    if not src.exists():
        raise NotFound(f"{src} does not exist", hint="give a folder of skills or a .tar.gz")
    reader = _Reader(src, limits or ReadLimits())
    if src.is_file():
        if not is_archive(src):
            raise ConfigError(f"{src} is neither a folder nor a .tar.gz archive",
                              hint="give a folder of <name>/SKILL.md skills or a .tar.gz")
        _read_archive(src, reader)
    else:
        _read_tree(src, reader)
    reader.out.files = dict(sorted(reader.out.files.items()))
    return reader.out


def write_folder(files: Mapping[str, bytes], dest: Path, *, overwrite: bool = False,
                 mtime: float = 0.0) -> Path:
    """Write ``files`` (relative path -> bytes) to a new folder or ``.tar.gz`` at ``dest``.

    An archive is deterministic (sorted entries, fixed owner and ``mtime``), so exporting the
    same version twice gives the same bytes. Nothing is written through a link: ``dest``
    itself may be one (it is what the caller named), but a link found inside it (``--force``
    over an old export) is removed and replaced, never followed; each file is written aside
    and renamed into place.
    """
    dest = Path(dest).expanduser()
    if os.path.lexists(dest) and not overwrite and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigError(f"{dest} already exists and is not empty",
                          hint="choose a new path or pass --force to overwrite")
    if is_archive(dest):
        return _write_archive(files, dest, mtime)
    if os.path.lexists(dest) and not dest.is_dir():
        raise ConfigError(f"{dest} is a file, not a folder",
                          hint="choose a new path, or name a .tar.gz to export an archive")
    dest.mkdir(parents=True, exist_ok=True)
    dirs: dict[str, int] = {"": os.open(dest, os.O_RDONLY | os.O_DIRECTORY)}
    try:
        for rel, data in files.items():
            folder, _, name = rel.rpartition("/")
            if name in ("", ".", "..") or any(p in ("", ".", "..") for p in folder.split("/")
                                               if folder):
                raise ConfigError(f"cannot export the path {shown(rel, 200)!r}",
                                  hint="`whetstone library check` finds such paths")
            _write_at(_folder_fd(dirs, folder), name, data)
    finally:
        for fd in dirs.values():
            os.close(fd)
    return dest


def _write_archive(files: Mapping[str, bytes], dest: Path, mtime: float) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    # gzip stamps its own header with a time; pin it so the archive is reproducible.
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=int(mtime)) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, data in sorted(files.items()):
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mtime = int(mtime)
            info.mode = 0o755 if rel.split("/")[1:2] == ["scripts"] else 0o644
            tar.addfile(info, io.BytesIO(data))
    try:  # the rename replaces a link at dest; it never writes where the link points
        atomic_write(dest, buf.getvalue(), tmp_dir=dest.parent)
    except IsADirectoryError as exc:
        raise ConfigError(f"{dest} is a folder", hint="remove it or choose another name "
                          "for the archive") from exc
    return dest


def _folder_fd(dirs: dict[str, int], folder: str) -> int:
    """A descriptor of ``folder`` (relative to the export), made as needed; a link or file
    where a folder belongs is removed, never followed."""
    if folder in dirs:
        return dirs[folder]
    parent, _, name = folder.rpartition("/")
    parent_fd = _folder_fd(dirs, parent)
    for _ in range(2):
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=parent_fd)
        try:
            dirs[folder] = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                   dir_fd=parent_fd)
            return dirs[folder]
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            os.unlink(name, dir_fd=parent_fd)  # a link or a file: replaced by the folder
    raise ConfigError(f"cannot make the folder {shown(folder, 200)!r} in the export: "
                      "something keeps replacing it", hint="export into a folder only you write")


def _write_at(dir_fd: int, name: str, data: bytes) -> None:
    """Write ``name`` in the folder ``dir_fd`` aside, then rename it over whatever is there (a
    link included: the rename replaces the link itself)."""
    tmp = f".{name[:32]}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666,
                 dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    try:
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        os.unlink(tmp, dir_fd=dir_fd)
        raise ConfigError(f"cannot write {name!r} in the export: {exc.strerror or exc}",
                          hint="remove what is in its place, or export to a new folder"
                          ) from exc
