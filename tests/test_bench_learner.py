"""The learner-latency benchmark runs end to end (tiny sizes: the numbers are not checked, only
that both blocks were measured and that the learner worked while it ran)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks" / "bench_learner_latency.py"
pytestmark = pytest.mark.timeout(600)


@pytest.mark.integration
def test_the_benchmark_measures_the_server_with_the_learner_paused_and_running() -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--requests", "12", "--rounds", "1",
                          "--every", "5"], check=False, capture_output=True, text=True,
                         timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = [line.split("|")[1].strip() for line in out.stdout.splitlines()
            if line.startswith("| ") and "ms" in line]
    assert rows == ["paused", "running"]
    assert re.search(r"added p50 grows by [+-]\d+\.\d ms while the learner runs", out.stdout)
    evolves = re.search(r"learner: (\d+) evolves started", out.stdout)
    assert evolves and int(evolves.group(1)) >= 1, out.stdout  # it worked while it ran
