"""The clinic stage: a clinic's records in SQLite behind mcp-server-sqlite, with a schema and
conventions unlike the ledger's (benchmarks/env_ledger.py), so a gain cannot be one schema's
luck.

    .venv/bin/python benchmarks/env_clinic.py          # writes benchmarks/fixtures/env_clinic/

writes ``clinic.db`` and ``tasks.jsonl`` (``servers.json`` is kept as it is: mcp-server-sqlite
on that file, read-only by its allow-list). Six tables:

- letters for roles and outcomes, spelled out in one shared ``legend`` table by domain
  (role ``P`` is a porter, outcome ``H`` is "discharged");
- times as seconds since 1970-01-01 UTC (``born_at``, ``seen_at``; births before 1970 are
  negative), asked for as YYYY-MM-DD;
- money in fils, thousandths of a dinar (``fee_fils``), asked for "in dinars";
- Y/N letters for states: a staff member no longer ``active``, a patient record ``merged``
  into another (its name lives on in the kept record, with another birth date), a
  ``void`` encounter (and its bills) that did not happen, a bill not yet ``settled``;
- a self-join: a staff member's manager is another staff row (``reports_to``); staff names
  are two columns (``given``, ``family``), a patient's one (``pt_name``).

Nine kinds of question, each a lookup or a short join, count or sum once that is known;
labels come from SQL over the written file (``LABELS``). The same seed gives the same bytes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import sqlite3
from pathlib import Path
from typing import Any

import stage_kit as kit

OUT = Path(__file__).resolve().parent / "fixtures" / "env_clinic"
SEED = 4603
PER_KIND = 190
DDL = (
    ("CREATE TABLE legend (domain TEXT NOT NULL, flag TEXT NOT NULL, meaning TEXT NOT NULL, "
     "PRIMARY KEY (domain, flag))"),
    "CREATE TABLE wards (ward_ref TEXT PRIMARY KEY, ward_title TEXT NOT NULL, level INTEGER)",
    ("CREATE TABLE staff (staff_no INTEGER PRIMARY KEY, given TEXT NOT NULL, "
     "family TEXT NOT NULL, role_flag TEXT NOT NULL, reports_to INTEGER REFERENCES staff, "
     "ward_ref TEXT NOT NULL REFERENCES wards, active TEXT NOT NULL)"),
    ("CREATE TABLE patients (mrn TEXT PRIMARY KEY, pt_name TEXT NOT NULL, "
     "born_at INTEGER NOT NULL, merged TEXT NOT NULL)"),
    ("CREATE TABLE encounters (enc_no INTEGER PRIMARY KEY, mrn TEXT NOT NULL REFERENCES "
     "patients, staff_no INTEGER NOT NULL REFERENCES staff, seen_at INTEGER NOT NULL, "
     "outcome_flag TEXT NOT NULL, void TEXT NOT NULL)"),
    ("CREATE TABLE billing (bill_id INTEGER PRIMARY KEY, enc_no INTEGER NOT NULL REFERENCES "
     "encounters, fee_fils INTEGER NOT NULL, settled TEXT NOT NULL)"),
)
# How values are stored: words a question must not use (beside the tables' and columns' names).
STORAGE_WORDS = ("fils", "epoch", "unix", "unixepoch", "seconds", "timestamp", "letter",
                 "flag", "flags", "sql", "database", "table", "column", "row", "rows", "mrn",
                 "void", "merged")
ROLES = (("D", "doctor"), ("N", "nurse"), ("P", "porter"), ("H", "pharmacist"),
         ("T", "therapist"), ("C", "clerk"))
OUTCOMES = (("H", "discharged"), ("A", "admitted"), ("R", "referred"), ("X", "transferred"))

PHRASINGS = {
    "staff_role": ("What is {staff}'s role at the clinic?",
                   "What job does {staff} do here?",
                   "{staff} works for us: in what role?"),
    "staff_manager": ("Who is {staff}'s manager?",
                      "Who does {staff} report to?",
                      "Name the person {staff} reports to."),
    "staff_ward": ("Which ward does {staff} work on?",
                   "On which ward is {staff} based?",
                   "{staff} works on which ward?"),
    "patient_born": ("What is {patient}'s date of birth? Answer as YYYY-MM-DD.",
                     "When was {patient} born (YYYY-MM-DD)?",
                     "Give {patient}'s birth date as YYYY-MM-DD."),
    "patient_last_seen": ("On what date was {patient} last seen? Answer as YYYY-MM-DD.",
                          "When was {patient}'s most recent visit (YYYY-MM-DD)?",
                          "What was the date of {patient}'s latest visit, as YYYY-MM-DD?"),
    "patient_visits": ("How many times has {patient} been seen at the clinic?",
                       "How many visits has {patient} had with us?",
                       "Count the times {patient} has come in to be seen."),
    "visit_outcome": ("What was the outcome of visit {visit}?",
                      "How did visit {visit} end?",
                      "Visit {visit}: what was its outcome?"),
    "visit_billed": ("How much was billed for visit {visit}, in dinars?",
                     "In dinars, what did visit {visit} cost in total?",
                     "What was the full bill for visit {visit} in dinars?"),
    "patient_owes": ("How much does {patient} still owe, in dinars?",
                     "In dinars, what is {patient}'s unpaid balance?",
                     "What does {patient} have left to pay, in dinars?"),
}
_NAME = "s.given || ' ' || s.family"
LABELS = {
    "staff_role": "SELECT l.meaning FROM staff s JOIN legend l ON l.domain = 'role' "
                  f"AND l.flag = s.role_flag WHERE {_NAME} = ? AND s.active = 'Y'",
    "staff_manager": "SELECT m.given || ' ' || m.family FROM staff s JOIN staff m "
                     f"ON m.staff_no = s.reports_to WHERE {_NAME} = ? AND s.active = 'Y'",
    "staff_ward": "SELECT w.ward_title FROM staff s JOIN wards w ON w.ward_ref = s.ward_ref "
                  f"WHERE {_NAME} = ? AND s.active = 'Y'",
    "patient_born": "SELECT date(born_at, 'unixepoch') FROM patients "
                    "WHERE pt_name = ? AND merged = 'N'",
    "patient_last_seen": "SELECT date(MAX(e.seen_at), 'unixepoch') FROM encounters e "
                         "JOIN patients p ON p.mrn = e.mrn WHERE p.pt_name = ? "
                         "AND p.merged = 'N' AND e.void = 'N'",
    "patient_visits": "SELECT COUNT(*) FROM encounters e JOIN patients p ON p.mrn = e.mrn "
                      "WHERE p.pt_name = ? AND p.merged = 'N' AND e.void = 'N'",
    "visit_outcome": "SELECT l.meaning FROM encounters e JOIN legend l "
                     "ON l.domain = 'outcome' AND l.flag = e.outcome_flag "
                     "WHERE e.enc_no = ? AND e.void = 'N'",
    "visit_billed": "SELECT SUM(b.fee_fils) / 1000.0 FROM billing b JOIN encounters e "
                    "ON e.enc_no = b.enc_no WHERE b.enc_no = ? AND e.void = 'N'",
    "patient_owes": "SELECT COALESCE(SUM(b.fee_fils), 0) / 1000.0 FROM billing b "
                    "JOIN encounters e "
                    "ON e.enc_no = b.enc_no JOIN patients p ON p.mrn = e.mrn "
                    "WHERE p.pt_name = ? AND p.merged = 'N' AND e.void = 'N' "
                    "AND b.settled = 'N'",
}
ENTITIES = {
    "staff": "SELECT given || ' ' || family FROM staff WHERE active = 'Y' "
             "AND reports_to IS NOT NULL ORDER BY 1",
    "patient": "SELECT pt_name FROM patients WHERE merged = 'N' AND mrn IN "
               "(SELECT mrn FROM encounters WHERE void = 'N') ORDER BY 1",
    "visit": "SELECT e.enc_no FROM encounters e WHERE e.void = 'N' AND e.enc_no IN "
             "(SELECT enc_no FROM billing) ORDER BY 1",
}
SLOT = {"staff_role": "staff", "staff_manager": "staff", "staff_ward": "staff",
        "patient_born": "patient", "patient_last_seen": "patient",
        "patient_visits": "patient", "patient_owes": "patient", "visit_outcome": "visit",
        "visit_billed": "visit"}


def seconds(when: dt.datetime) -> int:
    return int(when.replace(tzinfo=dt.UTC).timestamp())


def make_rows(rng: random.Random) -> dict[str, list[tuple[Any, ...]]]:
    """Wards, a staff tree (a director, heads, their teams; some no longer active), patients
    (some merged away, their name kept by the live record) and their encounters and bills."""
    ward_names = kit.made_up_words(rng, 9, syllables=(2, 3))
    wards = [(f"W{n:02d}", title, rng.randint(0, 6))
             for n, title in zip(rng.sample(range(10, 99), 9), ward_names, strict=True)]
    words = kit.made_up_words(rng, 560, syllables=(2, 2), avoid=ward_names)
    names = sorted({f"{rng.choice(words[:140])} {rng.choice(words[140:])}" for _ in range(900)})
    rng.shuffle(names)
    staff_names, patient_names = names[:320], names[320:820]

    staff: list[tuple[Any, ...]] = []
    numbers = iter(rng.sample(range(1000, 9999), len(staff_names)))
    for i, name in enumerate(staff_names):
        given, family = name.split(" ")
        boss = None if i == 0 else staff[0][0] if i < 14 else rng.choice(staff[1:14])[0] \
            if i < 60 else rng.choice(staff[1:60])[0]
        active = "Y" if i < 60 or rng.random() > 0.07 else "N"
        staff.append((next(numbers), given, family, rng.choice(ROLES)[0], boss,
                      rng.choice(wards)[0], active))

    patients, twins = [], set(rng.sample(patient_names, 36))
    mrns = iter(rng.sample(range(100000, 999999), len(patient_names) + len(twins)))
    for name in patient_names:
        for merged in (("Y", "N") if name in twins else ("N",)):
            born = dt.datetime(1935, 1, 1, 12) + dt.timedelta(days=rng.randrange(31000))
            patients.append((f"MRN-{next(mrns)}", name, seconds(born), merged))
    return {"legend": [("role", f, m) for f, m in ROLES]
            + [("outcome", f, m) for f, m in OUTCOMES],
            "wards": wards, "staff": staff, "patients": patients,
            **encounters(rng, [p for p in patients if p[3] == "N"],
                         [s for s in staff if s[6] == "Y"])}


def encounters(rng: random.Random, patients: list[tuple[Any, ...]],
               staff: list[tuple[Any, ...]]) -> dict[str, list[tuple[Any, ...]]]:
    """About 2,600 encounters between 2022 and mid-2025, in working hours (09:00-17:00 UTC,
    so the day is the same from UTC-9 to UTC+6); one in fourteen void. One to three bills
    each, in fils; most settled."""
    first = dt.datetime(2022, 1, 3)
    weights = [rng.choice((1, 1, 2, 3, 4)) for _ in patients]
    drafts = sorted((first + dt.timedelta(days=rng.randrange(1270),
                                          minutes=rng.randrange(9 * 60, 17 * 60)),
                     rng.choices(patients, weights)[0][0]) for _ in range(2600))
    rows: list[tuple[Any, ...]] = []
    bills: list[tuple[Any, ...]] = []
    for n, (when, mrn) in enumerate(drafts):
        enc_no = 700_003 + n * 7 + rng.randrange(7)
        rows.append((enc_no, mrn, rng.choice(staff)[0], seconds(when), rng.choice(OUTCOMES)[0],
                     "Y" if rng.random() < 0.07 else "N"))
        for _ in range(rng.randint(1, 3)):
            bills.append((len(bills) + 1, enc_no, rng.randrange(4_000, 260_000, 5),
                           "Y" if rng.random() < 0.7 else "N"))
    return {"encounters": rows, "billing": bills}


def label(db: sqlite3.Connection, kind: str, entity: Any) -> Any:
    """A kind's label for one entity, from the rows (``LABELS``): dinars to the fils."""
    return kit.sql_label(db, LABELS[kind], entity, 3)


def questions(db: sqlite3.Connection, rng: random.Random) -> list[dict[str, Any]]:
    """``PER_KIND`` questions of each kind, labels from ``LABELS``."""
    return kit.sql_questions(db, rng, "clinic", phrasings=PHRASINGS, labels=LABELS,
                             entities=ENTITIES, slot=SLOT, per_kind=PER_KIND, digits=3)


def generate(out: Path) -> dict[str, int]:
    """Write the database and the tasks into ``out``; the split sizes."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    db_path = out / "clinic.db"
    kit.write_sqlite(db_path, DDL, make_rows(rng))
    with sqlite3.connect(db_path) as db:
        tasks = questions(db, rng)
    kit.write_tasks(out / "tasks.jsonl", tasks)
    return kit.check_splits(tasks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    counts = generate(args.out)
    print(f"wrote {args.out}: clinic.db and tasks.jsonl ({counts})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
