"""The fast engine behind the ``Backend`` contract: ONNX int4 weights, continuous batching.

The default engine of ``embedded`` and ``hf:`` specs (``@onnx`` names it explicitly;
``@transformers`` picks the white-box path in ``hf.py``). The model is converted once
(``onnx_convert``) and decoded by ``onnx_engine.OnnxDecoder``; everything a caller sees is
the same as on the transformers engine: the chat template rendered by the model's own
transformers tokenizer (the torch weights are never loaded here), native tool calls parsed
from the text, stop strings, exact token counts, streaming, seeds, finish reasons and the
context-length check. Concurrent ``complete`` / ``acomplete`` / ``batch`` / ``stream`` calls
from any number of threads are decoded together, so ``max_concurrency`` is the batch size.

Engine settings come from ``BackendOptions.extra``: ``max_batch`` (8), ``threads`` (all usable
cores), ``prefill_chunk`` (64), ``kv_budget_mb`` (2048), ``cache_mb`` (512, the prefix cache),
``join_window_s`` (0: a request joins the running batch at the next step).
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ModelLoadError
from ..types import Completion, Request
from .base import Backend, Capabilities, StreamChunk
from .chat_template import template_supports_tools
from .local_text import completion_from_tokens, prompt_ids
from .model_cache import invalidate
from .onnx_convert import onnx_model
from .onnx_engine import Generation, OnnxDecoder, SamplingParams
from .registry import BackendOptions
from .toolcall_format import StreamGate

ENGINE_SETTINGS = ("max_batch", "threads", "prefill_chunk", "kv_budget_mb", "cache_mb",
                   "join_window_s")
_DONE = object()


def engine_settings(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The decoder settings found in ``BackendOptions.extra`` (unknown keys are left alone)."""
    out: dict[str, Any] = {}
    for key in ENGINE_SETTINGS:
        if key in extra and extra[key] is not None:
            try:
                out[key] = float(extra[key]) if key == "join_window_s" else int(extra[key])
            except (TypeError, ValueError):
                raise ConfigError(f"backend option {key}={extra[key]!r} is not a number",
                                  hint=f"e.g. {key}=8") from None
    return out


