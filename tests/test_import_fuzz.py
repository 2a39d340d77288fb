"""Issue 12, acceptance: a few hundred generated malformed skills and archives (random names,
lengths, YAML, encodings, sizes, links and special files) imported into one library. Every
import ends in a report or a clear error (never a traceback); afterwards ``library validate``
and ``library log`` work and every good skill is there, byte for byte.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from click.testing import CliRunner, Result

from whetstone.engine.commands.library import library_group
from whetstone.library_store.store import Library

SEED = 12
N_FOLDER_BATCHES = 8
SKILLS_PER_BATCH = 30
N_ARCHIVES = 40

# A special file in a generated skill: a symlink to a target, a FIFO; in archives also a
# hard link entry (on disk a hard link is a plain file, and is imported as one).
LINK, FIFO, HARDLINK = "link", "fifo", "hardlink"
Content = bytes | tuple[str, str]


@dataclass
class Skill:
    """One generated skill folder: its folder name (bytes: it may not be UTF-8), its files,
    and whether the import must take it."""

    folder: bytes
    files: dict[bytes, Content] = field(default_factory=dict)
    good: bool = False


def skill_md(name: str, desc: str = "Does a thing when asked.", body: str = "# Title\n\nDo.\n",
             extra: str = "", nl: str = "\n") -> bytes:
    text = f"---\nname: {name}\ndescription: {desc}\n{extra}---\n\n{body}"
    return text.replace("\n", nl).encode("utf-8")


def _alias_bomb(levels: int) -> str:
    out = "x-defs:\n  a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, levels):
        out += f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n"
    return out + f"metadata:\n  k: *a{levels - 1}\n"


def _rand_text(rng: random.Random, n: int) -> str:
    alphabet = "abcdefghij klmnop-_:#'\"[]{}&*!|>%@`é漢🙂\t"
    return "".join(rng.choice(alphabet) for _ in range(n))


# --- good skills (a name is given, unique across the run) -------------------------------------

def good_plain(rng: random.Random, name: str) -> Skill:
    desc = " ".join(rng.choice(["use", "when", "numbers", "tables", "pdf", "é"])
                    for _ in range(rng.randint(1, 60)))
    body = "".join(f"line {i} {_rand_text(rng, rng.randint(0, 40))}\n"
                   for i in range(rng.randint(0, 80)))
    return Skill(name.encode(), {b"SKILL.md": skill_md(name, desc.strip() or "x", body)}, True)


def good_bundled(rng: random.Random, name: str) -> Skill:
    s = good_plain(rng, name)
    s.files[b"references/notes.md"] = "".join(f"- {i}\n" for i in range(rng.randint(1, 200))
                                              ).encode()
    s.files[b"scripts/run.py"] = b"print('hi')\n"
    s.files[b"assets/blob.bin"] = bytes(rng.randrange(256) for _ in range(rng.randint(0, 5000)))
    s.files[b".hidden-notes"] = b"skipped by every import\n"  # not part of the skill
    return s


def good_crlf_bom(rng: random.Random, name: str) -> Skill:
    return Skill(name.encode(), {b"SKILL.md": b"\xef\xbb\xbf" + skill_md(
        name, extra="license: MIT\nmetadata:\n  version: \"1.0\"\n", nl="\r\n")}, True)


GOOD: list[Callable[[random.Random, str], Skill]] = [good_plain, good_bundled, good_crlf_bom]


# --- malformed skills ------------------------------------------------------------------------

def _bad(folder: str | bytes, files: dict[bytes, Content]) -> Skill:
    return Skill(folder if isinstance(folder, bytes) else folder.encode(), files, False)


def _md(name: str, **kw: str) -> dict[bytes, Content]:
    return {b"SKILL.md": skill_md(name, **kw)}


def bad_names(rng: random.Random, n: str) -> Skill:
    return rng.choice([
        _bad("Bad-" + n, _md("Bad-" + n)),
        _bad(n, _md(n + "-other")),
        _bad("x" * rng.randint(65, 200), _md("x")),
        _bad(n + "-", _md(n + "-")),
        _bad("sk\u00efll-" + n, _md("sk\u00efll-" + n)),
        _bad(n.encode() + b"-\xff\xfe", _md(n)),  # not UTF-8 on disk
        _bad(n + " two", _md(n + " two")),
    ])


def bad_yaml(rng: random.Random, n: str) -> Skill:
    heads = [
        f"name: {n}\ndescription: [unclosed\n",
        _alias_bomb(rng.randint(5, 9)).replace("x-defs", f"name: {n}\ndescription: d\nx-defs"),
        f"name: {n}\ndescription: d\nmetadata: " + "[" * 40 + "]" * 40 + "\n",
        f"name: {n}\ndescription: d\nmetadata: &a [*a, *a]\n",
        "- just\n- a list\n",
        f"name: {n}\n",
        f"name: {n}\ndescription: d\nallowed-tools: [1, 2]\n",
        f"name: {n}\ndescription: d\nmetadata:\n  k: {{nested: [1]}}\n",
        f"name: {n}\nname: {n}\ndescription: d\n",
        f"name: {n}\ndescription: {'long ' * 400}\n",
        f"name: {n}\ndescription: d\n\tbad: tab\n",
        f"name: {n}\ndescription: d\nunknown-field: 1\n",
        f"name: {n}\ndescription: {_rand_text(rng, 200)}\n{_rand_text(rng, 100)}\n",
        f"name: {n}\ndescription: d\ncompatibility: ''\n",
        f"name: {n}\ndescription: !!python/object/apply:os.system ['true']\n",
    ]
    return _bad(n, {b"SKILL.md": f"---\n{rng.choice(heads)}---\n\nbody\n".encode()})


def bad_encoding(rng: random.Random, n: str) -> Skill:
    text = skill_md(n).decode()
    return _bad(n, {b"SKILL.md": rng.choice([
        text.encode("utf-16"), text.encode("utf-8").replace(b"Does", b"D\xe9es"),
        text.encode().replace(b"a thing", b"a\x00thing"), b"", os.urandom(300),
        b"no front matter at all\n", b"---\nname: x\ndescription: never closed\n"])})


def bad_sizes(rng: random.Random, n: str) -> Skill:
    choice = rng.randrange(5)
    if choice == 0:
        return _bad(n, _md(n, body="x" * 300_000))  # SKILL.md over 256 KiB
    if choice == 1:
        return _bad(n, _md(n, body="line\n" * 600))  # body over 500 lines
    if choice == 2:
        return _bad(n, {**_md(n), b"references/long.md": b"r\n" * 400})
    if choice == 3:
        return _bad(n, {**_md(n), **{f"assets/a{i}.txt".encode(): b"a" for i in range(300)}})
    return _bad(n, {**_md(n), b"assets/big.bin": b"\0" * (16 * 1024 * 1024 + 1)})


def bad_layout(rng: random.Random, n: str) -> Skill:
    return _bad(n, {**_md(n), rng.choice([
        b"references/deep/er.md", b"docs/x.md", b"references/" + b"b" * 245 + b".md",
        b"assets/" + b"c" * 200 + b".txt", b"references/a\nb.md", b"references/a\\b.md",
        b"references/tab\there.md", b"references/\x7fdel.md"]): b"text\n"})


def bad_special(rng: random.Random, n: str) -> Skill:
    kind = rng.choice([LINK, LINK, FIFO])
    target = rng.choice(["/etc/passwd", "../../outside", "SKILL.md"])
    return _bad(n, {**_md(n), b"references/special.md": (kind, target)})


BAD: list[Callable[[random.Random, str], Skill]] = [bad_names, bad_yaml, bad_encoding,
                                                    bad_sizes, bad_layout, bad_special]


def generate(rng: random.Random, count: int, prefix: str) -> list[Skill]:
    out = []
    for i in range(count):
        name = f"{prefix}-{i}"
        make = rng.choice(GOOD) if rng.random() < 0.4 else rng.choice(BAD)
        out.append(make(rng, name))
    return out


# --- writing sources -------------------------------------------------------------------------

def write_folder(root: Path, skills: list[Skill]) -> None:
    base = os.fsencode(root)
    for s in skills:
        folder = base + b"/" + s.folder
        for rel, content in s.files.items():
            path = folder + b"/" + rel
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if isinstance(content, bytes):
                with open(path, "wb") as f:
                    f.write(content)
            elif content[0] == LINK:
                os.symlink(content[1], path)
            else:
                os.mkfifo(path)


def write_archive(path: Path, skills: list[Skill], rng: random.Random) -> bool:
    """A .tar.gz of ``skills`` with archive-level damage now and then; returns whether it
    is readable as a whole (a broken one is refused entirely)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for s in skills:
            for rel, content in s.files.items():
                info = tarfile.TarInfo(os.fsdecode(s.folder + b"/" + rel))
                if isinstance(content, bytes):
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
                    continue
                info.type = {LINK: tarfile.SYMTYPE, FIFO: tarfile.FIFOTYPE,
                             HARDLINK: tarfile.LNKTYPE}[content[0]]
                info.linkname = content[1]
                tar.addfile(info)
        for name in rng.sample(["/etc/evil/SKILL.md", "../escape/SKILL.md", "dup/SKILL.md",
                                "dup/SKILL.md", "./", "hl/SKILL.md"], k=rng.randint(0, 3)):
            info = tarfile.TarInfo(name)
            if name.startswith("hl/"):
                info.type, info.linkname = tarfile.LNKTYPE, "dup/SKILL.md"
                tar.addfile(info)
                continue
            data = skill_md("dup")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = gzip.compress(buf.getvalue())
    damage = rng.random()
    if damage < 0.1:
        path.write_bytes(data[:rng.randint(1, max(2, len(data) - 1))])  # truncated
        return False
    if damage < 0.15:
        path.write_bytes(os.urandom(rng.randint(0, 2000)))  # not an archive at all
        return False
    if damage < 0.2:
        path.write_bytes(gzip.compress(os.urandom(3000)))  # gzip, but not a tar
        return False
    path.write_bytes(data)
    return True


