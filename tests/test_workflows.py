"""The workflows method: verified calls of the host's tools, learned from runs and offered as
tools. The environment is a real SQLite database behind a function tool (what an MCP server's
read_query does, in process); the models are scripted."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.evaluation.tasks import TaskRecord, TaskSet
from whetstone.engine.methods.base import EvolveContext
from whetstone.engine.methods.workflows.evolver import WorkflowsConfig, _Fit
from whetstone.engine.methods.workflows.explore import explore, layout_of
from whetstone.engine.methods.workflows.induce import (
    CallRecord,
    Wording,
    induce,
    read_slots,
)
from whetstone.engine.methods.workflows.plugin import shown_calls
from whetstone.engine.methods.workflows.records import (
    CallStep,
    Selector,
    Slot,
    Workflow,
    check_workflow,
    fill,
    parse_workflows,
    render_workflows,
)
from whetstone.engine.methods.workflows.values import (
    holds,
    learn_selector,
    near_misses,
    select,
    supports,
)
from whetstone.engine.types import Request
from whetstone.tools.base import Tool, ToolResult
from whetstone.tools.functions import function_tool

pytestmark = [pytest.mark.workflows]  # every test here uses it

# -- values and induction --------------------------------------------------------------------


def test_a_result_supports_an_answer_only_as_a_whole_value() -> None:
    assert supports("[{'price': 12.5}]", 12.5)
    assert supports("[{'price': 12.5}]", "12.50")
    assert not supports("[{'price': 112.5}]", 12.5)
    assert supports("owner: Mo Ada\nport: 80", "mo ada")
    assert not supports("owner: Mo Adams", "Mo Ada")


@pytest.mark.parametrize("result,value,kind,other,expected", [
    ("[{'price': 12.5}]", 12.5, "key", "[{'price': 3.25}]", "3.25"),
    ("[{'SUM(qty)': 7}]", 7, "cell", "[{'SUM(qty)': 11}]", "11"),
    ("owner: ana\nport: 8080\n", 8080, "key", "owner: bo\nport: 9090\n", "9090"),
    ('{"lead": "Mo Ada", "size": 4}', "Mo Ada", "key", '{"size": 2, "lead": "Cy"}', "Cy"),
    ("2.3.1\n", "2.3.1", "whole", "4.0.0\n", "4.0.0"),
])
def test_a_selector_learned_on_one_result_reads_another(
        result: str, value: Any, kind: str, other: str, expected: str) -> None:
    sel = learn_selector(result, value)
    assert sel is not None and sel.kind == kind
    assert select(other, sel) == expected


QUESTIONS = [f"How much does the {c} {t} cost?" for c in ("Amber", "Jade", "Ruby", "Onyx")
             for t in ("Kettle", "Lamp", "Rake")] + \
    [f"Which region is {n} in?" for n in ("Dana Whit", "Al Bo", "Cy Dee", "Ed Fo", "Gil Ho")]


def test_induce_makes_the_questions_values_slots_and_its_wording_a_pattern() -> None:
    call = CallRecord("db_read_query", {"query": "SELECT cents/100.0 AS usd FROM items "
                                                 "WHERE title = 'Amber Lamp'"}, "[{'usd': 4.5}]")
    w = induce("How much does the Amber Lamp cost?", [call], 4.5, Wording(QUESTIONS))
    assert w is not None
    assert [s.name for s in w.slots] == ["title"]
    assert w.steps[0].arguments["query"].endswith("WHERE title = '{title}'")
    assert w.patterns == ("How much does the {title} cost?",)
    assert w.answer == Selector("key", "usd")
    assert read_slots(w.patterns, "how much does the Ruby Rake cost") == {"title": "Ruby Rake"}
    assert read_slots(w.patterns, "Which region is Al Bo in?") is None


def test_induce_refuses_a_call_that_holds_its_answer_or_takes_nothing_from_the_question() -> None:
    wording = Wording(QUESTIONS)
    leaked = CallRecord("db_read_query", {"query": "SELECT 4.5 AS usd WHERE 'Amber Lamp' = "
                                                   "'Amber Lamp'"}, "[{'usd': 4.5}]")
    assert induce("How much does the Amber Lamp cost?", [leaked], 4.5, wording) is None
    constant = CallRecord("db_read_query", {"query": "SELECT MAX(cents) AS m FROM items"},
                          "[{'m': 990}]")
    assert induce("How much does the Amber Lamp cost?", [constant], 990, wording) is None


def test_induce_follows_a_value_from_one_result_into_the_next_call() -> None:
    calls = [CallRecord("fs_list", {}, "/srv/repo"),
             CallRecord("fs_read", {"path": "/srv/repo/services/ledger.yaml"},
                        "name: ledger\nteam: payments\nport: 8443"),
             CallRecord("fs_read", {"path": "/srv/repo/teams/payments.json"},
                        '{"lead": "Mo Ada", "size": 3}')]
    questions = [f"Who leads the team that owns the {s} service?" for s in
                 ("ledger", "auth", "vault", "billing", "pay", "relay")] + QUESTIONS
    w = induce(questions[0], calls, "Mo Ada", Wording(questions))
    assert w is not None
    assert len(w.steps) == 2  # the look around (fs_list) is dropped
    team = next(s for s in w.slots if s.from_step == 0)
    assert team.select == Selector("key", "team")
    assert w.steps[1].arguments["path"] == "/srv/repo/teams/{" + team.name + "}.json"


def test_a_date_kept_in_seconds_is_found_at_any_time_of_its_day() -> None:
    # 1992-08-21 12:00 UTC: a birth recorded at noon, a visit at 14:07, never midnight
    noon = "[{'born_at': 714398400}]"
    assert holds(noon, "1992-08-21") == "date:seconds"
    sel = learn_selector(noon, "1992-08-21")
    assert sel == Selector("key", "born_at", convert="date:seconds")
    assert select("[{'born_at': 1732442820}]", sel) == "2024-11-24"  # 10:07 that day
    assert select("[{'born_at': -86399}]", sel) == "1969-12-31"  # before 1970
    assert holds("[{'born_at': 714484800}]", "1992-08-21") is None  # the next day's noon
    assert any("714398400" in m for m in near_misses(noon, "1992-08-21"))


def test_a_possessive_name_becomes_a_slot_without_its_s() -> None:
    names = ("Corwa Lonter", "Al Bo", "Cy Dee", "Ed Fo", "Gil Ho", "Ida Ju")
    questions = [f"What is {n}'s role at the clinic?" for n in names] + QUESTIONS
    call = CallRecord("db_read_query", {"query": "SELECT meaning FROM staff WHERE "
                                                 "given || ' ' || family = 'Corwa Lonter'"},
                      "[{'meaning': 'clerk'}]")
    w = induce(questions[0], [call], "clerk", Wording(questions))
    assert w is not None and w.patterns == ("What is {family}'s role at the clinic?",)
    assert read_slots(w.patterns, "What is Ida Ju's role at the clinic?") == {"family": "Ida Ju"}


SERVICES = ("relay-api", "kiln-sync", "moss-cron", "fern-web", "tarn-proxy", "wick-store")


def test_a_path_a_search_found_becomes_a_slot_and_its_folder_an_answer() -> None:
    questions = [f"{s} is at which release?" for s in SERVICES] + \
        [f"{s} belongs to which product area?" for s in SERVICES]
    found = CallRecord("fs_search", {"path": ".", "pattern": "**/relay-api"},
                       "/srv/tree/services/media/relay-api\n")
    for path in ("/srv/tree/services/media/relay-api/VERSION",
                 "services/media/relay-api/VERSION"):  # the server reads both
        w = induce(questions[0], [found, CallRecord("fs_read", {"path": path}, "4.1.9\n")],
                   "4.1.9", Wording(questions))
        assert w is not None
        assert w.steps[0].arguments == {"path": ".", "pattern": "**/{value}"}
        assert w.steps[1].arguments == {"path": "{path}/VERSION"}  # not the folder "media"
        assert w.slots[1] == Slot("path", "/srv/tree/services/media/relay-api", 0,
                                  Selector("whole"))
        assert read_slots(w.patterns, "kiln-sync is at which release?") == {"value": "kiln-sync"}
    area = induce(questions[6], [found], "media", Wording(questions))
    assert area is not None and area.answer == Selector("segment", index=-2)
    assert select("/srv/tree/services/search/kiln-sync", area.answer) == "search"
    assert select("two\nlines/a/b", area.answer) is None  # one path, or nothing


def test_the_look_around_walks_a_tree_past_its_first_level() -> None:
    tree = {"/t": ["[DIR] services", "[FILE] README.md"], "/t/services": ["[DIR] media"],
            "/t/services/media": ["[DIR] relay-api"], "/t/services/media/relay-api":
            ["[FILE] VERSION"]}

    def fs_roots() -> str:
        """The folders this server may read."""
        return "Allowed directories:\n/t"

    def fs_list(path: str) -> str:
        """List a folder."""
        if path not in tree:
            raise ValueError(f"no folder {path}")
        return "\n".join(tree[path])

    tools = [function_tool(fs_roots), function_tool(fs_list)]
    fit = _Fit(WorkflowsConfig(), [], {}, ScriptedBackend(responder=lambda r: ""), None,
               EvolveContext(tasks=tasks("t", TRAIN_NAMES, TRAIN_PEOPLE),
                             agent_tools=lambda: tools))
    looked = [c.arguments.get("path") for c, _ in fit._look()]
    assert looked == [None, "/t", "/t/services", "/t/services/media",
                      "/t/services/media/relay-api"]
    assert len(fit._look(budget=3)) == 3


def test_an_answer_kept_over_several_records_is_their_sum() -> None:
    bills = "[{'bill': 1, 'cents': 110480}, {'bill': 2, 'cents': 29650}]"
    assert holds(bills, "1401.30") == "scale:-2"  # no one record holds it
    sel = learn_selector(bills, "1401.30")
    assert sel == Selector("sum", "cents", convert="scale:-2")
    assert Selector.from_dict(sel.to_dict()) == sel
    assert select("[{'bill': 7, 'cents': 500}]", sel) == "5"  # a visit billed once
    assert select("[]", sel) is None  # nothing billed: abstains
    assert select("[{'cents': 'n/a'}, {'cents': 5}]", sel) is None
    assert learn_selector("[{'cents': 1450}]", "14.50") == Selector("key", "cents",
                                                                    convert="scale:-2")
    assert holds(bills, "1401.31") is None
    w = Workflow("bill_of_visit", "", (Slot("visit", "101"),),
                 (CallStep("db", {"query": "SELECT cents FROM bills WHERE visit = {visit}"}),),
                 sel, ("What was visit {visit} billed?",), 4, 4)
    assert check_workflow(w) == []
    assert "names the key" in " ".join(check_workflow(replace(w, answer=Selector("sum"))))
    assert "the sum of cents over the records" in shown_calls(w, {"visit": "101"})


VISITS = {101: [12040, 8075], 102: [4510], 103: [3020, 3090, 1575], 104: [9905]}


def test_a_key_learned_from_one_record_is_kept_as_a_sum_where_that_answers(
        tmp_path: Path) -> None:
    path = tmp_path / "bills.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE bills (visit INTEGER, cents INTEGER)")
        db.executemany("INSERT INTO bills VALUES (?, ?)",
                       [(v, c) for v, cs in VISITS.items() for c in cs])

    def db_read_query(query: str) -> str:
        """Run a read-only SQL query."""
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
            con.row_factory = sqlite3.Row
            return str([dict(r) for r in con.execute(query).fetchall()])

    tools = [function_tool(db_read_query)]
    train = TaskSet("b", tuple(TaskRecord(f"b{v}", f"What was visit {v} billed?",
                                          expected=sum(cs) / 100, scorer="numeric")
                               for v, cs in VISITS.items()))
    fit = _Fit(WorkflowsConfig(), [], {}, ScriptedBackend(responder=lambda r: ""), None,
               EvolveContext(tasks=train, agent_tools=lambda: tools))
    one = CallRecord("db_read_query", {"query": "SELECT cents FROM bills WHERE visit = 102"},
                     db_read_query("SELECT cents FROM bills WHERE visit = 102"))
    w = induce("What was visit 102 billed?", [one], 45.1, fit.wording)
    assert w is not None and w.answer == Selector("key", "cents", convert="scale:-2")
    kept: dict[str, Workflow] = {}
    assert fit.admit([w], kept, {}) == [(4, 4)]  # as a key: 2 of 4
    [got] = kept.values()
    assert got.answer.kind == "sum"


def test_a_label_in_a_calls_value_is_refused_and_one_inside_a_name_is_not() -> None:
    def db_read_query(query: str) -> str:
        """Run a read-only SQL query."""
        return "[]"

    train = TaskSet("o", (
        TaskRecord("o1", "What is the status of order 42249?", expected="placed"),
        TaskRecord("o2", "When was order 42250 placed?", expected="2023-06-15"),
        TaskRecord("o3", "What is the total of order 42251?", expected="1715.49")))
    fit = _Fit(WorkflowsConfig(), [], {}, ScriptedBackend(responder=lambda r: ""), None,
               EvolveContext(tasks=train, agent_tools=lambda: [function_tool(db_read_query)]))

    def flow(query: str) -> Workflow:
        return Workflow("w", "", (Slot("order_no", "42250"),),
                        (CallStep("db_read_query", {"query": query}),), Selector("cell"),
                        (f"{query[:12]} {{order_no}}?",), hits=3, tries=3)

    kept = [flow("SELECT placed_day FROM order_head WHERE order_no = {order_no}")]
    refused = [flow("SELECT st FROM order_head WHERE st_text = 'placed' AND n = {order_no}"),
               flow("SELECT '2023-06-15' FROM order_head WHERE order_no = {order_no}"),
               flow("SELECT 1715.49 FROM order_head WHERE order_no = {order_no}")]
    patch = fit.patch(kept + refused, {}, 0.0)
    assert patch.details["refused_labels"] == 3
    [text] = patch.changes.values()
    assert text is not None and "placed_day" in text and "'placed'" not in text


def test_a_call_that_fails_is_answered_with_the_layout_it_missed() -> None:
    staff = CallRecord("db_describe", {"table_name": "staff"},
                       "[{'name': 'given'}, {'name': 'family'}, {'name': 'role'}]")
    other = CallRecord("db_describe", {"table_name": "wards"}, "[{'name': 'title'}]")
    replies = iter(json.dumps({"name": "q", "arguments": {"query": q}}) for q in (
        "SELECT role FROM staff WHERE name = 'Al Bo'",
        "SELECT role FROM staff WHERE given = 'Al' AND family = 'Bo'"))
    analyst = ScriptedBackend(responder=lambda r: next(replies), prefill=True)

    def run(tool: str, args: dict[str, Any]) -> ToolResult:
        if "name =" in args["query"]:
            return ToolResult(output="Database error: no such column: name")
        return ToolResult(output="[{'role': 'nurse'}]")

    found = asyncio.run(explore(analyst, "system", "What is Al Bo's role?", "nurse", run,
                                {"q": "query"}, known=[other, staff], turns=2))
    assert found.found and found.calls[-1].arguments["query"].endswith("family = 'Bo'")
    told = found.transcript[3]["content"]  # what the failed call was answered with
    assert "no such column" in told and "given" in told and "family" in told
    assert "title" not in told  # only the layout the call named
    assert layout_of("q", {"query": "SELECT 1 FROM staffing"}, [staff]) == []
    # each turn's reply is begun as a call, so that it cannot open with an explanation
    assert [r.prefix for r in analyst.requests] == ['{"name": "'] * 2


def test_an_analyst_that_only_repeats_itself_is_given_up_after_patience_turns() -> None:
    seen = CallRecord("q", {"query": "SELECT * FROM staff"}, "[{'given': 'Al'}]")
    again = json.dumps({"name": "q", "arguments": {"query": "SELECT * FROM staff"}})
    analyst = ScriptedBackend(responder=lambda r: again, prefill=True)

    def run(tool: str, args: dict[str, Any]) -> ToolResult:
        raise AssertionError("a repeated call is never run")

    found = asyncio.run(explore(analyst, "system", "What is Al Bo's role?", "nurse", run,
                                {"q": "query"}, known=[seen], turns=5, resamples=2))
    # two turns of three samples each, every one a repeat: the other three turns are not spent
    assert not found.found and found.analyst_calls == 6 and found.bad_replies == 6
    never = asyncio.run(explore(analyst, "system", "What is Al Bo's role?", "nurse", run,
                                {"q": "query"}, known=[seen], turns=5, resamples=2,
                                patience=0))
    assert never.analyst_calls == 15


def test_a_value_with_a_quote_cannot_end_the_string_it_stands_in() -> None:
    assert fill("SELECT 1 WHERE t = '{title}'", {"title": "O'Brien"}) == \
        "SELECT 1 WHERE t = 'O''Brien'"
    assert fill("/srv/{svc}/x", {"svc": "a'b"}) == "/srv/a'b/x"


def test_the_file_round_trips_and_reports_what_is_malformed() -> None:
    w = Workflow("price_of_title", "", (Slot("title", "Amber Lamp"),),
                 (CallStep("db_read_query", {"query": "SELECT 1 WHERE t = '{title}'"}),),
                 Selector("cell"), ("How much does the {title} cost?",), 3, 3)
    text = render_workflows([w])
    assert parse_workflows(text) == ([w], [])
    bad = text.replace("'{title}'", "'{other}'")
    found, problems = parse_workflows(bad, path="workflows/x.yaml")
    assert found == [] and any("{other}" in str(p) for p in problems)
    assert parse_workflows("workflows: [", path="workflows/x.yaml")[1][0].rule == "yaml"


# -- the evolver and the runtime, end to end ----------------------------------------------

NAMES = ["Amber Lamp", "Jade Rake", "Ruby Kettle", "Onyx Mat", "Sage Lamp", "Coral Rake",
         "Ivory Kettle", "Azure Mat", "Slate Lamp"]
PEOPLE = {n: "NS"[i % 2] for i, n in enumerate(["Dana Whit", "Al Bo", "Cy Dee", "Ed Fo",
                                               "Gil Ho", "Ida Jo", "Kai Lo", "Mo Nu", "Oz Pi",
                                               "Qu Ra", "Sy Tu", "Uma Vo"])}
TRAIN_NAMES, DEV_NAMES = NAMES[:6], NAMES[6:]
TRAIN_PEOPLE, DEV_PEOPLE = list(PEOPLE)[:4], list(PEOPLE)[4:]


@pytest.fixture
def db_tool(tmp_path: Path) -> Tool:
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE items (title TEXT, cents INTEGER)")
        db.executemany("INSERT INTO items VALUES (?, ?)",
                       [(n, 150 * (i + 1)) for i, n in enumerate(NAMES)])
        db.execute("CREATE TABLE people (name TEXT, rg TEXT)")
        db.executemany("INSERT INTO people VALUES (?, ?)", list(PEOPLE.items()))
        db.execute("CREATE TABLE regions (rg TEXT, label TEXT)")
        db.executemany("INSERT INTO regions VALUES (?, ?)", [("N", "Northmoor"),
                                                             ("S", "Southfen")])

    def db_read_query(query: str) -> str:
        """Run a read-only SQL query on the shop's database."""
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
            con.row_factory = sqlite3.Row
            return str([dict(r) for r in con.execute(query).fetchall()])

    return function_tool(db_read_query)


