"""``hf:<path>`` — a local transformers model (folder or GGUF file), in process.

Specs: ``hf:/models/qwen`` (a transformers folder), ``hf:/models/qwen.gguf`` or
``hf:/models#qwen.gguf`` (a GGUF file, dequantized once and cached like ``embedded``), or a hub
id that is already in the local Hugging Face cache (nothing is ever downloaded). Like
``embedded``, the default engine is the fast ONNX one (the folder is converted once, cached by
the GGUF's sha256, or for a folder by a fingerprint of its files' names, sizes and times);
``hf:<path>@transformers`` runs the model through transformers here instead.

``HFBackend`` (the transformers engine) exposes ``model`` and ``tokenizer`` so white-box
methods can reach hidden states. It uses the model's own chat template and native tool-call
format.

A folder holding a vision-language model (``vision_config`` in its config) loads through
``AutoProcessor`` + ``AutoModelForImageTextToText`` (``hf_vlm.py``) and always runs on
transformers: the ONNX engine is text-only. The same ``HFBackend`` then holds the processor,
which encodes image parts, and ``capabilities.vision`` is set. A text model refuses images.
"""

from __future__ import annotations

import copy
import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import BackendError, ConfigError, ModelLoadError, ModelNotInstalled
from ..types import Completion, Request
from .base import Backend, Capabilities, StreamChunk
from .chat_template import template_supports_tools
from .hf_vlm import encode_vision_request, is_vision_folder, load_vlm
from .local_text import (
    check_prompt_fits,
    completion_from_tokens,
    prompt_text,
)
from .model_cache import cached_folder, dequantize_gguf
from .onnx_backend import load_converted
from .registry import (
    LOCAL_ENGINES,
    BackendOptions,
    engine_suffix,
    split_engine,
)
from .toolcall_format import StreamGate


def pick_device(requested: str | None) -> str:
    """``requested`` if usable, else cuda when present, else cpu."""
    import torch  # heavy: torch

    if requested:
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device {requested!r} was asked for but torch sees no CUDA GPU",
                              hint="drop --device or use --device cpu")
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


