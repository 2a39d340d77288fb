"""A self-contained HTML report of saved evaluation results.

A figure of every run's accuracy with its 95% interval (the latest run of each name per task
set and solver, so the scoreboard's rows, and a version's agent and direct runs, read side by
side), drawn as inline SVG by hand (no plotting
library needed); then three plots, each an inline base64 PNG made with matplotlib (imported
lazily; the figures are drawn with the Agg canvas directly, so no pyplot global state is
touched): accuracy per library version over time with its 95% interval, per-task wins and
losses between two runs, and tokens per task. A table lists every run.

A run with no scored task (aborted before its first, or every task failed) has no accuracy: the
table shows a dash and says why, and no chart draws it (it used to appear as 0.000). Runs with
failed tasks are drawn hollow and marked "N failed"; their accuracy is over the scored tasks.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from .compare import Comparison, compare
from .results import EvalResult

MAX_BOXES = 12  # tokens plot: the most recent runs only, so labels stay readable

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; margin-bottom: 2em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: right; }
th { background: #f2f2f2; } td.l { text-align: left; }
img { max-width: 100%; display: block; margin: 0.5em 0 2em; }
.note { color: #666; }
tr.failed td { background: #fff4e5; }
"""


def _short(task_set: str) -> str:
    """A task set's name for plot labels: a file's base name rather than its whole path."""
    head, sep, rest = task_set.partition(".jsonl")
    return Path(head).name + sep + rest if sep else task_set


def _marks(r: EvalResult) -> str:
    """What a chart label adds for a run whose number is not the whole story."""
    out = []
    if r.n_errors:
        out.append(f"{r.n_errors} failed")
    if r.partial:
        out.append("partial")
    return f" ({', '.join(out)})" if out else ""


def solver_of(r: EvalResult) -> str:
    """How the run answered: ``agent`` or ``direct``, with its runtime methods (``agent
    +horizon``); empty for a run saved before eval recorded it."""
    solver, methods = str(r.meta.get("solver") or ""), str(r.meta.get("methods") or "")
    return solver + (f" +{methods}" if methods and solver else "")


def shown_name(r: EvalResult) -> str:
    """The run's name and its solver (``current [direct]``): the agent and the direct runs of
    one library version are two runs, not one."""
    solver = solver_of(r)
    return r.name + (f" [{solver}]" if solver else "")


def run_label(r: EvalResult) -> str:
    """A run told apart from every other: name, run id, start time, solver, tasks."""
    rid = str(r.meta.get("run_id", ""))[:8]
    solver = " ".join(str(x) for x in (r.meta.get("solver"), r.meta.get("methods")) if x)
    when = datetime.fromtimestamp(r.started).strftime("%m-%d %H:%M")
    head = f"{r.name}" + (f" #{rid}" if rid else "")
    return (f"{head}\n{when}" + (f" {solver}" if solver else "")
            + f"\n{_short(r.task_set)} n={r.n}")


def charted(results: Sequence[EvalResult]) -> list[EvalResult]:
    """The runs a chart of accuracy may draw: those with a scored task. An aborted run has
    no accuracy; drawing its empty mean would show a 0.000 nobody measured."""
    return [r for r in results if not r.aborted]


def _png(fig: Any) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # heavy: matplotlib

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _img(b64: str, alt: str, plot_id: str) -> str:
    return (f'<img id="{plot_id}" class="plot" alt="{html.escape(alt)}" '
            f'src="data:image/png;base64,{b64}">')


