"""Middleware benchmark: what a proxy in front of a model costs, Whetstone and its peers measured
side by side in one interleaved run.

    .venv/bin/python benchmarks/bench_middleware.py [--peer litellm] [--rounds 3]
        [--requests 200] [--throughput-requests 400] [--concurrency 16] [--delay-ms 50]
        [--upstream-slots 64] [--baseline REV] [--store postgresql://...] [--json]

Processes, as in production: an upstream server (the scripted backend behind Whetstone's own
server: a reply derived from the request after ``--delay-ms``, so only the proxies' cost shows;
``--upstream-slots`` at a time, more than the client's concurrency, so the upstream is never the
bottleneck), and in front of it, each in its own process:

- ``whetstone serve --no-library``: the plain recording proxy;
- ``whetstone serve --library L``: a library of the 34 fixture skills applied to every request,
  every exchange recorded. Asked two ways: ``repeated`` prompts (a small set asked again and
  again: templated requests, retries, the turns of a tool-calling exchange; the guidance comes
  from the adapter's cache) and ``unique`` prompts (every one new: each request embeds its query
  and ranks the skills: the uncached path);
- with ``--peer litellm``: LiteLLM's proxy (one worker), installed by this script into a
  virtualenv of its own on first use (``--peer-venv``), run offline: a random master key, the
  packaged model cost map (``LITELLM_LOCAL_MODEL_COST_MAP``), telemetry off;
- with ``--baseline REV``: ``whetstone serve`` from the git revision REV too (its files as
  ``git archive`` gives them, run with this virtualenv), on unique prompts: a change's cost
  or saving measured in the same run as the code it changes;
- with ``--store postgresql://...``: ``whetstone serve --store URL``, the same library kept in
  PostgreSQL (a schema of its own, ``bench_<random>``, dropped at the end) with its traces
  written there through the server's spool, on unique prompts: its throughput is printed
  beside the folder store's (issue 49's target: at least 0.8x).

Each round measures every configuration, interleaved so that load from anything else on the
machine falls on all alike: latency, ``--requests`` rounds of one request to each configuration
in turn (a rotating order); throughput, a block of ``--throughput-requests`` at
``--concurrency`` per configuration (a rotating order), with the proxy process's CPU time over
the block (psutil, its children included) divided by the requests: the proxy's CPU per request.
The table gives the median over rounds of each figure; ratios are taken within a round.

Targets (issue 18): with the library on unique prompts, added p50 <= 15 ms, CPU per request
<= 12 ms, and throughput >= 2x LiteLLM's. A miss is printed as a miss, beside the machine's
load average: the processes share its CPUs with whatever else runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FIXTURE_SKILLS = REPO / "tests" / "fixtures" / "skills" / "library"
LITELLM_VERSION = "1.108.7"
PROMPTS = [
    "I have a scanned invoice as a PDF and need the line items out of it",
    "this export has duplicate rows and dates in three formats, tidy it up",
    "what should I write as the message for the changes I just staged?",
    "how many kilograms is 150 pounds, and what is 72 Fahrenheit in Celsius?",
    "my regex does not match phone numbers that include an area code, why?",
    "draft a polite email declining the meeting on Friday",
    "the container exits immediately with code 137, what is going on?",
    "plot monthly revenue as a bar chart with labelled axes",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the upstream process --------------------------------------------------------------------

def serve_upstream(port: int, delay_s: float, slots: int) -> None:
    """The upstream: scripted replies derived from the request, after a fixed delay, at most
    ``slots`` at a time (the rest wait in its queue)."""
    import uvicorn

    from whetstone.engine.backends.scripted import ScriptedBackend
    from whetstone.engine.server import create_app

    class Upstream(ScriptedBackend):
        async def acomplete(self, request: Any) -> Any:
            result = await super().acomplete(request)
            self.requests.clear()  # the double keeps every request; a benchmark must not
            return result

    backend = Upstream(responder=lambda r: "reply to " + r.messages[-1].text, delay_s=delay_s,
                       max_concurrency=slots)
    app = create_app(backend, model_name="tiny", max_concurrency=slots)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# --- processes -------------------------------------------------------------------------------

def start(cmd: list[str], env: dict[str, str], health: str, what: str,
          headers: dict[str, str] | None = None, log: Path | None = None, cwd: Path = REPO
          ) -> subprocess.Popen[str]:
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(health, timeout=2, headers=headers).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            tail = log.read_text(errors="replace")[-3000:] if log else ""
            raise SystemExit(f"{what} did not start:\n{tail}")
        time.sleep(0.25)


def checkout(rev: str, into: Path) -> str:
    """The files of git revision ``rev`` under ``into`` (no worktree left behind); its short
    hash."""
    try:
        short = subprocess.run(["git", "rev-parse", "--short", f"{rev}^{{commit}}"], cwd=REPO,
                               check=True, capture_output=True, text=True).stdout.strip()
        into.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", short], cwd=REPO, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None) or exc  # git archive's stderr comes as bytes
        if isinstance(detail, bytes):
            detail = detail.decode(errors="replace")
        raise SystemExit(f"--baseline {rev}: cannot check it out: {detail!s}".strip()) from None
    return short


def make_library(root: Path, store: str | None = None) -> Path:
    from whetstone.library_store.store import Library

    lib = Library.open(root, create=True, store=store)
    changes: dict[str, bytes] = {}
    for skill in sorted(FIXTURE_SKILLS.iterdir()):
        for f in skill.rglob("*"):
            if f.is_file():
                changes[f"skills/{skill.name}/{f.relative_to(skill)}"] = f.read_bytes()
    lib.commit(changes, method="bench", message="fixture skills")
    return root


def litellm_venv(path: Path, version: str) -> Path:
    """The ``litellm`` executable of a virtualenv at ``path``, made and filled on first use
    (pip, from the package index pip is configured with)."""
    exe = path / "bin" / "litellm"
    if exe.exists():
        return exe
    print(f"installing LiteLLM {version} (proxy extras) into {path} …", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q",
                    f"litellm[proxy]=={version}"], check=True)
    return exe


def start_litellm(exe: Path, upstream: str, tmp: Path, env: dict[str, str]
                  ) -> tuple[subprocess.Popen[str], str, str]:
    """LiteLLM's proxy (one worker) in front of ``upstream``, offline; returns the process,
    its base URL and its (random) master key."""
    key = "sk-" + secrets.token_hex(16)
    config = tmp / "litellm.yaml"
    config.write_text(json.dumps({  # JSON is YAML
        "model_list": [{"model_name": "tiny", "litellm_params": {
            "model": "openai/tiny", "api_base": upstream, "api_key": "none"}}],
        "general_settings": {"master_key": key},
        "litellm_settings": {"telemetry": False, "drop_params": True}}))
    port = free_port()
    # Its per-request log lines are its own cost, as in production: LITELLM_LOG as set by the
    # caller (LiteLLM's default when unset); Whetstone runs with --log-level warning.
    lenv = {**env, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
            "DISABLE_ADMIN_UI": "True"}
    proc = start([str(exe), "--config", str(config), "--host", "127.0.0.1", "--port",
                  str(port), "--num_workers", "1", "--telemetry", "False"], lenv,
                 f"http://127.0.0.1:{port}/health/liveliness", "LiteLLM's proxy",
                 log=tmp / "litellm.log")
    return proc, f"http://127.0.0.1:{port}/v1", key


# --- measuring -------------------------------------------------------------------------------

@dataclass
class Config:
    """One configuration: where requests go, which prompts, and the proxy process to watch."""

    name: str
    url: str
    prompts: str  # "repeated" or "unique"
    pid: int | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Round:
    """One configuration's figures in one round."""

    latencies: list[float] = field(default_factory=list)
    rps: float = 0.0
    cpu_ms: float | None = None
    wrong: int = 0


