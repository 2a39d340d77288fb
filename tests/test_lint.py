"""The code passes the project's ruff rules (pyproject.toml), so `make lint` stays clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.integration
def test_ruff_is_clean() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    exe = str(ruff) if ruff.exists() else shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed: pip install -e '.[dev]'")
    res = subprocess.run([exe, "check", "--output-format", "concise", "."], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_logger_is_under_whetstone() -> None:
    """One name configures them all (``whetstone -v``, ``logging.getLogger("whetstone")``):
    a logger named after its module (``__name__`` gives ``engine.x``) or anything else
    escapes it."""
    import ast

    bad = []
    for path in [*sorted(p for pkg in ("engine", "skills", "tools", "library_store")
                         for p in (REPO / pkg).rglob("*.py")), REPO / "cli.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "getLogger"):
                continue
            arg = node.args[0] if node.args else None
            name = arg.value if isinstance(arg, ast.Constant) else None
            if not (isinstance(name, str) and (name == "whetstone"
                                               or name.startswith("whetstone."))):
                shown = ast.unparse(arg) if arg is not None else "(the root logger)"
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}: getLogger({shown})")
    assert not bad, "loggers outside 'whetstone.':\n" + "\n".join(bad)
