"""Who sent a label, how fast, and how much it counts: the feedback endpoint's per-key policy.

Live feedback decides which version every user gets (a learner promotes or rolls back a
canary on it, docs/learning.md), so no one client may steer it. Each label is recorded with
the key that sent it (the SHA-256 of its API key; on a server without keys, a hash of the
client's address) and that key's weight; each key may send at most ``rate_per_min`` labels a
minute on each replica (a token bucket: bursts up to that many, then 429 with
``Retry-After``); the learner caps any one key's share of a comparison and decides only what
holds without each key in turn.

Weights come from a JSON file (``--feedback-weights``): ``{"<api key>": 2.0,
"sha256:<hex>": 0.5, "*": 1.0}``, a key by itself or by its SHA-256, ``*`` for every other
key (default 1). A weight of 0 keeps the label on the trace but out of the comparison.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import ConfigError
from .guard import key_hash

DEFAULT_RATE_PER_MIN = 600.0
MAX_TRACKED_KEYS = 100_000  # buckets kept (the least recently used go first)


def address_key(host: str | None) -> str:
    """The feedback key of a client on a server without API keys: a hash of its address."""
    return "addr:" + hashlib.sha256((host or "unknown").encode()).hexdigest()[:32]


def load_feedback_weights(path: Path | str) -> dict[str, float]:
    """``--feedback-weights``: key hash (or ``*``) -> weight; ``ConfigError`` saying what is
    wrong with the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the feedback weights file {path}: "
                          f"{exc.strerror or exc}", hint="pass an existing JSON file") from exc
    except ValueError as exc:
        raise ConfigError(f"the feedback weights file {path} is not JSON: {exc}",
                          hint='write {"<api key>": 2, "sha256:<hex>": 0.5, "*": 1}') from exc
    if not isinstance(data, dict):
        raise ConfigError(f"the feedback weights file {path} must hold a JSON object",
                          hint='e.g. {"<api key>": 2, "*": 1}')
    out: dict[str, float] = {}
    for key, weight in data.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
                or not math.isfinite(weight) or weight < 0:
            raise ConfigError(f"{path}: the weight of {str(key)[:4]}… must be a number >= 0, "
                              f"got {weight!r}")
        name = key if key == "*" else key[len("sha256:"):] if key.startswith("sha256:") \
            else key_hash(key)
        out[name] = float(weight)
    return out


class FeedbackPolicy:
    """Rate limit and weight per feedback key (see the module docstring). ``rate_per_min``
    0 lifts the limit. Thread-safe."""

    def __init__(self, rate_per_min: float = DEFAULT_RATE_PER_MIN,
                 weights: Mapping[str, float] | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate_per_min < 0 or not math.isfinite(rate_per_min):
            raise ConfigError(f"the feedback rate must be 0 or more a minute, got "
                              f"{rate_per_min}", hint="e.g. --feedback-rate 600 (0: no limit)")
        self.rate_per_min = rate_per_min
        self.weights = dict(weights or {})
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, time
        self._lock = threading.Lock()

    def weight(self, key: str) -> float:
        return self.weights.get(key, self.weights.get("*", 1.0))

    def allow(self, key: str) -> float | None:
        """None when ``key`` may send a label now (one is taken), else the seconds until it
        may."""
        if not self.rate_per_min:
            return None
        per_s = self.rate_per_min / 60.0
        now = self.clock()
        with self._lock:
            tokens, then = self._buckets.pop(key, (self.rate_per_min, now))
            tokens = min(self.rate_per_min, tokens + (now - then) * per_s)
            ok = tokens >= 1.0
            self._buckets[key] = (tokens - 1.0 if ok else tokens, now)
            while len(self._buckets) > MAX_TRACKED_KEYS:
                self._buckets.popitem(last=False)
        return None if ok else (1.0 - tokens) / per_s


__all__ = ["DEFAULT_RATE_PER_MIN", "FeedbackPolicy", "address_key", "load_feedback_weights"]
