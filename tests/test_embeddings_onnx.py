"""The ONNX query embedder gives the torch embedder's vectors, exported once and cached."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from library_store.embeddings import OnnxTextEmbedder, TextEmbedder, query_embedder

TEXTS = ["How many minutes are in 2.5 hours?", "Scale a bread recipe for 12 people.",
         "x", "A much longer sentence " * 20]


def test_onnx_vectors_match_torch(tmp_path: Path) -> None:
    onnx = OnnxTextEmbedder(cache_dir=tmp_path)
    a, b = onnx.embed(TEXTS), TextEmbedder(threads=1).embed(TEXTS)
    assert a.shape == b.shape == (4, 384)
    assert np.min(np.sum(a * b, axis=1)) > 0.9999
    # One text at a time (no padding: the traced graph must not have baked in a mask branch).
    for text, ref in zip(TEXTS, b):
        assert float(onnx.embed_one(text) @ ref) > 0.9999
    assert onnx.name == TextEmbedder().name  # an index built with torch serves ONNX queries
    exported = list((tmp_path / "embeddings").glob("*.onnx"))
    assert len(exported) == 1
    again = OnnxTextEmbedder(cache_dir=tmp_path)
    mtime = exported[0].stat().st_mtime_ns
    assert np.allclose(again.embed(TEXTS[:1]), a[:1], atol=1e-6)
    assert exported[0].stat().st_mtime_ns == mtime  # reused, not exported again


def test_a_failed_export_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("killed mid-export")

    monkeypatch.setattr(torch.onnx, "export", boom)
    with pytest.raises(RuntimeError):
        OnnxTextEmbedder(cache_dir=tmp_path).embed(["x"])
    assert list((tmp_path / "embeddings").glob("*")) == []


def test_query_embedder_prefers_onnx() -> None:
    assert isinstance(query_embedder(), OnnxTextEmbedder)
