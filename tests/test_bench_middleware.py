"""The middleware benchmark runs end to end (tiny sizes: the numbers are not checked, only that
every configuration answers correctly), and ``--baseline`` serves an older revision beside the
current one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks" / "bench_middleware.py"


@pytest.mark.integration
def test_a_revision_that_is_not_one_says_so(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH.parent))
    try:
        import bench_middleware
    finally:
        sys.path.remove(str(BENCH.parent))
    with pytest.raises(SystemExit, match="--baseline no-such-rev: cannot check it out"):
        bench_middleware.checkout("no-such-rev", tmp_path / "b")
    short = bench_middleware.checkout("HEAD", tmp_path / "head")
    assert (tmp_path / "head" / "cli.py").is_file() and len(short) >= 7


@pytest.mark.integration
def test_the_benchmark_runs_with_a_baseline_beside_it() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--requests", "2", "--throughput-requests", "8",
         "--concurrency", "4", "--rounds", "1", "--baseline", "HEAD"],
        check=False, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")][1:]
    names = [row.split("|")[1].strip() for row in rows]
    assert names[:4] == ["direct", "whetstone serve --no-library",
                         "whetstone, library, repeated prompts",
                         "whetstone, library, unique prompts"]
    assert names[4].startswith("whetstone @") and names[4].endswith(", unique prompts")
    assert all(row.split("|")[-2].strip() == "0" for row in rows)  # no wrong replies
    assert "library, unique prompts against whetstone @" in out.stdout