def plot_accuracy_over_time(results: Sequence[EvalResult]) -> str:
    """Accuracy of each run against its start time, one line per task set, with intervals."""
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter  # heavy: matplotlib
    from matplotlib.figure import Figure  # heavy: matplotlib

    fig = Figure(figsize=(10, 4.2), layout="constrained")
    ax = fig.add_subplot()
    by_set: dict[str, list[EvalResult]] = {}
    for r in charted(results):
        by_set.setdefault(r.task_set, []).append(r)
    for name, runs in by_set.items():
        runs = sorted(runs, key=lambda r: r.started)
        # matplotlib plots datetimes on a date axis; its stubs list only numbers
        xs: list[Any] = [datetime.fromtimestamp(r.started) for r in runs]
        cis = [r.interval() for r in runs]
        ys = [ci.mean for ci in cis]
        err = [[ci.mean - ci.low for ci in cis], [ci.high - ci.mean for ci in cis]]
        line = ax.errorbar(xs, ys, yerr=err, marker="o", capsize=4, label=_short(name))
        marked = [(x, y) for x, y, r in zip(xs, ys, runs, strict=False) if r.n_errors or r.partial]
        if marked:  # hollow: a number over fewer tasks than were asked
            ax.scatter([x for x, _ in marked], [y for _, y in marked], s=60, zorder=3,
                       facecolors="white", edgecolors=line.lines[0].get_color())
        for x, y, r in zip(xs, ys, runs, strict=False):
            ax.annotate(shown_name(r) + _marks(r), (x, y), textcoords="offset points",
                        xytext=(4, 6), fontsize=8)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("accuracy (95% CI)")
    ax.set_title("Accuracy per library version over time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    locator = AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    return _png(fig)


def plot_wins_losses(c: Comparison, a: EvalResult, b: EvalResult) -> str:
    """Counts of wins/ties/losses of b over a, and each task's score difference."""
    from matplotlib.figure import Figure  # heavy: matplotlib
    from matplotlib.ticker import MaxNLocator  # heavy: matplotlib

    fig = Figure(figsize=(10, 3.8), layout="constrained")
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 3]})
    left.bar(["wins", "ties", "losses"], [len(c.wins), c.ties, len(c.losses)],
             color=["#2e7d32", "#9e9e9e", "#c62828"])
    left.set_title(f"{c.b_name} vs {c.a_name}", fontsize=10)
    sa, sb = a.scores, b.scores
    diffs = sorted(((sb[t] - sa[t]), t) for t in c.task_ids)
    right.bar(range(len(diffs)), [d for d, _ in diffs],
              color=["#2e7d32" if d > 0 else "#c62828" if d < 0 else "#9e9e9e" for d, _ in diffs])
    right.axhline(0, color="#444", linewidth=0.8)
    right.set_xlabel("task (sorted by difference)")
    right.set_ylabel(f"score({c.b_name}) - score({c.a_name})")
    right.set_title(f"per-task difference: mean {c.difference:+.3f} "
                    f"[{c.ci_low:+.3f}, {c.ci_high:+.3f}]", fontsize=10)
    right.set_ylim(-1.05, 1.05)
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _png(fig)


def plot_tokens(results: Sequence[EvalResult]) -> str:
    """Tokens per task of each run (box plot), most recent runs."""
    from matplotlib.figure import Figure  # heavy: matplotlib

    runs = [r for r in sorted(results, key=lambda r: r.started) if r.n_scored][-MAX_BOXES:]
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    ax = fig.add_subplot()
    ax.boxplot([[t.tokens for t in r.scored] for r in runs],
               tick_labels=[run_label(r) for r in runs])
    ax.set_ylabel("tokens per task")
    ax.set_title("Tokens per task")
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(alpha=0.3, axis="y")
    return _png(fig)


def latest_per_name(results: Sequence[EvalResult]) -> list[EvalResult]:
    """The latest run with an accuracy (a scored task) of each (task set, name and solver),
    ordered by task set, then name."""
    latest: dict[tuple[str, str], EvalResult] = {}
    for r in sorted(results, key=lambda r: r.started):
        if not r.aborted:
            latest[(r.task_set, shown_name(r))] = r
    return [latest[k] for k in sorted(latest)]


