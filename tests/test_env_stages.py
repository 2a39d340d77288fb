"""The environment stages of issue 46 (benchmarks/env_ledger.py, env_clinic.py, env_repo.py):
each generator makes its committed fixtures byte for byte; the splits are large enough for
the scoreboard's slices; no question names a table, column, path, key or storage unit of its
environment (the words derived from the database and the tree); every label computes again
from the data, the SQL ones also by plain Python that does not share the generators' queries;
and one question of each kind is answered by real calls through Whetstone's MCP client with
the stage's allow-list in force (skipped with the reason where the server is not installed).
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import re
import sqlite3
import tomllib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import env_clinic
import env_ledger
import env_repo
import pytest
import stage_kit
import yaml
from mcp_support import REPO, filesystem_server, sqlite_server

from whetstone.engine.evaluation.benchmarks import load_tasks
from whetstone.engine.evaluation.tasks import split_of
from whetstone.tools.mcp_client import McpSessions
from whetstone.tools.mcp_config import load_mcp_config

FIXTURES = REPO / "benchmarks" / "fixtures"
STAGES = {"ledger": env_ledger, "clinic": env_clinic, "repo": env_repo}


def stage(name: str) -> Path:
    return FIXTURES / f"env_{name}"


def tasks_of(name: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (stage(name) / "tasks.jsonl").read_text().splitlines()]


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def connect(name: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{stage(name) / f'{name}.db'}?mode=ro", uri=True)


def entity_finder(pool: list[Any]) -> Callable[[str], Any]:
    """The one member of ``pool`` a question names (as whole words); an error for none or
    several (a question must name its entity verbatim, and only it)."""
    by_text = {str(e): e for e in pool}
    pattern = re.compile(r"(?<![\w-])(" + "|".join(
        re.escape(t) for t in sorted(by_text, key=len, reverse=True)) + r")(?![\w-])")

    def find(question: str) -> Any:
        found = set(pattern.findall(question))
        assert len(found) == 1, (question, found)
        return by_text[found.pop()]
    return find


def entities(name: str) -> Iterator[tuple[dict[str, Any], Any]]:
    """Each task of a stage with the entity its question names."""
    module = STAGES[name]
    if name == "repo":
        pool = sorted(p.name for p in (stage(name) / "tree" / "services").glob("*/*"))
        find = {"svc": entity_finder(pool)}
    else:
        with connect(name) as db:
            find = {slot: entity_finder([r[0] for r in db.execute(sql)])
                    for slot, sql in module.ENTITIES.items()}
    for t in tasks_of(name):
        slot = "svc" if name == "repo" else module.SLOT[t["metadata"]["kind"]]
        yield t, find[slot](t["question"])


# -- the files ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(STAGES))
def test_the_fixtures_are_what_the_generator_makes(name: str, tmp_path: Path) -> None:
    counts = STAGES[name].generate(tmp_path)
    made, committed = files_under(tmp_path), files_under(stage(name))
    assert set(committed) - set(made) == {"servers.json"}  # the one file written by hand
    assert [p for p in made if made[p] != committed[p]] == []
    assert counts == stage_kit.split_counts(tasks_of(name))
    big = [p for p, b in committed.items() if len(b) > 1_000_000]
    assert big == [] and sum(map(len, committed.values())) < 1_000_000


@pytest.mark.parametrize("name", sorted(STAGES))
def test_the_splits_hold_the_scoreboards_slices_and_every_kind(name: str) -> None:
    tasks = tasks_of(name)
    counts = Counter(split_of(t["id"]) for t in tasks)
    assert counts["train"] >= 300 and counts["dev"] >= 150 and counts["test"] >= 300, counts
    kinds = Counter(t["metadata"]["kind"] for t in tasks)
    assert 7 <= len(kinds) <= 10
    assert len({t["id"] for t in tasks}) == len(tasks)
    assert all(t["scorer"] == "value" and t["metadata"] == {"kind": t["metadata"]["kind"]}
               for t in tasks)  # nothing beside the kind: no query, path or argument
    test = [t for t in tasks if split_of(t["id"]) == "test"][:300]  # @test:0:300
    assert min(Counter(t["metadata"]["kind"] for t in test).values()) >= 20
    loaded = load_tasks(f"{stage(name) / 'tasks.jsonl'}@dev:0:150")
    assert len(loaded) == 150 and not loaded.problems


def forbidden_words(name: str) -> set[str]:
    """What a question must not say: the database's table and column names and the
    generator's storage words; for the tree, every file and folder name (and stem), every
    key of its config and team files, and the file formats, but not the services' names,
    which the questions ask about."""
    module = STAGES[name]
    if name != "repo":
        with connect(name) as db:
            return stage_kit.schema_words(db) | set(module.STORAGE_WORDS)
    root = stage(name) / "tree"
    services = {p.name for p in (root / "services").glob("*/*")}
    words: set[str] = {"file", "folder", "directory", "path", "repository"}
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        words.add(p.suffix.lstrip(".").lower())
        words.update(part.lower() for part in rel.parts if part not in services)
        words.update(part.split(".")[0].lower() for part in rel.parts[:-1]
                     if part not in services)
        if p.is_file() and p.stem not in services:
            words.add(p.stem.lower())
    for cfg in (*root.glob("services/*/*/service.*"), *root.glob("teams/*.yaml")):
        words |= {k.lower() for k in keys_of(cfg)}
    return words - {""}


def keys_of(path: Path) -> set[str]:
    """Every key of a config file (sections too), whatever its format."""
    text = path.read_text()
    if path.suffix == ".ini":
        return set(re.findall(r"^\[?([\w-]+)\]?(?:\s*=|$)", text, flags=re.MULTILINE))
    if path.suffix == ".toml":
        data: Any = tomllib.loads(text)
    else:
        data = yaml.safe_load(text) if path.suffix == ".yaml" else json.loads(text)
    keys: set[str] = set()

    def walk(d: Any) -> None:
        if isinstance(d, dict):
            for k, v in d.items():
                keys.add(str(k))
                walk(v)
    walk(data)
    return keys


@pytest.mark.parametrize("name", sorted(STAGES))
def test_no_question_describes_its_environment(name: str) -> None:
    words = forbidden_words(name)
    assert len(words) > 20  # derived, not empty
    said = {t["id"]: hit for t in tasks_of(name)
            if (hit := stage_kit.says_any(t["question"], words))}
    assert said == {}
    phrasings = defaultdict(Counter)  # each kind asked in two or three ways, each well used
    for t, entity in entities(name):
        phrasings[t["metadata"]["kind"]][t["question"].replace(str(entity), "{}")] += 1
    assert all(2 <= len(ways) <= 3 and min(ways.values()) >= 30
               for ways in phrasings.values()), phrasings


@pytest.mark.parametrize("name", sorted(STAGES))
def test_labels_are_values_one_reading_can_score(name: str) -> None:
    by_kind: dict[str, set[Any]] = defaultdict(set)
    for t in tasks_of(name):
        value = t["expected"]
        assert isinstance(value, (int, float, str)) and not isinstance(value, bool)
        assert value != 0 and value != ""
        if isinstance(value, str):
            assert len(value) <= 40 and value == value.strip()
        by_kind[t["metadata"]["kind"]].add(value)
    for kind, values in by_kind.items():
        texts = [v.lower() for v in values if isinstance(v, str)]
        inside = [(a, b) for a in texts for b in texts
                  if a != b and re.search(rf"(?<![\w-]){re.escape(a)}(?![\w-])", b)]
        assert inside == [], kind  # no label is a whole word of another of its kind
        assert len({type(v) for v in values} - {int, float}) <= 1, kind


# -- labels, computed again -----------------------------------------------------------------


def table(db: sqlite3.Connection, name: str) -> list[sqlite3.Row]:
    db.row_factory = sqlite3.Row
    return list(db.execute(f"SELECT * FROM {name}"))


@pytest.mark.parametrize("name", ["ledger", "clinic"])
def test_sql_labels_compute_again_from_the_rows(name: str) -> None:
    module = STAGES[name]
    with connect(name) as db:
        for t, entity in entities(name):
            assert module.label(db, t["metadata"]["kind"], entity) == t["expected"], t


def test_ledger_labels_follow_its_conventions_in_plain_python() -> None:
    """Codes through lookup tables, cents, YYYYMMDD and epoch days, soft deletes: each label
    again without SQL; and the deletes matter (a lookup that ignores them is wrong)."""
    with connect("ledger") as db:
        t_ = {n: table(db, n) for n in ("regions", "cat_codes", "state_codes", "accounts",
                                        "catalog", "order_head", "order_lines")}
    region = {r["rg_code"]: r["rg_label"] for r in t_["regions"]}
    category = {r["cat"]: r["cat_title"] for r in t_["cat_codes"]}
    state = {r["st"]: r["st_text"] for r in t_["state_codes"]}
    item = {p["title"]: p for p in t_["catalog"] if not p["retired"]}
    customer = {a["acct_name"]: a for a in t_["accounts"] if not a["is_deleted"]}
    live = {o["order_no"]: o for o in t_["order_head"] if o["deleted_at"] is None}
    lines = defaultdict(list)
    for line in t_["order_lines"]:
        lines[line["order_no"]].append(line)
    twins = {p["title"] for p in t_["catalog"] if p["retired"]} | \
        {a["acct_name"] for a in t_["accounts"] if a["is_deleted"]}

    def expect(kind: str, e: Any) -> Any:
        if kind.startswith("item_"):
            p = item[e]
            return {"item_price": p["list_cents"] / 100, "item_category": category[p["cat"]],
                    "item_units": sum(x["qty"] for o in live for x in lines[o]
                                      if x["sku"] == p["sku"])}[kind]
        if kind.startswith("customer_"):
            a, ymd = customer[e], str(customer[e]["opened_ymd"])
            return {"customer_region": region[a["rg_code"]],
                    "customer_since": f"{ymd[:4]}-{ymd[4:6]}-{ymd[6:]}",
                    "customer_orders": sum(o["acct_id"] == a["acct_id"]
                                           for o in live.values())}[kind]
        o = live[e]
        return {"order_status": state[o["st"]],
                "order_date": str(dt.date(1970, 1, 1) + dt.timedelta(days=o["placed_day"])),
                "order_total": round(sum(x["qty"] * x["each_cents"] for x in lines[e]) / 100,
                                     2)}[kind]
    asked_twins = 0
    for t, e in entities("ledger"):
        assert expect(t["metadata"]["kind"], e) == pytest.approx(t["expected"]), t
        asked_twins += e in twins
    assert asked_twins >= 40  # names a lookup finds twice unless it drops deleted rows
    assert len(t_["order_head"]) > len(live) + 100  # and deleted orders a count must skip


def test_clinic_labels_follow_its_conventions_in_plain_python() -> None:
    """The legend's letters, epoch seconds, fils, Y/N states and the manager self-join, each
    label again without SQL; merged records and void visits matter."""
    with connect("clinic") as db:
        t_ = {n: table(db, n) for n in ("legend", "wards", "staff", "patients", "encounters",
                                        "billing")}
    legend = {(r["domain"], r["flag"]): r["meaning"] for r in t_["legend"]}
    ward = {w["ward_ref"]: w["ward_title"] for w in t_["wards"]}
    by_no = {s["staff_no"]: s for s in t_["staff"]}
    staff = {f"{s['given']} {s['family']}": s for s in t_["staff"] if s["active"] == "Y"}
    patient = {p["pt_name"]: p for p in t_["patients"] if p["merged"] == "N"}
    visits = {e["enc_no"]: e for e in t_["encounters"] if e["void"] == "N"}
    bills = defaultdict(list)
    for b in t_["billing"]:
        bills[b["enc_no"]].append(b)

    def day(seconds: int) -> str:
        return str((dt.datetime(1970, 1, 1) + dt.timedelta(seconds=seconds)).date())

    def expect(kind: str, e: Any) -> Any:
        if kind.startswith("staff_"):
            s = staff[e]
            boss = by_no[s["reports_to"]]
            return {"staff_role": legend["role", s["role_flag"]],
                    "staff_manager": f"{boss['given']} {boss['family']}",
                    "staff_ward": ward[s["ward_ref"]]}[kind]
        if kind.startswith("visit_"):
            return {"visit_outcome": legend["outcome", visits[e]["outcome_flag"]],
                    "visit_billed": round(sum(b["fee_fils"] for b in bills[e]) / 1000, 3)
                    }[kind]
        p = patient[e]
        mine = [v for v in visits.values() if v["mrn"] == p["mrn"]]
        return {"patient_born": day(p["born_at"]),
                "patient_last_seen": day(max(v["seen_at"] for v in mine)),
                "patient_visits": len(mine),
                "patient_owes": round(sum(b["fee_fils"] for v in mine for b in bills[v["enc_no"]]
                                          if b["settled"] == "N") / 1000, 3)}[kind]
    merged = {p["pt_name"] for p in t_["patients"] if p["merged"] == "Y"}
    asked_merged = 0
    for t, e in entities("clinic"):
        assert expect(t["metadata"]["kind"], e) == pytest.approx(t["expected"]), t
        asked_merged += t["metadata"]["kind"] == "patient_born" and e in merged
    assert asked_merged >= 5  # a birth date found twice unless merged records are dropped
    assert len(t_["encounters"]) > len(visits) + 100  # and void visits a count must skip


def test_repo_labels_compute_again_from_the_files() -> None:
    root = stage("repo") / "tree"
    owners = (root / ".github" / "CODEOWNERS").read_text()
    overridden = 0
    for t, svc in entities("repo"):
        assert env_repo.label(root, t["metadata"]["kind"], svc) == t["expected"], t
        if t["metadata"]["kind"] == "owner":
            area = env_repo.service_dir(root, svc).parent.name
            by_area = env_repo.owner_handle(owners, f"/services/{area}/")
            overridden += by_area != t["expected"].lower()
    assert overridden >= 20  # the last matching CODEOWNERS line, not the area's, decides


# -- through the real servers ---------------------------------------------------------------


def one_per_kind(name: str) -> list[tuple[dict[str, Any], Any]]:
    first: dict[str, tuple[dict[str, Any], Any]] = {}
    for t, e in entities(name):
        if split_of(t["id"]) == "dev":
            first.setdefault(t["metadata"]["kind"], (t, e))
    return list(first.values())


@pytest.mark.parametrize("name", ["ledger", "clinic"])
def test_each_kind_is_answered_through_the_sqlite_server(name: str) -> None:
    sqlite_server()
    [server] = load_mcp_config(stage(name) / "servers.json")
    assert server.allow == ("read_query", "list_tables", "describe_table")
    with McpSessions([server]) as sessions:
        tools = {t.name: t for t in sessions.tools()}
        assert sorted(tools) == [f"{name}_{t}" for t in sorted(server.allow)]
        assert {n for n, _ in sessions.refused} == {
            f"{name}_write_query", f"{name}_create_table", f"{name}_append_insight"}
        listed = ast.literal_eval(tools[f"{name}_list_tables"].fn({}).output)
        with connect(name) as db:
            assert {r["name"] for r in listed} == \
                {t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        for t, entity in one_per_kind(name):
            literal = str(entity) if isinstance(entity, int) else f"'{entity}'"
            sql = STAGES[name].LABELS[t["metadata"]["kind"]].replace("?", literal)
            result = tools[f"{name}_read_query"].fn({"query": sql})
            assert result.error is None, result.error
            [[value]] = [list(r.values()) for r in ast.literal_eval(result.output)]
            value = round(value, 3) if isinstance(value, float) else value
            assert value == pytest.approx(t["expected"]), (t, result.output)
        refused = tools[f"{name}_read_query"].fn({"query": "DELETE FROM legend"})
        assert "Only SELECT" in (refused.output + (refused.error or ""))


def test_each_kind_is_answered_through_the_filesystem_server() -> None:
    """Relative paths, as a model that was never told the root would write them: the server
    reads them from its folder."""
    filesystem_server()
    [server] = load_mcp_config(stage("repo") / "servers.json")
    with McpSessions([server]) as sessions:
        tools = {t.name: t for t in sessions.tools()}
        assert sorted(tools) == sorted(f"repo_{t}" for t in server.allow)
        assert {"repo_write_file", "repo_edit_file", "repo_move_file",
                "repo_create_directory"} <= {n for n, _ in sessions.refused}

        def call(tool: str, **args: Any) -> str:
            result = tools[f"repo_{tool}"].fn(args)
            assert result.error is None, (tool, args, result.error)
            return result.output

        outside = tools["repo_read_text_file"].fn({"path": "/etc/hostname"})
        assert outside.error and "outside allowed directories" in outside.error
        for t, svc in one_per_kind("repo"):
            kind = t["metadata"]["kind"]
            [found] = [line for line in call("search_files", path=".", pattern=f"**/{svc}")
                       .splitlines() if "/services/" in line]
            where = "services/" + found.split("/services/", 1)[1]
            if kind == "area":
                value: Any = where.split("/")[1]
            elif kind == "release":
                value = call("read_text_file", path=f"{where}/VERSION").strip()
            elif kind in ("port", "language", "dependencies"):
                [cfg] = [x.split()[-1] for x in call("list_directory", path=where).splitlines()
                         if "service." in x]
                got = env_repo.read_config(cfg, call("read_text_file", path=f"{where}/{cfg}"))
                value = len(got[kind]) if kind == "dependencies" else got[kind]
            elif kind == "escalation":
                text = call("read_text_file", path=f"docs/runbooks/{svc}.md")
                value = int(re.search(r"after (\d+) minutes", text).group(1))  # type: ignore[union-attr]
            else:
                handle = env_repo.owner_handle(call("read_text_file", path=".github/CODEOWNERS"),
                                               f"/{where}/")
                team = yaml.safe_load(call("read_text_file", path=f"teams/{handle}.yaml"))
                value = {"owner": team["display"], "lead": team["tech_lead"],
                         "channel": team["oncall_channel"]}[kind]
            assert value == t["expected"], (t, value)


def test_the_agent_loop_reaches_the_filesystem_server(tmp_path: Path) -> None:
    """``whetstone run`` with the stage's servers file: a model's calls in the agent's own
    format, with relative paths, reach the server and its answers come back to the model."""
    from click.testing import CliRunner  # only this test drives the command line

    from whetstone.cli import cli

    filesystem_server()
    t, svc = next((t, e) for t, e in entities("repo") if t["metadata"]["kind"] == "release")
    where = env_repo.service_dir(stage("repo") / "tree", svc).relative_to(stage("repo") / "tree")
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps({"replies": [
        f'Action: repo_search_files[{json.dumps({"path": ".", "pattern": f"**/{svc}"})}]',
        f'Action: repo_read_text_file[{json.dumps({"path": f"{where.as_posix()}/VERSION"})}]',
        f"Final Answer: {t['expected']}"]}))
    res = CliRunner().invoke(cli, ["run", t["question"], "--tools", "", "--mcp-config",
                                   str(stage("repo") / "servers.json"), "--model",
                                   f"scripted:{replies}", "--json"])
    assert res.exit_code == 0, res.output
    trace = json.loads(res.stdout)
    acts = [s for s in trace["steps"] if s["kind"] == "act"]
    assert [a["meta"]["tool"]["mcp"]["tool"] for a in acts] == ["search_files", "read_text_file"]
    assert where.as_posix() in acts[0]["output"]["observation"]
    assert acts[1]["output"]["observation"].strip() == t["expected"]
    assert trace["answer"] == t["expected"]


@pytest.mark.memory
def test_evolve_on_a_stage_prints_the_gates_decision_with_its_interval(tmp_path: Path) -> None:
    """The stages' evolve command as docs/results.md gives it (`whetstone evolve METHOD --tasks
    ENV@train --gate-tasks ENV@dev --tools '' --mcp-config FILE`), on the ledger's database
    through mcp-server-sqlite: a scripted model whose train runs query the server and answer
    with what it returned, and which answers nothing on dev. The evolver keeps those runs; the
    gate runs both versions on dev through the same server and prints its decision: the
    verdict, the difference and its interval, on the dev tasks it names."""
    from click.testing import CliRunner  # only this test and the run test drive the CLI

    from whetstone.cli import cli

    sqlite_server()
    kind = "item_category"
    picked = [(t, e) for t, e in entities("ledger") if t["metadata"]["kind"] == kind]
    train = [(t, e) for t, e in picked if split_of(t["id"]) == "train"][:2]
    dev = [(t, e) for t, e in picked if split_of(t["id"]) == "dev"][:2]
    for name, part in (("train", train), ("dev", dev)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(t) + "\n" for t, _ in part))
    replies = []
    for t, entity in train:
        sql = env_ledger.LABELS[kind].replace("?", f"'{entity}'")
        replies += [f"Action: ledger_read_query[{json.dumps({'query': sql})}]",
                    f"Final Answer: {t['expected']}"]
    replies += ["Final Answer: I cannot tell."] * (2 * len(dev))
    (tmp_path / "replies.json").write_text(json.dumps(replies))
    (tmp_path / "lib").mkdir()
    res = CliRunner().invoke(cli, [
        "evolve", "memory", "--model", f"scripted:{tmp_path / 'replies.json'}",
        "--tasks", str(tmp_path / "train.jsonl"), "--gate-tasks", str(tmp_path / "dev.jsonl"),
        "--tools", "", "--mcp-config", str(stage("ledger") / "servers.json"),
        "--library", str(tmp_path / "lib"), "-j", "1"])
    assert res.exit_code in (0, 12), res.output  # 12: the gate kept it as a candidate
    text = " ".join(res.output.split())
    assert re.search(r"[+-]0\.\d+ \[[+-]0\.\d+, [+-]0\.\d+\] on 2 tasks", text), text
    assert "gate rejected" in text or "gate accepted" in text, text
    # Both train runs were supported by what the server returned: both were kept.
    assert "2 demonstrations added (2 kept) from 2 runs" in text, text
