"""Image files that tools read and write: inputs only from folders the caller allows, outputs
as PNG files named by their content hash.

A tool's image arguments are paths the model wrote. Without a check, a model (or a prompt
injected into a task) could hand ``/home/me/.ssh/id_rsa`` to a tool as "an image" and read it
back through the tool's output; so an input must be a regular file under one of ``roots``,
not a link, and not too large. Outputs go to ``out_dir``, which is always a root, so one tool's
result (``crop`` -> a PNG path) can be the next one's input (``zoom``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..engine.errors import ToolError

MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_IMAGE_PIXELS = 40_000_000  # decoded size bound (PIL's own bomb check is 2x its default)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class ImageFiles:
    """Where a run's tool images may come from (``roots``) and where new ones go
    (``out_dir``, created on first use)."""

    out_dir: Path
    roots: tuple[Path, ...] = ()

    @classmethod
    def temporary(cls, roots: Sequence[Path | str] = ()) -> ImageFiles:
        """A fresh output folder under the system temp dir (the caller removes it)."""
        out = Path(tempfile.mkdtemp(prefix="whetstone-images-"))
        return cls(out, tuple(Path(r) for r in roots))

    def allowed_roots(self) -> list[Path]:
        return [p.resolve() for p in (self.out_dir, *self.roots)]

    def resolve_input(self, value: object, *, param: str = "image") -> Path:
        """The checked file behind an image argument; ``ToolError`` says what is wrong."""
        if not isinstance(value, str) or not value.strip():
            raise ToolError(f"{param!r} must be the path of an image file",
                            hint="pass a path that a tool or the task gave you")
        raw = Path(value.strip())
        if raw.is_symlink():
            raise ToolError(f"{param!r}: {value} is a link, not an image file")
        path = raw.resolve()
        if not any(path.is_relative_to(root) for root in self.allowed_roots()):
            raise ToolError(f"{param!r}: {value} is not in a folder tools may read",
                            hint="use an image path from the task or from an earlier tool "
                                 "result")
        if not path.is_file():
            raise ToolError(f"{param!r}: no image file at {value}")
        if path.stat().st_size > MAX_IMAGE_BYTES:
            raise ToolError(f"{param!r}: {value} is larger than {MAX_IMAGE_BYTES // 2**20} MB")
        return path

    def store_png(self, data: bytes) -> Path:
        """Keep a PNG produced by a tool; the name is its sha256, so equal images are one
        file. Raises ``ToolError`` for anything that is not a PNG."""
        if not data.startswith(PNG_SIGNATURE):
            raise ToolError("the tool returned an image that is not a PNG file")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        target = self.out_dir / f"{hashlib.sha256(data).hexdigest()[:32]}.png"
        if not target.exists():
            tmp = target.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(data)
            tmp.replace(target)
        return target
