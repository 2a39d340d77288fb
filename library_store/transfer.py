"""Moving files in and out of the library: plain folders and ``.tar.gz`` archives, byte for byte.

Export writes the skills of a version as plain ``<name>/SKILL.md`` folders (what other Agent
Skills tools read); import reads such a folder. Contents are bytes throughout, so line endings
and encodings survive the round trip unchanged.
"""

from __future__ import annotations

import gzip
import io
import stat
import tarfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from engine.errors import ConfigError, NotFound
from library_store.paths import MAX_FILE_BYTES

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

    def refuse(self, rel: str, rule: str, detail: str) -> None:
        self.out.refused.append(Refused(rel, rule, detail))

    def admit(self, rel: str, size: int) -> bool:
        """Whether a file of ``size`` bytes may be read; refusals and the source caps here."""
        if len(self.out.files) + 1 > self.limits.max_files:
            raise ConfigError(f"{self.src} holds more than {self.limits.max_files} files",
                              hint="import it in smaller parts")
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
        if rel in self.out.files:
            self.refuse(rel, "duplicate", "the archive holds this path more than once")
            return
        self.out.files[rel] = data


def _read_archive(src: Path, reader: _Reader) -> None:
    scanned = 0
    try:
        with tarfile.open(src, "r:gz") as tar:
            for member in tar:
                # Skipping a member still inflates it: bound what is inflated, read or not.
                scanned += max(0, member.size)
                if scanned > reader.limits.max_total_bytes:
                    raise ConfigError(f"{src} inflates to more than "
                                      f"{reader.limits.max_total_bytes} bytes",
                                      hint="import it in smaller parts")
                rel = _safe_rel(member.name)
                if rel is None:
                    reader.refuse(member.name, "path", "the entry's path is absolute or "
                                  "leaves the archive ('..')")
                    continue
                if member.isdir() or _skipped(rel):
                    continue
                if not member.isfile():
                    kind = "a link" if member.issym() or member.islnk() else "a special file"
                    reader.refuse(rel, "file-type", f"{kind}; only plain files are imported")
                    continue
                if not reader.admit(rel, member.size):
                    continue
                f = tar.extractfile(member)
                if f is not None:
                    reader.add(rel, f.read(member.size + 1)[:member.size])
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as exc:
        raise ConfigError(f"cannot read the archive {src}: {exc}",
                          hint="check that it is a complete .tar.gz (gzip -t FILE)") from exc


def _read_tree(src: Path, reader: _Reader) -> None:
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src).as_posix()
        if _skipped(rel):
            continue
        try:
            st = path.lstat()
        except OSError as exc:
            reader.refuse(rel, "unreadable", exc.strerror or str(exc))
            continue
        if stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a special file"
            reader.refuse(rel, "file-type", f"{kind}; only plain files are imported")
            continue
        if not reader.admit(rel, st.st_size):
            continue
        try:
            with open(path, "rb") as f:  # no more than the limit, whatever it grew to
                data = f.read(reader.limits.max_file_bytes + 1)
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
        reader.out.files = dict(sorted(reader.out.files.items()))
    else:
        _read_tree(src, reader)
    return reader.out


def write_folder(files: Mapping[str, bytes], dest: Path, *, overwrite: bool = False,
                 mtime: float = 0.0) -> Path:
    """Write ``files`` (relative path -> bytes) to a new folder or ``.tar.gz`` at ``dest``.

    An archive is deterministic (sorted entries, fixed owner and ``mtime``), so exporting the
    same version twice gives the same bytes.
    """
    dest = Path(dest).expanduser()
    if dest.exists() and not overwrite and (dest.is_file() or any(dest.iterdir())):
        raise ConfigError(f"{dest} already exists and is not empty",
                          hint="choose a new path or pass --force to overwrite")
    if is_archive(dest):
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
        dest.write_bytes(buf.getvalue())
        return dest
    for rel, data in files.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    dest.mkdir(parents=True, exist_ok=True)
    return dest
