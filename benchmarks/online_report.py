"""The figures of ``bench_online.py``'s replay: served accuracy per window, the last requests
with intervals, when promotions came, and each canary's true live difference; the plot and the
page section. Reads the saved run only, so ``--render`` redraws without serving anything."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

LAST = 300


def _series(reqs: list[Mapping[str, Any]], replay: str, server: str, n: int
            ) -> list[float | None]:
    by_i = {r["i"]: float(r["right"]) for r in reqs
            if r["replay"] == replay and r["server"] == server}
    return [by_i.get(i) for i in range(n)]


def _windows(values: list[float | None], size: int) -> list[float | None]:
    out: list[float | None] = []
    for start in range(0, len(values), size):
        got = [v for v in values[start:start + size] if v is not None]
        out.append(sum(got) / len(got) if got else None)
    return out


def _at_request(reqs: list[Mapping[str, Any]], replay: str, when: float) -> int | None:
    """The first request (its index) of ``replay`` that started after ``when``."""
    later = [r["i"] for r in reqs if r["replay"] == replay and r["started"] >= when]
    return min(later) if later else None


def _canaries(reqs: list[Mapping[str, Any]], replay: str, steps: list[Mapping[str, Any]]
              ) -> list[dict[str, Any]]:
    """Each canary of ``replay`` with how it ended and its true live difference: the client's
    own scores of the requests its version served against the others' over its life."""
    from whetstone.engine.evaluation.stats import independent_difference

    out = []
    ends = {s["canary"]: s for s in steps if s["step"] != "canary_started" and s.get("canary")}
    for s in steps:
        if s["step"] != "canary_started":
            continue
        end = ends.get(s["canary"])
        stop = end["time"] if end else float("inf")
        live = [r for r in reqs if r["replay"] == replay and r["server"] == "learning"
                and s["time"] <= r["started"] and r["ended"] <= stop]
        on = [r["right"] for r in live if r["version"] == s["canary"]]
        off = [r["right"] for r in live if r["version"] != s["canary"]]
        d = independent_difference(sum(off) / len(off) if off else 0.0, len(off),
                                   sum(on) / len(on) if on else 0.0, len(on))
        out.append({"canary": s["canary"], "started_at": _at_request(reqs, replay, s["time"]),
                    "ended": end["step"] if end else "running",
                    "ended_at": _at_request(reqs, replay, end["time"]) if end else None,
                    "version": end.get("version") if end else None,
                    "gate": (s.get("figures") or {}).get("gate", {}),
                    "learner": {k: (end.get("figures") or {}).get(k) for k in
                                ("difference", "ci_low", "ci_high", "n_canary")} if end else {},
                    "true": {"canary": round(d.mean_b, 4), "current": round(d.mean_a, 4),
                             "n_canary": len(on), "n_current": len(off),
                             "difference": round(d.difference, 4), "low": round(d.low, 4),
                             "high": round(d.high, 4)},
                    "harmful": bool(end and end["step"] == "promoted" and d.high < 0)})
    return out


def analyse(data: Mapping[str, Any]) -> dict[str, Any]:
    """The replay's figures (see the module docstring)."""
    from whetstone.engine.evaluation.stats import mcnemar_exact, paired_bootstrap, score_interval

    settings, reqs = data["settings"], data["requests"]
    n, size = int(settings["requests"]), int(settings["window"])
    frozen, learning = (_series(reqs, "honest", s, n) for s in ("frozen", "learning"))
    adversarial = _series(reqs, "adversarial", "learning", n)
    windows = []
    for w, start in enumerate(range(0, n, size)):
        pairs = [(f, g) for f, g in zip(frozen[start:start + size], learning[start:start + size], strict=False)
                 if f is not None and g is not None]
        d = paired_bootstrap([p[0] for p in pairs], [p[1] for p in pairs]) if pairs else None
        windows.append({"window": w + 1, "requests": [start + 1, min(n, start + size)],
                        "frozen": _windows(frozen[start:start + size], size)[0],
                        "learning": _windows(learning[start:start + size], size)[0],
                        "adversarial": _windows(adversarial[start:start + size], size)[0],
                        "difference": round(d.difference, 4) if d else None,
                        "low": round(d.low, 4) if d else None,
                        "high": round(d.high, 4) if d else None})
    last = [(f, g) for f, g in zip(frozen[-LAST:], learning[-LAST:], strict=False)
            if f is not None and g is not None]
    tail: dict[str, Any] = {}
    if last:
        fi, li = score_interval([p[0] for p in last]), score_interval([p[1] for p in last])
        d = paired_bootstrap([p[0] for p in last], [p[1] for p in last])
        tail = {"n": len(last), "frozen": [fi.mean, fi.low, fi.high],
                "learning": [li.mean, li.low, li.high],
                "difference": [d.difference, d.low, d.high],
                "mcnemar_p": mcnemar_exact([p[0] for p in last], [p[1] for p in last]).p_value}
        adv = [a for a in adversarial[-LAST:] if a is not None]
        if adv:
            ai = score_interval(adv)
            tail["adversarial"] = [ai.mean, ai.low, ai.high]
    steps = data["steps"]
    promoted = [s for s in steps.get("honest", []) if s["step"] == "promoted"]
    return {"windows": windows, "last": tail,
            "first_promotion": _at_request(reqs, "honest", promoted[0]["time"])
            if promoted else None,
            "canaries": {replay: _canaries(reqs, replay, got) for replay, got in steps.items()},
            "below_frozen": [w["window"] for w in windows
                             if w["high"] is not None and w["high"] < 0]}


