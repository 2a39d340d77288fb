"""Library paths and change contents: the rules every writer (commits, candidates) checks.

Kept apart from ``store.py`` so ``candidates.py`` can use them without importing the store.

A path is checked before anything is written, so a version can always be written out as the
plain files of the view (``skills/`` and the folders methods own), exported and checked out elsewhere:
each part at most ``MAX_PART_BYTES`` bytes of UTF-8 (ext4 and most file systems allow 255; the
margin leaves room for the temp names of atomic writes and for the library's own folder), the
whole path at most ``MAX_PATH_BYTES``, at most ``MAX_DEPTH`` parts, no control characters,
and each file at most ``MAX_FILE_BYTES``.
"""

from __future__ import annotations

import re
import unicodedata

from ..engine.errors import ValidationError

# The top-level folder every library holds. A method that keeps files of its own declares
# its folder (``MethodSpec.roots``) and the faces open libraries with those as ``roots``.
CORE_ROOTS: tuple[str, ...] = ("skills",)
# Outside every version: evolvers' resume state, one folder per method (see state.py).
STATE_DIR = "state"

MAX_PART_BYTES = 128
MAX_PATH_BYTES = 512
MAX_DEPTH = 8
MAX_FILE_BYTES = 16 * 1024 * 1024

Content = str | bytes | None


def to_bytes(path: str, value: Content) -> bytes | None:
    """A change's content as bytes (None deletes); anything else is a ``ValidationError``."""
    if value is None or isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode("utf-8")
    else:
        raise ValidationError(path, "content-type", f"content must be str, bytes or None, "
                              f"not {type(value).__name__}")
    if data is not None and len(data) > MAX_FILE_BYTES:
        raise ValidationError(path, "file-size", f"the file is {len(data)} bytes; a library "
                              f"file holds at most {MAX_FILE_BYTES}",
                              hint="keep large data outside the library and refer to it")
    return data


def shown(text: str, limit: int = 60) -> str:
    """A name as a message can show it: as is when short and printable, else escaped and cut
    (a lone surrogate would crash the terminal's encoder; a 4 KB name buries the message)."""
    if len(text) <= limit and text.isprintable() and text.isascii():
        return text
    if len(text) <= limit and text.isprintable():
        try:
            text.encode("utf-8")
            return text
        except UnicodeEncodeError:
            pass
    cut = ascii(text[:limit])[1:-1]
    return cut if len(text) <= limit else f"{cut}... ({len(text)} characters)"


