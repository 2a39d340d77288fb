"""The HTML report: its content, and its rendering in headless Chromium."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.evaluation.direct import direct_solver
from whetstone.engine.evaluation.report import latest_pair, render_report, write_report
from whetstone.engine.evaluation.results import EvalResult, TaskResult
from whetstone.engine.evaluation.runner import evaluate
from whetstone.engine.evaluation.tasks import read_jsonl
from whetstone.engine.types import Request

ARITH = Path(__file__).parent / "fixtures" / "tasks" / "arith.jsonl"
CHROMIUM = "/usr/bin/chromium"


def runs() -> list[EvalResult]:
    """Three library versions of rising quality on the arithmetic fixture."""
    tasks = read_jsonl(ARITH)
    out = []
    for version, n_right in (("v1", 8), ("v2", 12), ("v3", 17)):
        def respond(req: Request, n_right: int = n_right) -> str:
            i, t = next((i, t) for i, t in enumerate(tasks) if t.question == req.messages[-1].text)
            # Wrong answers ramble, so tokens per task differ between versions.
            return (f"The answer is {t.expected}." if i < n_right
                    else "Let me think about this carefully. " * 5 + "The answer is 0.")
        solver = direct_solver(ScriptedBackend(responder=respond), model="scripted",
                               library_version=version)
        out.append(evaluate(tasks, solver, task_set="arith"))
    return out


def test_report_holds_the_table_and_three_plots() -> None:
    page = render_report(runs())
    assert page.startswith("<!DOCTYPE html>") and page.count("<tr>") == 4
    images = re.findall(r'<img id="(plot-[a-z]+)"[^>]*src="data:image/png;base64,([^"]+)"', page)
    assert [i for i, _ in images] == ["plot-accuracy", "plot-wins", "plot-tokens"]
    for _, b64 in images:
        assert base64.b64decode(b64).startswith(b"\x89PNG")
    # Wins and losses compare the two latest versions by default.
    assert "v3 vs v2 on arith (20 tasks): 5 wins, 0 losses, 15 ties" in page
    assert "http://" not in page and "https://" not in page  # self-contained


def test_latest_pair_skips_partial_runs_and_same_names() -> None:
    a, b, c = runs()
    part = EvalResult("arith", "numeric", (TaskResult("add-00", 1.0),), label="v4", partial=True,
                      started=c.started + 10)
    assert latest_pair([a, b, c, part]) == (b, c)
    assert latest_pair([a]) is None
    page = render_report([a])
    assert "Needs two complete runs" in page and page.count("<img") == 2


def test_report_of_nothing_says_so(tmp_path: Path) -> None:
    path = write_report([], tmp_path / "sub" / "r.html")
    assert "No evaluation results yet" in path.read_text() and "<img" not in path.read_text()


# Added to a copy of the page by the test only: it writes each image's decoded size into the
# DOM, which --dump-dom then shows.
_PROBE = ("<script>window.addEventListener('load', () => { for (const i of document.images) {"
          "i.setAttribute('data-w', i.naturalWidth); i.setAttribute('data-h', i.naturalHeight);"
          "} document.body.setAttribute('data-loaded', '1'); });</script>")


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.integration
@pytest.mark.skipif(not Path(CHROMIUM).exists() or shutil.which("chromium") is None,
                    reason="needs Debian's chromium (/usr/bin/chromium); .ci/run installs it")
def test_report_renders_in_headless_chromium_with_its_plots(tmp_path: Path) -> None:
    from PIL import Image, ImageStat

    page = write_report(runs(), tmp_path / "report.html")
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", _PROBE + "</body>"))

    dom = _chromium(["--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                    tmp_path / "profile-dom")
    assert 'data-loaded="1"' in dom.stdout, dom.stderr[-2000:]
    sizes = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in re.finditer(
        r'<img id="(plot-[a-z]+)"[^>]*?data-w="(\d+)" data-h="(\d+)"', dom.stdout)}
    assert set(sizes) == {"plot-accuracy", "plot-wins", "plot-tokens"}
    assert all(w > 300 and h > 200 for w, h in sizes.values()), sizes

    shot = tmp_path / "shot.png"
    res = _chromium(["--window-size=1200,2000", f"--screenshot={shot}", page.as_uri()],
                    tmp_path / "profile-shot")
    assert shot.exists(), res.stderr[-2000:]
    img = Image.open(io.BytesIO(shot.read_bytes())).convert("RGB")
    assert img.size == (1200, 2000)
    # Not blank: the grey levels vary, and the plots' colours are there (matplotlib's blue
    # line, the green wins bars).
    assert ImageStat.Stat(img.convert("L")).stddev[0] > 20
    colours = img.getcolors(maxcolors=1 << 20) or []
    blue = sum(n for n, (r, g, b) in colours if b > 150 and r < 80 and 90 < g < 150)
    green = sum(n for n, (r, g, b) in colours if g > 100 and r < 80 and b < 80)
    assert blue > 200 and green > 2000, (blue, green)


def test_the_accuracy_figure_is_inline_svg_with_an_interval_per_run() -> None:
    import xml.etree.ElementTree as ET

    from whetstone.engine.evaluation.report import svg_accuracy

    rs = runs()
    page = render_report(rs)
    svg = re.search(r"<svg id=\"plot-accuracy-rows\".*?</svg>", page, re.DOTALL)
    assert svg is not None
    root = ET.fromstring(svg.group(0))  # well-formed
    dots = root.findall("circle")
    assert len(dots) == 3  # one per run name on the one task set
    # Accuracies 8/20, 12/20, 17/20: the dots sit left to right in that order, each inside
    # its interval bar.
    xs = [float(d.get("cx")) for d in dots]
    assert xs == sorted(xs)
    bars = [b for b in root.findall("line") if b.get("stroke") == "#1f77b4"]
    for dot, bar in zip(dots, bars, strict=False):
        assert float(bar.get("x1")) < float(dot.get("cx")) < float(bar.get("x2"))
    assert "0.850 [" in svg.group(0) and "v3: 0.850" in svg.group(0)
    assert svg_accuracy([]).count("<circle") == 0
