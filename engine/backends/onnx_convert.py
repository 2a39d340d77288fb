"""Convert a transformers folder into the ONNX int4 model the fast engine runs; once, cached.

The conversion is onnxruntime-genai's model builder (``onnxruntime_genai.models.builder``, a
pinned wheel; nothing builds from source and nothing is downloaded): it reads the folder with
transformers, writes one ONNX graph with fused GroupQueryAttention and int4 block-wise weights
(``MatMulNBits``, block 32, asymmetric, int8 activations on CPU), and prunes the LM head so a
prompt's prefill computes logits for its last position only. Measured on the embedded 0.5B
model (teacher-forced on GSM8K answers, top-1 agreement with transformers fp32): asymmetric
int4 0.926, symmetric int4 0.876; the asymmetric grid fits the GGUF's own Q4_K/Q5_0 blocks.
Models that tie the input embedding to the LM head (SmolLM2) get symmetric int4: the builder's
asymmetric path writes a tied embedding onnxruntime cannot load (onnxruntime-genai 0.18.0).

It runs in a child process: the builder prints freely and holds ~7 GB while it works, and
neither may reach the caller. Its log lines drive ``progress``. The result is a cache entry
(``model_cache.cached_folder``) keyed by the source's sha256 and the recipe, holding the
source's own tokenizer files and a manifest of file sizes and sampled hashes that every load
checks, so a truncated, replaced or half-written entry is rebuilt instead of loaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections import deque
from pathlib import Path

from ..errors import ModelLoadError, ModelNotInstalled
from .model_cache import cached_folder
from .registry import ProgressFn

# Changing a recipe changes the cache key, so old conversions are not reused by mistake.
RECIPES = {
    "int4-b32-asym-v1": ("prune_lm_head=true", "is_symmetric=false"),
    "int4-b32-sym-v1": ("prune_lm_head=true", "is_symmetric=true"),
}
MANIFEST = "whetstone-onnx-manifest.json"
INSTALL_HINT = "pip install onnxruntime-genai==0.18.0 onnx-ir==1.1.0"
# The transformers tokenizer travels with the converted model (the fast path never loads the
# torch weights, but renders the chat template with the very same tokenizer).
_TOKENIZER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                    "special_tokens_map.json", "generation_config.json", "vocab.json",
                    "merges.txt", "added_tokens.json", "tokenizer.model")
_SAMPLES = 64  # chunks hashed per large file on every load: catches swaps and truncation fast
_SAMPLE_BYTES = 1 << 16
_READING = re.compile(r"Reading layer (\d+)")
_QUANTIZED = re.compile(r"complete quantization of")


def _fingerprint(path: Path) -> str:
    """sha256 over a file's size and ``_SAMPLES`` evenly spaced chunks (whole file if small)."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= _SAMPLES * _SAMPLE_BYTES:
            h.update(f.read())
        else:
            step = (size - _SAMPLE_BYTES) // (_SAMPLES - 1)
            for i in range(_SAMPLES):
                f.seek(i * step)
                h.update(f.read(_SAMPLE_BYTES))
    return h.hexdigest()


def write_manifest(folder: Path, recipe: str) -> None:
    """Record every file's size and fingerprint (the last file written into an entry)."""
    files = {p.name: {"size": p.stat().st_size, "fingerprint": _fingerprint(p)}
             for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps({"recipe": recipe, "files": files}, indent=1))


