"""Moving files in and out of the library: plain folders and ``.tar.gz`` archives, byte for byte.

Export writes the skills of a version as plain ``<name>/SKILL.md`` folders (what other Agent
Skills tools read); import reads such a folder. Contents are bytes throughout, so line endings
and encodings survive the round trip unchanged.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from engine.errors import ConfigError, NotFound

SKIPPED_NAMES = {"__pycache__", ".git", ".DS_Store", ".hg", ".svn"}


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


def read_folder(src: Path) -> dict[str, bytes]:
    """Every file under ``src`` (a folder or a ``.tar.gz``): relative path -> bytes.

    Hidden files, VCS folders and ``__pycache__`` are skipped; symlinks are not followed.
    """
    src = Path(src).expanduser()
    if not src.exists():
        raise NotFound(f"{src} does not exist", hint="give a folder of skills or a .tar.gz")
    out: dict[str, bytes] = {}
    if src.is_file():
        if not is_archive(src):
            raise ConfigError(f"{src} is neither a folder nor a .tar.gz archive",
                              hint="give a folder of <name>/SKILL.md skills or a .tar.gz")
        with tarfile.open(src, "r:gz") as tar:
            for member in tar.getmembers():
                rel = _safe_rel(member.name)
                if rel is None or not member.isfile() or _skipped(rel):
                    continue  # links, devices and paths escaping the archive are ignored
                f = tar.extractfile(member)
                if f is not None:
                    out[rel] = f.read()
        return dict(sorted(out.items()))
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src).as_posix()
        if path.is_symlink() or not path.is_file() or _skipped(rel):
            continue
        out[rel] = path.read_bytes()
    return out


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