# --- the test --------------------------------------------------------------------------------

def run_import(lib: Path, src: Path) -> Result:
    return CliRunner().invoke(library_group, ["import", str(src), "--library", str(lib),
                                              "--json"], catch_exceptions=False)


def test_hundreds_of_malformed_skills_and_archives_leave_a_working_library(
        tmp_path: Path) -> None:
    rng = random.Random(SEED)
    lib_path = tmp_path / "lib"
    Library.init(lib_path)
    expected: dict[str, dict[str, bytes]] = {}  # good skill -> its files as imported

    def expect(skills: list[Skill]) -> None:
        for s in skills:
            if s.good:
                expected[s.folder.decode()] = {
                    k.decode(): v for k, v in s.files.items()
                    if isinstance(v, bytes) and not k.startswith(b".")}

    for b in range(N_FOLDER_BATCHES):
        skills = generate(rng, SKILLS_PER_BATCH, f"f{b}")
        src = tmp_path / f"batch-{b}"
        write_folder(src, skills)
        res = run_import(lib_path, src)
        assert res.exit_code in (0, 5, 11), res.output
        report = json.loads(res.stdout)
        goods = {s.folder.decode() for s in skills if s.good}
        assert set(report["imported"]) == goods, report["summary"]
        assert len(report["skipped_skills"]) == len(skills) - len(goods)
        expect(skills)
    readable_archives = 0
    for a in range(N_ARCHIVES):
        skills = generate(rng, rng.randint(1, 8), f"a{a}")
        archive = tmp_path / f"archive-{a}.tar.gz"
        whole = write_archive(archive, skills, rng)
        res = run_import(lib_path, archive)
        if not whole:
            assert res.exit_code == 2, res.output  # a clear ConfigError, nothing committed
            assert "error:" in res.stderr and "Traceback" not in res.output
            continue
        readable_archives += 1
        assert res.exit_code in (0, 5, 11), res.output
        goods = {s.folder.decode() for s in skills if s.good}
        assert goods <= set(json.loads(res.stdout)["imported"])
        expect(skills)
    assert readable_archives >= N_ARCHIVES // 2 and len(expected) > 100

    runner = CliRunner()
    validate = runner.invoke(library_group, ["validate", "--library", str(lib_path), "--json"],
                             catch_exceptions=False)
    assert validate.exit_code == 0, validate.output
    assert json.loads(validate.stdout)["ok"] is True
    log = runner.invoke(library_group, ["log", "--library", str(lib_path), "--json"],
                        catch_exceptions=False)
    assert log.exit_code == 0 and len(json.loads(log.stdout)) > N_FOLDER_BATCHES
    lib = Library.open(lib_path)
    assert lib.view_problem is None
    snap = lib.snapshot()
    imported = {p.split("/")[1] for p in snap.files("skills/")}
    # The archives' stray "dup" entries form a skill of their own, also valid.
    assert imported - {"dup"} == set(expected)
    for name, files in expected.items():
        got = {p.split("/", 2)[2]: lib.blobs.get(h) for p, h in snap.unit(f"skills/{name}").items()}
        assert got == files, name
        assert (lib_path / "skills" / name / "SKILL.md").read_bytes() == files["SKILL.md"]
