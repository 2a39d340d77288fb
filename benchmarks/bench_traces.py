"""Trace store benchmark: finding one trace by id through the index against reading the whole
store (how feedback found a trace before the index), side by side, at several store sizes.

    .venv/bin/python benchmarks/bench_traces.py [--sizes 100,1000,10000] [--record-kb 8]

For each size it writes that many served-exchange traces (each with a user message of
``--record-kb`` KB), then times, for a known id and an unknown one:
- ``scan``: ``store.latest().get(id)``, the lookup feedback used to do;
- ``index``: ``store.find(id)``, what feedback does now (stat the files, one indexed query, one
  read of the record's line).
It also prints the bytes each record takes on disk (the record cap cuts long contents).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from whetstone.engine.chat.adapter import Adapted
from whetstone.engine.chat.exchange import chat_trace
from whetstone.engine.types import Completion, Message, Request
from whetstone.library_store.traces import TraceStore


def _traces(n: int, kb: int) -> list:
    body = "x" * (kb * 1024)
    out = []
    for i in range(n):
        adapted = Adapted(Request(messages=(Message("user", f"q{i} {body}"),)))
        out.append(chat_trace(f"t{i:07d}", adapted, model="m", started=1.7e9 + i,
                              completion=Completion(text=f"a{i}")))
    return out


def _time(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``fn`` over ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--record-kb", type=int, default=8)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; records of "
          f"{args.record_kb} KB")
    print(f"{'traces':>8} {'store MB':>9} {'B/record':>9} {'scan ms':>9} {'index ms':>9} "
          f"{'ratio':>7} {'unknown: scan ms':>17} {'index ms':>9} {'ratio':>7}")
    for n in (int(x) for x in args.sizes.split(",")):
        _measure(n, args.record_kb)


def _measure(n: int, record_kb: int) -> None:
    """One store of ``n`` traces: lookups of a known and an unknown id, scan against index."""
    with tempfile.TemporaryDirectory() as tmp:
        store = TraceStore(Path(tmp), max_bytes=0)
        store.append_many(_traces(n, record_kb))
        size = store.size()
        known, unknown = f"t{n // 2:07d}", "t-not-there"
        store.find(known)  # the first lookup builds nothing: the writer indexed as it wrote
        repeat = 3 if n >= 10_000 else 10
        scan = _time(lambda: store.latest().get(known), repeat)
        index = _time(lambda: store.find(known), 50)
        scan_u = _time(lambda: store.latest().get(unknown), repeat)
        index_u = _time(lambda: store.find(unknown), 50)
        print(f"{n:>8} {size / 1e6:>9.1f} {size / n:>9.0f} {scan * 1e3:>9.1f} "
              f"{index * 1e3:>9.2f} {scan / index:>6.0f}x {scan_u * 1e3:>17.1f} "
              f"{index_u * 1e3:>9.2f} {scan_u / index_u:>6.0f}x")

if __name__ == "__main__":
    main()
