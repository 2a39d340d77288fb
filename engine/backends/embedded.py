"""``embedded`` — the default model, shipped inside PyPI wheels, loaded through transformers.

``embedded`` / ``embedded:qwen-0.5b`` is Qwen2.5-Coder-0.5B-Instruct; ``embedded:smollm2`` a
135M model for fast plumbing tests; ``embedded:qwen-1.5b`` the 1.5B for quality runs (an extra
1.12 GB of wheels). The first load assembles and verifies the GGUF, dequantizes it and caches a
transformers copy under the cache directory (~1 min); later loads read the copy (seconds).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from engine.backends.hf import HFBackend
from engine.backends.model_cache import dequantized_packaged
from engine.backends.packaged import PACKAGED_MODELS, PackagedModel, installed
from engine.backends.registry import BackendOptions
from engine.errors import ConfigError

DEFAULT_VARIANT = "qwen-0.5b"


def embedded_variant(arg: str) -> PackagedModel:
    """The packaged model an ``embedded:<arg>`` spec names (empty: the default)."""
    name = arg.strip() or DEFAULT_VARIANT
    if name not in PACKAGED_MODELS:
        known = ", ".join(f"embedded:{n}" for n in PACKAGED_MODELS)
        raise ConfigError(f"unknown embedded model {arg!r}",
                          hint=f"embedded variants: embedded (= embedded:{DEFAULT_VARIANT}), "
                               f"{known}")
    return PACKAGED_MODELS[name]


def embedded_specs() -> list[tuple[str, PackagedModel, bool]]:
    """(spec, model, installed) for every variant, for ``whetstone models``.

    ``installed`` checks that the files are present with their pinned sizes (no hashing);
    ``model.install_hint`` says how to install a missing one.
    """
    return [("embedded" if name == DEFAULT_VARIANT else f"embedded:{name}", m, installed(m))
            for name, m in PACKAGED_MODELS.items()]


def load_embedded(arg: str, cache_dir: Path, device: str | None = None,
                  search_path: Sequence[Path] | None = None) -> HFBackend:
    """Build (once) and load the cached transformers copy of a packaged model."""
    model = embedded_variant(arg)
    folder = dequantized_packaged(model, cache_dir, search_path)
    return HFBackend.from_folder(folder, name=f"embedded:{model.name}", device=device)


def make_embedded(arg: str, options: BackendOptions) -> HFBackend:
    """Registry factory for ``embedded[:variant]``."""
    return load_embedded(arg, options.cache_dir, options.device)