def tasks(prefix: str, names: list[str], people: list[str]) -> TaskSet:
    out = [TaskRecord(f"{prefix}p{i}", f"How much does the {n} cost?",
                      expected=1.5 * (NAMES.index(n) + 1), scorer="numeric")
           for i, n in enumerate(names)]
    out += [TaskRecord(f"{prefix}r{i}", f"Which region is {n} in?",
                       expected={"N": "Northmoor", "S": "Southfen"}[PEOPLE[n]],
                       scorer="normalised") for i, n in enumerate(people)]
    return TaskSet(prefix, tuple(out))


def _name_in(text: str, pattern: str) -> str:
    return re.search(pattern, text).group(1)  # type: ignore[union-attr]


def agent_model(request: Request) -> str:
    """Calls the database for prices (the SQL it knows); guesses regions."""
    last = request.messages[-1].text
    if request.prefix:  # a required workflow call: its pattern reads the slot from the task
        return "}}</tool_call>"
    if "[{" in last:
        return "The answer is " + _name_in(last, r": ([\d.]+)")
    q = next(m.text for m in request.messages if m.role == "user")
    if "cost" in q:
        name = _name_in(q, r"the (.+) cost")
        sql = f"SELECT cents/100.0 AS usd FROM items WHERE title = '{name}'"
        return '<tool_call>{"name": "db_read_query", "arguments": ' + \
            json.dumps({"query": sql}) + "}</tool_call>"
    return "The answer is Eastvale"


