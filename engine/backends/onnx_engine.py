"""The fast engine's decoder: one ONNX Runtime session, many sequences decoded together.

The model is the builder's layout (see ``onnx_convert``): inputs ``input_ids`` (B, S) and
``attention_mask`` (B, T), ``past_key_values.<i>.key|value`` (B, kv_heads, cap, head_dim);
outputs ``logits`` (B, 1, vocab) for each row's last position, and ``present.<i>.key|value``
bound to the *same* buffers as the past, so GroupQueryAttention writes each new key/value in
place. GQA reads every row's own length from its attention-mask row, which is what makes
continuous batching possible without padding the sequences to one length.

A scheduler thread owns the session and the buffers; callers only ``submit`` and wait:
- rows ``[0, n)`` of the batch buffer hold the sequences being decoded; one decode step runs
  them all, each at its own length, and a finished row is replaced by the last one, so a step
  always sees a contiguous ``[0, n)`` view;
- a new sequence is prefilled in a one-row staging buffer, ``prefill_chunk`` tokens at a time
  between decode steps (so a long prompt never stalls the others for long), then copied into
  row ``n`` and joins the next step;
- keys and values of recent sequences are kept in a small LRU cache; a prompt that starts
  with one of them (an agent's next step re-sends its conversation, tasks share a system
  prompt) copies that prefix instead of recomputing it. Reuse stops at a chunk boundary, so
  the prompt's own positions are computed by the same chunks as in a cold prefill.

Greedy decoding of a request is reproducible; as in vLLM, the low-order bits of a step can
depend on which other sequences share it, so concurrent requests may differ from solo ones.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BackendError, ModelLoadError

_KV_BYTES = 4  # float32 keys and values


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence is generated. ``deadline`` is a ``time.monotonic()`` instant."""

    max_new: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    deadline: float | None = None


@dataclass(frozen=True)
class Generation:
    """What a sequence produced. ``reason``: eos | stop | length | timeout | cancelled."""

    tokens: tuple[int, ...]
    reason: str
    logprobs: tuple[float, ...] | None = None
    reused_tokens: int = 0  # prompt positions taken from the prefix cache


@dataclass(frozen=True)
class ModelLayout:
    """Sizes read from the builder's ``genai_config.json``."""

    layers: int
    kv_heads: int
    head_dim: int
    context: int
    eos_ids: frozenset[int]

    @classmethod
    def read(cls, folder: Path) -> ModelLayout:
        try:
            cfg = json.loads((Path(folder) / "genai_config.json").read_text())["model"]
            dec = cfg["decoder"]
            eos = cfg.get("eos_token_id")
            eos_ids = frozenset(eos if isinstance(eos, list) else [eos] if eos is not None
                                else [])
            return cls(int(dec["num_hidden_layers"]), int(dec["num_key_value_heads"]),
                       int(dec["head_size"]), int(cfg.get("context_length") or 0), eos_ids)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{folder} has no readable genai_config.json: {exc}",
                                 hint="delete the folder; it is rebuilt on next use") from exc

    @property
    def token_bytes(self) -> int:
        """Bytes of keys and values one position takes in one row."""
        return self.layers * 2 * self.kv_heads * self.head_dim * _KV_BYTES


@dataclass
class _Seq:
    """A sequence in flight (owned by the scheduler thread once submitted)."""

    prompt: list[int]
    params: SamplingParams
    future: Future
    on_token: Callable[[int], None] | None
    cancel: threading.Event
    rng: Any = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    kv_len: int = 0  # positions whose keys/values are in the buffer
    reused: int = 0
    reason: str | None = None


@dataclass
class _CacheEntry:
    tokens: Any  # np.ndarray of int64, the positions held
    kv: Any  # np.ndarray (2 * layers, kv_heads, len, head_dim)


# model(input_ids (B, S), attention_mask (B, T), buffers) -> logits (B, vocab): one forward
# pass that also writes the S new positions' keys/values into ``buffers`` in place.
ModelFn = Callable[[Any, Any, "list[Any]"], Any]


