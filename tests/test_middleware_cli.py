"""``whetstone serve``: options checked before anything loads, and one real server process
(scripted upstream) answering the ``openai`` client with the library, keys and traces."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from click.testing import CliRunner
from middleware_support import SKILLS
from servers import free_port

from whetstone.cli import cli
from whetstone.engine.errors import AddressInUse, BackendError, ConfigError, ModelNotInstalled
from whetstone.engine.runtime.skills_plugin import SkillsConfig
from whetstone.library_store.store import Library
from whetstone.library_store.traces import TraceStore

REPO = Path(__file__).resolve().parent.parent


def test_a_missing_keys_file_stops_serve_before_loading(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["serve", "--model", "scripted:", "--api-keys-file",
                                 str(tmp_path / "nope")])
    assert r.exit_code == 2 and "cannot read the API keys file" in r.output


def test_bad_limits_are_usage_errors() -> None:
    for args in (["--queue", "-1"], ["--max-body-bytes", "0"], ["--upstream-timeout", "0"],
                 ["--skills-k", "0"], ["--skills-min-score", "1.5"],
                 ["--skills-min-score", "high"]):
        r = CliRunner().invoke(cli, ["serve", "--upstream", "scripted:", *args])
        assert r.exit_code == 2, (args, r.output)


def test_a_port_in_use_has_its_own_exit_code(tmp_path: Path) -> None:
    """Not 3 ("model missing", uvicorn's start-up failure): 10, with what to do."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = CliRunner().invoke(cli, ["serve", "--model", "scripted:", "--port", str(port),
                                     "--library", str(tmp_path / "lib")])
    assert r.exit_code == AddressInUse.exit_code == 10, r.output
    assert f"127.0.0.1:{port}" in r.output and "--port" in r.output
    assert len({AddressInUse.exit_code, ModelNotInstalled.exit_code, ConfigError.exit_code,
                BackendError.exit_code}) == 4


def test_skills_options_reach_the_retriever(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    import whetstone.engine.server.app as app_module

    lib = Library.open(tmp_path / "lib", create=True)
    lib.commit(SKILLS, method="test", message="skills")
    served: list[dict[str, Any]] = []
    monkeypatch.setattr(app_module, "serve", lambda backend, **kw: served.append(kw))
    for args in (["--skills-k", "2", "--skills-min-score", "0.6"],
                 ["--skills-min-score", "none"], []):
        r = CliRunner().invoke(cli, ["serve", "--model", "scripted:", "--library",
                                     str(lib.root), "--port", str(free_port()), *args])
        assert r.exit_code == 0, r.output
    got = [(kw["adapter"].plugins[0].config.k, kw["adapter"].plugins[0].config.min_score,
            kw["adapter"].plugins[0].retriever.min_score) for kw in served]
    default = SkillsConfig()
    assert got == [(2, 0.6, 0.6), (default.k, None, None),
                   (default.k, default.min_score, default.min_score)]


@pytest.mark.integration
def test_whetstone_serve_end_to_end(tmp_path: Path) -> None:
    lib = Library.open(tmp_path / "lib", create=True)
    lib.commit(SKILLS, method="test", message="skills")
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps({"replies": ["first answer", "second answer"]}))
    port = free_port()
    env = {**os.environ, "WHETSTONE_API_KEY": "", "OPENAI_API_KEY": ""}
    proc = subprocess.Popen(
        [sys.executable, "-m", "whetstone", "serve", "--upstream", f"scripted:{replies}",
         "--library", str(lib.root), "--port", str(port), "--served-name", "tiny",
         "--api-key", "sk-test", "--max-body-bytes", "4000", "--queue", "4"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"whetstone serve did not start:\n{proc.stdout.read()}")
            time.sleep(0.2)
        health = httpx.get(base + "/health", timeout=5,  # the library's state: keyed only
                           headers={"authorization": "Bearer sk-test"}).json()
        assert health["library_version"] == "v2" and health["recording"] is True
        c = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0, timeout=30)
        raw = c.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "2.5 hours in minutes?"}])
        assert raw.parse().choices[0].message.content == "first answer"
        assert raw.headers["x-whetstone-library-version"] == "v2"
        trace_id = raw.headers["x-whetstone-trace-id"]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base + "/v1", api_key="sk-bad", max_retries=0).models.list()
        big = httpx.post(base + "/v1/chat/completions", timeout=10,
                         headers={"authorization": "Bearer sk-test"},
                         json={"model": "tiny", "messages": [{"role": "user",
                                                              "content": "x" * 5000}]})
        assert big.status_code == 413
        fb = httpx.post(base + "/v1/feedback", timeout=10,
                        headers={"authorization": "Bearer sk-test"},
                        json={"trace_id": trace_id, "score": 1})
        assert fb.status_code == 200, fb.text
        # A request no skill is about gets none of their bodies (the skills floor).
        hello = c.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "say hello world"}])
        hello_id = hello.headers["x-whetstone-trace-id"]
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: uvicorn shuts down, the trace queue drains
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode in (0, 130), out
    assert "Traceback" not in out, out
    trace = TraceStore(lib.root / "traces").get(trace_id)
    assert trace.answer == "first answer" and trace.score == 1.0
    assert trace.meta["skills"]["shown"] == ["unit-conversion"]
    hello_trace = TraceStore(lib.root / "traces").get(hello_id)
    assert hello_trace.meta["skills"]["shown"] == [] and hello_trace.answer == "second answer"