def name_problem(part: str) -> tuple[str, str] | None:
    """(rule, detail) when one part of a path (a file or folder name) cannot be kept, else
    None: too long, not encodable as UTF-8, holding a control character, a backslash or an
    invisible format character (bidi, zero-width), or not in Unicode NFC form."""
    try:
        size = len(part.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: bytes that were not UTF-8 on disk
        return "path-encoding", f"the name {shown(part)} is not valid UTF-8"
    if size > MAX_PART_BYTES:
        return "path-length", (f"the name {shown(part)} is {size} bytes of UTF-8; a file or "
                               f"folder name holds at most {MAX_PART_BYTES}")
    bad = next((c for c in part if c == "\\" or unicodedata.category(c) in ("Cc", "Cs")), None)
    if bad is not None:
        return "path-characters", (f"the name {shown(part)} holds the character {bad!r}; "
                                   "names may not hold control characters or backslashes")
    # Invisible format characters (bidi overrides such as U+202E, zero-width U+200B..U+200D,
    # U+2060, U+FEFF) make a name read as another one; so do two spellings of one accent.
    bad = next((c for c in part if unicodedata.category(c) == "Cf"), None)
    if bad is not None:
        return "path-characters", (f"the name {part[:60]!a} holds the invisible "
                                   f"character U+{ord(bad):04X}; names may not hold bidi "
                                   "controls or zero-width characters")
    if not unicodedata.is_normalized("NFC", part):
        return "path-normalization", (f"the name {shown(part)} is not in Unicode NFC form "
                                      "(an accent spelled as two characters); write it "
                                      f"composed, as {unicodedata.normalize('NFC', part)!r}")
    return _lookalike_problem(part)


# Characters that draw nothing although they are letters or marks (Unicode's
# Default_Ignorable_Code_Point less the format characters refused above): a grapheme
# joiner, Khmer inherent vowels, Mongolian and other variation selectors, Hangul fillers.
_IGNORABLE = ((0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F),
              (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xE0000, 0xE0FFF))
# Letters, marks and digits: what a name may hold besides printable ASCII (so no symbols,
# spaces or punctuation outside ASCII: NBSP, U+2028, U+2800 and U+2024 pass for others).
_NAME_CATEGORIES = {"Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Nd", "Nl", "No"}
# Scripts one word may mix (Unicode TS #39, "Highly Restrictive"): Japanese, Chinese with
# Bopomofo and Korean beside Latin; any other mixture (a Cyrillic a among Latin letters) is
# a look-alike of another name.
_MIXES = ({"LATIN", "HAN", "HIRAGANA", "KATAKANA"}, {"LATIN", "HAN", "BOPOMOFO"},
          {"LATIN", "HAN", "HANGUL"})
_WORD_BREAKS = re.compile(r"[ -/:-@\[-`{-~]+")  # ASCII spaces and punctuation
_SCRIPT_ALIASES = {"CJK": "HAN", "IDEOGRAPHIC": "HAN", "KATAKANA-HIRAGANA": "KATAKANA"}


def _script(char: str) -> str | None:
    """The script of a letter, mark or digit outside ASCII, read from its Unicode name (the
    standard library has no script property); None for marks that take their base's."""
    word = unicodedata.name(char, "UNNAMED").split(" ", 1)[0]
    return None if word == "COMBINING" else _SCRIPT_ALIASES.get(word, word)


def _lookalike_problem(part: str) -> tuple[str, str] | None:
    """(rule, detail) when ``part`` holds a character outside the allow-list, a
    compatibility form (NFKC) or, within one word, letters of scripts that do not mix."""
    for char in part:
        code = ord(char)
        if 0x20 <= code < 0x7F:
            continue
        ignorable = any(lo <= code <= hi for lo, hi in _IGNORABLE)
        if ignorable or unicodedata.category(char) not in _NAME_CATEGORIES:
            return "path-characters", (
                f"the name {part[:60]!a} holds U+{code:04X} "
                f"({unicodedata.name(char, 'unnamed').lower()}), which passes for another "
                "character or for none; outside ASCII a name holds only letters, marks and "
                "digits")
    plain = unicodedata.normalize("NFKC", part)
    if plain != part:
        return "path-normalization", (
            f"the name {part[:60]!a} holds a compatibility form (a ligature, a full-width or "
            f"superscript letter) that reads as {shown(plain)!r}; write it that way")
    for word in _WORD_BREAKS.split(part):
        scripts = {s for c in word if not (c.isascii() and c.isdigit())
                   if (s := "LATIN" if c.isascii() else _script(c)) is not None}
        if len(scripts) > 1 and not any(scripts <= mix for mix in _MIXES):
            return "path-script", (
                f"the name {part[:60]!a} mixes {' and '.join(sorted(scripts)).lower()} letters "
                f"in the word {word[:40]!a}, which passes for another name; write each word "
                "in one script")
    return None


def path_problems(path: str) -> list[tuple[str, str]]:
    """(rule, detail) for everything that keeps ``path`` out of a library: its parts (see
    ``name_problem``), its total length and its depth. The layout rules (roots, '.', '..',
    hidden names) are ``check_path``'s."""
    parts = path.split("/")
    out = [p for p in (name_problem(part) for part in parts) if p is not None]
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        size = 0  # reported per part above
    if size > MAX_PATH_BYTES:
        detail = f"the path is {size} bytes of UTF-8; a library path holds at most {MAX_PATH_BYTES}"
        out.append(("path-length", detail))
    if len(parts) > MAX_DEPTH:
        out.append(("path-depth", f"the path has {len(parts)} parts; at most {MAX_DEPTH}"))
    return out


def check_path(path: str, *, deleting: bool = False,
               roots: tuple[str, ...] = CORE_ROOTS) -> str:
    """A library path: relative, '/'-separated, inside one of ``roots``, no '.' or '..'.

    Hidden parts (``.env.example``) and ``__pycache__`` are refused too: the view, export and
    import all skip them, so such a file would show as deleted and be lost on a round trip.
    So are names the view could not write (``path_problems``).
    ``deleting`` allows them, so a library that holds one from before can still drop it."""
    parts = path.split("/") if isinstance(path, str) else []
    bad = (not parts or "\\" in path or path.startswith("/")
           or any(p in ("", ".", "..") for p in parts))
    if bad or len(parts) < 2 or parts[0] not in roots:
        raise ValidationError(
            shown(str(path), 200), "path", "a library path is relative, uses '/', has no '.' "
            f"or '..' parts and starts with one of {', '.join(r + '/' for r in roots)}",
            hint="e.g. skills/<name>/SKILL.md; a folder a method owns is writable when the "
                 "library is opened with that method installed (Engine, the CLI)")
    if deleting:
        return path
    problems = path_problems(path)
    if problems:
        rule, detail = problems[0]
        raise ValidationError(shown(path, 200), rule, detail,
                              hint="rename the file or folder with a shorter, plain name")
    hidden = next((p for p in parts if p.startswith(".") or p == "__pycache__"), None)
    if hidden is not None:
        raise ValidationError(
            path, "path-hidden", f"{hidden!r} is a hidden or cache name; the library does not "
            "keep such files (the view, export and import skip them)",
            hint=f"rename it without the leading '.' (e.g. {hidden.lstrip('.') or 'name'}) "
                 "or leave it out" if hidden != "__pycache__" else "leave __pycache__ out")
    return path
