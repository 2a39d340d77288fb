"""docs/sandbox.md's code runs as written: the status snippet prints the identity the page
describes, and the example learned tool passes the admission check and runs."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

from whetstone.tools.images import ImageFiles
from whetstone.tools.learned import define_tool
from whetstone.tools.learned_run import run_learned
from whetstone.tools.sandbox import default_sandbox

DOC = Path(__file__).resolve().parent.parent / "docs" / "sandbox.md"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


def test_the_status_snippet_prints_what_the_page_shows() -> None:
    snippet = next(b for b in blocks("python") if "default_sandbox" in b)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, str(DOC), "exec"), {})  # noqa: S102 - the doc's own code
    printed = out.getvalue()
    assert printed.strip() == default_sandbox().status.describe()
    if default_sandbox().status.isolation == "bwrap" and os.geteuid() == 0:
        shown = next(b for b in blocks("text") if b.startswith("runs as:"))
        for line in shown.strip().splitlines():
            assert line in printed.splitlines(), (line, printed)


def test_the_example_learned_tool_is_admitted_and_runs(tmp_path: Path) -> None:
    from PIL import Image

    source = next(b for b in blocks("python") if "def count_red" in b)
    definition, problems = define_tool(source, name="count_red", skill="doc")
    assert definition is not None and problems == [], problems
    image = tmp_path / "red.png"
    Image.new("RGB", (4, 2), (255, 0, 0)).save(image)
    res = run_learned(definition, {"image": str(image)},
                      images=ImageFiles(tmp_path / "out", (tmp_path,)))
    assert res.ok, res
    assert '"red": 8' in res.output and '"total": 8' in res.output