def analyst_model(request: Request) -> str:
    """Looks up regions through the join, after one look at the tables."""
    user = [m.text for m in request.messages if m.role == "user"]
    q = _name_in(user[0], r"Question: (.*)")
    if len(user) == 1:
        return '{"name": "db_read_query", "arguments": {"query": "SELECT name FROM ' \
               'sqlite_master"}}'
    person = _name_in(q, r"region is (.+) in")
    sql = ("SELECT r.label FROM people p JOIN regions r ON r.rg = p.rg "
           f"WHERE p.name = '{person}'")
    return json.dumps({"name": "db_read_query", "arguments": {"query": sql}})


def test_evolve_learns_workflows_and_the_agent_calls_them(tmp_path: Path, db_tool: Tool) -> None:
    agent = ScriptedBackend(responder=agent_model, tool_calls=True, prefill=True)
    engine = Engine(model=agent, library=tmp_path / "lib", create=True, tools=[db_tool])
    result = engine.evolve("workflows", tasks=tasks("t", TRAIN_NAMES, TRAIN_PEOPLE),
                           gate_tasks=tasks("d", DEV_NAMES, DEV_PEOPLE),
                           analyst=ScriptedBackend(responder=analyst_model), concurrency=1)
    details = result.patch.details
    assert details["runs_that_reached_the_answer"] == len(TRAIN_NAMES)  # each price run
    added = {w["name"]: w for w in details["added"]}
    assert set(added) == {"usd_of_title", "label_of_name"}, added
    assert added["usd_of_title"]["hits"] == len(TRAIN_NAMES)
    assert added["label_of_name"]["hits"] == len(TRAIN_PEOPLE)  # found exploring, then checked
    assert details["explored_kept"] == 1 and result.patch.costs["analyst_calls"] >= 2
    explored = details["explorations"]  # why a kind was (not) learned can be read back
    assert explored[0]["found"] and explored[0]["hits"] == len(TRAIN_PEOPLE)
    assert explored[0]["calls"][-1]["tool"] == "db_read_query"
    assert explored[0]["turns"][0].startswith("assistant: ")
    text = result.patch.changes["workflows/db.yaml"] if "workflows/db.yaml" in \
        result.patch.changes else next(iter(result.patch.changes.values()))
    assert "Northmoor" not in text and "Southfen" not in text  # no label is learned
    assert result.version is not None, result.decision  # regions went from 0 to 8 on dev
    assert result.decision.candidate_score > result.decision.current_score
    serving = Engine(model=agent, library=tmp_path / "lib", tools=[db_tool],
                     methods=["workflows"])
    trace = serving.run("Which region is Cy Dee in?")
    assert trace.answer == "Northmoor"
    prepare = next(s for s in trace.steps if s.kind == "prepare")
    assert prepare.output["require_tools"] == ["label_of_name"]
    assert "usd_of_title" not in prepare.output["tools"]  # only what fits is offered
    hello = next(s for s in serving.run("Say hello").steps if s.kind == "prepare")
    assert not {"label_of_name", "usd_of_title"} & set(hello.output["tools"])


