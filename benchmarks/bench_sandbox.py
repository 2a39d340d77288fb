"""Sandbox benchmark: the cost of one tool call in each sandbox mode, side by side in one run.

    .venv/bin/python benchmarks/bench_sandbox.py [--calls 30]

Modes, each running the same programs in turn (round-robin, so drift hits them alike):
- ``subprocess``: the python tool before bubblewrap (a plain child interpreter, ``-I -B``, a
  temp dir, RLIMIT_AS set in the child, reaped and cleaned up): the baseline;
- ``process/<limits>``: our fallback without bubblewrap (gate, limits, leftover sweep);
- ``bwrap/<limits>``: the default where bubblewrap works.
``<limits>`` is ``cgroup1``/``cgroup2`` where a cgroup is writable here, and ``watchdog``.
Run as root, the sandbox modes include giving root up first (``setpriv``, and staging what
uid 65534 cannot reach: docs/sandbox.md); a process mode that must refuse as root is skipped.
Programs: ``print(1)`` (pure overhead), ``import numpy`` (a typical tool), and a learned tool
call through the harness (numpy + PIL, an image in and a number out; sandbox modes only).
Prints the median and p90 wall time per call and each mode's median over the baseline's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from whetstone.tools.images import ImageFiles
from whetstone.tools.learned import define_tool
from whetstone.tools.learned_run import run_learned
from whetstone.tools.sandbox import Sandbox

PROGRAMS = {"print(1)": "print(1)", "import numpy": "import numpy\nprint(numpy.ones(3).sum())"}
TOOL = textwrap.dedent('''
    import numpy as np
    from PIL import Image

    def mean_red(image: Image.Image) -> float:
        """The mean of the red channel."""
        return float(np.asarray(image.convert("RGB"))[..., 0].mean())
''')


def _limit_as() -> None:  # what the old sandbox did in the child before exec
    limit = 512 * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def baseline(code: str) -> str:
    """The python tool as it was: a child interpreter in a temp dir, RLIMIT_AS, new session."""
    with tempfile.TemporaryDirectory(prefix="bench-subprocess-") as tmp:
        script = Path(tmp) / "main.py"
        script.write_text(code)
        run = subprocess.run([sys.executable, "-I", "-B", str(script)], cwd=tmp,
                             capture_output=True, text=True, check=False, timeout=30,
                             env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp},
                             start_new_session=True, preexec_fn=_limit_as)
        return run.stdout


def _measure(fn: Callable[[], object], calls: int, out: list[float]) -> None:
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)


def _modes() -> dict[str, Sandbox]:
    modes: dict[str, Sandbox] = {}
    for isolation in ("process", "bwrap"):
        for limits in ("cgroup", "watchdog"):
            try:
                box = Sandbox.detect(isolation=isolation, limits=limits)  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 -- a mode this machine lacks is reported
                print(f"  ({isolation}/{limits} unavailable: {exc})")
                continue
            if box.refusal:  # root without bubblewrap that cannot give root up
                print(f"  ({isolation}/{limits} refuses every call here: {box.refusal})")
                continue
            modes[f"{box.status.isolation}/{box.status.limits}"] = box
    return modes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30, help="calls per mode and program")
    args = parser.parse_args()
    import logging

    logging.disable(logging.WARNING)  # the weak modes warn once each; we know
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.calls} calls each")
    modes = _modes()
    with tempfile.TemporaryDirectory() as tmp:
        from PIL import Image

        image = Path(tmp) / "in" / "x.png"
        image.parent.mkdir()
        Image.new("RGB", (64, 64), (200, 10, 10)).save(image)
        files = ImageFiles(Path(tmp) / "out", (image.parent,))
        tool, _ = define_tool(TOOL, name="mean_red", skill="bench")
        assert tool is not None
        rows: list[tuple[str, str, list[float]]] = []
        for label, code in PROGRAMS.items():
            runners: dict[str, Callable[[], object]] = {"subprocess": lambda c=code: baseline(c)}
            runners.update({name: (lambda b=box, c=code: b.run_python(c))
                            for name, box in modes.items()})
            rows += _round_robin(label, runners, args.calls)
        tool_runners: dict[str, Callable[[], object]] = {
            name: (lambda b=box: run_learned(tool, {"image": str(image)}, images=files,
                                             sandbox=b)) for name, box in modes.items()}
        rows += _round_robin("learned tool", tool_runners, args.calls)
    _report(rows)


def _round_robin(label: str, runners: dict[str, Callable[[], object]], calls: int
                 ) -> list[tuple[str, str, list[float]]]:
    times: dict[str, list[float]] = {name: [] for name in runners}
    for fn in runners.values():
        fn()  # warm the page cache and the probes
    for _ in range(calls):
        for name, fn in runners.items():
            _measure(fn, 1, times[name])
    return [(label, name, ts) for name, ts in times.items()]


def _report(rows: list[tuple[str, str, list[float]]]) -> None:
    print(f"\n{'program':<14}{'mode':<20}{'median ms':>10}{'p90 ms':>9}{'vs subprocess':>15}")
    base: dict[str, float] = {}
    summary = []
    for label, name, ts in rows:
        med = statistics.median(ts)
        p90 = sorted(ts)[int(0.9 * (len(ts) - 1))]
        if name == "subprocess":
            base[label] = med
        ratio = f"{med / base[label]:.2f}x" if label in base else "-"
        print(f"{label:<14}{name:<20}{med * 1000:>10.1f}{p90 * 1000:>9.1f}{ratio:>15}")
        summary.append({"program": label, "mode": name, "median_ms": round(med * 1000, 1)})
    print("\n" + json.dumps(summary))


if __name__ == "__main__":
    main()
