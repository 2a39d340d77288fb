"""Elastic Horizon: the censoring-aware p90, convergence from both sides in a closed loop, the
incremental read of the trace store, and the runtime method on stored traces."""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import ConfigError
from whetstone.engine.methods.horizon.controller import (
    HorizonController,
    RunRecord,
    record_from_trace,
    success_quantile,
    task_family,
)
from whetstone.engine.methods.horizon.plugin import ElasticHorizon, HorizonConfig
from whetstone.engine.runtime import Agent, RunConfig
from whetstone.engine.runtime.checkpoints import Checkpoints
from whetstone.engine.types import Request, Step, Trace
from whetstone.library_store.traces import TraceStore


def rec(i: int, length: int, *, success: bool = True, censored: bool = False,
        budget: int | None = None, family: str = "f") -> RunRecord:
    return RunRecord(str(i), f"task {i}", length, success, censored, budget, family, float(i))


# -- the estimate ----------------------------------------------------------------------------


@pytest.mark.horizon
def test_uncensored_successes_give_the_nearest_rank_p90() -> None:
    lengths = [1, 2, 2, 3, 3, 3, 4, 4, 5, 7] * 3
    records = [rec(i, n, budget=10) for i, n in enumerate(lengths)]
    est = success_quantile(records, 0.9)
    assert (est.quantile, est.edge, est.successes) == (5, 10, 30)
    # Wrong answers are a competing outcome, not a success: they do not move the percentile.
    wrong = [rec(100 + i, 1, success=False, budget=10) for i in range(30)]
    assert success_quantile(records + wrong, 0.9).quantile == 5


@pytest.mark.horizon
def test_runs_cut_off_by_a_tight_budget_do_not_drag_the_estimate_down() -> None:
    # 40 runs had room for 10 steps; 160 later ones were cut at 3 (their long tails hidden).
    wide = [rec(i, n, budget=10) for i, n in enumerate([2, 2, 3, 5] * 10)]
    tight = [rec(100 + i, n, budget=3) if n <= 3 else rec(100 + i, 3, success=False,
                                                          censored=True, budget=3)
             for i, n in enumerate([2, 2, 3, 5] * 40)]
    naive = sorted(r.length for r in wide + tight if r.success)
    assert naive[int(0.9 * len(naive))] == 3  # counting only the successes seen: too short
    assert success_quantile(wide + tight, 0.9).quantile == 5


@pytest.mark.horizon
def test_the_edge_is_how_far_enough_runs_could_see() -> None:
    records = [rec(i, 2, budget=4) for i in range(30)] + [rec(99, 2, budget=12)]
    assert success_quantile(records, 0.9, min_runs=20).edge == 4


# -- the controller in a closed loop ---------------------------------------------------------

# Successful runs need 2, 3, 4 or 6 calls; p90 = 4 (80% need at most 3, 95% at most 4).
SUCCESS_LENGTHS = [(2, 0.5), (3, 0.3), (4, 0.15), (6, 0.05)]
TRUE_P90 = 4


def simulate(start: int, seed: int, runs: int = 900) -> list[tuple[int, str]]:
    """Runs of one family under the controller: 70% would succeed after a length drawn from
    SUCCESS_LENGTHS, 20% answer wrongly, 10% loop until the horizon. A run needing more steps
    than its budget is cut off there (censored)."""
    rng = random.Random(seed)
    controller = HorizonController(budget=start, min_steps=1, max_steps=20)
    records: list[RunRecord] = []
    decisions: list[tuple[int, str]] = []
    for i in range(runs):
        d = controller.update(records)
        budget = d.max_steps
        decisions.append((budget, d.reason))
        kind = rng.random()
        if kind < 0.7:
            need = rng.choices([n for n, _ in SUCCESS_LENGTHS],
                               [p for _, p in SUCCESS_LENGTHS])[0]
            r = rec(i, need, budget=budget) if need <= budget else \
                rec(i, budget, success=False, censored=True, budget=budget)
        elif kind < 0.9:
            need = rng.randint(1, 6)
            r = rec(i, need, success=False, budget=budget) if need <= budget else \
                rec(i, budget, success=False, censored=True, budget=budget)
        else:
            r = rec(i, budget, success=False, censored=True, budget=budget)
        records.append(r)
    return decisions