def plot(data: Mapping[str, Any], png: Path) -> None:
    import matplotlib  # heavy, and only for the figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a, s = data["analysis"], data["settings"]
    xs = [w["requests"][1] for w in a["windows"]]
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=110)
    for key, label, style in (("frozen", "frozen server", {"color": "0.45", "marker": "o"}),
                              ("learning", "learning server", {"color": "tab:blue",
                                                                   "marker": "o"}),
                              ("adversarial", ("learning server, one key up-voting wrong "
                                              "answers"), {"color": "tab:orange", "marker": "s",
                                                              "linestyle": "--"})):
        ys = [w[key] for w in a["windows"]]
        if any(y is not None for y in ys):
            ax.plot(xs, [float("nan") if y is None else y for y in ys], label=label, **style)
    for replay, color in (("honest", "tab:blue"), ("adversarial", "tab:orange")):
        for c in a["canaries"].get(replay, []):
            if c["ended"] == "promoted" and c["ended_at"] is not None:
                ax.axvline(c["ended_at"], color=color, linewidth=1, alpha=0.6)
            elif c["ended_at"] is not None:
                ax.axvline(c["ended_at"], color=color, linewidth=1, alpha=0.4, linestyle=":")
    ax.set_xlabel(f"requests (windows of {s['window']}; solid line: a promotion, dotted: a "
                  "rollback or expiry)")
    ax.set_ylabel("served accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(f"{s['stage']} · {s['model']} · learning with {s['method']}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)


def _iv(v: list[float]) -> str:
    return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"


def summary_lines(data: Mapping[str, Any]) -> list[str]:
    a, s = data["analysis"], data["settings"]
    out = [(f"{s['requests']} requests per server, {s['stage']}, model {s['model']}, "
           f"{data.get('minutes', '?')} min")]
    first = a["first_promotion"]
    out.append(f"first promotion: after request {first}" if first is not None
               else "first promotion: none")
    t = a["last"]
    if t:
        out.append(f"last {t['n']} requests: frozen {_iv(t['frozen'])}, learning "
                   f"{_iv(t['learning'])}; paired difference {t['difference'][0]:+.3f} "
                   f"[{t['difference'][1]:+.3f}, {t['difference'][2]:+.3f}], McNemar p = "
                   f"{t['mcnemar_p']:.3g}")
        if "adversarial" in t:
            out.append(f"last {t['n']} requests, adversarial replay: learning "
                       f"{_iv(t['adversarial'])}")
    out.append("windows where the learning server fell below the frozen one beyond the noise "
               f"(paired interval below 0): {a['below_frozen'] or 'none'}")
    for replay, canaries in a["canaries"].items():
        for c in canaries:
            tr = c["true"]
            out.append(f"{replay}: canary {c['canary']} (from request {c['started_at']}) "
                       f"{c['ended']}{' as ' + c['version'] if c['version'] else ''}; true live "
                       f"difference {tr['difference']:+.3f} [{tr['low']:+.3f}, {tr['high']:+.3f}]"
                       f" on {tr['n_canary']}/{tr['n_current']}"
                       + ("  HARMFUL" if c["harmful"] else ""))
    failed: dict[str, int] = {}
    for r in data["requests"]:
        if r.get("error"):
            name = f"{r['replay']} {r['server']}"
            failed[name] = failed.get(name, 0) + 1
    out.append("replies the server failed (scored 0, no feedback; a conversation past the "
               "model's context): " + (", ".join(f"{k} {v}" for k, v in sorted(failed.items()))
                                       or "none"))
    harmful = sum(c["harmful"] for cs in a["canaries"].values() for c in cs)
    out.append(f"harmful promotions (promoted with a true live difference below 0): {harmful}")
    return out


def markdown(data: Mapping[str, Any], png: Path | str) -> str:
    """The page section: the settings, the figure, the windows and the summary."""
    s, a = data["settings"], data["analysis"]
    opts = "".join(f" --option {o}" for o in s.get("option") or [])
    opts += f" --analyst {s['analyst']}" if s.get("analyst") else ""
    lines = [
        (f"Stage `{s['stage']}`, model `{s['model']}`, {s['requests']} requests through each "
        f"server ({s['concurrency']} conversations at a time; the client runs the stage's MCP "
        f"tools itself, at most {s['max_turns']} rounds of calls), feedback on every reply (scorer "
        f"`value`, with the label). Learner: `--method {s['method']}{opts} --every "
        f"{s['every']} --share {s['share']} --min-scored {s['min_scored']} --min-rollback "
        f"{s['min_rollback']} --max-scored {s['max_scored']} --limit {s.get('limit')} --solver "
         f"{s['solver']}`. "
        f"{data.get('minutes', '?')} minutes."), "", f"![served accuracy per window]({png})", "",
        "| requests | frozen | learning | Δ (paired, 95% CI) | adversarial replay |",
        "|---|---|---|---|---|"]
    for w in a["windows"]:
        def f(v: Any) -> str:
            return "–" if v is None else f"{v:.2f}"
        delta = "–" if w["difference"] is None else \
            f"{w['difference']:+.2f} [{w['low']:+.2f}, {w['high']:+.2f}]"
        lines.append(f"| {w['requests'][0]}-{w['requests'][1]} | {f(w['frozen'])} | "
                     f"{f(w['learning'])} | {delta} | {f(w['adversarial'])} |")
    lines += ["", *(f"- {line}" for line in summary_lines(data)[1:])]
    return "\n".join(lines)
