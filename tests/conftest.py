"""Shared fixtures. Every test gets its own Whetstone home; model caches are shared so the
embedded model is dequantized once per machine, not once per test."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg_support import pg_cluster, pg_url  # noqa: F401  the PostgreSQL store's fixtures

REPO = Path(__file__).resolve().parent.parent
SHARED_CACHE = Path(os.environ.get("WHETSTONE_TEST_CACHE", REPO / ".cache" / "whetstone"))

# The scoreboard harness is not part of the package: it lives in benchmarks/, importable as
# scripts there import it (their folder is sys.path[0]).
sys.path.insert(0, str(REPO / "benchmarks"))

# No test may reach a model hub; make any accidental attempt fail fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
# A pytest-xdist worker (make test's -n 2) starts with COLUMNS=80 and LINES=24 in its
# environment, which a plain pytest run has not; the command line reads COLUMNS as a terminal's
# width (piped output is otherwise drawn whole: commands/common.py's PIPED_WIDTH), so tests that
# read a table or a progress line would pass alone and fail on the workers. A test that wants a
# width sets it itself (CliRunner(env={"COLUMNS": ...})).
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)


def pytest_configure(config: pytest.Config) -> None:
    # A suite started in the background by a non-interactive shell (`make test &`, nohup)
    # inherits SIGINT as ignored, and so would every CLI subprocess the Ctrl-C tests start:
    # they would never see the interrupt. Give the children the default disposition back.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def whetstone_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "whetstone-home"
    monkeypatch.setenv("WHETSTONE_HOME", str(home))
    monkeypatch.setenv("WHETSTONE_CACHE", str(SHARED_CACHE))
    # Libraries keep their state in their folder unless a test names a store (pg_url); set,
    # not deleted, so a --store a command line set in this process is undone after the test.
    monkeypatch.setenv("WHETSTONE_STORE", "")
    return home


@pytest.fixture(scope="session")
def embedded_backend() -> Iterator[object]:
    """The real embedded model (Qwen2.5-Coder-0.5B-Instruct), loaded once per session."""
    from whetstone.engine.backends import BackendOptions, get_backend

    backend = get_backend("embedded", BackendOptions(cache_dir=SHARED_CACHE))
    yield backend
    backend.close()
