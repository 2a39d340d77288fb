"""The MCP stage's data: a small shop database and questions only its rows can answer.

    .venv/bin/python benchmarks/mcp_shop.py            # writes benchmarks/fixtures/mcp_shop/

writes ``shop.db`` (SQLite: one table ``products(name, category, price, stock)``, 48 rows of
made-up names, prices and stock counts from a fixed seed), ``tasks.jsonl`` (questions whose
labels are computed from the rows with SQL here, never written by hand) and leaves
``servers.json`` (the ``mcpServers`` file the scoreboard's rows use: ``mcp-server-sqlite``
from PyPI on that file, read-only through its allow-list) as it is. No value can be known
without reading the table, so a model answers only by calling the server's tools. Splits
follow the task ids (``tasks.jsonl@train|dev|test``, 60/20/20 by hash).

The same seed gives the same bytes: running it again changes nothing (the test checks that).
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
from pathlib import Path

OUT = Path(__file__).resolve().parent / "fixtures" / "mcp_shop"
SEED = 40
SCHEMA = "The shop's SQLite database has one table, products(name, category, price, stock)."
CATEGORIES = ("kitchen", "garden", "office", "toys", "sport", "bath")
COLOURS = ("Amber", "Azure", "Coral", "Ivory", "Jade", "Onyx", "Ruby", "Sage")
THINGS = {"kitchen": ("Kettle", "Toaster", "Whisk", "Skillet"),
          "garden": ("Trowel", "Planter", "Hose", "Rake"),
          "office": ("Stapler", "Ledger", "Lamp", "Binder"),
          "toys": ("Kite", "Yo-yo", "Puzzle", "Robot"),
          "sport": ("Racket", "Helmet", "Jersey", "Bottle"),
          "bath": ("Towel", "Sponge", "Mirror", "Mat")}


def make_rows(rng: random.Random) -> list[tuple[str, str, float, int]]:
    rows = []
    for category in CATEGORIES:
        names = [f"{c} {t}" for t in THINGS[category] for c in COLOURS]
        for name in rng.sample(names, 8):
            rows.append((name, category, round(rng.uniform(3, 180), 2), rng.randint(0, 400)))
    return rows


def write_db(path: Path, rows: list[tuple[str, str, float, int]]) -> None:
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE products (name TEXT PRIMARY KEY, category TEXT NOT NULL, "
                   "price REAL NOT NULL, stock INTEGER NOT NULL)")
        db.executemany("INSERT INTO products VALUES (?, ?, ?, ?)", rows)
    # A fixed page layout: the file's bytes depend only on the rows.
    with sqlite3.connect(path) as db:
        db.execute("VACUUM")


def questions(db: sqlite3.Connection, rng: random.Random) -> list[dict[str, object]]:
    """Each question with its label, computed by the SQL beside it."""
    names = [r[0] for r in db.execute("SELECT name FROM products ORDER BY name")]
    out: list[dict[str, object]] = []

    def add(kind: str, text: str, sql: str, args: tuple[object, ...], scorer: str) -> None:
        value = db.execute(sql, args).fetchone()[0]
        out.append({"id": f"shop-{kind}-{len(out):03d}", "question": f"{SCHEMA} {text}",
                    "expected": value if scorer == "numeric" else str(value),
                    "scorer": scorer, "metadata": {"kind": kind, "sql": sql,
                                                   "args": list(args)}})

    for name in rng.sample(names, 36):
        add("stock", f"How many units of '{name}' are in stock?",
            "SELECT stock FROM products WHERE name = ?", (name,), "numeric")
    for name in rng.sample(names, 36):
        add("price", f"What is the price of '{name}'?",
            "SELECT price FROM products WHERE name = ?", (name,), "numeric")
    for category in CATEGORIES:
        add("total", f"What is the total stock of all products in the category '{category}'?",
            "SELECT SUM(stock) FROM products WHERE category = ?", (category,), "numeric")
        add("priciest", f"Which product in the category '{category}' has the highest price?",
            "SELECT name FROM products WHERE category = ? ORDER BY price DESC LIMIT 1",
            (category,), "contains")
        add("cheapest", f"Which product in the category '{category}' has the lowest price?",
            "SELECT name FROM products WHERE category = ? ORDER BY price LIMIT 1",
            (category,), "contains")
    for name in rng.sample(names, 12):
        add("category", f"In which category is '{name}'?",
            "SELECT category FROM products WHERE name = ?", (name,), "contains")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    db_path = args.out / "shop.db"
    write_db(db_path, make_rows(rng))
    with sqlite3.connect(db_path) as db:
        tasks = questions(db, rng)
    with (args.out / "tasks.jsonl").open("w", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")
    print(f"wrote {db_path} and {len(tasks)} tasks to {args.out / 'tasks.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
