"""What recording large requests costs the server's event loop: ``/health`` latency while
big chat requests are answered and recorded, beside the same probe on an idle server.

    .venv/bin/python benchmarks/bench_recording_loop.py [--requests 3] [--messages 2000]
        [--chars 7900] [--probes 40] [--repo PATH] [--json]

``whetstone serve`` (the ``scripted:`` backend answering at once, traces recorded in a
temporary library) in its own process, from this checkout or ``--repo``'s. A probe thread
asks ``/health`` every 50 ms: first ``--probes`` probes on the idle server, then as many as
fit while ``--requests`` bodies of ``--messages`` messages of ``--chars`` characters each
(16 MB by default) are posted one after another and their traces built, cut and written. The table gives each phase's median
and worst probe and the ratio of the loaded figures to the idle ones (issue 36.3: the trace
was built on the loop, and three 16 MB bodies of 480k messages stalled ``/health`` for 17 s
at worst; ``--messages 480000 --chars 1`` sends those: they are now refused with a 400).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx


@contextlib.contextmanager
def _serve(repo: Path, tmp: Path) -> Iterator[tuple[str, Path]]:
    """``whetstone serve`` of the checkout ``repo`` in its own process, recording traces:
    its base URL and its traces folder."""
    replies, lib = tmp / "replies.json", tmp / "lib"
    replies.write_text(json.dumps({"replies": ["ok"] * 1000}))
    env = {**os.environ, "WHETSTONE_HOME": str(tmp / "home"), "WHETSTONE_API_KEY": ""}
    cli = [sys.executable, "-m", "whetstone"]  # run from repo (cwd): its package first
    subprocess.run([*cli, "library", "init", "--library", str(lib)], check=True, env=env,
                   capture_output=True, cwd=repo)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*cli, "serve", "--upstream", f"scripted:{replies}", "--library",
                             str(lib), "--no-library", "--port", str(port), "--log-level",
                             "warning"], env=env, cwd=repo, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(base + "/health", timeout=2).raise_for_status()
                break
            if proc.poll() is not None:
                raise SystemExit(f"whetstone serve in {repo} did not start")
            time.sleep(0.2)
        yield base, lib / "traces"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _probe(base: str, count: int | None, stop: threading.Event) -> list[float]:
    took: list[float] = []
    with httpx.Client(timeout=120) as client:
        while not stop.is_set() and (count is None or len(took) < count):
            start = time.perf_counter()
            client.get(base + "/health").raise_for_status()
            took.append(time.perf_counter() - start)
            time.sleep(0.05)
    return took


def measure(repo: Path, requests: int, messages: int, chars: int, probes: int
            ) -> dict[str, Any]:
    from whetstone.library_store.traces import TraceStore

    body = json.dumps({"messages": [
        {"role": "user", "content": "x" * chars} for _ in range(messages)]}).encode()
    with tempfile.TemporaryDirectory() as tmp, _serve(repo, Path(tmp)) as (base, traces):
        idle = _probe(base, probes, threading.Event())
        stop, loaded = threading.Event(), []
        prober = threading.Thread(target=lambda: loaded.extend(_probe(base, None, stop)))
        prober.start()
        ids, started = [], time.perf_counter()
        with httpx.Client(timeout=300) as client:
            for _ in range(requests):
                r = client.post(base + "/v1/chat/completions", content=body,
                                headers={"Content-Type": "application/json"})
                if r.status_code != 400:  # a body over the request's item cap is refused
                    r.raise_for_status()
                    ids.append(r.headers["X-Whetstone-Trace-Id"])
        store = TraceStore(traces)
        while any(store.find(i) is None for i in ids):
            time.sleep(0.05)
        recorded_s = time.perf_counter() - started
        stop.set()
        prober.join()
    return {"idle": idle, "loaded": loaded, "recorded_s": recorded_s,
            "body_mb": len(body) / 1e6, "refused": requests - len(ids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--chars", type=int, default=7900)
    parser.add_argument("--probes", type=int, default=40)
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the checkout whose `whetstone serve` is measured (another "
                             "revision's files, e.g. from `git archive`, for a baseline)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = measure(args.repo, args.requests, args.messages, args.chars, args.probes)
    idle, loaded = out["idle"], out["loaded"]
    rows = {"idle": (statistics.median(idle), max(idle)),
            "recording": (statistics.median(loaded), max(loaded))}
    if args.json:
        print(json.dumps({k: {"p50_ms": v[0] * 1e3, "max_ms": v[1] * 1e3}
                          for k, v in rows.items()} | {"recorded_s": out["recorded_s"]}))
        return
    print(f"{args.requests} bodies of {out['body_mb']:.1f} MB ({args.messages} messages), "
          f"{out['refused']} refused (400), the rest answered and recorded, in "
          f"{out['recorded_s']:.2f} s; /health probes:")
    print(f"{'phase':<10} {'probes':>6} {'p50 ms':>8} {'max ms':>8}")
    for name, (p50, worst) in rows.items():
        n = len(idle if name == "idle" else loaded)
        print(f"{name:<10} {n:>6} {p50 * 1e3:>8.1f} {worst * 1e3:>8.1f}")
    (i50, imax), (l50, lmax) = rows["idle"], rows["recording"]
    print(f"ratio recording/idle: p50 {l50 / i50:.1f}x, max {lmax / imax:.1f}x")


if __name__ == "__main__":
    main()