class OrtModel:
    """The converted model in an ONNX Runtime session, as a ``ModelFn``."""

    def __init__(self, folder: Path, layout: ModelLayout, threads: int | None = None) -> None:
        import onnxruntime as ort  # heavy: onnxruntime

        self._ort = ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads or len(os.sched_getaffinity(0))
        so.inter_op_num_threads = 1
        # Spinning worker threads burn the cores other processes (and our own scheduler,
        # tokenizer and HTTP threads) need; measured ~1.8x slower decode on a busy 2-core box.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(str(folder / "model.onnx"), so,
                                                 providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own unrelated exception types
            raise ModelLoadError(f"onnxruntime could not load {folder / 'model.onnx'}: {exc}",
                                 hint="delete that folder; it is converted again on next "
                                      "use") from exc
        # buffer 2 * layer holds that layer's keys, 2 * layer + 1 its values
        self._names = [(f"past_key_values.{layer}.{kind}", f"present.{layer}.{kind}")
                       for layer in range(layout.layers) for kind in ("key", "value")]

    def __call__(self, ids: Any, mask: Any, buffers: list[Any]) -> Any:
        """One forward pass; ``buffers`` are views whose rows match ``ids``' rows."""
        ort = self._ort
        io = self._session.io_binding()
        # OrtValues wrap the numpy memory (no copy); they must stay alive through the run.
        # Present is bound to the past's own memory: GQA then writes new positions in place.
        values = [ort.OrtValue.ortvalue_from_numpy(ids), ort.OrtValue.ortvalue_from_numpy(mask)]
        io.bind_ortvalue_input("input_ids", values[0])
        io.bind_ortvalue_input("attention_mask", values[1])
        io.bind_output("logits")
        for (past, present), buf in zip(self._names, buffers, strict=False):
            v = ort.OrtValue.ortvalue_from_numpy(buf)
            values.append(v)
            io.bind_ortvalue_input(past, v)
            io.bind_ortvalue_output(present, v)
        self._session.run_with_iobinding(io)
        return io.get_outputs()[0].numpy()[:, -1, :]  # (rows, vocab)


