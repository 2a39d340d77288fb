"""``embedded`` — the default model, shipped inside PyPI wheels, run in process.

``embedded`` / ``embedded:qwen-0.5b`` is Qwen2.5-Coder-0.5B-Instruct; ``embedded:smollm2`` a
135M model for fast plumbing tests; ``embedded:qwen-1.5b`` the 1.5B for quality runs (an extra
1.12 GB of wheels). The first load assembles and verifies the GGUF, dequantizes it and caches a
transformers copy under the cache directory (~1 min); later loads read the copy (seconds).

Two engines (``@<engine>`` after the spec):
- ``onnx`` (the default): the transformers copy is converted once more, to ONNX int4
  (``onnx_convert``, ~1 min, cached beside it, keyed by the GGUF's sha256), and decoded with
  continuous batching (``onnx_backend``); not white-box;
- ``transformers`` (``embedded@transformers``, ``embedded:qwen-1.5b@transformers``): the fp32
  copy through transformers, one sequence at a time, with hidden states and gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from .base import Backend
from .hf import HFBackend
from .model_cache import dequantized_packaged
from .onnx_backend import load_converted
from .packaged import PACKAGED_MODELS, PackagedModel, installed
from .registry import BackendOptions, ProgressFn, engine_suffix

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
                  search_path: Sequence[Path] | None = None,
                  progress: ProgressFn | None = None) -> HFBackend:
    """Build (once) and load the cached transformers copy of a packaged model."""
    model = embedded_variant(arg)
    folder = dequantized_packaged(model, cache_dir, search_path, progress=progress)
    return HFBackend.from_folder(folder, name=f"embedded:{model.name}", device=device)


def load_embedded_onnx(arg: str, options: BackendOptions,
                       search_path: Sequence[Path] | None = None) -> Backend:
    """Build (once) the transformers copy and its ONNX int4 conversion, then load the latter."""
    model = embedded_variant(arg)
    folder = dequantized_packaged(model, options.cache_dir, search_path,
                                  progress=options.progress)
    return load_converted(folder, model.sha256, f"embedded:{model.name}", options, model.name)


def make_embedded(arg: str, options: BackendOptions) -> Backend:
    """Registry factory for ``embedded[:variant][@engine]``."""
    name, engine = engine_suffix(arg, "embedded")
    if engine == "transformers":
        return load_embedded(name, options.cache_dir, options.device, progress=options.progress)
    return load_embedded_onnx(name, options)
