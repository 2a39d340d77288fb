"""``/metrics``: counters, gauges and histograms in the Prometheus text format (version 0.0.4).

Written here rather than taken from ``prometheus-client``: the server needs a dozen series, the
exposition format is a few lines of text, and one dependency fewer is one pin fewer. Every
``Metrics`` object is built by the server that owns it (no process-wide registry), so two
servers in one process (the tests run several) never mix their numbers.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

LabelKey = tuple[tuple[str, str], ...]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds; from a cache hit (~1 ms) to a slow generation (2 min).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0, 120.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(key: LabelKey, extra: Iterable[tuple[str, str]] = ()) -> str:
    pairs = [*key, *extra]
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _number(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return str(int(v)) if float(v).is_integer() and abs(v) < 2 ** 53 else repr(float(v))


@dataclass
class _Metric:
    name: str
    help: str
    labelnames: tuple[str, ...] = ()
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _key(self, labels: Mapping[str, object]) -> LabelKey:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {sorted(labels)}")
        return tuple((n, str(labels[n])) for n in self.labelnames)

    def _header(self, kind: str) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {kind}"]


@dataclass
class Counter(_Metric):
    """A value that only goes up, one per label combination."""

    _values: dict[LabelKey, float] = field(default_factory=dict, repr=False)

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        if not 0 <= amount < math.inf:  # NaN fails both comparisons
            raise ValueError(f"{self.name}: a counter cannot go down or by a non-finite step "
                             f"({amount})")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: object) -> float:
        return self._values.get(self._key(labels), 0.0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return self._header("counter") + [f"{self.name}{_labels(k)} {_number(v)}"
                                          for k, v in items]


@dataclass
class Gauge(_Metric):
    """A value read when ``/metrics`` is scraped (``read``), or set by hand."""

    read: Callable[[], float] | None = None
    _value: float = 0.0

    def set(self, value: float) -> None:
        self._value = value

    def value(self) -> float:
        return float(self.read()) if self.read is not None else self._value

    def render(self) -> list[str]:
        return self._header("gauge") + [f"{self.name} {_number(self.value())}"]


@dataclass
class Histogram(_Metric):
    """Observations counted into cumulative ``le`` buckets, with their sum and count."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    _series: dict[LabelKey, tuple[list[int], list[float]]] = field(default_factory=dict,
                                                                    repr=False)

    def observe(self, value: float, **labels: object) -> None:
        key = self._key(labels)
        with self._lock:
            counts, total = self._series.setdefault(key, ([0] * (len(self.buckets) + 1), [0.0]))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    counts[i] += 1
                    break
            else:
                counts[-1] += 1
            total[0] += value

    def count(self, **labels: object) -> int:
        series = self._series.get(self._key(labels))
        return sum(series[0]) if series else 0

    def render(self) -> list[str]:
        out = self._header("histogram")
        with self._lock:
            items = sorted((k, (list(c), t[0])) for k, (c, t) in self._series.items())
        for key, (counts, total) in items:
            running = 0
            for bound, n in zip((*self.buckets, math.inf), counts, strict=False):
                running += n
                out.append(f"{self.name}_bucket{_labels(key, [('le', _number(bound))])} "
                           f"{running}")
            out.append(f"{self.name}_sum{_labels(key)} {_number(total)}")
            out.append(f"{self.name}_count{_labels(key)} {running}")
        return out


class Metrics:
    """The server's series. ``in_flight`` / ``queued`` / ``traces_pending`` are read from the
    objects that know them when scraped."""

    def __init__(self, *, in_flight: Callable[[], float] | None = None,
                 queued: Callable[[], float] | None = None,
                 traces_pending: Callable[[], float] | None = None) -> None:
        self.requests = Counter("whetstone_requests_total",
                                "HTTP requests answered, by route and status code.",
                                ("route", "status"))
        self.latency = Histogram("whetstone_request_duration_seconds",
                                 "Time from request to response end, by route.", ("route",))
        self.upstream_latency = Histogram(
            "whetstone_upstream_duration_seconds",
            "Time the upstream model took per call (a stream: until its last chunk).",
            ("stream",))
        self.retrieval_latency = Histogram(
            "whetstone_retrieval_duration_seconds",
            "Time spent adapting a request (retrieving guidance and injecting it).")
        self.tokens = Counter("whetstone_tokens_total",
                              "Tokens reported by the upstream, by kind.", ("kind",))
        self.errors = Counter("whetstone_errors_total",
                              "Requests answered with an error, by error code.", ("code",))
        self.library = Counter("whetstone_library_requests_total",
                               "Chat requests by whether the library was applied.",
                               ("applied",))
        self.traces_written = Counter("whetstone_traces_written_total",
                                      "Exchanges stored as traces.")
        self.trace_errors = Counter("whetstone_trace_write_errors_total",
                                    "Traces that could not be stored (see the server log).")
        self.feedback = Counter("whetstone_feedback_total", "Feedback labels stored.")
        self.in_flight = Gauge("whetstone_requests_in_flight",
                               "Chat requests admitted and not yet answered.", read=in_flight)
        self.queued = Gauge("whetstone_queue_depth",
                            "Chat requests waiting for an upstream slot.", read=queued)
        self.traces_pending = Gauge("whetstone_traces_pending",
                                    "Traces queued for the background writer.",
                                    read=traces_pending)
        self.connections_open = Gauge("whetstone_connections_open",
                                      "Client connections open (whetstone serve only).")
        self.connections_closed = Counter(
            "whetstone_connections_closed_total",
            "Client connections the server closed on its own, by reason: max_connections and "
            "max_per_ip (refused when accepted), header_timeout (headers too slow).",
            ("reason",))
        self.feedback_limited = Counter(
            "whetstone_feedback_rate_limited_total",
            "Feedback refused (429) by the per-key rate limit (--feedback-rate).")
        self.canary_requests = Counter(
            "whetstone_canary_requests_total",
            "Chat requests routed while a canary ran, by arm (canary or current).", ("arm",))
        # More families rendered after these, read when scraped (the library's learning
        # state: engine/server/canary.py).
        self.extra: list[Callable[[], list[str]]] = []

    def all(self) -> list[Counter | Gauge | Histogram]:
        return [self.requests, self.latency, self.upstream_latency, self.retrieval_latency,
                self.tokens, self.errors, self.library, self.traces_written, self.trace_errors,
                self.feedback, self.feedback_limited, self.canary_requests, self.in_flight,
                self.queued, self.traces_pending, self.connections_open,
                self.connections_closed]

    def render(self) -> str:
        """The exposition text, one metric family after another."""
        lines: list[str] = []
        for metric in self.all():
            lines.extend(metric.render())
        for more in self.extra:
            lines.extend(more())
        return "\n".join(lines) + "\n"