class HFBackend(Backend):
    """A causal LM and its tokenizer behind the backend contract.

    Build it with ``HFBackend.from_folder`` or hand it a loaded ``model`` and ``tokenizer``;
    a vision-language model also gets its ``processor`` (``hf_vlm.load_vlm``), which renders
    the prompt with its chat template and turns image parts into pixel inputs.
    One generation runs at a time per model (a lock): ``max_concurrency`` is 1.
    """

    def __init__(self, model: Any, tokenizer: Any, *, name: str = "", device: str = "cpu",
                 processor: Any = None) -> None:
        template = getattr(processor or tokenizer, "chat_template", None)
        if not template:
            raise ModelLoadError(
                f"model {name or type(model).__name__} has no chat template (a base model?)",
                hint="use an instruction-tuned model whose tokenizer has a chat_template",
            )
        self.model = model
        self.tokenizer = tokenizer
        self.processor = processor
        self.name = name
        self.device = device
        self.spec = f"hf:{name}"
        self._lock = threading.Lock()
        # Building a StopStringCriteria scans the whole vocabulary (~1 s for Qwen's 151k
        # tokens); agents send the same stop strings on every call, so keep the last few.
        self._stop_criteria: dict[tuple[str, ...], Any] = {}
        self.capabilities = Capabilities(
            vision=processor is not None, white_box=True, logprobs=True, streaming=True,
            max_concurrency=1, tool_calls=template_supports_tools(template), prefill=True,
        )
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        self._eos_ids = eos_ids
        text_config = model.config.get_text_config()  # a VLM's language model's config
        self._max_positions = int(getattr(text_config, "max_position_embeddings", 0) or 0)

    @classmethod
    def from_folder(cls, folder: Path, *, name: str = "", device: str | None = None
                    ) -> HFBackend:
        """Load a transformers folder (fp32 on CPU, bf16 on a GPU)."""
        import torch  # heavy: torch
        from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: transformers

        dev = pick_device(device)
        dtype = torch.float32 if dev == "cpu" else torch.bfloat16
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                str(folder), local_files_only=True, dtype=dtype
            )
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"could not load a transformers model from {folder}: {exc}",
                                 hint="point hf: at a folder with config.json and weights") \
                from exc
        model.to(dev)
        model.eval()
        return cls(model, tokenizer, name=name or str(folder), device=dev)

    @classmethod
    def from_vision_folder(cls, folder: Path, *, name: str = "", device: str | None = None
                           ) -> HFBackend:
        """Load a vision-language folder: its model and processor (``hf_vlm.load_vlm``)."""
        dev = pick_device(device)
        model, processor = load_vlm(folder, dev)
        return cls(model, processor.tokenizer, name=name or str(folder), device=dev,
                   processor=processor)

    # -- request -> tensors ---------------------------------------------------------------

    def _encode(self, request: Request) -> Any:
        if self.processor is not None:
            return encode_vision_request(self.processor, request, self.capabilities.tool_calls,
                                         self._max_positions).to(self.device)
        text = prompt_text(self.tokenizer, request, self.capabilities.tool_calls)
        enc = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)
        check_prompt_fits(int(enc["input_ids"].shape[1]), self._max_positions)
        return enc.to(self.device)

    def _generation_config(self, request: Request, n_prompt: int) -> Any:
        cfg = copy.deepcopy(self.model.generation_config)
        room = self._max_positions - n_prompt if self._max_positions else request.max_tokens
        cfg.max_new_tokens = min(request.max_tokens, room)
        cfg.do_sample = request.temperature > 0
        if cfg.do_sample:
            cfg.temperature, cfg.top_p = request.temperature, request.top_p
        else:  # greedy: sampling knobs would only draw warnings
            cfg.temperature, cfg.top_p, cfg.top_k = None, None, None
        cfg.stop_strings = None  # passed as a cached criterion instead (see _stopping)
        cfg.max_time = request.timeout
        cfg.output_logits = bool(request.logprobs)
        cfg.return_dict_in_generate = True
        if cfg.pad_token_id is None:
            cfg.pad_token_id = self.tokenizer.pad_token_id or next(iter(self._eos_ids), None)
        return cfg

    def _stopping(self, stops: tuple[str, ...], cancel: threading.Event | None) -> Any:
        """Stopping criteria: the request's stop strings (cached) and stream cancellation."""
        # heavy: torch, transformers
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList
        from transformers.generation.stopping_criteria import StopStringCriteria

        class _Cancelled(StoppingCriteria):
            """Stops generation when the stream's reader went away."""

            def __call__(self, input_ids: Any, scores: Any, **kw: Any) -> Any:
                flag = cancel is not None and cancel.is_set()
                return torch.full((input_ids.shape[0],), flag, dtype=torch.bool,
                                  device=input_ids.device)

        criteria = []
        stops = tuple(s for s in stops if s)
        if stops:
            if stops not in self._stop_criteria:
                if len(self._stop_criteria) >= 16:
                    self._stop_criteria.pop(next(iter(self._stop_criteria)))
                self._stop_criteria[stops] = StopStringCriteria(self.tokenizer, list(stops))
            criteria.append(self._stop_criteria[stops])
        if cancel is not None:
            criteria.append(_Cancelled())
        return StoppingCriteriaList(criteria) if criteria else None

    # -- generation ----------------------------------------------------------------------

    def _generate(self, request: Request, streamer: Any = None,
                  cancel: threading.Event | None = None) -> Completion:
        import torch  # heavy: torch

        start = time.perf_counter()
        with self._lock:
            if self.model is None:
                raise BackendError(f"{self.spec} was closed", hint="load the backend again")
            enc = self._encode(request)
            n_prompt = int(enc["input_ids"].shape[1])
            cfg = self._generation_config(request, n_prompt)
            if request.seed is not None:
                torch.manual_seed(request.seed)  # under the lock: the global RNG is ours here
            with torch.inference_mode():
                out = self.model.generate(
                    **enc, generation_config=cfg, streamer=streamer,
                    stopping_criteria=self._stopping(request.stop, cancel),
                )
            new = out.sequences[0, n_prompt:].tolist()
            logprobs = None
            if request.logprobs:
                # out.logits: one (1, vocab) tensor per generated token, before any processor
                logprobs = tuple(
                    float(torch.log_softmax(step[0].float(), dim=-1)[tok])
                    for step, tok in zip(out.logits, new, strict=False)
                )
        elapsed = time.perf_counter() - start
        return self._completion(request, n_prompt, new, cfg.max_new_tokens, elapsed, logprobs)

    def _completion(self, request: Request, n_prompt: int, new: list[int], max_new: int,
                    elapsed: float, logprobs: tuple[float, ...] | None) -> Completion:
        return completion_from_tokens(
            request, decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
            new=new, n_prompt=n_prompt, eos_ids=self._eos_ids, max_new=max_new,
            elapsed=elapsed, logprobs=logprobs, model=self.name)

    def complete(self, request: Request) -> Completion:
        """One chat completion (greedy when temperature is 0)."""
        return self._generate(request)

    def stream(self, request: Request) -> Iterator[StreamChunk]:
        """Text as it is decoded (a worker thread runs ``generate``), then the ``Completion``."""
        from transformers import TextIteratorStreamer  # heavy: transformers

        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True,
                                        skip_special_tokens=True)
        cancel = threading.Event()
        result: dict[str, Any] = {}

        def work() -> None:
            try:
                result["completion"] = self._generate(request, streamer, cancel)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the reader below
                result["error"] = exc
                streamer.end()  # unblock the reader if generate never got to end the stream

        worker = threading.Thread(target=work, name="whetstone-hf-stream", daemon=True)
        worker.start()
        gate = StreamGate(request.stop, hold_tool_calls=bool(request.tools))
        try:
            # A prefilled reply start is part of the completion's text: stream it first.
            if shown := gate.feed(request.prefix):
                yield StreamChunk(text=shown)
            for piece in streamer:
                shown = gate.feed(piece)
                if shown:
                    yield StreamChunk(text=shown)
            worker.join()
        finally:
            cancel.set()  # the reader stopped early: let generate stop at the next token
        if "error" in result:
            raise result["error"]
        completion: Completion = result["completion"]
        rest = gate.finish(completion.text)
        if rest:
            yield StreamChunk(text=rest)
        yield StreamChunk(completion=completion)

    def count_tokens(self, text: str) -> int:
        """Exact count with the model's tokenizer."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0

    def close(self) -> None:
        """Drop the references to the weights so their memory can be freed."""
        self.model = None
        self.tokenizer = None
        self.processor = None


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def resolve_local_model(arg: str) -> Path:
    """A path, or a hub id already in the local Hugging Face cache. Never downloads;
    ``ModelNotInstalled`` when it is neither."""
    path = Path(arg).expanduser()
    if path.exists():
        return path
    if arg.count("/") == 1 and not arg.startswith(("/", ".", "~")):
        from huggingface_hub import snapshot_download  # heavy: huggingface_hub
        from huggingface_hub.errors import LocalEntryNotFoundError  # heavy: huggingface_hub

        try:
            return Path(snapshot_download(arg, local_files_only=True))
        except (LocalEntryNotFoundError, OSError, ValueError):
            pass
    # A model that is not there is a model not installed (exit 3), whatever names it.
    raise ModelNotInstalled(
        f"no model at {arg!r} (not a file or folder, nor in the local Hugging Face cache)",
        hint="give the path of a transformers folder or a .gguf file; nothing is downloaded",
    )


def gguf_folder(gguf: Path, cache_root: Path, sha: str | None = None) -> Path:
    """A dequantized transformers folder for any GGUF file, cached by the file's sha256."""
    sha = sha or _sha256_file(gguf)
    key = f"hf-{gguf.stem}-{sha[:12]}"
    return cached_folder(key, sha, cache_root, lambda out, scratch: dequantize_gguf(gguf, out))


