"""Derived model files in the cache directory, built once and trusted only when complete.

Loading a GGUF through transformers dequantizes every tensor (~40 s for the 0.5B model); the
result is saved once as a plain transformers folder and later loads take seconds. The rules
that make the cache safe to share between processes:

- an entry is built in a temporary folder beside its final place and made visible by one
  ``rename``; a completion marker naming the source's sha256 is written last, before the rename;
- an entry without a valid marker is never trusted (a killed build, a copy made by hand);
- an entry whose files fail the caller's ``verify`` check (a file truncated or changed after
  the build) is rebuilt like a missing one;
- one file lock per entry serialises builders; readers of a complete entry never wait.

``dequantize_gguf`` is the transformers step; ``cached_folder`` / ``cached_gguf`` hold the rules.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from .packaged import PackagedModel, assemble, get_packaged
from .registry import ProgressFn

MARKER = "whetstone-complete.json"
_FORMAT = 1  # bump when the folder layout changes, so old entries are rebuilt
_LOCK_TIMEOUT_S = 1800.0  # a build takes ~1 min; a lock held longer belongs to a stuck process

# build(out_dir, scratch_dir): write the entry's files into out_dir; scratch_dir is for temporaries
Builder = Callable[[Path, Path], None]
# verify(folder) -> True when a complete entry's files are still intact
Verifier = Callable[[Path], bool]


def _marker_ok(folder: Path, source_sha256: str) -> bool:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return data.get("source_sha256") == source_sha256 and data.get("format") == _FORMAT


def is_complete(folder: Path, source_sha256: str) -> bool:
    """True when ``folder`` is a finished cache entry built from that source."""
    return folder.is_dir() and _marker_ok(folder, source_sha256)


def _lock(root: Path, key: str) -> Any:
    """A ``filelock.FileLock`` for one entry (OS-level: released if the holder dies)."""
    from filelock import FileLock  # lazy: filelock (~25 ms), only when a model is fetched

    return FileLock(str(root / f".{key}.lock"), timeout=_LOCK_TIMEOUT_S)


def _clear_leftovers(root: Path, key: str) -> None:
    """Remove what killed builds left behind. Call only while holding the entry's lock."""
    for stale in root.glob(f".{key}.tmp-*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def cached_folder(key: str, source_sha256: str, cache_root: Path, build: Builder,
                  verify: Verifier | None = None) -> Path:
    """``cache_root/models/<key>``, built by ``build`` unless a complete, intact entry exists.

    ``verify(folder)`` (optional) checks a complete entry's files; one that fails is rebuilt.
    """
    root = Path(cache_root) / "models"
    final = root / key

    def usable() -> bool:
        return is_complete(final, source_sha256) and (verify is None or verify(final))

    if usable():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root, key):
        if usable():  # another process finished it while we waited
            return final
        _clear_leftovers(root, key)
        if final.exists():  # incomplete or from another source: not trusted, rebuild
            shutil.rmtree(final)
        work = root / f".{key}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        out, scratch = work / "out", work / "scratch"
        out.mkdir(parents=True)
        scratch.mkdir()
        try:
            build(out, scratch)
            marker = {"source_sha256": source_sha256, "format": _FORMAT, "key": key,
                      "created": time.time()}
            (out / MARKER).write_text(json.dumps(marker))
            os.rename(out, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def invalidate(folder: Path) -> None:
    """Remove a cache entry that turned out to be unusable, so the next use rebuilds it.

    Takes the entry's lock, so a builder or another invalidation is never interrupted.
    """
    folder = Path(folder)
    with _lock(folder.parent, folder.name):
        (folder / MARKER).unlink(missing_ok=True)  # untrusted from here on, even if rmtree stops
        shutil.rmtree(folder, ignore_errors=True)


def cached_gguf(model: str | PackagedModel, cache_root: Path,
                search_path: Sequence[Path] | None = None) -> Path:
    """The packaged model's assembled, verified GGUF, kept in the cache (for llama.cpp)."""
    m = get_packaged(model)

    def build(out: Path, scratch: Path) -> None:
        assemble(m, out, search_path)

    folder = cached_folder(f"gguf-{m.name}-{m.sha256[:12]}", m.sha256, cache_root, build)
    return folder / m.filename


def dequantized_packaged(model: str | PackagedModel, cache_root: Path,
                         search_path: Sequence[Path] | None = None,
                         convert: Callable[[Path, Path], None] | None = None,
                         progress: ProgressFn | None = None) -> Path:
    """A transformers folder for a packaged GGUF model: assemble, dequantize, save once.

    ``convert(gguf_path, out_dir)`` defaults to ``dequantize_gguf``; the assembled GGUF is
    deleted once converted (the folder is all later loads need). ``progress`` hears about the
    two steps of a first build (nothing when the cached copy exists).
    """
    m = get_packaged(model)
    conv = convert or dequantize_gguf

    def build(out: Path, scratch: Path) -> None:
        if progress:
            progress(f"assembling and verifying {m.name} ({m.size / 1e6:.0f} MB)", 0.0)
        gguf = assemble(m, scratch, search_path)
        if progress:
            progress(f"dequantizing {m.name} with transformers (first use only)", 0.1)
        conv(gguf, out)
        gguf.unlink()
        if progress:
            progress(f"dequantized {m.name}", 1.0)

    return cached_folder(f"{m.name}-{m.sha256[:12]}", m.sha256, cache_root, build)


def dequantize_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Load a GGUF with transformers (dequantized to fp32) and save it as a plain folder."""
    import torch  # heavy: torch
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: transformers

    folder, name = str(Path(gguf_path).parent), Path(gguf_path).name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, local_files_only=True, dtype=torch.float32
        )
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(
            f"transformers could not load {gguf_path}: {exc}",
            hint="check that the file is a GGUF of an architecture transformers supports",
        ) from exc
    # transformers refuses save_pretrained on a GGUF-loaded model, but the weights are already
    # plain fp32 tensors; dropping the quantizer bookkeeping makes it a normal model to save.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