def prompt_for(config: Config, i: int, run: str) -> str:
    if config.prompts == "unique":  # new text every time: never in any cache
        return f"{PROMPTS[i % len(PROMPTS)]} (ticket {run}-{i})"
    return PROMPTS[i % len(PROMPTS)]


async def ask(http: httpx.AsyncClient, config: Config, prompt: str, out: Round) -> float:
    body = {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": prompt}]}
    t = time.perf_counter()
    r = await http.post(config.url + "/chat/completions", json=body, headers=config.headers)
    took = time.perf_counter() - t
    try:
        ok = r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == (
            "reply to " + prompt)
    except (ValueError, KeyError, IndexError, TypeError):
        ok = False
    out.wrong += not ok
    return took


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of process ``pid`` and its children (LiteLLM forks workers)."""
    if pid is None:
        return 0.0
    import psutil

    total = 0.0
    proc = psutil.Process(pid)
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


async def one_round(http: httpx.AsyncClient, configs: list[Config], args: argparse.Namespace,
                    shift: int) -> dict[str, Round]:
    rounds = {c.name: Round() for c in configs}
    run = uuid.uuid4().hex[:6]
    order = configs[shift % len(configs):] + configs[:shift % len(configs)]
    for i in range(args.requests):  # latency: one request to each in turn
        for c in order[i % len(order):] + order[:i % len(order)]:
            rounds[c.name].latencies.append(await ask(http, c, prompt_for(c, i, run + "s"),
                                                      rounds[c.name]))
    for c in order:  # throughput: a block each, the proxy's CPU over it
        sem = asyncio.Semaphore(args.concurrency)

        async def bounded(p: str, c: Config = c, sem: asyncio.Semaphore = sem) -> None:
            async with sem:
                await ask(http, c, p, rounds[c.name])

        prompts = [prompt_for(c, i, run + "t") for i in range(args.throughput_requests)]
        cpu, t = cpu_seconds(c.pid), time.perf_counter()
        await asyncio.gather(*(bounded(p) for p in prompts))
        wall = time.perf_counter() - t
        rounds[c.name].rps = len(prompts) / wall
        if c.pid is not None:
            rounds[c.name].cpu_ms = (cpu_seconds(c.pid) - cpu) / len(prompts) * 1e3
    return rounds


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summarise(configs: list[Config], rounds: list[dict[str, Round]]) -> list[dict[str, Any]]:
    """Median over rounds of each figure; added p50 and ratios are taken within a round."""
    def med(values: list[float | None]) -> float | None:
        kept = [v for v in values if v is not None]
        return statistics.median(kept) if kept else None

    direct = [r["direct"] for r in rounds]
    unique = [r.get(UNIQUE) for r in rounds]
    rows = []
    for c in configs:
        mine = [r[c.name] for r in rounds]
        rows.append({
            "configuration": c.name,
            "p50_ms": med([pct(m.latencies, 0.5) * 1e3 for m in mine]),
            "p99_ms": med([pct(m.latencies, 0.99) * 1e3 for m in mine]),
            "added_p50_ms": med([(pct(m.latencies, 0.5) - pct(d.latencies, 0.5)) * 1e3
                                 for m, d in zip(mine, direct, strict=False)]),
            "rps": med([m.rps for m in mine]),
            "vs_direct": med([m.rps / d.rps for m, d in zip(mine, direct, strict=False)]),
            "vs_folder_unique": med([m.rps / u.rps if u else None
                                     for m, u in zip(mine, unique, strict=False)]),
            "cpu_ms": med([m.cpu_ms for m in mine]),
            "rps_by_round": [round(m.rps, 1) for m in mine],
            "wrong": sum(m.wrong for m in mine),
        })
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace, load: tuple[float, float]
           ) -> None:
    print(f"\nupstream: {args.delay_ms:g} ms a request, {args.upstream_slots} at a time · per "
          f"round and configuration: {args.requests} requests one at a time (interleaved) + "
          f"{args.throughput_requests} at concurrency {args.concurrency} · {args.rounds} "
          f"rounds, medians · library: {len(list(FIXTURE_SKILLS.iterdir()))} skills, traces "
          f"recorded · load average {load[0]:.2f} at start, {load[1]:.2f} at the end, "
          f"{os.cpu_count()} CPUs\n")
    head = (f"| {'configuration':<36} | {'p50':>8} | {'added p50 vs direct':>19} | "
            f"{'p99':>8} | {'r/s':>6} | {'throughput vs direct':>20} | "
            f"{'proxy CPU per request':>21} | {'wrong':>5} |")
    print(head)
    print("|" + "|".join("-" * (len(cell)) for cell in head.split("|")[1:-1]) + "|")

    def ms(v: float | None, sign: bool = False) -> str:
        return "-" if v is None else (f"{v:+.1f} ms" if sign else f"{v:.1f} ms")

    for r in rows:
        direct = r["configuration"] == "direct"
        print(f"| {r['configuration']:<36} | {ms(r['p50_ms']):>8} | "
              f"{'-' if direct else ms(r['added_p50_ms'], True):>19} | {ms(r['p99_ms']):>8} | "
              f"{r['rps']:>6.1f} | {r['vs_direct']:>20.2f} | {ms(r['cpu_ms']):>21} | "
              f"{r['wrong']:>5} |")
    by = {r["configuration"]: r for r in rows}
    unique = by.get(UNIQUE)
    if unique is None:
        return
    print()
    checks = [("added p50", unique["added_p50_ms"], "<= 15 ms", unique["added_p50_ms"] <= 15),
              ("proxy CPU per request", unique["cpu_ms"], "<= 12 ms",
               unique["cpu_ms"] is not None and unique["cpu_ms"] <= 12)]
    lite = by.get("LiteLLM proxy, 1 worker")
    if lite is not None:
        ratio = unique["rps"] / lite["rps"]
        checks.append(("throughput vs LiteLLM", ratio, ">= 2x", ratio >= 2))
    for what, value, target, ok in checks:
        shown = f"{value:.2f}x" if what.endswith("LiteLLM") else ms(value)
        print(f"library, unique prompts: {what} {shown} (target {target}): "
              f"{'met' if ok else 'NOT met'}")
    pg = by.get(PG_UNIQUE)
    if pg is not None:
        ratio = pg["vs_folder_unique"]  # within each round, then the median
        print(f"library, unique prompts, PostgreSQL store against the folder store: throughput "
              f"{ratio:.2f}x (target >= 0.8x): {'met' if ratio >= 0.8 else 'NOT met'}; proxy "
              f"CPU per request {ms(pg['cpu_ms'])} vs {ms(unique['cpu_ms'])}")
    for name, base in by.items():
        if name.startswith(BASELINE_PREFIX):
            print(f"library, unique prompts against {name.split(',')[0]}: proxy CPU per request "
                  f"{ms(unique['cpu_ms'])} vs {ms(base['cpu_ms'])}, throughput "
                  f"{unique['rps'] / base['rps']:.2f}x")


UNIQUE = "whetstone, library, unique prompts"
PG_UNIQUE = "whetstone --store pg, unique prompts"
BASELINE_PREFIX = "whetstone @"


def bench_schema(url: str) -> str:
    """``url`` with a schema of this run's own (``schema=bench_<random>``)."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "schema"]
    query.append(("schema", f"bench_{uuid.uuid4().hex[:10]}"))
    return urlunsplit(parts._replace(query=urlencode(query)))


def drop_schema(url: str) -> None:
    from whetstone.library_store.pg_connect import StoreUrl, psycopg

    parsed = StoreUrl.parse(url)
    with psycopg().connect(parsed.conninfo, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{parsed.schema}" CASCADE')


def configurations(args: argparse.Namespace, tmp: Path, env: dict[str, str],
                   procs: list[subprocess.Popen[str]]) -> list[Config]:
    """Start every process; the configurations in table order."""
    library = make_library(tmp / "lib", store="file")
    up, plain, lib = free_port(), free_port(), free_port()
    procs.append(start([sys.executable, __file__, "--serve-upstream", str(up), "--delay-ms",
                        str(args.delay_ms), "--upstream-slots", str(args.upstream_slots)], env,
                       f"http://127.0.0.1:{up}/health", "the upstream", log=tmp / "up.log"))
    upstream = f"http://127.0.0.1:{up}/v1"
    configs = [Config("direct", upstream, "unique")]
    if "litellm" in args.peer:
        exe = litellm_venv(args.peer_venv, args.litellm_version)
        proc, url, key = start_litellm(exe, upstream, tmp, env)
        procs.append(proc)
        configs.append(Config("LiteLLM proxy, 1 worker", url, "unique", proc.pid,
                              {"Authorization": f"Bearer {key}"}))
    print("starting whetstone serve twice (one loads the embedder, indexes the library) …",
          flush=True)
    common = ["--upstream", f"openai:tiny@{upstream}", "--max-concurrency", "1024", "--queue",
              "4096", "--log-level", "warning"]
    (tmp / "plain").mkdir()  # its traces' home: an empty folder becomes a library
    procs.append(start([sys.executable, "-m", "whetstone", "serve", *common, "--port",
                        str(plain), "--no-library", "--library", str(tmp / "plain")], env,
                       f"http://127.0.0.1:{plain}/health", "whetstone serve --no-library",
                       log=tmp / "plain.log"))
    configs.append(Config("whetstone serve --no-library", f"http://127.0.0.1:{plain}/v1",
                          "unique", procs[-1].pid))
    procs.append(start([sys.executable, "-m", "whetstone", "serve", *common, "--port",
                        str(lib), "--library", str(library)], env,
                       f"http://127.0.0.1:{lib}/health", "whetstone serve", log=tmp / "lib.log"))
    for prompts in ("repeated", "unique"):
        configs.append(Config(f"whetstone, library, {prompts} prompts",
                              f"http://127.0.0.1:{lib}/v1", prompts, procs[-1].pid))
    if args.store:
        port = free_port()
        pg_library = make_library(tmp / "lib-pg", store=args.store)
        procs.append(start([sys.executable, "-m", "whetstone", "serve", *common, "--port",
                            str(port), "--library", str(pg_library), "--store", args.store],
                           env, f"http://127.0.0.1:{port}/health",
                           "whetstone serve --store", log=tmp / "pg.log"))
        configs.append(Config(PG_UNIQUE, f"http://127.0.0.1:{port}/v1", "unique",
                              procs[-1].pid))
    if args.baseline:
        src = tmp / "baseline"
        short = checkout(args.baseline, src)
        port = free_port()
        # Run from its own folder: its packages come first on sys.path, before this checkout's
        # editable install.
        procs.append(start([sys.executable, "-m", "whetstone", "serve", *common, "--port",
                            str(port), "--library", str(make_library(tmp / "lib-baseline"))],
                           env, f"http://127.0.0.1:{port}/health", f"whetstone serve @{short}",
                           log=tmp / "baseline.log", cwd=src))
        configs.append(Config(f"{BASELINE_PREFIX}{short}, unique prompts",
                              f"http://127.0.0.1:{port}/v1", "unique", procs[-1].pid))
    return configs


async def bench(configs: list[Config], args: argparse.Namespace) -> list[dict[str, Any]]:
    # Idle connections expire before uvicorn's 5 s keep-alive does: reusing one the server is
    # closing at that moment is a ReadError, a client artifact that is not what we measure.
    n = args.concurrency * 2 + 8
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n, keepalive_expiry=1.0)
    async with httpx.AsyncClient(limits=limits, timeout=120) as http:
        warm = Round()
        for c in configs:  # warm up every process, and the guidance cache for "repeated"
            for i in range(len(PROMPTS) * 2):
                await ask(http, c, prompt_for(c, i, "warm"), warm)
        if warm.wrong:
            raise SystemExit(f"{warm.wrong} warm-up requests failed: a proxy does not answer "
                             "as the upstream does")
        rounds = []
        for k in range(args.rounds):
            rounds.append(await one_round(http, configs, args, k))
            print(f"  round {k + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    return summarise(configs, rounds)


def main() -> None:
    from whetstone.engine.paths import cache_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200,
                        help="Latency: requests per configuration and round, one at a time.")
    parser.add_argument("--throughput-requests", type=int, default=400,
                        help="Throughput: requests per configuration and round.")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--upstream-slots", type=int, default=64,
                        help="Requests the upstream serves at a time (more than --concurrency: "
                             "the proxies are measured, not the upstream).")
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--peer", action="append", default=[], choices=["litellm"],
                        help="Measure a peer proxy too (installed on first use).")
    parser.add_argument("--litellm-version", default=LITELLM_VERSION)
    parser.add_argument("--peer-venv", type=Path, default=None,
                        help="The peer's virtualenv (default: in Whetstone's cache folder).")
    parser.add_argument("--baseline", metavar="REV", default=None,
                        help="Also serve unique prompts with whetstone as of this git revision "
                             "(e.g. HEAD~1, main): a change measured against what it changes.")
    parser.add_argument("--store", metavar="URL", default=None,
                        help="Also serve the library from this PostgreSQL store (a schema of "
                             "its own, dropped at the end), on unique prompts.")
    parser.add_argument("--json", action="store_true", help="Print the rows as JSON too.")
    parser.add_argument("--serve-upstream", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream is not None:
        serve_upstream(args.serve_upstream, args.delay_ms / 1000, args.upstream_slots)
        return
    args.peer_venv = args.peer_venv or cache_dir() / "bench" / f"litellm-{args.litellm_version}"
    args.store = bench_schema(args.store) if args.store else None
    tmp = Path(tempfile.mkdtemp(prefix="bench-middleware-"))
    env = {**os.environ, "WHETSTONE_HOME": str(tmp / "home"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "ANONYMIZED_TELEMETRY": "False",
           "WHETSTONE_STORE": ""}  # the folder store, unless a command names --store
    procs: list[subprocess.Popen[str]] = []
    load = os.getloadavg()[0]
    try:
        configs = configurations(args, tmp, env, procs)
        rows = asyncio.run(bench(configs, args))
        report(rows, args, (load, os.getloadavg()[0]))
        if args.json:
            print(json.dumps(rows, indent=2))
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if args.store:
            drop_schema(args.store)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
