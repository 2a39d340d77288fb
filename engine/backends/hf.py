"""``hf:<path>`` — a local transformers model (folder or GGUF file), in process, white-box.

Specs: ``hf:/models/qwen`` (a transformers folder), ``hf:/models/qwen.gguf`` or
``hf:/models#qwen.gguf`` (a GGUF file, dequantized once and cached like ``embedded``), or a hub
id that is already in the local Hugging Face cache (nothing is ever downloaded).

``HFBackend`` exposes ``model`` and ``tokenizer`` so white-box methods (latent test-time scaling)
can reach hidden states. It uses the model's own chat template and native tool-call format.
Text models only: vision-language models (``AutoProcessor`` + ``AutoModelForImageTextToText``)
will get their own backend beside this one; a message holding an image is refused here.
"""

from __future__ import annotations

import copy
import hashlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.backends.base import Backend, Capabilities, StreamChunk, check_local_request
from engine.backends.chat_template import template_messages, template_supports_tools
from engine.backends.model_cache import cached_folder, dequantize_gguf
from engine.backends.registry import BackendOptions
from engine.backends.toolcall_format import StreamGate, offered_tool_names, parse_tool_calls
from engine.errors import BackendError, ConfigError, ModelLoadError
from engine.types import Completion, Request


def pick_device(requested: str | None) -> str:
    """``requested`` if usable, else cuda when present, else cpu."""
    import torch

    if requested:
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device {requested!r} was asked for but torch sees no CUDA GPU",
                              hint="drop --device or use --device cpu")
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def _new_call_id(index: int) -> str:
    return f"call_{uuid.uuid4().hex[:12]}"


class HFBackend(Backend):
    """A causal LM and its tokenizer behind the backend contract.

    Build it with ``HFBackend.from_folder`` or hand it a loaded ``model`` and ``tokenizer``.
    One generation runs at a time per model (a lock): ``max_concurrency`` is 1.
    """

    def __init__(self, model: Any, tokenizer: Any, *, name: str = "", device: str = "cpu"
                 ) -> None:
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise ModelLoadError(
                f"model {name or type(model).__name__} has no chat template (a base model?)",
                hint="use an instruction-tuned model whose tokenizer has a chat_template",
            )
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.device = device
        self.spec = f"hf:{name}"
        self._lock = threading.Lock()
        # Building a StopStringCriteria scans the whole vocabulary (~1 s for Qwen's 151k
        # tokens); agents send the same stop strings on every call, so keep the last few.
        self._stop_criteria: dict[tuple[str, ...], Any] = {}
        self.capabilities = Capabilities(
            white_box=True, logprobs=True, streaming=True, max_concurrency=1,
            tool_calls=template_supports_tools(template),
        )
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        self._eos_ids = eos_ids
        self._max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 0)

    @classmethod
    def from_folder(cls, folder: Path, *, name: str = "", device: str | None = None
                    ) -> HFBackend:
        """Load a transformers folder (fp32 on CPU, bf16 on a GPU)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

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

    # -- request -> tensors ---------------------------------------------------------------

    def _encode(self, request: Request) -> Any:
        check_local_request(request)
        msgs = template_messages(request.messages, self.capabilities.tool_calls)
        text = self.tokenizer.apply_chat_template(
            msgs, tools=[dict(t) for t in request.tools] or None,
            add_generation_prompt=True, tokenize=False,
        )
        enc = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)
        n_prompt = enc["input_ids"].shape[1]
        if self._max_positions and n_prompt >= self._max_positions:
            raise BackendError(
                f"the prompt has {n_prompt} tokens; the model's context holds "
                f"{self._max_positions}",
                hint="shorten the conversation or the retrieved context",
            )
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
        import torch

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
                    for step, tok in zip(out.logits, new)
                )
        elapsed = time.perf_counter() - start
        return self._completion(request, n_prompt, new, cfg.max_new_tokens, elapsed, logprobs)

    def _completion(self, request: Request, n_prompt: int, new: list[int], max_new: int,
                    elapsed: float, logprobs: tuple[float, ...] | None) -> Completion:
        hit_eos = bool(new) and new[-1] in self._eos_ids
        raw = self.tokenizer.decode(new[:-1] if hit_eos else new, skip_special_tokens=True)
        cuts = [raw.find(s) for s in request.stop if s and s in raw]
        if cuts:
            raw, finish = raw[:min(cuts)], "stop"
        elif hit_eos:
            finish = "stop"
        elif len(new) >= max_new:
            finish = "length"
        elif request.timeout is not None and elapsed >= request.timeout:
            finish = "timeout"
        else:
            finish = "stop"
        if request.tools:
            text, calls = parse_tool_calls(raw, _new_call_id, offered_tool_names(request.tools))
        else:
            text, calls = raw.strip(), ()
        if calls and finish == "stop":
            finish = "tool_calls"
        return Completion(
            text=text, finish_reason=finish, prompt_tokens=n_prompt, completion_tokens=len(new),
            latency_s=elapsed, tool_calls=calls, logprobs=logprobs, model=self.name,
        )

    def complete(self, request: Request) -> Completion:
        """One chat completion (greedy when temperature is 0)."""
        return self._generate(request)

    def stream(self, request: Request) -> Iterator[StreamChunk]:
        """Text as it is decoded (a worker thread runs ``generate``), then the ``Completion``."""
        from transformers import TextIteratorStreamer

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


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def resolve_local_model(arg: str) -> Path:
    """A path, or a hub id already in the local Hugging Face cache. Never downloads."""
    path = Path(arg).expanduser()
    if path.exists():
        return path
    if arg.count("/") == 1 and not arg.startswith(("/", ".", "~")):
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            return Path(snapshot_download(arg, local_files_only=True))
        except (LocalEntryNotFoundError, OSError, ValueError):
            pass
    raise ConfigError(
        f"no model at {arg!r} (not a file or folder, nor in the local Hugging Face cache)",
        hint="give the path of a transformers folder or a .gguf file; nothing is downloaded",
    )


def gguf_folder(gguf: Path, cache_root: Path) -> Path:
    """A dequantized transformers folder for any GGUF file, cached by the file's sha256."""
    sha = _sha256_file(gguf)
    key = f"hf-{gguf.stem}-{sha[:12]}"
    return cached_folder(key, sha, cache_root, lambda out, scratch: dequantize_gguf(gguf, out))


def make_hf(arg: str, options: BackendOptions) -> HFBackend:
    """``hf:<folder>``, ``hf:<file.gguf>`` or ``hf:<folder>#<file.gguf>``."""
    if not arg.strip():
        raise ConfigError("hf: needs a model path",
                          hint="e.g. hf:/models/qwen2.5-0.5b or hf:/models/qwen.gguf")
    base, _, gguf_name = arg.strip().partition("#")
    path = resolve_local_model(base)
    if gguf_name:
        path = path / gguf_name
        if not path.is_file():
            raise ConfigError(f"no GGUF file {gguf_name!r} in {base}",
                              hint="check the name after '#'")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ConfigError(f"{path} is a file but not a .gguf",
                              hint="point hf: at a transformers folder or a .gguf file")
        folder = gguf_folder(path, options.cache_dir)
    else:
        folder = path
    return HFBackend.from_folder(folder, name=arg.strip(), device=options.device)
