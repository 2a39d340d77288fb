"""Converting a model for the fast engine: progress from the converter's own log, a failed
conversion leaving nothing behind, a damaged or half-written cache entry rebuilt instead of
loaded, engine selection by spec suffix; and (slow) the real converter on the small model,
damaged on disk and rebuilt."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from whetstone.engine.backends import onnx_convert
from whetstone.engine.backends.model_cache import MARKER, invalidate
from whetstone.engine.backends.registry import (
    BackendOptions,
    default_registry,
    engine_suffix,
    get_backend,
)
from whetstone.engine.errors import ConfigError, ModelLoadError

FAKE_BUILDER = textwrap.dedent('''
    import sys, pathlib
    out = pathlib.Path(sys.argv[sys.argv.index("-o") + 1])
    fail = "FAIL" in sys.argv[sys.argv.index("-i") + 1]
    print("GroupQueryAttention (GQA) is used in this model.")
    for i in range(2):
        print(f"Reading layer {i}", flush=True)
    for i in range(11):
        print(f"INFO - complete quantization of /model/layers.{i}/MatMul with 4 bits ...")
    if fail:
        print("NotImplementedError: The Mystery architecture is not supported.")
        sys.exit(1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.onnx").write_bytes(b"graph" * 100)
    (out / "model.onnx.data").write_bytes(bytes(range(256)) * 40000)
    (out / "genai_config.json").write_text("{}")
    print("Saving GenAI config in", out)
''')


@pytest.fixture
def fake_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Replace the real converter's command with a small script that logs like it."""
    script = tmp_path / "fake_builder.py"
    script.write_text(FAKE_BUILDER)
    calls: list[list[str]] = []

    def command(source: Path, out: Path, scratch: Path, recipe: str) -> list[str]:
        cmd = [sys.executable, str(script), "-i", str(source), "-o", str(out), recipe]
        calls.append(cmd)
        return cmd

    monkeypatch.setattr(onnx_convert, "builder_command", command)
    monkeypatch.setattr(onnx_convert, "_check_builder_installed", lambda: None)
    return calls


def source_folder(tmp_path: Path, name: str = "src", **config: Any) -> Path:
    src = tmp_path / name
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"num_hidden_layers": 2, **config}))
    (src / "tokenizer.json").write_text("{}")
    return src


def test_conversion_reports_progress_and_is_cached(tmp_path: Path,
                                                   fake_builder: list[list[str]]) -> None:
    events: list[tuple[str, float | None]] = []
    src = source_folder(tmp_path)
    folder = onnx_convert.onnx_model(src, "ab" * 32, tmp_path / "cache", "tiny",
                                     progress=lambda m, f: events.append((m, f)))
    assert (folder / "model.onnx").is_file() and (folder / MARKER).is_file()
    assert (folder / "tokenizer.json").read_text() == "{}"  # the source's tokenizer travels
    fractions = [f for _, f in events]
    assert fractions[0] == 0.0 and fractions[-1] == 1.0
    assert fractions == sorted(fractions) and len(set(fractions)) > 10  # moves as it works
    assert all("tiny" in m for m, _ in events)
    again = onnx_convert.onnx_model(src, "ab" * 32, tmp_path / "cache", "tiny")
    assert again == folder and len(fake_builder) == 1  # the second use converts nothing
    assert "int4-b32-asym-v1" in folder.name and "is_symmetric=false" in " ".join(
        onnx_convert.RECIPES["int4-b32-asym-v1"])


def test_tied_embeddings_convert_symmetric(tmp_path: Path, fake_builder: list[list[str]]
                                           ) -> None:
    src = source_folder(tmp_path, tie_word_embeddings=True)
    folder = onnx_convert.onnx_model(src, "cd" * 32, tmp_path / "cache", "tied")
    assert "int4-b32-sym-v1" in folder.name and fake_builder[0][-1] == "int4-b32-sym-v1"


@pytest.mark.parametrize("damage", ["truncate", "overwrite", "no-manifest", "no-marker",
                                    "half-written"])
