"""The code passes the project's ruff rules (pyproject.toml), so `make lint` stays clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_ruff_is_clean() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    exe = str(ruff) if ruff.exists() else shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed: pip install -e '.[dev]'")
    res = subprocess.run([exe, "check", "--output-format", "concise", "."], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