class OnnxDecoder:
    """Continuous-batching generation over one ONNX Runtime session (see the module doc).

    ``decode(ids) -> text`` is only used to look for stop strings. Thread-safe: ``submit``
    from any thread; every ONNX call happens on the scheduler thread.
    """

    def __init__(self, layout: ModelLayout, model: ModelFn, *,
                 decode: Callable[[list[int]], str], max_batch: int = 8,
                 prefill_chunk: int = 64, kv_budget_mb: int = 2048, cache_mb: int = 512,
                 join_window_s: float = 0.0) -> None:
        import numpy as np  # heavy: numpy

        self._np = np
        self.layout = layout
        self._model = model
        self.max_batch = max(1, int(max_batch))
        self.prefill_chunk = max(1, int(prefill_chunk))
        self.join_window_s = max(0.0, float(join_window_s))
        row_tokens = (int(kv_budget_mb) << 20) // (self.max_batch * layout.token_bytes)
        # the longest sequence (prompt + new tokens) one row can hold
        self.max_context = int(min(layout.context or row_tokens, row_tokens))
        self._decode = decode
        self.eos_ids = layout.eos_ids  # the backend adds the tokenizer's own
        self._cap = 0
        # one array per past tensor (2 per layer): (max_batch | 1, kv_heads, cap, head_dim)
        self._batch: list[Any] = []
        self._stage: list[Any] = []  # one row, for prefills
        self._cache: collections.OrderedDict[int, _CacheEntry] = collections.OrderedDict()
        self._cache_budget = int(cache_mb) << 20
        self._cache_bytes = 0
        self._cache_key = 0
        self._inbox: queue.Queue[_Seq | None] = queue.Queue()
        self._waiting: collections.deque[_Seq] = collections.deque()
        self._active: list[_Seq] = []  # row i of the batch buffer holds _active[i]
        self._prefill: _Seq | None = None
        self._closed = False
        self._failure: BaseException | None = None
        self.stats = {"steps": 0, "tokens": 0, "peak_batch": 0, "prefill_tokens": 0,
                      "reused_tokens": 0}
        self._thread = threading.Thread(target=self._run, name="whetstone-onnx-scheduler",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def from_folder(cls, folder: Path, *, decode: Callable[[list[int]], str],
                    threads: int | None = None, **settings: Any) -> OnnxDecoder:
        """A decoder over the converted model in ``folder`` (see ``OrtModel``)."""
        layout = ModelLayout.read(folder)
        return cls(layout, OrtModel(Path(folder), layout, threads), decode=decode, **settings)

    # -- the public side ----------------------------------------------------------------

    def submit(self, prompt: Sequence[int], params: SamplingParams,
               on_token: Callable[[int], None] | None = None
               ) -> tuple[Future, threading.Event]:
        """Queue a sequence; returns its future (a ``Generation``) and a cancel event."""
        if not prompt:
            raise BackendError("empty prompt", hint="send at least one message")
        if len(prompt) >= self.max_context:
            raise BackendError(
                f"the prompt has {len(prompt)} tokens; this engine holds {self.max_context} "
                "per sequence",
                hint="shorten the conversation, or raise kv_budget_mb in the backend options")
        if self._closed or self._failure is not None:
            raise BackendError("the ONNX engine is closed" if self._closed else
                               f"the ONNX engine stopped: {self._failure}",
                               hint="load the backend again")
        future: Future = Future()
        cancel = threading.Event()
        seq = _Seq(list(prompt), params, future, on_token, cancel)
        seq.rng = self._np.random.default_rng(params.seed)
        self._inbox.put(seq)
        return future, cancel

    def close(self) -> None:
        """Stop the scheduler; requests still queued or running fail with ``BackendError``."""
        if self._closed:
            return
        self._closed = True
        self._inbox.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=60)

    # -- the scheduler thread -------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closed:
                idle = not (self._active or self._prefill or self._waiting)
                self._take_new(block=idle)
                self._expire()
                if self._prefill is None and self._waiting and (
                        len(self._active) < self.max_batch):
                    self._start_prefill(self._waiting.popleft())
                if self._prefill is not None:
                    self._prefill_guarded()
                if self._active:
                    self._decode_step()
        except BaseException as exc:  # noqa: BLE001 - every waiter must hear about it
            self._failure = exc
        finally:
            self._fail_all(BackendError(
                "the ONNX engine was closed" if self._failure is None else
                f"the ONNX engine failed: {self._failure}", hint="load the backend again"))

    def _take_new(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=None) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        if block and self.join_window_s:
            time.sleep(self.join_window_s)  # let requests sent together start together
        while item is not None:
            self._waiting.append(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
        self._closed = True

    def _expire(self) -> None:
        """Sequences whose caller gave up or whose deadline passed end now."""
        now = time.monotonic()

        def over(s: _Seq) -> str | None:
            if s.cancel.is_set():
                return "cancelled"
            if s.params.deadline is not None and now >= s.params.deadline:
                return "timeout"
            return None

        for s in list(self._waiting):
            if (reason := over(s)) is not None:
                self._waiting.remove(s)
                self._resolve(s, reason)
        if self._prefill is not None and (reason := over(self._prefill)) is not None:
            self._resolve(self._prefill, reason)
            self._prefill = None
        for i in reversed(range(len(self._active))):
            if (reason := over(self._active[i])) is not None:
                self._active[i].reason = reason
                self._finish_row(i)

    def _fail_all(self, error: BaseException) -> None:
        pending = list(self._waiting) + self._active + ([self._prefill] if self._prefill else [])
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                pending.append(item)
        for s in pending:
            if not s.future.done():
                s.future.set_exception(error)
        self._waiting.clear()
        self._active.clear()
        self._prefill = None

    # -- buffers ----------------------------------------------------------------------

    def _ensure_capacity(self, need: int) -> None:
        """Grow every key/value buffer to hold ``need`` positions per row (doubling)."""
        if need <= self._cap:
            return
        np = self._np
        cap = max(256, self._cap)
        while cap < need:
            cap *= 2
        cap = min(cap, self.max_context)
        shape = (self.layout.kv_heads, cap, self.layout.head_dim)
        old, old_stage, n = self._batch, self._stage, len(self._active)
        # np.zeros maps fresh pages lazily: rows never used cost no memory
        count = 2 * self.layout.layers
        self._batch = [np.zeros((self.max_batch, *shape), np.float32) for _ in range(count)]
        self._stage = [np.zeros((1, *shape), np.float32) for _ in range(count)]
        for new, prev in zip(self._batch, old, strict=False):
            new[:n, :, :self._cap] = prev[:n]
        for new, prev in zip(self._stage, old_stage, strict=False):
            new[:, :, :self._cap] = prev
        self._cap = cap

    def _run_model(self, ids: Any, mask: Any, buffers: list[Any]) -> Any:
        return self._model(ids, mask, buffers)

    # -- prefill ------------------------------------------------------------------------

    def _start_prefill(self, s: _Seq) -> None:
        need = len(s.prompt) + s.params.max_new
        self._ensure_capacity(min(need, self.max_context))
        reuse, entry = self._lookup(s.prompt)
        if reuse and entry is not None:
            for dst, src in zip(self._stage, entry.kv, strict=False):
                dst[0, :, :reuse] = src[:, :reuse]
            s.kv_len = s.reused = reuse
            self.stats["reused_tokens"] += reuse
        self._prefill = s

    def _prefill_guarded(self) -> None:
        """A prefill that fails (a prompt too large for memory) fails its request only."""
        s = self._prefill
        try:
            self._prefill_step()
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
            self._prefill = None
            if s is not None and not s.future.done():
                s.future.set_exception(BackendError(
                    f"the ONNX engine could not read the prompt: {exc}",
                    hint="shorten the prompt; if it keeps failing, use @transformers"))

    def _prefill_step(self) -> None:
        np = self._np
        s = self._prefill
        assert s is not None
        start = s.kv_len
        end = min(len(s.prompt), (start // self.prefill_chunk + 1) * self.prefill_chunk)
        ids = np.array([s.prompt[start:end]], np.int64)
        mask = np.ones((1, end), np.int64)
        logits = self._run_model(ids, mask, self._stage)
        s.kv_len = end
        self.stats["prefill_tokens"] += end - start
        if end < len(s.prompt):
            return
        self._prefill = None
        self._store(s.prompt, [b[0, :, :end] for b in self._stage])
        if self._accept(s, logits[0]):
            self._resolve(s, s.reason or "length")
            return
        row = len(self._active)
        for dst, src in zip(self._batch, self._stage, strict=False):
            dst[row, :, :end] = src[0, :, :end]
        self._active.append(s)

    # -- decode -------------------------------------------------------------------------

    def _decode_step(self) -> None:
        np = self._np
        n = len(self._active)
        lens = np.array([s.kv_len for s in self._active], np.int64)
        ids = np.array([[s.tokens[-1]] for s in self._active], np.int64)
        width = int(lens.max()) + 1
        mask = (np.arange(width)[None, :] <= lens[:, None]).astype(np.int64)
        logits = self._run_model(ids, mask, [b[:n] for b in self._batch])
        self.stats["steps"] += 1
        self.stats["peak_batch"] = max(self.stats["peak_batch"], n)
        done = []
        for i, s in enumerate(self._active):
            s.kv_len += 1
            if self._accept(s, logits[i]):
                done.append(i)
        for i in reversed(done):
            self._finish_row(i)

    def _accept(self, s: _Seq, logits: Any) -> bool:
        """Sample the next token of ``s`` from its logits; True when ``s`` is finished."""
        token, logprob = self._sample(s, logits)
        s.tokens.append(token)
        if s.params.logprobs:
            s.logprobs.append(logprob)
        self.stats["tokens"] += 1
        if s.on_token is not None:
            s.on_token(token)
        if token in self.eos_ids:
            s.reason = "eos"
        elif s.params.stop and self._hit_stop(s):
            s.reason = "stop"
        elif len(s.tokens) >= s.params.max_new or s.kv_len + 1 >= self.max_context:
            s.reason = "length"
        return s.reason is not None

    def _sample(self, s: _Seq, logits: Any) -> tuple[int, float]:
        np = self._np
        logits = logits.astype(np.float64)
        p = s.params
        if p.temperature <= 0:
            token = int(logits.argmax())
        else:
            z = logits / p.temperature
            probs = np.exp(z - z.max())
            probs /= probs.sum()
            if p.top_p < 1.0:
                order = np.argsort(-probs)
                keep = int(np.searchsorted(np.cumsum(probs[order]), p.top_p)) + 1
                chosen = order[:keep]
                token = int(chosen[s.rng.choice(keep, p=probs[chosen] / probs[chosen].sum())])
            else:
                token = int(s.rng.choice(probs.size, p=probs))
        logprob = 0.0
        if p.logprobs:  # of the raw distribution, before temperature (as transformers reports)
            shifted = logits - logits.max()
            logprob = float(shifted[token] - np.log(np.exp(shifted).sum()))
        return token, logprob

    def _hit_stop(self, s: _Seq) -> bool:
        """Whether a stop string ends the text so far (only the tail is decoded)."""
        window = max(len(x) for x in s.params.stop) + 8
        tail = self._decode(s.tokens[-window:])
        return any(x and x in tail for x in s.params.stop)

    def _finish_row(self, i: int) -> None:
        s = self._active[i]
        held = [b[i, :, :s.kv_len] for b in self._batch]
        self._store(s.prompt + s.tokens[:s.kv_len - len(s.prompt)], held)
        last = len(self._active) - 1
        if i != last:  # keep rows contiguous: the last row moves into the gap
            n = self._active[last].kv_len
            for b in self._batch:
                b[i, :, :n] = b[last, :, :n]
            self._active[i] = self._active[last]
        self._active.pop()
        self._resolve(s, s.reason or "length")

    def _resolve(self, s: _Seq, reason: str) -> None:
        if not s.future.done():
            s.future.set_result(Generation(
                tuple(s.tokens), reason, tuple(s.logprobs) if s.params.logprobs else None,
                s.reused))

    # -- the prefix cache --------------------------------------------------------------

    def _lookup(self, prompt: list[int]) -> tuple[int, _CacheEntry | None]:
        """Positions of ``prompt`` to copy from the cache (chunk-aligned, at least one left)."""
        np = self._np
        best, best_entry, best_key = 0, None, None
        probe = np.asarray(prompt, np.int64)
        for key, entry in self._cache.items():
            n = min(len(entry.tokens), len(probe))
            diff = np.flatnonzero(entry.tokens[:n] != probe[:n])
            common = int(diff[0]) if diff.size else n
            if common > best:
                best, best_entry, best_key = common, entry, key
        usable = min(best, len(prompt) - 1) // self.prefill_chunk * self.prefill_chunk
        if best_key is not None and usable:
            self._cache.move_to_end(best_key)
            return usable, best_entry
        return 0, None

    def _store(self, tokens: list[int], kv: list[Any]) -> None:
        """Keep the keys/values of ``tokens``; drop entries this one extends, then the LRU."""
        np = self._np
        n = len(tokens)
        if n < self.prefill_chunk or not self._cache_budget:
            return
        arr = np.asarray(tokens, np.int64)
        for key, entry in list(self._cache.items()):
            m = len(entry.tokens)
            if m <= n and np.array_equal(entry.tokens, arr[:m]):
                self._cache_bytes -= entry.kv.nbytes
                del self._cache[key]
        stacked = np.stack(kv)  # copies: the rows are about to be reused
        if stacked.nbytes > self._cache_budget:
            return
        while self._cache and self._cache_bytes + stacked.nbytes > self._cache_budget:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= old.kv.nbytes
        self._cache_key += 1
        self._cache[self._cache_key] = _CacheEntry(arr, stacked)
        self._cache_bytes += stacked.nbytes
