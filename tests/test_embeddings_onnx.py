"""The ONNX query embedder gives the torch embedder's vectors, exported once and cached."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from whetstone.library_store.embeddings import OnnxTextEmbedder, TextEmbedder, query_embedder

TEXTS = ["How many minutes are in 2.5 hours?", "Scale a bread recipe for 12 people.",
         "x", "A much longer sentence " * 20]


def test_onnx_vectors_match_torch(tmp_path: Path) -> None:
    onnx = OnnxTextEmbedder(cache_dir=tmp_path)
    a, b = onnx.embed(TEXTS), TextEmbedder(threads=1).embed(TEXTS)
    assert a.shape == b.shape == (4, 384)
    assert np.min(np.sum(a * b, axis=1)) > 0.9999
    # One text at a time (no padding: the traced graph must not have baked in a mask branch).
    for text, ref in zip(TEXTS, b, strict=False):
        assert float(onnx.embed_one(text) @ ref) > 0.9999
    assert onnx.name == TextEmbedder().name  # an index built with torch serves ONNX queries
    exported = list((tmp_path / "embeddings").glob("*.onnx"))
    assert len(exported) == 1
    again = OnnxTextEmbedder(cache_dir=tmp_path)
    mtime = exported[0].stat().st_mtime_ns
    assert np.allclose(again.embed(TEXTS[:1]), a[:1], atol=1e-6)
    assert exported[0].stat().st_mtime_ns == mtime  # reused, not exported again


def test_the_fast_tokenizer_gives_the_transformers_ids(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from whetstone.library_store.embeddings import packaged_minilm_dir

    onnx = OnnxTextEmbedder(cache_dir=tmp_path, max_length=16)
    fast = onnx._fast_tokenizer()
    reference = AutoTokenizer.from_pretrained(packaged_minilm_dir(), local_files_only=True)
    for text in [*TEXTS, "Ünïcödé  tabs\tand\nnewlines", "", "(ticket r-123) 3.5e-2 km/h"]:
        want = reference(text, truncation=True, max_length=16)["input_ids"]
        assert fast.encode(text).ids == want, text  # truncated at 16 like transformers


def test_a_cached_export_serves_without_torch_weights(tmp_path: Path) -> None:
    OnnxTextEmbedder(cache_dir=tmp_path, quantized=True).embed(["warm the cache"])
    again = OnnxTextEmbedder(cache_dir=tmp_path, quantized=True)
    again.embed(["a query", "and a batch of two"])
    assert again._torch._model is None  # the torch model is loaded only to export


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


def test_the_int8_embedder_is_close_to_the_float_one_and_cached(tmp_path: Path) -> None:
    float_model = OnnxTextEmbedder(cache_dir=tmp_path)
    int8 = OnnxTextEmbedder(cache_dir=tmp_path, quantized=True)
    a, b = int8.embed(TEXTS), float_model.embed(TEXTS)
    assert a.shape == b.shape == (4, 384)
    assert np.min(np.sum(a * b, axis=1)) > 0.9  # close, not equal: hence its own name
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert int8.name != float_model.name  # an index built with one is rebuilt for the other
    # One text per run: a vector never depends on what it was batched with.
    for text, row in zip(TEXTS, a, strict=False):
        assert np.array_equal(int8.embed([text])[0], row)
    files = sorted((tmp_path / "embeddings").glob("*.onnx"))
    assert len(files) == 2  # the float export, and its int8 copy beside it
    quantized = next((tmp_path / "embeddings").glob("*-int8.onnx"))
    mtime = quantized.stat().st_mtime_ns
    OnnxTextEmbedder(cache_dir=tmp_path, quantized=True).embed(["again"])
    assert quantized.stat().st_mtime_ns == mtime  # reused, not quantized again


def test_the_skills_index_embeds_with_int8(tmp_path: Path) -> None:
    from whetstone.library_store.embeddings import MINILM_INT8_NAME, skill_embedder
    from whetstone.library_store.store import Library
    from whetstone.skills.index import LibraryIndex

    e = skill_embedder()
    assert isinstance(e, OnnxTextEmbedder) and e.quantized
    # The index's default, so `whetstone library reindex`, the agent and the server agree.
    assert LibraryIndex(Library.init(tmp_path / "lib")).embedder.name == MINILM_INT8_NAME
