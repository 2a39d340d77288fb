"""The fast engine's scheduler (continuous batching, chunked prefill, the prefix cache, stop
strings, deadlines) against a small numpy model whose every answer depends on the keys and
values the scheduler kept for it: a row moved to the wrong place, a prefix copied short or a
position written twice changes the tokens (or trips the model's own position check)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from whetstone.engine.backends.onnx_engine import ModelLayout, OnnxDecoder, SamplingParams
from whetstone.engine.errors import BackendError

VOCAB = 41
EOS = 0


class PositionalModel:
    """next token = sum over the history of token * (position + 1), mod VOCAB.

    It stores each token and its position in the key buffer, as a real model stores keys, and
    reads the whole history back from there: the scheduler must keep every row intact.
    """

    def __init__(self, delay_s: float = 0.0, fail_after: int | None = None) -> None:
        self.delay_s = delay_s
        self.fail_after = fail_after
        self.calls = 0
        self.max_rows = 0

    def __call__(self, ids: Any, mask: Any, buffers: list[Any]) -> Any:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("the model broke")
        if self.delay_s:
            time.sleep(self.delay_s)
        keys = buffers[0]
        rows, width = ids.shape
        self.max_rows = max(self.max_rows, rows)
        logits = np.zeros((rows, VOCAB), np.float32)
        for r in range(rows):
            total = int(mask[r].sum())
            past = total - width
            keys[r, 0, past:total, 0] = ids[r]
            keys[r, 0, past:total, 1] = np.arange(past, total)
            history = keys[r, 0, :total]
            assert (history[:, 1] == np.arange(total)).all(), "a position went missing"
            nxt = int((history[:, 0] * (np.arange(total) + 1)).sum()) % VOCAB
            logits[r, nxt] = 4.0
            logits[r, (nxt + 1) % VOCAB] = 3.0  # a runner-up, so sampling has a choice
        return logits


def reference(prompt: list[int], max_new: int) -> list[int]:
    history, out = list(prompt), []
    while len(out) < max_new:
        nxt = sum(t * (p + 1) for p, t in enumerate(history)) % VOCAB
        out.append(nxt)
        history.append(nxt)
        if nxt == EOS:
            break
    return out


def text_of(ids: list[int]) -> str:
    return "".join(chr(ord("a") + t % 26) for t in ids)


LAYOUT = ModelLayout(layers=1, kv_heads=1, head_dim=2, context=4096, eos_ids=frozenset({EOS}))


@pytest.fixture
def make() -> Iterator[Any]:
    made: list[OnnxDecoder] = []

    def build(model: Any = None, **settings: Any) -> OnnxDecoder:
        settings.setdefault("prefill_chunk", 16)
        decoder = OnnxDecoder(LAYOUT, model or PositionalModel(), decode=text_of, **settings)
        made.append(decoder)
        return decoder

    yield build
    for d in made:
        d.close()


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(1, VOCAB, size=int(rng.integers(3, 90)))]
            for _ in range(n)]


def test_concurrent_requests_are_batched_and_exact(make: Any) -> None:
    model = PositionalModel()
    decoder = make(model, max_batch=4)
    work = prompts(24)

    def one(p: list[int]) -> list[int]:
        future, _ = decoder.submit(p, SamplingParams(max_new=40))
        return list(future.result(timeout=60).tokens)

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, work))
    assert got == [reference(p, 40) for p in work]
    assert model.max_rows == 4 == decoder.stats["peak_batch"]  # rows decoded together


def test_a_shared_prefix_is_reused_chunk_aligned_and_stays_exact(make: Any) -> None:
    decoder = make(prefill_chunk=8)
    system = [int(x) for x in np.arange(1, 40) % VOCAB]
    first = decoder.submit(system + [5, 6], SamplingParams(max_new=6))[0].result(timeout=30)
    assert first.reused_tokens == 0
    follow = system + [5, 6] + list(first.tokens) + [7, 8, 9]
    second = decoder.submit(follow, SamplingParams(max_new=12))[0].result(timeout=30)
    assert second.reused_tokens > len(system) and second.reused_tokens % 8 == 0
    assert list(second.tokens) == reference(follow, 12)
    other = decoder.submit(system + [11], SamplingParams(max_new=5))[0].result(timeout=30)
    assert other.reused_tokens == 32  # the system prompt, down to a chunk boundary
    assert list(other.tokens) == reference(system + [11], 5)


def test_long_prompts_grow_the_buffers_while_others_decode(make: Any) -> None:
    decoder = make(max_batch=3)
    short = decoder.submit([3, 4, 5], SamplingParams(max_new=200))[0]
    time.sleep(0.05)
    long_prompt = [int(x) for x in (np.arange(600) % (VOCAB - 1)) + 1]
    long = decoder.submit(long_prompt, SamplingParams(max_new=30))[0]
    assert list(long.result(timeout=60).tokens) == reference(long_prompt, 30)
    assert list(short.result(timeout=60).tokens) == reference([3, 4, 5], 200)


def test_stop_strings_length_and_eos_end_sequences(make: Any) -> None:
    decoder = make()
    p = [1, 2, 3, 4]
    ref = reference(p, 30)
    stop_at = 5
    stop_char = text_of([ref[stop_at]])
    assert stop_char not in text_of(ref[:stop_at])  # the prompt is chosen so this holds
    got = decoder.submit(p, SamplingParams(max_new=30, stop=(stop_char,)))[0].result(timeout=30)
    assert got.reason == "stop" and list(got.tokens) == ref[:stop_at + 1]
    got = decoder.submit(p, SamplingParams(max_new=3))[0].result(timeout=30)
    assert got.reason == "length" and len(got.tokens) == 3
    ends = next(q for q in prompts(200, seed=1) if EOS in reference(q, 60))
    got = decoder.submit(ends, SamplingParams(max_new=60))[0].result(timeout=30)
    assert got.reason == "eos" and got.tokens[-1] == EOS


def test_seeded_sampling_repeats_and_logprobs_are_reported(make: Any) -> None:
    decoder = make()
    params = SamplingParams(max_new=20, temperature=1.0, seed=7, logprobs=True)
    a = decoder.submit([9, 9, 9], params)[0].result(timeout=30)
    b = decoder.submit([9, 9, 9], params)[0].result(timeout=30)
    assert a.tokens == b.tokens and a.logprobs == b.logprobs
    assert a.logprobs is not None and len(a.logprobs) == len(a.tokens)
    assert all(x <= 0 for x in a.logprobs)
    others = {decoder.submit([9, 9, 9], SamplingParams(max_new=20, temperature=1.0, seed=s))[0]
              .result(timeout=30).tokens for s in range(8)}
    assert len(others) > 1  # the seed matters
    greedy = decoder.submit([9, 9, 9], SamplingParams(max_new=20))[0].result(timeout=30)
    assert list(greedy.tokens) == reference([9, 9, 9], 20)


def test_deadlines_and_cancellation_end_a_sequence_early(make: Any) -> None:
    decoder = make(PositionalModel(delay_s=0.02))
    soon = SamplingParams(max_new=1000, deadline=time.monotonic() + 0.3)
    got = decoder.submit([1, 2], soon)[0].result(timeout=30)
    assert got.reason == "timeout" and 0 < len(got.tokens) < 1000
    future, cancel = decoder.submit([1, 2], SamplingParams(max_new=1000))
    time.sleep(0.2)
    cancel.set()
    got = future.result(timeout=30)
    assert got.reason == "cancelled" and len(got.tokens) < 1000


def test_prompts_too_long_and_empty_are_refused(make: Any) -> None:
    decoder = make(kv_budget_mb=1, max_batch=2)  # 1 MiB / (2 rows * 16 B) = 32768 positions
    assert decoder.max_context == LAYOUT.context
    with pytest.raises(BackendError, match="this engine holds"):
        decoder.submit([1] * LAYOUT.context, SamplingParams(max_new=1))
    with pytest.raises(BackendError, match="empty prompt"):
        decoder.submit([], SamplingParams(max_new=1))


def test_a_model_failure_fails_every_waiter_instead_of_hanging(make: Any) -> None:
    decoder = make(PositionalModel(delay_s=0.05, fail_after=3))
    futures = [decoder.submit([1, 2, 3], SamplingParams(max_new=50))[0] for _ in range(3)]
    for f in futures:
        with pytest.raises(BackendError, match="the model broke"):
            f.result(timeout=30)
    with pytest.raises(BackendError, match="stopped"):
        decoder.submit([1], SamplingParams(max_new=1))


def test_close_fails_what_is_in_flight_and_is_idempotent(make: Any) -> None:
    decoder = make(PositionalModel(delay_s=0.05))
    future, _ = decoder.submit([1, 2, 3], SamplingParams(max_new=10_000))
    started = threading.Event()
    threading.Timer(0.2, started.set).start()
    started.wait()
    decoder.close()
    decoder.close()
    with pytest.raises(BackendError, match="closed"):
        future.result(timeout=30)
    with pytest.raises(BackendError, match="closed"):
        decoder.submit([1], SamplingParams(max_new=1))