def test_a_damaged_entry_is_rebuilt_not_loaded(tmp_path: Path, fake_builder: list[list[str]],
                                              damage: str) -> None:
    src = source_folder(tmp_path)
    cache = tmp_path / "cache"
    folder = onnx_convert.onnx_model(src, "ef" * 32, cache, "tiny")
    data = folder / "model.onnx.data"
    good = data.read_bytes()
    if damage == "truncate":
        data.write_bytes(good[: len(good) // 2])
    elif damage == "overwrite":  # same size, different bytes (another model copied over it)
        data.write_bytes(bytes(reversed(good)))
    elif damage == "no-manifest":
        (folder / onnx_convert.MANIFEST).unlink()
    elif damage == "no-marker":
        (folder / MARKER).unlink()
    else:  # a build killed half way: its scratch folder is left next to the entry
        (folder / MARKER).unlink()
        (cache / "models" / f".{folder.name}.tmp-99-dead").mkdir()
    assert not onnx_convert.verify_folder(folder) or damage in ("no-marker", "half-written")
    rebuilt = onnx_convert.onnx_model(src, "ef" * 32, cache, "tiny")
    assert rebuilt == folder and len(fake_builder) == 2
    assert data.read_bytes() == good and onnx_convert.verify_folder(rebuilt)
    assert not list((cache / "models").glob(".*.tmp-*"))


def test_a_failed_conversion_names_the_cause_and_leaves_nothing(
        tmp_path: Path, fake_builder: list[list[str]]) -> None:
    src = source_folder(tmp_path, name="FAIL-model")
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError) as info:
        onnx_convert.onnx_model(src, "01" * 32, cache, "broken")
    assert "Mystery architecture is not supported" in info.value.message
    assert "@transformers" in (info.value.hint or "")
    assert [p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")] == []


def test_invalidate_removes_an_entry(tmp_path: Path, fake_builder: list[list[str]]) -> None:
    folder = onnx_convert.onnx_model(source_folder(tmp_path), "23" * 32, tmp_path / "c", "t")
    invalidate(folder)
    assert not folder.exists()


def test_engine_suffixes_pick_the_engine_and_unknown_ones_are_refused() -> None:
    assert engine_suffix("", "embedded") == ("", "onnx")
    assert engine_suffix("@transformers", "embedded") == ("", "transformers")
    assert engine_suffix("qwen-1.5b@onnx", "embedded") == ("qwen-1.5b", "onnx")
    assert engine_suffix("/models/me@corp/qwen", "hf") == ("/models/me@corp/qwen", "onnx")
    with pytest.raises(ConfigError, match="unknown engine 'fast'") as info:
        get_backend("embedded@fast")
    assert "@transformers" in (info.value.hint or "")
    entry, _ = default_registry().entry_for("embedded:qwen-1.5b@transformers")
    assert entry.engine_for("embedded:qwen-1.5b@transformers").white_box
    assert not entry.engine_for("embedded").white_box


def test_models_says_which_engine_each_spec_uses() -> None:
    from whetstone.engine.backends.catalog import describe_models

    rows = {r["spec"]: r for r in describe_models()}
    assert rows["embedded"]["engine"] == "onnx" and not rows["embedded"]["white_box"]
    assert rows["embedded@transformers"]["engine"] == "transformers"
    assert rows["embedded@transformers"]["white_box"]
    assert rows["embedded:qwen-1.5b@transformers"]["engine"] == "transformers"
    openai = next(r for r in rows.values() if r["prefix"] == "openai")
    assert openai["engine"] == "openai"


@pytest.mark.slow
def test_the_real_converter_rebuilds_a_damaged_model(tmp_path: Path) -> None:
    """SmolLM2 (135M) through the real converter into a fresh cache; then its weights file is
    cut short and the next load converts again instead of failing."""
    from conftest import SHARED_CACHE

    from whetstone.engine.backends.model_cache import dequantized_packaged
    from whetstone.engine.backends.onnx_backend import OnnxBackend, load_converted
    from whetstone.engine.types import Message, Request

    source = dequantized_packaged("smollm2", SHARED_CACHE)
    events: list[tuple[str, float | None]] = []
    options = BackendOptions(cache_dir=tmp_path, progress=lambda m, f: events.append((m, f)))
    sha = "5" * 64
    backend = load_converted(source, sha, "smol", options, "smol")
    assert isinstance(backend, OnnxBackend) and events[-1][1] == 1.0
    folder = backend.folder
    backend.close()
    data = folder / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    events.clear()
    backend = load_converted(source, sha, "smol", options, "smol")
    try:
        assert events and events[-1][1] == 1.0  # converted again
        c = backend.complete(Request(messages=[Message("user", "Hi!")], max_tokens=4))
        assert c.completion_tokens > 0
    finally:
        backend.close()
