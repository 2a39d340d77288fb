"""Issue 44 (Hardening IV), the trace store and its borders: future-dated records (finding 3),
deeply nested JSON in ``traces import`` (8), what an import's drops cost (9), ``--otel-file``
through a link (10) and a replica killed after its reply (11).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner
from fastapi import FastAPI
from fastapi import Request as HttpRequest

from whetstone.cli import cli
from whetstone.engine.server.adapter import Adapted
from whetstone.engine.server.exchange import chat_trace
from whetstone.engine.types import Completion, Message, Request, Trace
from whetstone.library_store.store import Library
from whetstone.library_store.trace_import import import_traces
from whetstone.library_store.traces import TraceStore

Y2100 = 4_102_444_800.0  # 2100-01-01


def chat(i: int, body: str = "", started: float | None = None) -> Trace:
    """A served exchange whose user message is ``body`` (as the server records it)."""
    adapted = Adapted(Request(messages=(Message("user", f"q{i} {body}"),)))
    return chat_trace(f"t{i:05d}", adapted, model="m",
                      started=time.time() if started is None else started,
                      completion=Completion(text=f"a{i}"))


def log_line(i: int, created: float, content: str = "") -> str:
    return json.dumps({"id": f"req-{i}", "created": created, "messages": [
        {"role": "user", "content": f"What is {i} + 1? {content}"},
        {"role": "assistant", "content": str(i + 1)}]})


# --- finding 3: future-dated records -------------------------------------------------------

def test_an_import_skips_records_that_start_in_the_future(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join([log_line(1, time.time() - 60), log_line(2, Y2100),
                              log_line(3, time.time() + 3600), log_line(4, 1e300),
                              log_line(5, -1e300)]) + "\n")
    store = TraceStore(tmp_path / "traces")
    report = import_traces(store, [log])
    assert len(report.imported) == 2  # now, and an hour ahead (a clock a little off)
    assert [s.split(": ", 1)[0] for s in report.skipped] == [f"{log}:2", f"{log}:4",
                                                             f"{log}:5"]
    assert "2100-01-01 00:00 UTC, in the future" in report.skipped[0]
    assert not any(p.name.startswith("2100") for p in store.files())


def test_the_store_evicts_by_write_time_not_by_the_day_a_record_claims(tmp_path: Path
                                                                        ) -> None:
    store = TraceStore(tmp_path / "traces", max_bytes=256 * 1024)
    # Through the Python API a record may claim any time: 2100 fills the store first.
    for i in range(80):
        store.append(chat(i, "f" * 4000, started=Y2100 + i))
    time.sleep(0.05)  # the next files are written later, whatever the file system's clock tick
    for i in range(100, 400):
        store.append(chat(i, "y" * 4000))
    kept = store.latest()
    assert "t00399" in kept and "t00398" in kept  # the newest real traces stay
    assert not any(f"t{i:05d}" in kept for i in range(80))  # 2100 went first, as written first
    assert store.size() <= 256 * 1024
    # They age out too: keep_days reads when a file was written, not the day it is named.
    store = TraceStore(tmp_path / "aged", max_bytes=0)
    store.append(chat(1, started=Y2100))
    assert store.prune(keep_days=7, now=time.time() + 8 * 86400)
    assert store.latest() == {}


# --- finding 8: deeply nested JSON ---------------------------------------------------------

def test_deeply_nested_json_is_a_malformed_record_listed_and_skipped(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    nested_args = json.dumps({"id": "req-9", "messages": [
        {"role": "user", "content": "call it"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "f", "arguments": "[" * 5000 + "]" * 5000}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
        {"role": "assistant", "content": "done"}]})
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join([log_line(1, time.time()), '{"messages": ' + deep + "}",
                              json.dumps({"messages": json.loads("[" * 300 + "]" * 300)}),
                              nested_args, log_line(5, time.time())]) + "\n")
    otlp = tmp_path / "spans.json"
    otlp.write_text('{"resourceSpans": ' + deep + "}\n")
    lib = Library.init(tmp_path / "lib")
    res = CliRunner().invoke(cli, ["traces", "import", str(log), str(otlp), "--library",
                                   str(lib.root), "--json"])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    assert "Traceback" not in res.output and "RecursionError" not in res.output
    assert res.exit_code == 11, res.output  # some records skipped
    report = json.loads(res.stdout)
    assert report["imported"] == 3  # lines 1, 4 (its arguments kept as text) and 5
    where = [s.split(": ", 1)[0] for s in report["skipped"]]
    assert f"{log}:2" in where and f"{log}:3" in where
    assert any(s.startswith(str(otlp)) and "nested deeper" in s for s in report["skipped"])
    assert sum("nested deeper than 200 levels" in s for s in report["skipped"]) >= 3


# --- finding 9: the import report says what the size cap dropped ---------------------------

def test_the_import_report_counts_evictions_and_what_is_still_stored(tmp_path: Path) -> None:
    lib = Library.init(tmp_path / "lib")
    lib.update_settings(trace_max_bytes=300_000, trace_max_record_bytes=8192)
    store = Library.open(lib.root).traces
    for i in range(30):
        store.append(chat(i, "w" * 3000))
    own = set(store.latest())
    time.sleep(0.05)
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(log_line(i, time.time(), "z" * 3000) for i in range(300)) + "\n")
    res = CliRunner().invoke(cli, ["traces", "import", str(log), "--library", str(lib.root),
                                   "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    stored = set(Library.open(lib.root).traces.latest())
    assert report["imported"] == 300
    assert report["kept"] == len(stored & set(report["ids"])) < 300
    assert report["evicted"] == len(own - stored) == 30
    text = CliRunner().invoke(cli, ["traces", "import", str(log), "--library", str(lib.root)])
    assert "already there" in text.output  # a re-import of what is kept stores nothing twice
    log.write_text("\n".join(log_line(i, time.time(), "q" * 3000) for i in range(1000, 1300)))
    text = CliRunner().invoke(cli, ["traces", "import", str(log), "--library", str(lib.root)])
    assert "of the 300 imported are stored" in text.output, text.output


# --- finding 10: --otel-file through a link ------------------------------------------------

def test_the_otel_file_is_never_a_link_nor_a_fifo(tmp_path: Path) -> None:
    import os

    from whetstone.library_store.otel_export import _file_exporter

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "spans.jsonl"
    link.symlink_to(victim)
    replies = tmp_path / "r.json"
    replies.write_text(json.dumps({"replies": ["Final Answer: 4"]}))
    res = CliRunner().invoke(cli, ["run", "2 + 2?", "--model", f"scripted:{replies}",
                                   "--otel-file", str(link), "--tools", ""])
    assert res.exit_code == 2, res.output
    assert "symbolic link" in res.output and victim.read_text() == "precious\n"
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    res = CliRunner().invoke(cli, ["run", "2 + 2?", "--model", f"scripted:{replies}",
                                   "--otel-file", str(fifo), "--tools", ""])
    assert res.exit_code == 2 and "not a regular file" in res.output, res.output
    # A file swapped for a link after the start is refused at the next batch.
    out = tmp_path / "ok.jsonl"
    exporter = _file_exporter(out)
    assert exporter.export([]).name == "SUCCESS" and out.read_text().count("\n") == 1
    out.unlink()
    out.symlink_to(victim)
    assert exporter.export([]).name == "FAILURE"
    assert victim.read_text() == "precious\n"


# --- finding 11: kill -9 of a replica loses no acknowledged trace --------------------------

def _echo_upstream() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat_reply(request: HttpRequest) -> dict[str, object]:
        body = await request.json()
        return {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop", "message": {
                    "role": "assistant", "content": "echo"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}

    return app


def test_a_replica_killed_after_its_replies_has_stored_every_acknowledged_trace(
        tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from servers import free_port, running_server, wait_healthy

    lib = Library.open(tmp_path / "lib", create=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "replica.log"
    env = {**os.environ, "WHETSTONE_API_KEY": "", "OPENAI_API_KEY": ""}
    with running_server(_echo_upstream()) as upstream, open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "whetstone", "serve", "--upstream", f"openai:up@{upstream}/v1",
             "--library", str(lib.root), "--port", str(port), "--log-level", "warning"],
            env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_healthy(base, proc, log)

            def one(i: int) -> str:
                res = httpx.post(base + "/v1/chat/completions", timeout=60, json={
                    "model": "up", "messages": [{"role": "user", "content": f"q {i}"}]})
                assert res.status_code == 200, res.text
                return res.headers["x-whetstone-trace-id"]

            with ThreadPoolExecutor(8) as pool:
                acknowledged = list(pool.map(one, range(40)))
            os.kill(proc.pid, signal.SIGKILL)  # at once: the last replies' traces were due
            proc.wait(10)
        finally:
            proc.kill()
    stored = set(Library.open(lib.root).traces.latest())
    assert set(acknowledged) <= stored, f"lost {sorted(set(acknowledged) - stored)}"
