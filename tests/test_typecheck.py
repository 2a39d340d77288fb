"""The product passes mypy at the level pyproject.toml's ``[tool.mypy]`` sets, checked from the
checkout as it is: the product's relative imports resolve by path, and ``-p whetstone`` finds
the package through the links in ``whetstone/`` (docs/architecture.md, "One namespace"), with
no installed finder. No module is exempt from a finding (issue 47 fixed the last ones): a
``[[tool.mypy.overrides]]`` block that disables an error code fails here."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("engine", "skills", "tools", "library_store")
ERROR = re.compile(r"^(?P<path>\S+)\.py:\d+: error: .*\[(?P<code>[a-z-]+)\]$")
CHECKED = re.compile(r"(\d+) source files?\)?$")


def _mypy() -> list[str] | None:
    if importlib.util.find_spec("mypy") is not None:
        return [sys.executable, "-m", "mypy"]
    exe = shutil.which("mypy")
    return [exe] if exe else None


def _exemptions(config: dict) -> dict[str, set[str]]:
    """Module -> the error codes its ``[[tool.mypy.overrides]]`` entry disables."""
    out: dict[str, set[str]] = {}
    for o in config.get("overrides", []):
        for module in [o["module"]] if isinstance(o["module"], str) else o["module"]:
            out.setdefault(module, set()).update(o.get("disable_error_code", ()))
    return {m: codes for m, codes in out.items() if codes}


def _ini_without_exemptions(config: dict) -> str:
    """The same settings as a mypy.ini, less the exemptions: mypy then reports every finding
    and the test tells the known from the new."""
    def value(v: object) -> str:
        return ", ".join(map(str, v)) if isinstance(v, list) else str(v)

    lines = ["[mypy]", *(f"{k} = {value(v)}" for k, v in config.items() if k != "overrides")]
    for o in config.get("overrides", []):
        if "disable_error_code" in o:
            continue
        modules = [o["module"]] if isinstance(o["module"], str) else o["module"]
        lines.append(f"[mypy-{','.join(modules)}]")
        lines += [f"{k} = {value(v)}" for k, v in o.items() if k != "module"]
    return "\n".join(lines) + "\n"


def _module(path: str) -> str:
    return path.replace("/", ".").removesuffix(".__init__")


@pytest.mark.integration
def test_the_product_type_checks_from_the_checkout(tmp_path: Path) -> None:
    exe = _mypy()
    if exe is None:
        pytest.skip("mypy is not installed: pip install -e '.[dev]'")
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    allowed = _exemptions(config)
    assert allowed == {}, ("no module may be exempt from mypy's findings: fix them instead of "
                           f"disabling their codes in pyproject.toml: {allowed}")
    ini = tmp_path / "mypy.ini"
    ini.write_text(_ini_without_exemptions(config))
    # The checkout's own cache (.gitignore'd): a second run reads it and takes seconds.
    res = subprocess.run([*exe, "-p", "whetstone", "--config-file", str(ini),
                          "--cache-dir", str(REPO / ".mypy_cache")], cwd=REPO,
                         capture_output=True, text=True, timeout=900, check=False)
    out = res.stdout + res.stderr
    assert res.returncode in (0, 1), f"mypy did not run:\n{out[-3000:]}"

    found: set[tuple[str, str]] = set()
    new: list[str] = []
    for line in res.stdout.splitlines():
        if ": error: " not in line:
            continue
        m = ERROR.match(line)
        if m is None:  # no code: nothing can exempt it
            new.append(line)
            continue
        key = (_module(m["path"]), m["code"])
        found.add(key)
        if key[1] not in allowed.get(key[0], ()):
            new.append(line)
    assert not new, (
        "mypy finds what the product did not have before: fix it (a finding that only moved "
        "with its code moves its module's name in pyproject.toml's [[tool.mypy.overrides]])"
        ":\n" + "\n".join(new))
    stale = sorted(f"{m}: {c}" for m, codes in allowed.items() for c in codes
                   if (m, c) not in found)
    assert not stale, ("fixed, or the module is gone: drop these from pyproject.toml's "
                       "[[tool.mypy.overrides]] so they stay fixed:\n" + "\n".join(stale))

    # Every file of the product was read under its whetstone.* name (the links followed).
    checked = CHECKED.search(res.stdout.strip().splitlines()[-1])
    files = [*(p for f in FOLDERS for p in (REPO / f).rglob("*.py")),
             *(REPO / "whetstone").glob("*.py")]
    assert checked and int(checked[1]) >= len(files), res.stdout[-500:]