def svg_accuracy(results: Sequence[EvalResult], *, width: int = 900) -> str:
    """Accuracy with its 95% interval for each run of ``latest_per_name``: one line per run
    (a dot, the interval as a bar), grouped by task set, as an inline ``<svg>``."""
    runs = latest_per_name(results)
    label_w, right_w, row_h, top = 330, 110, 22, 30
    plot_w = max(200, width - label_w - right_w)
    groups = sorted({r.task_set for r in runs})
    height = top + row_h * (len(runs) + len(groups)) + 24

    def x(v: float) -> float:
        return label_w + max(0.0, min(1.0, v)) * plot_w

    out = [(f'<svg id="plot-accuracy-rows" width="{width}" height="{height}" '
            'font-family="system-ui, sans-serif" font-size="12" role="img" '
            'aria-label="accuracy with 95% intervals per run">')]
    for tick in range(0, 11, 2):
        tx = x(tick / 10)
        out.append(f'<line x1="{tx:.1f}" y1="{top - 6}" x2="{tx:.1f}" y2="{height - 20}" '
                   f'stroke="#ddd"/><text x="{tx:.1f}" y="{top - 10}" text-anchor="middle" '
                   f'fill="#666">{tick / 10:.1f}</text>')
    y = top
    for group in groups:
        y += row_h
        out.append(f'<text x="4" y="{y - 6}" font-weight="bold">{html.escape(_short(group))}'
                   '</text>')
        for r in (r for r in runs if r.task_set == group):
            ci = r.interval()
            mid = y + row_h / 2
            fill = "white" if r.n_errors or r.partial else "#0b3d91"
            out.append(
                f'<text x="16" y="{mid + 4:.1f}">{html.escape(shown_name(r)[:48] + _marks(r))}'
                '</text>'
                f'<line x1="{x(ci.low):.1f}" y1="{mid:.1f}" x2="{x(ci.high):.1f}" '
                f'y2="{mid:.1f}" stroke="#1f77b4" stroke-width="3"/>'
                f'<circle cx="{x(ci.mean):.1f}" cy="{mid:.1f}" r="4.5" fill="{fill}" '
                f'stroke="#0b3d91" stroke-width="1.5">'
                f'<title>{html.escape(shown_name(r))}: {ci.mean:.3f} [{ci.low:.3f}, {ci.high:.3f}]'
                f' over {r.n_scored} scored of {r.n}</title></circle>'
                f'<text x="{label_w + plot_w + 8}" y="{mid + 4:.1f}" fill="#333">'
                f'{ci.mean:.3f} [{ci.low:.2f}, {ci.high:.2f}]</text>')
            y += row_h
    out.append(f'<text x="{x(0.5):.1f}" y="{height - 4}" text-anchor="middle" fill="#666">'
               'accuracy (95% interval)</text></svg>')
    return "".join(out)


def latest_pair(results: Sequence[EvalResult]) -> tuple[EvalResult, EvalResult] | None:
    """The two most recent complete runs on one task set under different names or solvers
    (a, b): a library version's agent run against its direct run is such a pair."""
    done = sorted((r for r in results if not r.partial and not r.aborted),
                  key=lambda r: r.started)
    for b in reversed(done):
        for a in reversed(done):
            if a is not b and a.task_set == b.task_set and shown_name(a) != shown_name(b) \
                    and a.started <= b.started:
                return a, b
    return None