def test_a_host_without_the_tools_is_shown_the_calls_filled_in(tmp_path: Path,
                                                              db_tool: Tool) -> None:
    # Chat mode (the caller runs its own tools): the workflow's calls, for this task.
    w = Workflow("usd_of_title", "", (Slot("title", "Amber Lamp"),),
                 (CallStep("db_read_query", {"query": "SELECT cents FROM items WHERE title = "
                                                      "'{title}'"}),),
                 Selector("key", "cents", 0, "scale:-2"), ("How much does the {title} cost?",),
                 5, 5)
    model = ScriptedBackend(responder=lambda r: "ok")
    engine = Engine(model=model, library=tmp_path / "lib", create=True, methods=["workflows"])
    engine.library.commit({"workflows/db.yaml": render_workflows([w])}, method="test",
                          validate=False)
    reply = engine.chat([{"role": "user", "content": "How much does the Ruby Kettle cost?"}])
    system = model.requests[-1].messages[0].text  # what the model was sent
    assert "call db_read_query with" in system
    assert "WHERE title = 'Ruby Kettle'" in system
    assert "divide it by 100" in system
    assert reply.guidance["workflows"]["shown_calls"] == "usd_of_title"
    engine.chat([{"role": "user", "content": "Say hello"}])
    assert "db_read_query" not in model.requests[-1].messages[0].text
