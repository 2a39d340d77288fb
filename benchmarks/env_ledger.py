"""The ledger stage: a shop's order ledger in SQLite behind mcp-server-sqlite, and questions
that only its rows answer, asked as a customer or a clerk would ask them.

    .venv/bin/python benchmarks/env_ledger.py          # writes benchmarks/fixtures/env_ledger/

writes ``ledger.db`` and ``tasks.jsonl`` (``servers.json``, the ``mcpServers`` file, is kept as
it is: mcp-server-sqlite 2025.4.25 on that file, read-only by its allow-list). Seven tables,
with conventions no model can guess and a library can learn from its calls:

- category and status codes resolved through lookup tables (``cat_codes``, ``state_codes``:
  status 3 is "returned"); a customer's region through ``regions``;
- money in cents (``list_cents``, ``each_cents``): a price asked "in dollars" is cents / 100;
- two date forms: an account's opening day as YYYYMMDD (``opened_ymd``), an order's day as
  days since 1970-01-01 (``placed_day``), and a deletion day as YYYYMMDD again;
- soft deletes: a deleted account (``is_deleted = 1``), a retired product (``retired = 1``)
  and a deleted order (``deleted_at`` set) are not there any more. Some names belong to a
  deleted or retired row and a live one, so a lookup that ignores the flag finds two;
- join paths: account -> region; order -> lines -> products.

Made-up names (seeded syllables) make every fact unguessable. Nine kinds of question, each a
single lookup or a short join or sum once the layout is known; labels come from SQL over the
written file (``LABELS``), numbers as numbers (dollars with cents), dates as YYYY-MM-DD.
Splits follow the task ids (60/20/20 by hash); the same seed gives the same bytes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import sqlite3
from pathlib import Path
from typing import Any

import stage_kit as kit

OUT = Path(__file__).resolve().parent / "fixtures" / "env_ledger"
SEED = 4601
PER_KIND = 190
DDL = (
    "CREATE TABLE regions (rg_code TEXT PRIMARY KEY, rg_label TEXT NOT NULL)",
    "CREATE TABLE cat_codes (cat TEXT PRIMARY KEY, cat_title TEXT NOT NULL)",
    "CREATE TABLE state_codes (st INTEGER PRIMARY KEY, st_text TEXT NOT NULL)",
    ("CREATE TABLE accounts (acct_id INTEGER PRIMARY KEY, acct_name TEXT NOT NULL, "
     "rg_code TEXT NOT NULL REFERENCES regions, opened_ymd INTEGER NOT NULL, "
     "is_deleted INTEGER NOT NULL DEFAULT 0)"),
    ("CREATE TABLE catalog (sku TEXT PRIMARY KEY, title TEXT NOT NULL, "
     "cat TEXT NOT NULL REFERENCES cat_codes, list_cents INTEGER NOT NULL, "
     "retired INTEGER NOT NULL DEFAULT 0)"),
    ("CREATE TABLE order_head (order_no INTEGER PRIMARY KEY, "
     "acct_id INTEGER NOT NULL REFERENCES accounts, placed_day INTEGER NOT NULL, "
     "st INTEGER NOT NULL REFERENCES state_codes, deleted_at INTEGER)"),
    ("CREATE TABLE order_lines (order_no INTEGER NOT NULL REFERENCES order_head, "
     "line_no INTEGER NOT NULL, sku TEXT NOT NULL REFERENCES catalog, qty INTEGER NOT NULL, "
     "each_cents INTEGER NOT NULL, PRIMARY KEY (order_no, line_no))"),
)
# How values are stored: words a question must not use (beside the tables' and columns' names).
STORAGE_WORDS = ("cents", "yyyymmdd", "epoch", "unix", "unixepoch", "timestamp", "code",
                 "codes", "sql", "database", "table", "column", "row", "rows", "deleted",
                 "retired", "flag", "sku")
CATEGORIES = (("KT", "Kitchen"), ("GR", "Garden"), ("LN", "Linens"), ("HW", "Hardware"),
              ("ST", "Stationery"), ("PT", "Pet Care"), ("LG", "Lighting"), ("TY", "Toys"),
              ("BT", "Bath"), ("OD", "Outdoor"))
STATES = ((1, "placed"), (2, "packed"), (3, "returned"), (4, "shipped"), (5, "cancelled"))
GOODS = ("Prism", "Vane", "Crest", "Loop", "Arc", "Nook", "Spire", "Drift", "Knot", "Halo",
         "Ridge", "Bloom")
EPOCH = dt.date(1970, 1, 1)

PHRASINGS = {
    "item_price": ("How much does the {item} cost, in dollars?",
                   "What is the price of the {item} in dollars?",
                   "In dollars, what does a {item} sell for?"),
    "item_category": ("What category does the {item} belong to?",
                      "Which product category is the {item} sold under?",
                      "In which category would I find the {item}?"),
    "customer_region": ("Which region is {customer} in?",
                        "What region does the customer {customer} belong to?",
                        "{customer} is a customer of ours: which region are they in?"),
    "customer_since": ("On what date did {customer} become a customer? Answer as YYYY-MM-DD.",
                       "When did {customer} open their account with us (YYYY-MM-DD)?",
                       "Since what date, in YYYY-MM-DD form, has {customer} been a customer?"),
    "order_status": ("What is the status of order {order}?",
                     "Where does order {order} stand right now: what is its status?",
                     "Order {order}: what state is it in?"),
    "order_date": ("On what date was order {order} placed? Answer as YYYY-MM-DD.",
                   "When was order {order} placed (YYYY-MM-DD)?",
                   "Give the date order {order} was placed, as YYYY-MM-DD."),
    "order_total": ("What was the total of order {order} in dollars?",
                    "How much did order {order} come to, in dollars?",
                    "In dollars, what is the full amount of order {order}?"),
    "customer_orders": ("How many orders has {customer} placed?",
                        "How many orders are on record for {customer}?",
                        "Count the orders {customer} has made with us."),
    "item_units": ("How many units of the {item} have been ordered in all?",
                   "What is the total quantity of the {item} ordered so far?",
                   "Across all orders, how many {item} units were ordered?"),
}
# Each kind's label: one SQL query over the written file, its entity as the only parameter.
LABELS = {
    "item_price": "SELECT list_cents / 100.0 FROM catalog WHERE title = ? AND retired = 0",
    "item_category": "SELECT c.cat_title FROM catalog p JOIN cat_codes c ON c.cat = p.cat "
                     "WHERE p.title = ? AND p.retired = 0",
    "customer_region": "SELECT r.rg_label FROM accounts a JOIN regions r "
                       "ON r.rg_code = a.rg_code WHERE a.acct_name = ? AND a.is_deleted = 0",
    "customer_since": "SELECT substr(opened_ymd, 1, 4) || '-' || substr(opened_ymd, 5, 2) "
                      "|| '-' || substr(opened_ymd, 7, 2) FROM accounts "
                      "WHERE acct_name = ? AND is_deleted = 0",
    "order_status": "SELECT s.st_text FROM order_head o JOIN state_codes s ON s.st = o.st "
                    "WHERE o.order_no = ? AND o.deleted_at IS NULL",
    "order_date": "SELECT date(placed_day * 86400, 'unixepoch') FROM order_head "
                  "WHERE order_no = ? AND deleted_at IS NULL",
    "order_total": "SELECT SUM(l.qty * l.each_cents) / 100.0 FROM order_lines l "
                   "JOIN order_head o ON o.order_no = l.order_no "
                   "WHERE l.order_no = ? AND o.deleted_at IS NULL",
    "customer_orders": "SELECT COUNT(*) FROM order_head o JOIN accounts a "
                       "ON a.acct_id = o.acct_id WHERE a.acct_name = ? AND a.is_deleted = 0 "
                       "AND o.deleted_at IS NULL",
    "item_units": "SELECT COALESCE(SUM(l.qty), 0) FROM order_lines l JOIN order_head o "
                  "ON o.order_no = l.order_no JOIN catalog p ON p.sku = l.sku "
                  "WHERE p.title = ? AND p.retired = 0 AND o.deleted_at IS NULL",
}
# The entities each kind may ask about (live ones; an order of a live account).
ENTITIES = {
    "item": "SELECT title FROM catalog WHERE retired = 0 ORDER BY title",
    "customer": "SELECT acct_name FROM accounts WHERE is_deleted = 0 ORDER BY acct_name",
    "order": "SELECT o.order_no FROM order_head o JOIN accounts a ON a.acct_id = o.acct_id "
             "WHERE o.deleted_at IS NULL AND a.is_deleted = 0 ORDER BY o.order_no",
}
SLOT = {"item_price": "item", "item_category": "item", "item_units": "item",
        "customer_region": "customer", "customer_since": "customer",
        "customer_orders": "customer", "order_status": "order", "order_date": "order",
        "order_total": "order"}


def ymd(day: dt.date) -> int:
    return day.year * 10000 + day.month * 100 + day.day


def make_rows(rng: random.Random) -> dict[str, list[tuple[Any, ...]]]:
    """The tables' rows: live and soft-deleted accounts and products (some sharing a name),
    orders over four years with their lines."""
    region_names = kit.made_up_words(rng, 8, syllables=(2, 3))
    regions = [(f"{rng.choice('NSEWQXZ')}{i}", name) for i, name in enumerate(region_names, 1)]
    words = kit.made_up_words(rng, 700, syllables=(2, 2), avoid=[r[1] for r in regions])
    given, family, brands = words[:120], words[120:320], words[320:]
    people = sorted({f"{rng.choice(given)} {rng.choice(family)}" for _ in range(400)})
    rng.shuffle(people)
    names = people[:300]
    items = sorted({f"{rng.choice(brands)} {rng.choice(GOODS)}" for _ in range(400)})
    rng.shuffle(items)
    titles = items[:300]

    start, end = dt.date(2015, 1, 1), dt.date(2023, 12, 31)
    accounts: list[tuple[Any, ...]] = []
    twins = set(rng.sample(names, 26))
    for name in names:
        for deleted in ((1, 0) if name in twins else (0,)):
            day = start + dt.timedelta(days=rng.randrange((end - start).days))
            accounts.append((len(accounts) + 1, name, rng.choice(regions)[0], ymd(day), deleted))
    catalog, retired = [], set(rng.sample(titles, 30))
    skus = iter(rng.sample(range(10**5, 10**6), len(titles) + len(retired)))
    for title in titles:
        for gone in ((1, 0) if title in retired else (0,)):
            catalog.append((f"SK-{next(skus)}", title, rng.choice(CATEGORIES)[0],
                            rng.randrange(199, 45000), gone))
    return {"regions": regions, "cat_codes": list(CATEGORIES), "state_codes": list(STATES),
            "accounts": accounts, "catalog": catalog, **orders(rng, accounts, catalog)}


def orders(rng: random.Random, accounts: list[tuple[Any, ...]],
           catalog: list[tuple[Any, ...]]) -> dict[str, list[tuple[Any, ...]]]:
    """About 2,300 orders, numbered in date order, each with one to four lines at the list
    price or a discount from it; about one in twelve soft-deleted."""
    first, last = (dt.date(2021, 1, 1) - EPOCH).days, (dt.date(2024, 12, 31) - EPOCH).days
    weights = [rng.choice((1, 1, 2, 3, 5)) for _ in accounts]
    drafts = sorted((rng.randrange(first, last), rng.choices(accounts, weights)[0][0])
                    for _ in range(2300))
    heads, lines = [], []
    for n, (day, acct) in enumerate(drafts):
        order_no = 40017 + n * 3 + rng.randrange(3)
        deleted = ymd(EPOCH + dt.timedelta(days=day + rng.randrange(1, 60))) \
            if rng.random() < 0.08 else None
        heads.append((order_no, acct, day, rng.choice([s for s, _ in STATES]), deleted))
        for line_no, product in enumerate(rng.sample(catalog, rng.randint(1, 4)), 1):
            price = product[3] if rng.random() < 0.7 else \
                round(product[3] * rng.choice((0.9, 0.85, 0.75)))
            lines.append((order_no, line_no, product[0], rng.randint(1, 6), price))
    return {"order_head": heads, "order_lines": lines}


def label(db: sqlite3.Connection, kind: str, entity: Any) -> Any:
    """A kind's label for one entity, from the rows (``LABELS``): dollars rounded to cents."""
    return kit.sql_label(db, LABELS[kind], entity, 2)


def questions(db: sqlite3.Connection, rng: random.Random) -> list[dict[str, Any]]:
    """``PER_KIND`` questions of each kind, labels from ``LABELS`` (dollars to the cent)."""
    return kit.sql_questions(db, rng, "ledger", phrasings=PHRASINGS, labels=LABELS,
                             entities=ENTITIES, slot=SLOT, per_kind=PER_KIND, digits=2)


def generate(out: Path) -> dict[str, int]:
    """Write the database and the tasks into ``out``; the split sizes."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    db_path = out / "ledger.db"
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
    print(f"wrote {args.out}: ledger.db and tasks.jsonl ({counts})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