def _generation_eos(folder: Path) -> set[int]:
    try:
        eos = json.loads((folder / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError):
        return set()
    return set(eos if isinstance(eos, list) else [eos] if eos is not None else [])


class OnnxBackend(Backend):
    """A converted model folder (``onnx_convert.onnx_model``) behind the backend contract."""

    def __init__(self, folder: Path, *, name: str = "", **settings: Any) -> None:
        from transformers import AutoTokenizer  # heavy: transformers

        folder = Path(folder)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"no usable tokenizer in {folder}: {exc}",
                                 hint="delete that folder; it is converted again on next use"
                                 ) from exc
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise ModelLoadError(f"model {name or folder} has no chat template (a base model?)",
                                 hint="use an instruction-tuned model whose tokenizer has a "
                                      "chat_template")
        self.tokenizer = tokenizer
        self.name = name or str(folder)
        self.spec = f"hf:{self.name}@onnx"
        self.folder = folder
        self._tok_lock = threading.Lock()  # the Rust tokenizer is not meant for shared use
        self._decoder = OnnxDecoder.from_folder(folder, decode=self._decode_ids, **settings)
        eos = set(self._decoder.layout.eos_ids) | _generation_eos(folder)
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        self._decoder.eos_ids = frozenset(eos)
        self._eos_ids = frozenset(eos)
        self.capabilities = Capabilities(
            logprobs=True, streaming=True, tool_calls=template_supports_tools(template),
            max_concurrency=self._decoder.max_batch, prefill=True,
        )

    # -- tokens <-> text ------------------------------------------------------------------

    def _decode_ids(self, ids: Sequence[int]) -> str:
        with self._tok_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _prepare(self, request: Request) -> tuple[list[int], SamplingParams]:
        with self._tok_lock:
            ids = prompt_ids(self.tokenizer, request, self.capabilities.tool_calls,
                             self._decoder.max_context)
        max_new = min(request.max_tokens, self._decoder.max_context - len(ids))
        deadline = time.monotonic() + request.timeout if request.timeout else None
        return ids, SamplingParams(
            max_new=max_new, temperature=request.temperature, top_p=request.top_p,
            seed=request.seed, stop=tuple(s for s in request.stop if s),
            logprobs=request.logprobs, deadline=deadline)

    def _completion(self, request: Request, n_prompt: int, params: SamplingParams,
                    gen: Generation, elapsed: float) -> Completion:
        ended = {"timeout": "timeout", "cancelled": "timeout", "length": "length"}.get(gen.reason)
        return completion_from_tokens(
            request, decode=self._decode_ids, new=gen.tokens, n_prompt=n_prompt,
            eos_ids=self._eos_ids, max_new=params.max_new, elapsed=elapsed, model=self.name,
            logprobs=gen.logprobs, ended=ended)

    # -- the contract ---------------------------------------------------------------------

    def complete(self, request: Request) -> Completion:
        """One chat completion, decoded together with whatever else is in flight."""
        start = time.perf_counter()
        ids, params = self._prepare(request)
        future, cancel = self._decoder.submit(ids, params)
        try:
            gen = future.result()
        finally:
            cancel.set()  # a caller interrupted while waiting frees its row
        return self._completion(request, len(ids), params, gen, time.perf_counter() - start)

    async def acomplete(self, request: Request) -> Completion:
        """Async form: awaits the scheduler's future, no worker thread per request."""
        start = time.perf_counter()
        ids, params = self._prepare(request)
        future, cancel = self._decoder.submit(ids, params)
        try:
            gen = await asyncio.wrap_future(future)
        finally:
            cancel.set()
        return self._completion(request, len(ids), params, gen, time.perf_counter() - start)

    def stream(self, request: Request) -> Iterator[StreamChunk]:
        """Text as tokens are decoded, then the ``Completion``; closing the iterator early
        stops the sequence at the next step."""
        start = time.perf_counter()
        ids, params = self._prepare(request)
        tokens: queue.Queue[Any] = queue.Queue()
        future, cancel = self._decoder.submit(ids, params, on_token=tokens.put)
        future.add_done_callback(lambda _: tokens.put(_DONE))
        gate = StreamGate(request.stop, hold_tool_calls=bool(request.tools))
        # A prefilled reply start is part of the completion's text: stream it first.
        if shown := gate.feed(request.prefix):
            yield StreamChunk(text=shown)
        seen: list[int] = []
        text = ""
        try:
            while (token := tokens.get()) is not _DONE:
                seen.append(token)
                now = self._decode_ids(seen)
                if now.endswith("\ufffd"):  # half of a multi-byte character: wait for more
                    continue
                shown, text = gate.feed(now[len(text):]), now
                if shown:
                    yield StreamChunk(text=shown)
            completion = self._completion(request, len(ids), params, future.result(),
                                          time.perf_counter() - start)
        finally:
            cancel.set()
        rest = gate.finish(completion.text)
        if rest:
            yield StreamChunk(text=rest)
        yield StreamChunk(completion=completion)

    def count_tokens(self, text: str) -> int:
        """Exact count with the model's tokenizer."""
        if not text:
            return 0
        with self._tok_lock:
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @property
    def stats(self) -> dict[str, int]:
        """Decoder counters: steps, tokens, peak batch, prefill and reused prompt tokens."""
        return dict(self._decoder.stats)

    def close(self) -> None:
        """Stop the scheduler thread; requests in flight fail with ``BackendError``."""
        self._decoder.close()


def load_converted(source: Path, source_sha256: str, name: str, options: BackendOptions,
                   cache_name: str) -> OnnxBackend:
    """Convert ``source`` once (cached under ``cache_name``) and load the result.

    An entry that passes the file checks but still does not load (a bit flipped inside the
    weights) is removed and converted again, once.
    """
    settings = engine_settings(options.extra)
    for attempt in (1, 2):
        folder = onnx_model(source, source_sha256, options.cache_dir, cache_name,
                            progress=options.progress)
        try:
            return OnnxBackend(folder, name=name, **settings)
        except ModelLoadError:
            if attempt == 2:
                raise
            invalidate(folder)
    raise AssertionError("unreachable")
