"""``whetstone serve`` replicas that share no folder, only a PostgreSQL store (issue 49, items
4 and 5): each has its own WHETSTONE_HOME; the library, its versions and the traces live in the
database. Real server processes, a real cluster (pg_support.py), an echo upstream in this
process. Checked: 1,000 requests over 3 replicas with ``whetstone library import`` landing in
the middle lose and double no trace, and a request that starts after the new version's
notification is served with it; PostgreSQL restarted mid-traffic loses nothing while
``/readyz`` reports it; a replica killed with -9 keeps every trace it acknowledged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from middleware_support import SKILLS
from pg_support import CuttingProxy, PgCluster
from servers import free_port, running_server, wait_healthy
from test_replicas import echo_upstream, new_skill_folder

from whetstone.library_store.pg_connect import StoreUrl, psycopg
from whetstone.library_store.store import Library

REPO = Path(__file__).resolve().parent.parent
REQUESTS = 1000
REPLICAS = 3

pytestmark = pytest.mark.timeout(600)


def start_replica(upstream: str, home: Path, url: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "WHETSTONE_HOME": str(home), "WHETSTONE_STORE": url,
           "WHETSTONE_API_KEY": "", "OPENAI_API_KEY": ""}
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "serve.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "whetstone", "serve", "--upstream",
             f"openai:up@{upstream}/v1", "--port", str(port), "--log-level", "warning"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def chat(client: httpx.Client, base: str, text: str) -> tuple[str, str]:
    """(trace id, library version) of one answered chat."""
    res = client.post(base + "/v1/chat/completions", timeout=60,
                      json={"model": "up", "messages": [{"role": "user", "content": text}]})
    assert res.status_code == 200, res.text
    assert res.json()["choices"][0]["message"]["content"] == f"echo {text}"
    return res.headers["x-whetstone-trace-id"], res.headers["x-whetstone-library-version"]


def rows_per_id(url: str) -> Counter[str]:
    parsed = StoreUrl.parse(url)
    with psycopg().connect(parsed.conninfo, autocommit=True,
                           options=f"-c search_path={parsed.schema}") as conn:
        rows = conn.execute("SELECT id, count(*) FROM trace_records GROUP BY id").fetchall()
    return Counter({str(r[0]): int(r[1]) for r in rows})


class Listener:
    """This test's own LISTEN on the library's channel: when each version was announced."""

    def __init__(self, url: str) -> None:
        parsed = StoreUrl.parse(url)
        self.conn = psycopg().connect(parsed.conninfo, autocommit=True)
        self.conn.execute(f"LISTEN {parsed.channel}")
        self.heard: dict[str, float] = {}
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop:
            for note in self.conn.notifies(timeout=0.2):
                self.heard.setdefault(note.payload, time.monotonic())

    def close(self) -> None:
        self._stop = True
        self.thread.join(timeout=5)
        self.conn.close()


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # the trace queue drains on shutdown
    for proc in procs:
        proc.communicate(timeout=120)


@pytest.mark.integration
def test_three_replicas_share_only_the_database(pg_url: str, tmp_path: Path) -> None:
    admin = tmp_path / "admin"
    Library.init(admin / "library", store=pg_url).commit(SKILLS, method="test")  # v2
    incoming = new_skill_folder(tmp_path)
    homes = [tmp_path / f"home-{i}" for i in range(REPLICAS)]
    ports = [free_port() for _ in range(REPLICAS)]
    bases = [f"http://127.0.0.1:{p}" for p in ports]
    listener = Listener(pg_url)
    procs: list[subprocess.Popen[bytes]] = []
    served: list[tuple[int, str, str, float]] = []  # (replica, trace id, version, started)
    lock = threading.Lock()
    imported: dict[str, Any] = {}
    with running_server(echo_upstream()) as upstream:
        try:
            procs = [start_replica(upstream, h, pg_url, p)
                     for h, p in zip(homes, ports, strict=False)]
            for base, proc, home in zip(bases, procs, homes, strict=False):
                wait_healthy(base, proc, home / "serve.log")

            def one(i: int) -> None:
                replica = i % REPLICAS
                started = time.monotonic()
                with httpx.Client() as client:
                    trace_id, version = chat(client, bases[replica], f"kilo and milli? #{i}")
                with lock:
                    served.append((replica, trace_id, version, started))

            def import_when_busy() -> None:
                while len(served) < REQUESTS // 3:
                    time.sleep(0.02)
                done = subprocess.run(
                    [sys.executable, "-m", "whetstone", "library", "import", str(incoming),
                     "--store", pg_url], cwd=REPO, capture_output=True, text=True,
                    env={**os.environ, "WHETSTONE_HOME": str(admin)}, timeout=300,
                    check=False)
                imported.update(code=done.returncode, out=done.stdout + done.stderr)

            importer = threading.Thread(target=import_when_busy)
            importer.start()
            with ThreadPoolExecutor(max_workers=12) as pool:
                list(pool.map(one, range(REQUESTS)))
            importer.join(timeout=300)
            assert imported.get("code") == 0, imported
            deadline = time.monotonic() + 5
            while "v3" not in listener.heard:
                assert time.monotonic() < deadline, "no notification of v3"
                time.sleep(0.01)
            heard = listener.heard["v3"]
            # Every replica's next request serves the new version.
            with httpx.Client() as client:
                nxt = [chat(client, base, "after the import")[1] for base in bases]
            assert nxt == ["v3"] * REPLICAS
        finally:
            listener.close()
            stop(procs)
    assert all(p.returncode in (0, 130) for p in procs)

    # A request that started after the notification reached this machine got v3 on every
    # replica; those that served v2 started before it (or were in flight).
    late_old = [s for s in served if s[2] != "v3" and s[3] > heard]
    assert late_old == []
    per_id = rows_per_id(pg_url)
    ids = [trace_id for _, trace_id, _, _ in served]
    assert len(ids) == len(set(ids)) == REQUESTS
    assert {i: per_id[i] for i in ids if per_id[i] != 1} == {}  # none lost, none doubled
    assert sum(per_id.values()) == REQUESTS + REPLICAS  # and the three "after" requests
    latest = Library.open(admin / "library", store=pg_url).traces.latest()
    assert {latest[i].answer for i in ids} == {f"echo kilo and milli? #{n}"
                                               for n in range(REQUESTS)}
    versions = Counter(v for _, _, v, _ in served)
    assert set(versions) == {"v2", "v3"}, versions
    old_lag = max((s[3] - heard for s in served if s[2] == "v2"), default=0.0)
    print(json.dumps({"replicas": REPLICAS, "requests": REQUESTS,
                      "by_replica": Counter(r for r, _, _, _ in served),
                      "by_version": versions, "traces_stored": len(ids),
                      "last_v2_request_started_s_after_notification": round(old_lag, 4)}))


def traffic(base: str, acked: list[str], stop_at: threading.Event, failures: list[str],
            workers: int = 4) -> list[threading.Thread]:
    """Threads sending chats to ``base`` until ``stop_at``; ``acked`` gets the trace id of
    every 200 reply, ``failures`` the error of every other outcome."""
    def run(w: int) -> None:
        with httpx.Client() as client:
            n = 0
            while not stop_at.is_set():
                n += 1
                try:
                    res = client.post(base + "/v1/chat/completions", timeout=30, json={
                        "model": "up", "messages": [{"role": "user", "content": f"w{w} #{n}"}]})
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))
                    time.sleep(0.05)
                    continue
                if res.status_code == 200:
                    acked.append(res.headers["x-whetstone-trace-id"])
                else:
                    failures.append(f"{res.status_code} {res.text[:200]}")

    threads = [threading.Thread(target=run, args=(w,), daemon=True) for w in range(workers)]
    for t in threads:
        t.start()
    return threads


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def readyz(base: str) -> dict[str, Any]:
    res = httpx.get(base + "/readyz", timeout=10)
    return {"code": res.status_code, **res.json()}


@pytest.mark.integration
def test_postgres_restarted_mid_traffic_loses_and_doubles_nothing(
        pg_cluster: PgCluster, pg_url: str, tmp_path: Path) -> None:
    Library.init(tmp_path / "admin" / "library", store=pg_url).commit(SKILLS, method="test")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    acked: list[str] = []
    failures: list[str] = []
    stop_at = threading.Event()
    with running_server(echo_upstream()) as upstream:
        proc = start_replica(upstream, tmp_path / "home", pg_url, port)
        try:
            wait_healthy(base, proc, tmp_path / "home" / "serve.log")
            assert readyz(base) == {"code": 200, "status": "ready"}
            threads = traffic(base, acked, stop_at, failures)
            wait_for(lambda: len(acked) >= 100, 60, "no traffic")
            pg_cluster.stop()
            down_at = len(acked)
            wait_for(lambda: readyz(base).get("status") == "degraded", 20,
                     "/readyz did not report the outage")
            during = readyz(base)
            wait_for(lambda: len(acked) >= down_at + 100, 60, "no answers while it was down")
            pg_cluster.start()
            wait_for(lambda: readyz(base).get("status") == "ready", 30,
                     "/readyz did not recover")
            wait_for(lambda: len(acked) >= down_at + 200, 60, "no traffic after the restart")
            stop_at.set()
            for t in threads:
                t.join(timeout=60)
        finally:
            stop_at.set()
            stop([proc])
    assert proc.returncode in (0, 130) and failures == []
    assert during["code"] == 200 and "spool" in during["store"]
    assert "postgresql" not in json.dumps(during)  # never the store's address
    per_id = rows_per_id(pg_url)
    assert len(acked) == len(set(acked))
    assert {i: per_id[i] for i in acked if per_id[i] != 1} == {}
    assert not list((tmp_path / "home" / "library" / "traces" / "spool").glob("*.jsonl"))
    print(json.dumps({"acknowledged": len(acked), "while_down": len(acked) - down_at,
                      "stored_once": sum(1 for i in acked if per_id[i] == 1)}))


@pytest.mark.integration
def test_a_replica_killed_with_9_keeps_every_trace_it_acknowledged(
        pg_cluster: PgCluster, pg_url: str, tmp_path: Path) -> None:
    """The store is made unreachable (a proxy that refuses), so traces acknowledged after
    that can only be in the replica's spool; the replica is killed with -9 mid-request and
    started again on the same home: every acknowledged trace reaches the store, once."""
    Library.init(tmp_path / "admin" / "library", store=pg_url).commit(SKILLS, method="test")
    proxy = CuttingProxy(pg_cluster.port)
    via_proxy = proxy.url(StoreUrl.parse(pg_url).schema)
    home = tmp_path / "home"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    acked: list[str] = []
    failures: list[str] = []
    stop_at = threading.Event()
    procs: list[subprocess.Popen[bytes]] = []
    with running_server(echo_upstream()) as upstream:
        try:
            procs.append(start_replica(upstream, home, via_proxy, port))
            wait_healthy(base, procs[0], home / "serve.log")
            threads = traffic(base, acked, stop_at, failures, workers=6)
            wait_for(lambda: len(acked) >= 60, 60, "no traffic")
            proxy.pause()
            paused_at = len(acked)
            wait_for(lambda: len(acked) >= paused_at + 60, 60, "no answers with the store down")
            procs[0].send_signal(signal.SIGKILL)  # requests are in flight
            procs[0].wait(timeout=30)
            stop_at.set()
            for t in threads:
                t.join(timeout=60)
            killed = list(acked)
            missing = [i for i in killed if rows_per_id(pg_url)[i] == 0]
            proxy.resume()
            procs.append(start_replica(upstream, home, via_proxy, port))
            wait_healthy(base, procs[1], home / "serve.log")
            wait_for(lambda: all(rows_per_id(pg_url)[i] for i in killed), 60,
                     "acknowledged traces did not reach the store")
        finally:
            stop_at.set()
            stop(procs)
            proxy.close()
    per_id = rows_per_id(pg_url)
    assert len(killed) == len(set(killed))
    assert len(missing) >= 60  # the spool held them: the test is not vacuous
    assert {i: per_id[i] for i in killed if per_id[i] != 1} == {}
    print(json.dumps({"acknowledged": len(killed), "only_in_the_spool_at_the_kill":
                      len(missing), "in_the_store_after_restart": sum(
                          1 for i in killed if per_id[i] == 1),
                      "requests_cut_by_the_kill": len(failures)}))