def _table(results: Sequence[EvalResult]) -> str:
    head = ("<tr><th>started</th><th>task set</th><th>run</th><th>solver</th><th>model</th>"
            "<th>n</th>"
            "<th>accuracy</th><th>95% CI</th><th>errors</th><th>tokens/task</th>"
            "<th>latency/task (s)</th><th>notes</th></tr>")
    rows = []
    for r in sorted(results, key=lambda r: r.started, reverse=True):
        ci = r.interval()
        notes = []
        if "stopped_by" in r.meta:
            notes.append(f"aborted: {r.meta['stopped_by']}")
        if r.partial:
            notes.append(f"partial ({r.n} of {r.n_planned})")
        if r.n_errors:
            notes.append(r.errors_line(3) + "; accuracy over the scored tasks")
        if r.n_length:
            notes.append(f"{r.n_length} cut at the length limit")
        if r.aborted:
            acc, band = "&mdash;", "no task scored"
        else:
            acc, band = f"{ci.mean:.3f}", f"[{ci.low:.3f}, {ci.high:.3f}] {ci.method}"
        rid = str(r.meta.get("run_id", ""))[:8]
        cls = " class='failed'" if r.n_errors or r.aborted else ""
        rows.append(
            f"<tr{cls}>"
            f"<td class='l'>{datetime.fromtimestamp(r.started):%Y-%m-%d %H:%M}</td>"
            f"<td class='l'>{html.escape(r.task_set)}</td><td class='l'>{html.escape(r.name)}"
            f"{' #' + html.escape(rid) if rid else ''}</td>"
            f"<td class='l'>{html.escape(solver_of(r) or '?')}</td>"
            f"<td class='l'>{html.escape(r.model)}</td><td>{r.n}</td><td>{acc}</td>"
            f"<td>{band}</td><td>{r.n_errors}</td><td>{r.mean_tokens:.0f}</td>"
            f"<td>{r.mean_latency_s:.2f}</td>"
            f"<td class='l'>{html.escape('; '.join(notes))}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def render_report(results: Sequence[EvalResult],
                  pair: tuple[EvalResult, EvalResult] | None = None,
                  title: str = "Whetstone evaluation report") -> str:
    """The report as one HTML string. ``pair`` (a, b) picks the runs for wins and losses;
    by default the two latest runs on one task set under different names."""
    parts = [(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"),
             (f"<p class='note'>Generated {datetime.now():%Y-%m-%d %H:%M}; {len(results)} runs. "
             "Intervals: Wilson for 0/1 scores, percentile bootstrap otherwise; differences: "
             "paired bootstrap.</p>")]
    if not results:
        parts.append("<p>No evaluation results yet: run <code>whetstone eval</code>.</p>")
        return "".join(parts) + "</body></html>"
    parts.append("<h2>Runs</h2>" + _table(results))
    parts.append("<h2>Accuracy per run</h2><p class='note'>The latest run of each name per "
                 "task set; the bar is its 95% interval.</p>" + svg_accuracy(results))
    parts.append("<h2>Accuracy over time</h2>"
                 + _img(plot_accuracy_over_time(results), "accuracy over time", "plot-accuracy"))
    pair = pair or latest_pair(results)
    parts.append("<h2>Wins and losses</h2>")
    if pair is None:
        parts.append("<p class='note'>Needs two complete runs on the same task set.</p>")
    else:
        a, b = pair
        c = replace(compare(a, b), a_name=shown_name(a), b_name=shown_name(b))
        p = "n/a" if c.p_value is None else f"{c.p_value:.4g}"
        left = f"; {c.left_out} task(s) left out (failed or not in both)" if c.left_out \
            else ""
        parts.append(f"<p>{html.escape(c.b_name)} vs {html.escape(c.a_name)} on "
                     f"{html.escape(b.task_set)} ({c.n} tasks): {len(c.wins)} wins, "
                     f"{len(c.losses)} losses, {c.ties} ties; McNemar p = {p}{left}.</p>")
        parts.append(_img(plot_wins_losses(c, a, b), "per-task wins and losses", "plot-wins"))
    parts.append("<h2>Tokens per task</h2>"
                 + _img(plot_tokens(results), "tokens per task", "plot-tokens"))
    return "".join(parts) + "</body></html>"


def write_report(results: Sequence[EvalResult], out: Path | str,
                 pair: tuple[EvalResult, EvalResult] | None = None) -> Path:
    """Write ``render_report`` to ``out`` and return the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(results, pair), encoding="utf-8")
    return out
