"""Values in tool results: whether a result supports an answer, and where the answer sits.

A tool's result is text: a table printed as a Python or JSON literal (an SQL server's rows), a
file's content (YAML, TOML, INI, JSON), a listing. A value *supports* an answer when the answer
stands in it as a whole value: a number equal to it, or the text with nothing alphanumeric
touching either end. ``learn_selector`` finds how to read the answer back out of such a result
(``Selector``: the whole result, its one value, or the value after a key), and ``select`` reads
it from another result of the same call, for another task.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import replace
from typing import Any

from .records import Selector

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.]*\d)")
_KEY_BEFORE = re.compile(r"""(["']?)([A-Za-z_][\w.-]{0,40})\1\s*[:=]\s*["']?\Z""")
MAX_RESULT_CHARS = 200_000


def as_number(text: Any) -> float | None:
    """``text`` as a number when it is one (``"12.50"``, ``12``, ``"1,204"``), else None."""
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return float(text) if math.isfinite(text) else None
    s = str(text).strip().replace(",", "")
    try:
        value = float(s)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def same_number(a: float, b: float, rel: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


def _leaves(value: Any, out: list[Any], limit: int = 10_000) -> None:
    if len(out) > limit:
        return
    if isinstance(value, dict):
        for v in value.values():
            _leaves(v, out, limit)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _leaves(v, out, limit)
    else:
        out.append(value)


def structured(text: str) -> Any | None:
    """The result read as a JSON or Python literal (a table of rows, an object); None when it
    is neither."""
    s = text.strip()
    if not s or s[0] not in "[{(\"'" and as_number(s) is None:
        return None
    if len(s) > MAX_RESULT_CHARS:
        return None
    try:
        return json.loads(s)
    except ValueError:
        pass
    try:
        return ast.literal_eval(s)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def leaf_values(text: str) -> list[Any] | None:
    """Every scalar of a structured result, in order; None when it is not structured."""
    value = structured(text)
    if value is None:
        return None
    out: list[Any] = []
    _leaves(value, out)
    return out


def _text_key(value: Any) -> str:
    return " ".join(str(value).split()).casefold().strip(" \t\"'`")


def equal_values(a: Any, b: Any) -> bool:
    """Whether two values are the same answer: numbers within tolerance, text up to case and
    spacing."""
    na, nb = as_number(a), as_number(b)
    if na is not None and nb is not None:
        return same_number(na, nb)
    if (na is None) != (nb is None):
        return False
    return _text_key(a) == _text_key(b) and _text_key(a) != ""


def _occurrences(text: str, value: Any) -> list[tuple[int, int]]:
    """Where ``value`` stands in ``text`` as a whole value: (start, end) spans."""
    number = as_number(value)
    if number is not None:
        return [m.span() for m in _NUMBER.finditer(text)
                if same_number(float(m.group()), number)]
    needle = " ".join(str(value).split())
    if not needle:
        return []
    pattern = r"(?<![A-Za-z0-9])" + r"\s+".join(re.escape(w) for w in needle.split()) + \
        r"(?![A-Za-z0-9])"
    return [m.span() for m in re.finditer(pattern, text, re.IGNORECASE)]


def distinctive(value: Any) -> bool:
    """Whether ``value`` is specific enough that finding it somewhere means it was copied:
    a number with three significant digits or more, a text of four characters or more."""
    if value is None or isinstance(value, (bool, dict, list)):
        return False
    number = as_number(value)
    if number is not None:
        digits = re.sub(r"\D", "", f"{abs(number):.6f}").strip("0")
        return len(digits) >= 3
    return len(str(value).strip()) >= 4


def supports(result: str, value: Any) -> bool:
    """Whether ``result`` holds ``value`` as a whole value (see the module docstring)."""
    if result is None or len(result) > MAX_RESULT_CHARS:
        return False
    leaves = leaf_values(result)
    if leaves is not None and any(equal_values(v, value) for v in leaves
                                  if not isinstance(v, (dict, list))):
        return True
    return bool(_occurrences(result, value))


def _keys(text: str, key: str) -> list[re.Match[str]]:
    return list(re.finditer(r"""(["']?)""" + re.escape(key) + r"""\1\s*[:=]\s*""", text))


def _value_at(text: str, start: int) -> str:
    """The value written at ``start``: a quoted string, or the rest of the item."""
    rest = text[start:]
    if rest[:1] in "\"'":
        q = rest[0]
        end = rest.find(q, 1)
        return rest[1:end] if end > 0 else rest[1:].split("\n", 1)[0]
    m = re.match(r"[^,}\]\n#;]*", rest)
    return (m.group() if m else "").strip()


_ISO_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})\Z")
_EPOCH = "1970-01-01"
_WORDS = {"date:yyyymmdd": "the date written as the number YYYYMMDD",
          "date:days": "the number of days since 1970-01-01",
          "date:seconds": "the number of seconds since 1970-01-01 UTC (a time on that day)"}


def _date(text: str) -> Any:
    import datetime as dt  # lazy: only for date-shaped values

    m = _ISO_DATE.match(text.strip())
    if not m:
        return None
    try:
        return dt.date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    except ValueError:
        return None


def kept_forms(value: Any) -> list[tuple[float, str]]:
    """The numbers an environment may keep ``value`` as, each with the conversion that reads
    it back (``records.CONVERSIONS``): a distinctive number scaled by a power of ten, a date
    as YYYYMMDD, days or seconds since 1970."""
    import datetime as dt  # lazy: only when a value is looked for in another form

    out: list[tuple[float, str]] = []
    number = as_number(value)
    if number is not None and number != 0 and distinctive(value):
        for k in (2, 1, 3, 4, 6, -1, -2, -3):
            out.append((number * 10 ** k, f"scale:{-k}"))
    day = _date(str(value)) if isinstance(value, str) else None
    if day is not None:
        days = (day - dt.date(1970, 1, 1)).days
        out += [(float(day.strftime("%Y%m%d")), "date:yyyymmdd"), (float(days), "date:days"),
                (float(days * 86400), "date:seconds")]
    return out


def forms_in(result: str, value: Any) -> list[tuple[float, str]]:
    """``kept_forms`` of ``value``, and for a date each number of ``result`` that falls
    inside its day as seconds since 1970: a time kept in seconds is rarely midnight (a visit
    at 14:07, a birth recorded at noon), and the date is what the question asks for."""
    out = kept_forms(value)
    day = _date(str(value)) if isinstance(value, str) else None
    if day is None or result is None or len(result) > MAX_RESULT_CHARS:
        return out
    import datetime as dt  # lazy: only when a date is looked for

    start = (day - dt.date(1970, 1, 1)).days * 86400
    for m in _NUMBER.finditer(result):
        n = float(m.group())
        if n.is_integer() and start < n < start + 86400 and \
                not any(same_number(n, raw) for raw, _ in out):
            out.append((n, "date:seconds"))
    return out


def convert(raw: str, how: str) -> str | None:
    """The value ``raw`` read back by the conversion ``how`` (None when it cannot be)."""
    if not how:
        return raw
    import datetime as dt  # lazy: only for converted values

    number = as_number(raw)
    if number is None:
        return None
    kind, _, arg = how.partition(":")
    if kind == "scale":
        value = round(number * 10 ** int(arg), 10)
        return f"{value:g}" if abs(value) < 1e15 else str(value)
    try:
        if arg == "yyyymmdd":
            return dt.datetime.strptime(str(int(number)), "%Y%m%d").date().isoformat()
        days = number if arg == "days" else number // 86400
        return (dt.date(1970, 1, 1) + dt.timedelta(days=int(days))).isoformat()
    except (ValueError, OverflowError):
        return None


def near_misses(result: str, value: Any) -> list[str]:
    """How a result holds ``value`` in another form (``kept_forms``), in words: said to an
    analyst looking for the call that answers, as a failing test says what it got."""
    if result is None or len(result) > MAX_RESULT_CHARS:
        return []
    numbers = {float(m.group()) for m in _NUMBER.finditer(result)}
    out: list[str] = []
    for raw, how in forms_in(result, value):
        if not any(same_number(raw, n) for n in numbers):
            continue
        if how.startswith("scale:"):
            k = -int(how.split(":")[1])
            word = f"the expected answer times {10 ** k:g}" if k > 0 else \
                f"the expected answer divided by {10 ** -k:g}"
        else:
            word = f"the expected date as {_WORDS[how]}"
        shown = str(int(raw)) if float(raw).is_integer() else f"{raw:g}"
        out.append(f"{shown} in the result is {word}")
    return out


def holds(result: str, value: Any) -> str | None:
    """How ``result`` holds ``value``: "" as it is, a conversion (``kept_forms``) when only
    in another form or as the sum of its records' field (``learn_sum``), None when not at
    all."""
    if supports(result, value):
        return ""
    for raw, how in forms_in(result, value):
        if supports(result, raw):
            return how
    summed = learn_sum(result, value)
    return None if summed is None else summed.convert


def _records(result: str | None) -> list[dict[Any, Any]] | None:
    """``result`` as a list of records (one dict each), or None when it is not one."""
    rows = structured(result) if result is not None and len(result) <= MAX_RESULT_CHARS \
        else None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return None
    return rows


def _column(rows: list[dict[Any, Any]], key: str) -> list[float] | None:
    """The number ``key`` holds in each of ``rows``, or None when one holds no number."""
    numbers = [None if isinstance(r.get(key), str) else as_number(r.get(key)) for r in rows]
    return None if any(n is None for n in numbers) else numbers  # type: ignore[return-value]


def _sum_text(total: float) -> str:
    return str(int(total)) if total.is_integer() and abs(total) < 1e15 else f"{total:.10g}"


def learn_sum(result: str, value: Any) -> Selector | None:
    """``value`` as the sum of one numeric field over the records of ``result`` (several
    bills of one visit), as it is or in a kept form (``forms_in``): a ``sum`` selector, or
    None. Only a field of two or more records: one record's field is a ``key``."""
    rows = _records(result)
    if rows is None or len(rows) < 2:
        return None
    number = as_number(value)
    targets = ([(number, "")] if number is not None and distinctive(value) else []) + \
        [(raw, how) for raw, how in forms_in(result, value) if how.startswith("scale:")]
    for key in rows[0]:
        column = _column(rows, key)
        if column is None:
            continue
        total = sum(column)
        for raw, how in targets:
            if same_number(total, raw):
                return Selector("sum", str(key), convert=how)
    return None


def _learn_plain(result: str, value: Any) -> Selector | None:
    """Where ``value`` stands as it is in ``result`` (see ``learn_selector``)."""
    if result is None or not supports(result, value):
        return None
    if equal_values(result.strip(), value):
        return Selector("whole")
    parts = _segments(result)
    for i in range(len(parts) - 1, -1, -1):  # the nearest the end: robust to the root
        if equal_values(parts[i], value):
            return Selector("segment", index=i - len(parts))
    leaves = leaf_values(result)
    cell = leaves is not None and len(leaves) == 1 and equal_values(leaves[0], value)
    for start, _ in _occurrences(result, value):
        m = _KEY_BEFORE.search(result[max(0, start - 80):start])
        if m is None:
            continue
        key = m.group(2)
        for index, km in enumerate(_keys(result, key)):
            if km.end() <= start <= km.end() + 1 and equal_values(
                    _value_at(result, km.end()), value):
                return Selector("key", key, index)
    return Selector("cell") if cell else None


def learn_selector(result: str, value: Any) -> Selector | None:
    """How to read ``value`` back out of ``result``: the whole result, the value after a key
    (the first such key that reads it back: it still reads the value when other results of
    the call hold more), or its one value; when the result keeps it only in another form
    (``kept_forms``), where that form stands and the conversion back; else the sum of a field
    over its records (``learn_sum``). None when none does."""
    if result is None:
        return None
    found = _learn_plain(result, value)
    if found is not None:
        return found
    for raw, how in forms_in(result, value):
        sel = _learn_plain(result, raw)
        if sel is not None:
            return replace(sel, convert=how)
    return learn_sum(result, value)


def one_path(result: str | None) -> str:
    """The result when it is one path (``/srv/tree/services/media/relay``, a search's one
    hit), stripped; "" for anything else."""
    text = (result or "").strip()
    if "\n" in text or "/" not in text or len(text) > 1000 or " " in text:
        return ""
    return text


def _segments(result: str) -> list[str]:
    """The parts of a result that is one path; empty for anything else."""
    return [p for p in one_path(result).split("/") if p]


def _select_plain(result: str, selector: Selector) -> str | None:
    """The value ``selector`` reads, as it stands in ``result``."""
    if result is None:
        return None
    if selector.kind == "whole":
        text = result.strip()
        return text or None
    if selector.kind == "segment":
        parts = _segments(result)
        at = selector.index
        return parts[at] if -len(parts) <= at < len(parts) else None
    if selector.kind == "sum":
        rows = _records(result)
        column = _column(rows, selector.key) if rows is not None else None
        return _sum_text(sum(column)) if column is not None else None
    if selector.kind == "cell":
        leaves = leaf_values(result)
        if leaves is None or len(leaves) != 1 or leaves[0] is None:
            return None
        return str(leaves[0])
    found = _keys(result, selector.key)
    if selector.index >= len(found):
        return None
    value = _value_at(result, found[selector.index].end())
    return value or None


def select(result: str, selector: Selector) -> str | None:
    """The value ``selector`` reads from ``result``, converted back when it says so; None
    when it is not there."""
    raw = _select_plain(result, selector)
    return None if raw is None else convert(raw, selector.convert)


__all__ = ["as_number", "convert", "distinctive", "equal_values", "forms_in", "holds",
           "kept_forms", "leaf_values", "learn_selector", "learn_sum", "near_misses", "one_path", "select",
           "structured", "supports"]
