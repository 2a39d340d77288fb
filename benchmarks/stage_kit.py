"""What the environment stages' generators share (benchmarks/env_*.py): made-up names from a
seeded generator, task records, the order tasks are written in, and a SQLite file whose bytes
depend only on its rows.

A task record holds the question, the label the generator computed from the environment, the
scorer ``value`` and ``metadata.kind`` only: no query, path or argument an evolver could read
the answer from. Tasks are written kind by kind in turn (round robin), so any slice of a split
(``@test:0:300``) holds every kind in about equal shares.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from whetstone.engine.evaluation.tasks import split_of

SCORER = "value"
MIN_SPLITS = {"train": 300, "dev": 150, "test": 300}
_ONSETS = ("b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
           "z", "br", "dr", "st", "tr", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ea")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "th", "nd", "rk")


def made_up_word(rng: random.Random, syllables: int) -> str:
    """A pronounceable word that names nothing (``vornik``): no model knows its facts."""
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                   for _ in range(syllables))


def made_up_words(rng: random.Random, n: int, *, syllables: tuple[int, int] = (2, 3),
                  avoid: Iterable[str] = (), min_len: int = 4) -> list[str]:
    """``n`` distinct capitalised made-up words, none of them in ``avoid`` (lower case) and
    none inside another (so a name found in a question is the one meant)."""
    taken = {a.lower() for a in avoid}
    out: list[str] = []
    while len(out) < n:
        w = made_up_word(rng, rng.randint(*syllables))
        if len(w) < min_len or w in taken or any(w in o or o in w for o in taken):
            continue
        taken.add(w)
        out.append(w.capitalize())
    return out


def task(prefix: str, kind: str, index: int, question: str, expected: Any) -> dict[str, Any]:
    """One task record: the label and the kind, nothing that tells how it was found."""
    return {"id": f"{prefix}-{kind}-{index:04d}", "question": question, "expected": expected,
            "scorer": SCORER, "metadata": {"kind": kind}}


def phrase(rng: random.Random, phrasings: Sequence[str], **slots: Any) -> str:
    """One of a kind's phrasings, chosen by the seeded generator, with its slots filled."""
    return rng.choice(phrasings).format(**slots)


def interleave(by_kind: Mapping[str, Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Tasks kind by kind in turn: the first of each kind, then the second, ..."""
    out: list[dict[str, Any]] = []
    longest = max((len(v) for v in by_kind.values()), default=0)
    for i in range(longest):
        out += [tasks[i] for tasks in by_kind.values() if i < len(tasks)]
    return out


def split_counts(tasks: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    counts = {"train": 0, "dev": 0, "test": 0}
    for t in tasks:
        counts[split_of(str(t["id"]))] += 1
    return counts


def check_splits(tasks: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The split sizes, or an error when one is under what the scoreboard's slices take."""
    counts = split_counts(tasks)
    short = {k: (counts[k], n) for k, n in MIN_SPLITS.items() if counts[k] < n}
    if short:
        raise SystemExit(f"too few tasks in a split (have, need): {short}; make more per kind")
    return counts


def write_tasks(path: Path, tasks: Sequence[Mapping[str, Any]]) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for t in tasks:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")


def write_sqlite(path: Path, ddl: Sequence[str], rows: Mapping[str, Sequence[tuple[Any, ...]]]
                 ) -> None:
    """A fresh database of ``ddl`` and ``rows`` (table -> rows, inserted in order), VACUUMed:
    a fixed page layout, so the same rows give the same bytes."""
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as db:
        for statement in ddl:
            db.execute(statement)
        for table, values in rows.items():
            if values:
                marks = ", ".join("?" * len(values[0]))
                db.executemany(f"INSERT INTO {table} VALUES ({marks})", values)
    with sqlite3.connect(path) as db:
        db.execute("VACUUM")


def sql_label(db: sqlite3.Connection, sql: str, entity: Any, digits: int) -> Any:
    """The one value ``sql`` gives for ``entity`` (its only parameter); a float rounded to
    ``digits`` (money: cents are 2, fils 3). Anything but one non-null value is an error."""
    rows = db.execute(sql, (entity,)).fetchall()
    if len(rows) != 1 or rows[0][0] is None:
        raise ValueError(f"{sql!r} for {entity!r} gave {rows}, not one value")
    value = rows[0][0]
    return round(value, digits) if isinstance(value, float) else value


def sql_questions(db: sqlite3.Connection, rng: random.Random, prefix: str, *,
                  phrasings: Mapping[str, Sequence[str]], labels: Mapping[str, str],
                  entities: Mapping[str, str], slot: Mapping[str, str], per_kind: int,
                  digits: int) -> list[dict[str, Any]]:
    """``per_kind`` questions of each kind about distinct entities (``entities``: a query per
    slot listing the ones that may be asked about), each labelled by its kind's query in
    ``labels``; a sum or count of zero is not asked (a model could say it without looking)."""
    pools = {name: [r[0] for r in db.execute(sql)] for name, sql in entities.items()}
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for kind, texts in phrasings.items():
        name = slot[kind]
        made: list[dict[str, Any]] = []
        for entity in rng.sample(pools[name], len(pools[name])):
            value = sql_label(db, labels[kind], entity, digits)
            if value == 0:
                continue
            made.append(task(prefix, kind, len(made), phrase(rng, texts, **{name: entity}),
                             value))
            if len(made) == per_kind:
                break
        if len(made) < per_kind:
            raise SystemExit(f"{prefix}: only {len(made)} {kind} questions; add entities")
        by_kind[kind] = made
    return interleave(by_kind)


def schema_words(db: sqlite3.Connection) -> set[str]:
    """Every table and column name of a database, lower case: words a question must not say."""
    words: set[str] = set()
    for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        words.add(table.lower())
        words.update(str(c[1]).lower() for c in db.execute(f"PRAGMA table_info({table})"))
    return words


def says_any(text: str, words: Iterable[str]) -> list[str]:
    """The ``words`` that ``text`` holds as whole words (case-insensitive)."""
    low = text.lower()
    return sorted(w for w in words
                  if re.search(rf"(?<![a-z0-9_]){re.escape(w.lower())}(?![a-z0-9_])", low))


__all__ = ["MIN_SPLITS", "SCORER", "check_splits", "interleave", "made_up_word",
           "made_up_words", "phrase", "says_any", "schema_words", "split_counts", "sql_label",
           "sql_questions", "task", "write_sqlite", "write_tasks"]
