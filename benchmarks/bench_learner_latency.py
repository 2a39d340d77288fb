"""What a learner beside the server costs the requests it serves (issue 48): the proxy's added
p50 with ``whetstone learn`` paused and running, measured side by side in one interleaved run.

    .venv/bin/python benchmarks/bench_learner_latency.py [--requests 200] [--rounds 4]
        [--delay-ms 50] [--every 20] [--learner-nice 10] [--json]

Processes, as in production: an upstream (``bench_middleware.py``'s: a scripted reply after
``--delay-ms``), ``whetstone serve`` in front of it with a library of the 34 fixture skills and
the memory method on (every request embeds its question and retrieves; every exchange
recorded), and ``whetstone learn`` beside it on the same library (memory, every ``--every``
scored traces, its model the same upstream). A client asks new questions one at a time,
alternating between the upstream itself and the server, and labels each reply through
``/v1/feedback`` (score 1, the reply as the label), so the learner always has new scored
traces and keeps evolving: reading the store, fitting, and running the gate's two runs.

Each round has two blocks of ``--requests`` requests: one with the learner stopped
(``SIGSTOP``) and one with it running (``SIGCONT``), in alternating order, so load from
anything else on the machine falls on both alike. Added p50 is the server's p50 minus the
upstream's within a block; the table gives the median over rounds, and the learner's CPU
seconds over each kind of block (that it worked while it ran). Target: the added p50 grows by
at most 5 ms while the learner runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_middleware import cpu_seconds, free_port, make_library, pct, start

TARGET_MS = 5.0
KEYS = ("bench-a", "bench-b", "bench-c", "bench-d")
PROMPT = "what should I write as the message for the changes I just staged?"


def processes(args: argparse.Namespace, tmp: Path, env: dict[str, str],
              procs: list[subprocess.Popen[str]]) -> tuple[str, str, subprocess.Popen[str]]:
    """Start the upstream, the server and the learner; (upstream URL, server URL, learner)."""
    library = make_library(tmp / "lib")
    keys = tmp / "keys.txt"
    keys.write_text("\n".join(KEYS) + "\n")
    up, port = free_port(), free_port()
    procs.append(start([sys.executable, str(REPO / "benchmarks" / "bench_middleware.py"),
                        "--serve-upstream", str(up), "--delay-ms", str(args.delay_ms),
                        "--upstream-slots", "64"], env, f"http://127.0.0.1:{up}/health",
                       "the upstream", log=tmp / "up.log"))
    upstream = f"http://127.0.0.1:{up}/v1"
    print("starting whetstone serve and whetstone learn …", flush=True)
    procs.append(start([sys.executable, "-m", "whetstone", "serve", "--upstream",
                        f"openai:tiny@{upstream}", "--library", str(library), "--methods",
                        "memory", "--port", str(port), "--api-keys-file", str(keys),
                        "--feedback-rate", "0", "--log-level", "warning"], env,
                       f"http://127.0.0.1:{port}/health", "whetstone serve",
                       log=tmp / "serve.log"))
    log = tmp / "learn.log"
    out = open(log, "w")  # noqa: SIM115 - closed with the process
    learner = subprocess.Popen(
        [sys.executable, "-m", "whetstone", "learn", "--library", str(library), "--method",
         "memory", "--model",
         f"openai:tiny@{upstream}", "--solver", "direct", "--tools", "", "--every",
         str(args.every), "--poll", "0.5", "--lease-ttl", "600", "--nice",
         str(args.learner_nice), "--idle" if args.learner_idle else "--no-idle", "--scorer",
         "normalised"], cwd=REPO, env=env, stdout=out,
        stderr=subprocess.STDOUT, text=True)
    procs.append(learner)
    deadline = time.monotonic() + 300
    while "holds the lease" not in log.read_text(errors="replace"):
        if learner.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"whetstone learn did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.25)
    return upstream, f"http://127.0.0.1:{port}/v1", learner


def ask(http: httpx.Client, url: str, prompt: str, key: str | None) -> tuple[float, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": prompt}]}
    t = time.perf_counter()
    r = http.post(url + "/chat/completions", json=body, headers=headers)
    took = time.perf_counter() - t
    r.raise_for_status()
    return took, r.headers.get("x-whetstone-trace-id", "")


def block(http: httpx.Client, upstream: str, served: str, n: int, run: str
          ) -> tuple[list[float], list[float]]:
    """``n`` new questions to each, alternating; each served reply labelled (untimed)."""
    direct: list[float] = []
    proxy: list[float] = []
    for i in range(n):
        prompt = f"{PROMPT} (ticket {run}-{i})"
        key = KEYS[i % len(KEYS)]
        order = [(upstream, None), (served, key)] if i % 2 else [(served, key), (upstream, None)]
        for url, k in order:
            took, trace = ask(http, url, prompt, k)
            (proxy if k else direct).append(took)
            if k and trace:
                http.post(served + "/feedback", headers={"Authorization": f"Bearer {k}"},
                          json={"trace_id": trace, "score": 1, "label": "reply to " + prompt})
    return direct, proxy


def measure(args: argparse.Namespace, upstream: str, served: str,
            learner: subprocess.Popen[str]) -> dict[str, Any]:
    rows: dict[str, list[dict[str, float]]] = {"paused": [], "running": []}
    with httpx.Client(timeout=120) as http:
        block(http, upstream, served, 10, "warm")
        for r in range(args.rounds):
            order = ["paused", "running"] if r % 2 == 0 else ["running", "paused"]
            for state in order:
                learner.send_signal(signal.SIGSTOP if state == "paused" else signal.SIGCONT)
                cpu, t = cpu_seconds(learner.pid), time.perf_counter()
                direct, proxy = block(http, upstream, served, args.requests,
                                      uuid.uuid4().hex[:6])
                wall = time.perf_counter() - t
                rows[state].append({
                    "direct_p50_ms": pct(direct, 0.5) * 1e3,
                    "proxy_p50_ms": pct(proxy, 0.5) * 1e3,
                    "added_p50_ms": (pct(proxy, 0.5) - pct(direct, 0.5)) * 1e3,
                    "learner_cpu_s": cpu_seconds(learner.pid) - cpu, "wall_s": wall})
            print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        learner.send_signal(signal.SIGCONT)
    out = {state: {k: statistics.median(row[k] for row in got) for k in got[0]}
           for state, got in rows.items()}
    out["growth_ms"] = out["running"]["added_p50_ms"] - out["paused"]["added_p50_ms"]
    return out


def report(result: dict[str, Any], args: argparse.Namespace, steps: list[str],
           evolves: int, load: tuple[float, float]) -> None:
    print(f"\nupstream: {args.delay_ms:g} ms a request · {args.rounds} rounds of "
          f"{args.requests} requests per block, one at a time, new questions, medians · "
          f"server: 34 fixture skills + memory, traces recorded, each reply labelled · learner: "
          f"memory every {args.every} scored traces, nice {args.learner_nice}"
          f"{', SCHED_IDLE' if args.learner_idle else ''} · load average "
          f"{load[0]:.2f} at start, {load[1]:.2f} at the end, {os.cpu_count()} CPUs\n")
    print("| learner | upstream p50 | whetstone serve p50 | added p50 | learner CPU over the "
          "block |")
    print("|---|---|---|---|---|")
    for state in ("paused", "running"):
        r = result[state]
        print(f"| {state} | {r['direct_p50_ms']:.1f} ms | {r['proxy_p50_ms']:.1f} ms | "
              f"{r['added_p50_ms']:+.1f} ms | {r['learner_cpu_s']:.1f} s of "
              f"{r['wall_s']:.0f} s |")
    growth = result["growth_ms"]
    print(f"\nadded p50 grows by {growth:+.1f} ms while the learner runs (target <= "
          f"{TARGET_MS:g} ms): {'met' if growth <= TARGET_MS else 'NOT met'}")
    counted = {s: steps.count(s) for s in sorted(set(steps))}
    print(f"learner: {evolves} evolves started over the run; steps logged: {counted or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200,
                        help="Requests per block (each to the upstream and to the server).")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--every", type=int, default=20,
                        help="The learner evolves after this many new scored traces.")
    parser.add_argument("--learner-nice", type=int, default=10)
    parser.add_argument("--learner-idle", action=argparse.BooleanOptionalAction, default=True,
                        help="Run the learner in SCHED_IDLE (whetstone learn's default).")
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON too.")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-learner-"))
    env = {**os.environ, "WHETSTONE_HOME": str(tmp / "home"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "OPENAI_API_KEY": ""}
    procs: list[subprocess.Popen[str]] = []
    load = os.getloadavg()[0]
    try:
        upstream, served, learner = processes(args, tmp, env, procs)
        result = measure(args, upstream, served, learner)
        from whetstone.library_store.learning import LearningState
        from whetstone.library_store.store import Library

        steps = [s.step for s in LearningState(Library.open(tmp / "lib")).steps()]
        evolves = (tmp / "learn.log").read_text(errors="replace").count("] evolving on ")
        report(result, args, steps, evolves, (load, os.getloadavg()[0]))
        if args.json:
            print(json.dumps({**result, "steps": steps, "evolves": evolves}, indent=2))
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGCONT)
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