def recipe_for(source: Path) -> str:
    """The conversion recipe for a transformers folder (see the module doc)."""
    try:
        config = json.loads((Path(source) / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    return "int4-b32-sym-v1" if config.get("tie_word_embeddings") else "int4-b32-asym-v1"


def verify_folder(folder: Path) -> bool:
    """True when every file named in the manifest is present, of its size and fingerprint."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        for name, meta in files.items():
            path = folder / name
            if path.stat().st_size != meta["size"] or _fingerprint(path) != meta["fingerprint"]:
                return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return manifest.get("recipe") in RECIPES and "model.onnx" in files


def _check_builder_installed() -> None:
    for module in ("onnxruntime_genai", "onnx_ir", "onnxruntime"):
        if importlib.util.find_spec(module) is None:
            raise ModelNotInstalled(
                f"the fast engine's converter needs the {module!r} package, which is missing",
                hint=INSTALL_HINT + "  (or pick the transformers engine with @transformers)")


def _num_layers(source: Path) -> int:
    try:
        config = json.loads((source / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    return int(config.get("num_hidden_layers") or 0)


def _fraction(line: str, layers: int, quantized: int) -> float | None:
    """Where the builder is, from one of its log lines (reading, then quantizing, then saving)."""
    if (m := _READING.search(line)) is not None and layers:
        return 0.05 + 0.25 * (int(m.group(1)) + 1) / layers
    if _QUANTIZED.search(line):
        total = 5 * layers + 1 if layers else 0  # qkv, o, gate, up, down per layer + the head
        return 0.3 + 0.6 * min(1.0, quantized / total) if total else None
    if "Saving GenAI config" in line:
        return 0.95
    return None


def builder_command(source: Path, out: Path, scratch: Path, recipe: str) -> list[str]:
    """The model builder's command line for one conversion."""
    return [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source),
            "-o", str(out), "-p", "int4", "-e", "cpu", "-c", str(scratch),
            "--extra_options", *RECIPES[recipe]]


def run_builder(source: Path, out: Path, scratch: Path, progress: ProgressFn | None,
                name: str = "", recipe: str = "int4-b32-asym-v1") -> None:
    """Run the model builder on ``source`` into ``out`` in a child process."""
    _check_builder_installed()
    cmd = builder_command(source, out, scratch, recipe)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1"}
    layers, quantized, tail = _num_layers(source), 0, deque[str](maxlen=30)
    name = name or source.name
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                          cwd=str(scratch)) as proc:
        assert proc.stdout is not None
        buf = ""
        # os.read returns whatever the child wrote so far: progress arrives as it happens
        while chunk := os.read(proc.stdout.fileno(), 1 << 16):
            buf += chunk.decode("utf-8", errors="replace")
            *lines, buf = re.split(r"[\r\n]", buf)
            for line in lines:
                if not line.strip():
                    continue
                tail.append(line[:300])
                quantized += bool(_QUANTIZED.search(line))
                fraction = _fraction(line, layers, quantized)
                if progress is not None and fraction is not None:
                    progress(f"converting {name} to ONNX int4 (first use only)", fraction)
        code = proc.wait()
    if code != 0 or not (out / "model.onnx").is_file():
        raise ModelLoadError(
            f"converting {source} to ONNX failed (exit {code}); the converter said:\n"
            + "\n".join(tail),
            hint="check that the model's architecture is one onnxruntime-genai supports, "
                 "or use the transformers engine: add @transformers to the model spec")


def _copy_tokenizer(source: Path, out: Path) -> None:
    for name in _TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)


def onnx_model(source: Path, source_sha256: str, cache_root: Path, name: str,
               progress: ProgressFn | None = None) -> Path:
    """The cached ONNX int4 folder for a transformers folder, converted on first use.

    ``source_sha256`` identifies the source weights (the packaged GGUF's hash for ``embedded``),
    ``name`` is a readable stem for the cache entry.
    """

    recipe = recipe_for(source)

    def build(out: Path, scratch: Path) -> None:
        if progress is not None:
            progress(f"converting {name} to ONNX int4 (first use only)", 0.0)
        run_builder(Path(source), out, scratch, progress, name, recipe)
        _copy_tokenizer(Path(source), out)
        write_manifest(out, recipe)
        if progress is not None:
            progress(f"converted {name} to ONNX int4", 1.0)

    key = f"{name}-onnx-{recipe}-{source_sha256[:12]}"
    return cached_folder(key, source_sha256, cache_root, build, verify=verify_folder)
