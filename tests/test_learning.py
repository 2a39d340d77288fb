"""Learning in production (issue 48): a learner beside ``serve`` evolves on live feedback, serves
an accepted change as a canary to a share of conversations, and promotes it or rolls it back on
live feedback; no one key's feedback decides, two learners never both write, and a person
takes a canary or a promotion back with one command.

The server runs in this process on a scripted model (``learning_support``); the learner's
steps are taken one at a time, so each test says exactly when what happened.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from learning_support import (
    FAST_RULES,
    KEYS,
    Users,
    code,
    engine,
    learner,
    question,
    scripted,
)
from servers import running_server

from whetstone.cli import cli
from whetstone.engine.errors import LeaseLost
from whetstone.engine.evolution.canary import (
    CanaryRules,
    Scored,
    cap_shares,
    decide,
    scored_of,
)
from whetstone.engine.server.canary import CanaryRouter
from whetstone.engine.server.feedback import FeedbackPolicy
from whetstone.library_store.learning import CanaryRecord, LearningState, Step
from whetstone.library_store.lease import FileLease
from whetstone.library_store.otel_export import OtelSettings


def serve_app(eng, **kw):  # type: ignore[no-untyped-def]
    router = CanaryRouter(eng.library, lambda snap: eng.chat_adapter(snapshot=snap))
    return eng.app(api_keys=KEYS, canary=router, **kw)


def invoke(*args: str) -> str:
    res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


# --- the decision ------------------------------------------------------------------------

def scores(arm: str, key: str, right: int, wrong: int) -> list[Scored]:
    return [Scored(arm, 1.0, key)] * right + [Scored(arm, 0.0, key)] * wrong


def honest(canary_right: float, current_right: float, per_key: int = 40) -> list[Scored]:
    """Four keys, ``per_key`` canary and 3x as many current scores each."""
    out: list[Scored] = []
    for key in ("k1", "k2", "k3", "k4"):
        c = round(canary_right * per_key)
        o = round(current_right * per_key * 3)
        out += scores("canary", key, c, per_key - c) + scores("current", key, o,
                                                              per_key * 3 - o)
    return out


def ask_until(users, learn, wanted: str) -> None:  # type: ignore[no-untyped-def]
    """Honest users ask and the learner steps until it reaches ``wanted`` (asserted)."""
    steps = []
    for n in range(40, 400):
        users.ask(n)
        steps.append(learn.step())
        if steps[-1] == wanted:
            break
    assert steps[-1] == wanted, Counter(steps)


def test_one_key_is_capped_and_a_lone_key_weighs_nothing() -> None:
    assert cap_shares({"a": 10, "b": 10, "c": 10}, 0.5) == {"a": 10, "b": 10, "c": 10}
    capped = cap_shares({"a": 1, "b": 1, "flood": 100}, 0.5)
    assert capped == {"a": 1, "b": 1, "flood": 2}  # the flood is half of the arm, no more
    assert cap_shares({"a": 10, "flood": 1000}, 0.5) == {"a": 10, "flood": 10}
    assert cap_shares({"alone": 500}, 0.5) == {"alone": 0.0}
    assert cap_shares({"alone": 500}, 1.0) == {"alone": 500}


def test_a_gain_is_promoted_and_a_loss_rolled_back() -> None:
    rules = CanaryRules()
    gain = decide(honest(0.8, 0.5), rules)
    assert gain.action == "promote", gain.why
    loss = decide(honest(0.3, 0.7), rules)
    assert loss.action == "rollback", loss.why
    # A tie inside the margin is promoted only with enough scores; before that it waits.
    assert decide(honest(0.6, 0.6, per_key=10), rules).action == "wait"
    assert decide(honest(0.6, 0.6, per_key=150), rules).action == "promote"
    # Rolled back at once: well before the scores a promotion needs.
    early = decide(honest(0.0, 0.7, per_key=6), rules)
    assert early.action == "rollback" and early.comparison.n_canary < rules.min_scored


def test_one_keys_flood_can_neither_promote_nor_roll_back() -> None:
    rules = CanaryRules()
    # Honest users see a worse canary; one key floods up-votes for it and down-votes for the
    # current version.
    promote_flood = honest(0.4, 0.7) + scores("canary", "flood", 3000, 0) + \
        scores("current", "flood", 0, 3000)
    unprotected = CanaryRules(max_key_share=1.0, min_keys=1)
    assert decide(promote_flood, unprotected).action == "promote"  # the attack works there
    verdict = decide(promote_flood, rules)
    assert verdict.action == "wait" and verdict.pivotal == "flood", verdict.why
    # Honest users see no difference; the key down-votes the canary.
    rollback_flood = honest(0.6, 0.6) + scores("canary", "flood", 0, 3000) + \
        scores("current", "flood", 3000, 0)
    assert decide(rollback_flood, unprotected).action == "rollback"
    verdict = decide(rollback_flood, rules)
    assert verdict.action == "wait" and verdict.pivotal == "flood", verdict.why
    # The flood alone, however large, is no comparison at all.
    alone = scores("canary", "flood", 3000, 0) + scores("current", "flood", 0, 3000)
    assert decide(alone, rules).action == "wait"


@pytest.mark.integration
@pytest.mark.memory
def test_a_flood_through_the_server_cannot_promote_a_worse_canary(tmp_path: Path) -> None:
    """End to end: three honest users see the canary answer worse; a fourth key asks four
    times as often and up-votes every canary reply, down-votes every other. The learner waits
    and never promotes."""
    eng = engine(tmp_path / "lib", scripted(live_loses=True))
    learn = learner(eng)
    assert learn.lease.acquire()
    with running_server(serve_app(eng)) as base:
        users = Users(base)
        for n in range(40):
            users.ask(n, key=KEYS[n % 3])
        assert learn.step() == "canary_started"
        record = LearningState(eng.library).canary()
        assert record is not None
        flood = KEYS[3]
        steps = []
        for n in range(40, 330):
            if n % 5 == 0:
                users.ask(n, key=KEYS[n % 3])
            else:
                served = users.ask(n, key=flood, flip=False, label=False)
                # the flood's vote: up for the canary, down for the current version
                users.client.post("/v1/feedback", headers={"Authorization": f"Bearer {flood}"},
                                  json={"trace_id": served.trace_id,
                                        "score": float(served.version == record.id)})
            steps.append(learn.step())
    assert "promoted" not in steps and eng.library.current_id() == "v1", Counter(steps)
    status = LearningState(eng.library).status()["comparison"]
    # Waiting, never promoting: on the flood's key (the numbers with it say promote) or still
    # undecided on the honest scores, which varies with how loaded the machine is (a clean
    # clone once ended undecided). Waiting on a pivotal key is pinned by the unit test above.
    assert status["action"] == "wait", status
    eng.close()


# --- the loop through a real server ----------------------------------------------------------

@pytest.mark.integration
@pytest.mark.memory
def test_a_candidate_that_gains_is_promoted(tmp_path: Path) -> None:
    spans = tmp_path / "spans.jsonl"
    eng = engine(tmp_path / "lib", scripted(), otel=OtelSettings(otlp=False, file=spans))
    learn = learner(eng)
    assert learn.lease.acquire()
    with running_server(serve_app(eng)) as base:
        users = Users(base)
        for n in range(40):
            users.ask(n)
        assert learn.step() == "canary_started"
        record = LearningState(eng.library).canary()
        assert record is not None and record.base == "v1" and record.share == 0.3
        ask_until(users, learn, "promoted")
        metrics = httpx.get(base + "/metrics").text
        served_after = users.ask(1001)
    # The canary served about its share, each answer right; the current version a third.
    during = [s for s in users.served[40:-1]]
    on_canary = [s for s in during if s.version == record.id]
    assert 0.15 < len(on_canary) / len(during) < 0.45
    assert all(s.right for s in on_canary)
    assert eng.library.current_id() == "v2" and served_after.version == "v2"
    assert served_after.right
    version = eng.library.manifest("v2")
    assert version.scores["gate"]["accepted"] and version.scores["canary"]["canary"] == record.id
    assert [s.step for s in LearningState(eng.library).steps()] == ["canary_started", "promoted"]
    assert 'whetstone_learning_steps_total{step="promoted"} 1' in metrics
    assert 'whetstone_canary_requests_total{arm="canary"}' in metrics
    log = json.loads(invoke("library", "log", "--library", str(eng.library.root), "--json"))
    assert [s["step"] for s in log[1]["learning"]] == ["promoted", "canary_started"]
    table = " ".join(invoke("library", "log", "--library", str(eng.library.root)).split())
    assert "canary promoted" in table and "canary started" in table
    for sink in eng.library.trace_sinks:
        sink.flush()
    names = {s["name"] for line in spans.read_text().splitlines()
             for r in json.loads(line)["resourceSpans"] for sc in r["scopeSpans"]
             for s in sc["spans"]}
    assert {"whetstone.learning.canary_started", "whetstone.learning.promoted"} <= names
    eng.close()


@pytest.mark.integration
@pytest.mark.memory
def test_one_that_loses_live_is_rolled_back_at_once(tmp_path: Path) -> None:
    eng = engine(tmp_path / "lib", scripted(live_loses=True))
    learn = learner(eng)
    assert learn.lease.acquire()
    with running_server(serve_app(eng)) as base:
        users = Users(base)
        for n in range(40):
            users.ask(n)
        assert learn.step() == "canary_started"  # the gate saw a gain
        record = LearningState(eng.library).canary()
        assert record is not None
        ask_until(users, learn, "rolled_back")
        after = users.ask(1001)
    step = LearningState(eng.library).steps()[-1]
    assert step.step == "rolled_back" and step.figures["ci_high"] < 0
    assert step.figures["n_canary"] < FAST_RULES.min_scored  # at once, before a promotion could
    assert eng.library.current_id() == "v1" and after.version == "v1"
    assert LearningState(eng.library).canary() is None
    table = " ".join(invoke("library", "log", "--library", str(eng.library.root)).split())
    assert "canary ROLLED BACK" in table
    eng.close()


@pytest.mark.integration
@pytest.mark.memory
def test_a_conversation_stays_on_one_version(tmp_path: Path) -> None:
    eng = engine(tmp_path / "lib", scripted())
    eng.library.commit({"memory/demonstrations.md": "# Memory\n"}, method="test",
                       message="v2", validate=False)
    snap = eng.library.candidates.snapshot(eng.library.candidates.save(
        "c", {"memory/demonstrations.md": "# Memory: changed\n"}, method="memory").name)
    LearningState(eng.library).start_canary(
        CanaryRecord(id="v2+canary-x", base="v2", root=snap.root, candidate="c", share=0.5,
                     started=0.0, method="memory"),
        Step("canary_started", 0.0, "v2", canary="v2+canary-x"))
    with running_server(serve_app(eng)) as base, httpx.Client(base_url=base) as client:
        seen: dict[int, set[str]] = {}
        for conv in range(24):
            messages = [{"role": "user", "content": question(conv)}]
            for turn in range(3):
                res = client.post("/v1/chat/completions", timeout=60,
                                  headers={"Authorization": f"Bearer {KEYS[turn]}"},
                                  json={"model": "scripted:", "messages": messages})
                assert res.status_code == 200, res.text
                seen.setdefault(conv, set()).add(res.headers["x-whetstone-library-version"])
                messages += [res.json()["choices"][0]["message"],
                             {"role": "user", "content": f"and turn {turn}?"}]
    assert all(len(v) == 1 for v in seen.values()), seen
    assert Counter(next(iter(v)) for v in seen.values()).keys() == {"v2", "v2+canary-x"}
    eng.close()


# --- safety --------------------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.memory
def test_feedback_is_rate_limited_per_key_and_recorded_with_its_key(tmp_path: Path) -> None:
    eng = engine(tmp_path / "lib", scripted())
    policy = FeedbackPolicy(rate_per_min=5, weights={"*": 1.0})
    with running_server(serve_app(eng, feedback_policy=policy)) as base:
        users = Users(base)
        flood = [users.client.post("/v1/chat/completions", headers={
            "Authorization": f"Bearer {KEYS[0]}"}, json={
            "model": "scripted:", "messages": [{"role": "user", "content": question(n)}]})
            for n in range(8)]
        codes = [users.client.post("/v1/feedback", headers={
            "Authorization": f"Bearer {KEYS[0]}"}, json={
            "trace_id": r.headers["x-whetstone-trace-id"], "score": 1}).status_code
            for r in flood]
        assert codes == [200] * 5 + [429] * 3
        other = users.ask(9, key=KEYS[1])  # another key is not held back
        metrics = httpx.get(base + "/metrics").text
    assert "whetstone_feedback_rate_limited_total 3" in metrics
    trace = eng.traces.get(other.trace_id)
    assert trace.meta["feedback_key"] != KEYS[1] and len(trace.meta["feedback_key"]) == 64
    assert trace.meta["feedback_weight"] == 1.0 and trace.label == code(9)
    eng.close()


@pytest.mark.integration
@pytest.mark.memory
def test_two_learners_never_both_commit(tmp_path: Path) -> None:
    """A learner paused past its lease (its heartbeat stopped) finds another holding it: its
    canary is not started and its promotion not committed, whatever it had prepared."""
    now = [1000.0]
    eng = engine(tmp_path / "lib", scripted())
    folder = eng.library.root / "learning"
    first = learner(eng, lease=FileLease(folder, "first", ttl_s=30, clock=lambda: now[0]))
    second = learner(eng, lease=FileLease(folder, "second", ttl_s=30, clock=lambda: now[0]))
    assert first.lease.acquire() and not second.lease.acquire()
    with running_server(serve_app(eng)) as base:
        users = Users(base)
        for n in range(40):
            users.ask(n)
        now[0] += 31  # the first learner stops beating (paused, swapped out)
        assert second.lease.acquire()
        with pytest.raises(LeaseLost):
            first.step()  # it evolves, then may not start its canary
        assert LearningState(eng.library).canary() is None
        assert second.step() == "canary_started"
        record = LearningState(eng.library).canary()
        assert record is not None and record.holder == "second"
        for n in range(40, 400):
            users.ask(n)
            second._follow(record)
            if decide(scored_of(second._window.values(), record.id),
                      FAST_RULES).action == "promote":
                break
        # Both judge the same canary, and both would promote it; only the holder's lands.
        first._follow(record)
        with pytest.raises(LeaseLost):
            first._check(record)
        assert eng.library.current_id() == "v1"
        assert second._check(record) == "promoted"
    assert eng.library.current_id() == "v2"
    assert {s.holder for s in LearningState(eng.library).steps()} == {"second"}
    eng.close()


@pytest.mark.memory
def test_manual_rollbacks_are_one_command(tmp_path: Path) -> None:
    eng = engine(tmp_path / "lib", scripted())
    lib = str(eng.library.root)
    before = eng.library.commit({"memory/demonstrations.md": "# Memory\n\nv2's bytes\n"},
                                method="test", message="v2", validate=False)
    after = eng.library.commit({"memory/demonstrations.md": "# Memory\n\npromoted\n",
                                "memory/more.md": "# More\n"}, method="test",
                               message="a promotion", validate=False)
    # A promotion taken back: a new version with the exact files of the one before.
    invoke("library", "rollback", before.id, "--library", lib)
    now, was = eng.library.manifest(), eng.library.manifest(before.id)
    assert now.id == "v4" and now.root == was.root and after.id == "v3"
    assert eng.library.snapshot().read_bytes("memory/demonstrations.md") == \
        b"# Memory\n\nv2's bytes\n"
    # A running canary taken back: every replica serves the current version at once.
    snap = eng.library.candidates.snapshot(eng.library.candidates.save(
        "c", {"memory/x.md": "# X\n"}, method="memory").name)
    LearningState(eng.library).start_canary(
        CanaryRecord(id="v4+canary-x", base="v4", root=snap.root, candidate="c", share=0.5,
                     started=0.0, method="memory"), Step("canary_started", 0.0, "v4"))
    assert "v4+canary-x" in invoke("library", "canary", "--library", lib)
    invoke("library", "canary", "stop", "--library", lib, "-m", "looked wrong")
    assert LearningState(eng.library).canary() is None
    assert LearningState(eng.library).steps()[-1].step == "stopped"
    assert "canary stopped by hand" in " ".join(
        invoke("library", "log", "--library", lib).split())
    eng.close()


def test_the_lease_goes_to_the_next_learner_only_after_its_heartbeat_stops(
        tmp_path: Path) -> None:
    now = [0.0]
    a = FileLease(tmp_path, "a", ttl_s=30, clock=lambda: now[0])
    b = FileLease(tmp_path, "b", ttl_s=30, clock=lambda: now[0])
    assert a.acquire() and not b.acquire() and a.current()["holder"] == "a"  # type: ignore[index]
    for _ in range(5):  # a beats every 10 s: b never gets it
        now[0] += 10
        assert a.renew() and not b.acquire()
    a.check()
    now[0] += 21  # a third of the time left: a may no longer write
    with pytest.raises(LeaseLost, match="heartbeat is late"):
        a.check()
    now[0] += 10  # expired: b takes it, and a can neither renew nor write
    assert b.acquire() and not a.renew()
    with pytest.raises(LeaseLost, match="b holds it"):
        a.check()
    a.release()  # not a's to give up
    assert b.current()["holder"] == "b"  # type: ignore[index]
    b.release()
    assert b.current() is None and a.acquire()