@pytest.mark.horizon
@pytest.mark.parametrize("start", [2, 20], ids=["under-capacity", "over-capacity"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_budget_converges_to_the_p90_of_successful_lengths(start: int, seed: int) -> None:
    decisions = simulate(start, seed)
    assert decisions[0][0] == start
    settled = Counter(b for b, _ in decisions[-300:])
    assert settled.most_common(1)[0][0] == TRUE_P90
    assert settled[TRUE_P90] >= 0.75 * 300
    # What is not the p90 is the loop re-checking the tail now and then (a probe), or noise
    # of one step.
    assert all(abs(b - TRUE_P90) <= 1 or reason == "probe" for b, reason in decisions[-300:])


@pytest.mark.horizon
def test_no_data_holds_the_start_and_all_runs_cut_off_probes_upwards() -> None:
    c = HorizonController(budget=8, min_steps=2, max_steps=16)
    assert c.update([]).reason == "cold start" and c.budget == 8
    cut = [rec(i, 3, success=False, censored=True, budget=3) for i in range(10)]
    d = c.update(cut)
    assert d.reason == "probe" and d.max_steps == 12  # from max(edge, budget) = 8, +50%
    wrong = [rec(i, 2, success=False, budget=8) for i in range(10)]
    assert HorizonController(budget=8).update(wrong).reason == "hold"


@pytest.mark.horizon
def test_the_budget_stays_within_its_bounds() -> None:
    short = [rec(i, 1, budget=10) for i in range(50)]
    c = HorizonController(budget=10, min_steps=3, max_steps=6, gain=1.0)
    assert c.update(short).max_steps == 3
    assert HorizonController(budget=50, max_steps=6).budget == 6


# -- reading traces ---------------------------------------------------------------------------


def run_trace(i: int, calls: int, *, outcome: str = "answered", score: float | None = 1.0,
               task_set: str | None = "gsm8k@test:0:50", budget: int | None = 8,
               task: str = "apples", started: float | None = None) -> Trace:
    steps = [Step(kind="think", module="think").to_dict() for _ in range(calls)]
    meta: dict[str, Any] = {}
    if task_set:
        meta["task_set"] = task_set
    if budget is not None:
        meta["budgets"] = {"max_steps": budget}
    if outcome == "horizon":
        meta["reason"] = f"reached the step horizon ({calls} model calls) without an answer"
    return Trace(id=f"t{i}", task=task, steps=tuple(Step.from_dict(s) for s in steps),
                 outcome=outcome, score=score, meta=meta,  # type: ignore[arg-type]
                 started=started if started is not None else 1000.0 + i)


@pytest.mark.horizon
def test_records_from_traces() -> None:
    r = record_from_trace(run_trace(1, 3))
    assert r is not None and (r.length, r.success, r.censored, r.budget, r.family) == \
        (3, True, False, 8, "gsm8k")
    assert record_from_trace(run_trace(2, 3, score=0.0)).success is False  # type: ignore
    cut = record_from_trace(run_trace(3, 5, outcome="horizon", score=None, budget=None))
    assert cut is not None and cut.censored and cut.budget == 5 and not cut.success
    unscored = record_from_trace(run_trace(4, 2, score=None, task_set=None))
    assert unscored is not None and unscored.success and unscored.family == ""
    assert record_from_trace(run_trace(5, 2, outcome="running")) is None
    assert record_from_trace(run_trace(6, 0)) is None
    assert [task_family(s) for s in ("gsm8k@train:0:9", "bfcl-simple", "/x/my_set.jsonl@dev",
                                     None)] == ["gsm8k", "bfcl-simple", "my_set", ""]


@pytest.mark.horizon
def test_the_store_reads_only_what_was_written_since_the_last_read(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "traces")
    assert store.read_since(None) == ([], {})
    store.append(run_trace(1, 2))
    store.append(run_trace(2, 3))
    traces, cursor = store.read_since(None)
    assert [(t.id, len(t.steps)) for t in traces] == [("t1", 2), ("t2", 3)]
    assert store.read_since(cursor)[0] == []
    store.append(run_trace(3, 3))
    day = store.files()[0]
    with open(day, "a", encoding="utf-8") as f:
        f.write('{"id": "torn", "tas')  # a writer still on its line
    traces, cursor = store.read_since(cursor)
    assert [t.id for t in traces] == ["t3"]
    with open(day, "a", encoding="utf-8") as f:
        f.write('k": "x"}\nnot json\n')
    traces, cursor = store.read_since(cursor)
    assert [t.id for t in traces] == ["torn"] and traces[0].task == "x"
    assert len(store.problems) == 1 and "unreadable trace record" in store.problems[0]
    day.write_text(run_trace(4, 1).to_json() + "\n")  # shrank (rewritten): read again
    assert [t.id for t in store.read_since(cursor)[0]] == ["t4"]
    day.unlink()
    assert store.read_since(cursor) == ([], {})


@pytest.mark.horizon
def test_the_controller_reads_traces_through_the_store_only() -> None:
    # The controller parses no trace files itself: the store hands it Trace objects.
    from whetstone.engine.methods.horizon import controller, plugin

    for module in (plugin, controller):
        src = Path(module.__file__ or "").read_text()
        assert "import json" not in src and "json.loads" not in src and "open(" not in src


# -- the runtime method -----------------------------------------------------------------------


class WordEmbedder:
    """A deterministic bag-of-words embedder (hashed words), standing in for MiniLM."""

    name = "words"
    dim = 64

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().split():
                out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


MATH = "apples cost dollars how many apples in total"
FACTS = "which city is the capital of the country"


def library_with(tmp_path: Path, families: dict[str, tuple[str, list[int]]]) -> TraceStore:
    """Scored traces per family: (task words, successful lengths), every run with budget 8."""
    store = TraceStore(tmp_path / "traces")
    i = 0
    for family, (words, lengths) in families.items():
        for n in lengths:
            store.append(run_trace(i, n, task_set=f"{family}@train", task=f"{words} #{i}"))
            i += 1
    return store


@pytest.mark.horizon
def test_each_task_gets_the_budget_of_its_own_family(tmp_path: Path) -> None:
    store = library_with(tmp_path, {"gsm8k": (MATH, [1, 2, 2, 2, 3] * 8),
                                    "halueval": (FACTS, [3, 4, 5, 6, 6] * 8)})
    horizon = ElasticHorizon(store, HorizonConfig(gain=1.0), embedder=WordEmbedder())
    math = horizon.adjust_config(f"{MATH} today", RunConfig(max_steps=8))
    facts = horizon.adjust_config(f"{FACTS} now", RunConfig(max_steps=8))
    assert (math.max_steps, facts.max_steps) == (3, 6)
    other = horizon.adjust_config("zzz qqq", RunConfig(max_steps=8))
    assert other.max_steps == 8  # like no family: the configured budget


@pytest.mark.horizon
def test_a_named_family_skips_the_embedder(tmp_path: Path) -> None:
    store = library_with(tmp_path, {"gsm8k": (MATH, [1, 2, 2, 2, 3] * 8)})

    class NoEmbedder(WordEmbedder):
        def embed(self, texts: Sequence[str]) -> np.ndarray:
            raise AssertionError("embedded with a family named")

    horizon = ElasticHorizon(store, HorizonConfig(family="gsm8k", gain=1.0),
                             embedder=NoEmbedder())
    assert horizon.adjust_config("anything at all", RunConfig(max_steps=8)).max_steps == 3


@pytest.mark.horizon
def test_bad_bounds_are_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="min_steps"):
        ElasticHorizon(TraceStore(tmp_path / "t"), HorizonConfig(min_steps=9, max_steps=4))


@pytest.mark.horizon
def test_a_run_cut_at_the_elastic_horizon_records_what_it_saved(tmp_path: Path) -> None:
    store = library_with(tmp_path, {"gsm8k": (MATH, [1, 2, 2, 2, 3] * 8)})
    horizon = ElasticHorizon(store, HorizonConfig(gain=1.0), embedder=WordEmbedder())
    looping = ScriptedBackend([f"Action: calculator[{i}+1]" for i in range(8)])
    agent = Agent(looping, config=RunConfig(max_steps=8), plugins=[horizon], trace_store=store)
    trace = agent.run(f"{MATH} in the shop")
    assert trace.outcome == "horizon" and len(looping.requests) == 3
    assert trace.meta["budgets"]["max_steps"] == 3
    meta = trace.meta["horizon"]
    assert meta["family"] == "gsm8k" and meta["reason"] == "p90" and meta["max_steps"] == 3
    assert meta["baseline_max_steps"] == 8 and meta["steps_used"] == 3
    assert meta["steps_saved"] == 5
    assert meta["tokens_saved_est"] == round(5 * trace.total_tokens / 3) > 0
    # The next run reads this trace too: the loop is closed.
    answered = Agent(ScriptedBackend(["Final Answer: 4"]), plugins=[horizon],
                     trace_store=store).run(f"{MATH} again")
    assert answered.meta["horizon"]["steps_saved"] == 0
    assert trace.id in horizon._records and horizon._records[trace.id].censored


@pytest.mark.horizon
def test_budgets_are_recorded_and_a_resumed_run_keeps_its_own(tmp_path: Path) -> None:
    store, cps = TraceStore(tmp_path / "traces"), Checkpoints(tmp_path / "cp.sqlite")
    replies = iter(["Action: calculator[1+1]"])

    def ctrl_c_on_second_call(request: Request) -> str:
        try:
            return next(replies)
        except StopIteration:
            raise KeyboardInterrupt from None

    agent = Agent(ScriptedBackend(responder=ctrl_c_on_second_call), trace_store=store,
                  checkpoints=cps, config=RunConfig(max_steps=3))
    with pytest.raises(KeyboardInterrupt):
        agent.run("x", trace_id="run-1")
    assert store.get("run-1").meta["budgets"] == {"max_steps": 3, "max_total_tokens": 24_000}
    later = Agent(ScriptedBackend(["Action: calculator[2+2]", "Action: calculator[3+3]"]),
                  trace_store=store, checkpoints=cps, config=RunConfig(max_steps=8))
    trace = later.resume("run-1")
    assert trace.outcome == "horizon" and trace.meta["budgets"]["max_steps"] == 3
    assert sum(s.kind == "think" for s in trace.steps) == 3


@pytest.mark.horizon
def test_the_horizon_is_selectable_by_name_and_recorded(tmp_path: Path) -> None:
    from whetstone.engine.api import Engine

    engine = Engine(ScriptedBackend(["Final Answer: 1"]), library=tmp_path / "lib", create=True,
                    methods=[("horizon", {"family": "gsm8k", "max_steps": 12})],
                    checkpointing=False, skills=False)
    trace = engine.run("1?")
    described = {m["name"]: m["config"] for m in trace.meta["methods"]}
    assert described["horizon"]["max_steps"] == 12 and described["horizon"]["family"] == "gsm8k"
    assert trace.meta["horizon"]["reason"] == "cold start"
    assert json.loads(json.dumps(trace.meta["horizon"])) == trace.meta["horizon"]


@pytest.mark.horizon
def test_splits_keep_a_test_run_from_learning_from_test_labels(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "traces")
    for i, n in enumerate([2] * 30):
        store.append(run_trace(i, n, task_set="gsm8k@train:0:30"))
    for i, n in enumerate([6] * 30, start=100):
        store.append(run_trace(i, n, task_set="gsm8k@test:0:30"))
    only_train = ElasticHorizon(store, HorizonConfig(family="gsm8k", gain=1.0, splits="train"))
    every = ElasticHorizon(store, HorizonConfig(family="gsm8k", gain=1.0))
    assert only_train.adjust_config("x", RunConfig(max_steps=8)).max_steps == 2
    assert every.adjust_config("x", RunConfig(max_steps=8)).max_steps == 6
