"""Images in traces, stored once by content hash instead of inline.

A vision run repeats its image in every model call it records (each ``think`` step holds the
whole conversation), and a server exchange carries the client's data URL: written inline, one
screenshot costs megabytes per trace. The trace store keeps each image once, as a file named by
its sha256 under ``<library>/traces/images/``, and writes an ``image_ref`` part in its place::

    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR..."}}
    {"type": "image", "image": "/data/shapes/3.png"}
        -> {"type": "image_ref", "sha256": "9f86d0...", "media_type": "image/png"}

``inline`` turns the references back into data-URL parts: a trace round-trips. Remote image
URLs (``https://...``) are kept as they are: they are references already.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..engine.errors import NotFound
from .fsutil import atomic_write, sha256_bytes

REF_TYPE = "image_ref"
_DATA_URL = re.compile(r"^data:(image/[\w.+-]+);base64,(.*)$", re.DOTALL)
MAX_IMAGE_BYTES = 50 * 1024 * 1024  # a local image part larger than this stays a path


class ImageStore:
    """Image files under ``root`` (``<library>/traces/images``), named by sha256."""

    def __init__(self, root: Path | str, *, durable: bool = True) -> None:
        self.root = Path(root)
        self.durable = durable

    def path(self, digest: str) -> Path:
        return self.root / digest[:2] / digest[2:]

    def put(self, data: bytes, media_type: str = "image/png") -> dict[str, Any]:
        """Store ``data`` (once) and return its ``image_ref`` part."""
        digest = sha256_bytes(data)
        target = self.path(digest)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(target, data, tmp_dir=self.root / ".tmp", durable=self.durable)
        return {"type": REF_TYPE, "sha256": digest, "media_type": media_type}

    def get(self, digest: str) -> bytes:
        """The bytes of a stored image; ``NotFound`` when it is not here."""
        if not re.fullmatch(r"[0-9a-f]{64}", digest or ""):
            raise NotFound(f"{digest!r} is not an image hash", hint="image refs hold a sha256")
        try:
            return self.path(digest).read_bytes()
        except FileNotFoundError as exc:
            raise NotFound(f"image {digest[:12]} is not in {self.root}",
                           hint="it was pruned or the traces were copied without it") from exc

    # -- whole records ----------------------------------------------------------------------

    def externalize(self, value: Any) -> Any:
        """A copy of a JSON value with every inline image part replaced by its reference."""
        if isinstance(value, list):
            return [self.externalize(v) for v in value]
        if not isinstance(value, Mapping):
            return value
        ref = self._ref(value)
        if ref is not None:
            return ref
        return {k: self.externalize(v) for k, v in value.items()}

    def inline(self, value: Any) -> Any:
        """A copy of a JSON value with every ``image_ref`` part back as a data-URL part."""
        if isinstance(value, list):
            return [self.inline(v) for v in value]
        if not isinstance(value, Mapping):
            return value
        if value.get("type") == REF_TYPE and isinstance(value.get("sha256"), str):
            data = base64.b64encode(self.get(value["sha256"])).decode("ascii")
            media = value.get("media_type") or "image/png"
            url: dict[str, Any] = {"url": f"data:{media};base64,{data}"}
            if value.get("detail"):
                url["detail"] = value["detail"]
            return {"type": "image_url", "image_url": url}
        return {k: self.inline(v) for k, v in value.items()}

    def _ref(self, part: Mapping[str, Any]) -> dict[str, Any] | None:
        kind = part.get("type")
        if kind == "image_url" and isinstance(part.get("image_url"), Mapping):
            url = part["image_url"].get("url")
            m = _DATA_URL.match(url) if isinstance(url, str) else None
            if m is None:
                return None
            try:
                data = base64.b64decode(m.group(2), validate=False)
            except (binascii.Error, ValueError):
                return None  # not decodable: kept as written
            ref = self.put(data, m.group(1))
            if part["image_url"].get("detail"):
                ref["detail"] = part["image_url"]["detail"]
            return ref
        if kind == "image" and isinstance(part.get("image"), str):
            path = Path(part["image"])
            try:
                if not path.is_file() or path.stat().st_size > MAX_IMAGE_BYTES:
                    return None
                data = path.read_bytes()
            except OSError:
                return None
            media = mimetypes.guess_type(path.name)[0] or "image/png"
            return {**self.put(data, media), "path": os.fspath(path)}
        return None