def folder_fingerprint(folder: Path) -> str:
    """sha256 over the names, sizes and modification times of a model folder's files: cheap
    to compute on every load, and changed by any rewrite of the weights."""
    h = hashlib.sha256()
    for p in sorted(Path(folder).rglob("*")):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.relative_to(folder)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _model_path(arg: str) -> Path:
    """The file or folder an ``hf:`` argument names (checked, never downloaded)."""
    if not arg.strip():
        raise ConfigError("hf: needs a model path",
                          hint="e.g. hf:/models/qwen2.5-0.5b or hf:/models/qwen.gguf")
    base, _, gguf_name = arg.strip().partition("#")
    path = resolve_local_model(base)
    if gguf_name:
        path = path / gguf_name
        if not path.is_file():
            raise ModelNotInstalled(f"no GGUF file {gguf_name!r} in {base}",
                              hint="check the name after '#'")
    if path.is_file() and path.suffix.lower() != ".gguf":
        raise ConfigError(f"{path} is a file but not a .gguf",
                          hint="point hf: at a transformers folder or a .gguf file")
    return path


def make_hf(arg: str, options: BackendOptions) -> Backend:
    """``hf:<folder>``, ``hf:<file.gguf>`` or ``hf:<folder>#<file.gguf>``, then optionally
    ``@transformers`` (white-box) or ``@onnx`` (the default). A vision-language folder runs
    on transformers whatever the suffix says, except an explicit ``@onnx``: refused."""
    explicit = split_engine(arg.strip(), tuple(e.name for e in LOCAL_ENGINES))[1]
    arg, engine = engine_suffix(arg.strip(), "hf")
    path = _model_path(arg)
    sha = _sha256_file(path) if path.is_file() else None
    folder = gguf_folder(path, options.cache_dir, sha) if path.is_file() else path
    if path.is_dir() and is_vision_folder(path):
        if explicit == "onnx":
            raise ConfigError(
                f"{arg.strip()} is a vision-language model; the ONNX engine is text-only",
                hint="drop @onnx: a vision-language folder runs on transformers")
        return HFBackend.from_vision_folder(folder, name=arg.strip(), device=options.device)
    if engine == "transformers":
        return HFBackend.from_folder(folder, name=arg.strip(), device=options.device)

    stem = "".join(c if c.isalnum() or c in "-_." else "-" for c in path.stem)[:40] or "model"
    return load_converted(folder, sha or folder_fingerprint(folder), arg.strip(), options,
                          f"hf-{stem}")
