"""Issue 29, findings 3, 4, 6, 7 and 13: what an attacker got through import, export and the
corpus on the second pass.

Each test reproduces one attack; on the code before the fix (476f81d) each one failed: the
corpus stored a linked secret and /proc's environment, a 64 MB "long name" header was read
into memory and 25,000 folders were not counted, ``export --force`` wrote through a link, an
import racing a link swap committed the link's target, and look-alike names were imported as
two files or with invisible characters in them.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
import unicodedata
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from whetstone.engine.commands.corpus import corpus_group
from whetstone.engine.commands.library import library_group
from whetstone.engine.errors import ConfigError, ValidationError
from whetstone.library_store.chunking import ReadReport, read_path
from whetstone.library_store.paths import check_path
from whetstone.library_store.store import Library
from whetstone.library_store.transfer import ReadLimits, read_folder
from whetstone.skills.transfer import import_skills

ROOT = Path(__file__).resolve().parents[1]
GOOD = "---\nname: {name}\ndescription: A good skill called {name}.\n---\n\n# {name}\n\nDo it.\n"
SECRET = "MY_TEST_SECRET=hunter2-attack-library"


def write_skill(root: Path, name: str, files: dict[str, str] | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(GOOD.format(name=name))
    for rel, body in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(body)
    return folder


def lib_cmd(*args: str) -> Result:
    return CliRunner().invoke(library_group, list(args), catch_exceptions=False)


def every_committed_byte(lib: Library) -> bytes:
    """The contents of every file of every version, joined."""
    out = []
    for m in lib.log():
        snap = lib.snapshot(m.id)
        out += [lib.blobs.get(h) for h in snap.files().values()]
    return b"\n".join(out)


# --- 3. corpus add follows no link and reads no kernel or special file ------------------------

def test_corpus_add_follows_no_link_and_reads_no_proc_fifo_or_linked_folder(
        tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "shadow").write_text(f"root:$6$salt$hash:19000:0:99999:7:::\n{SECRET}\n")
    (outside / "sub").mkdir()
    (outside / "sub" / "secret.md").write_text(f"# Secret\n\n{SECRET}\n")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "good.md").write_text("# Paris\n\nThe Eiffel Tower was completed in 1889.\n")
    (notes / "env.txt").symlink_to("/proc/self/environ")
    (notes / "shadow.txt").symlink_to(outside / "shadow")
    (notes / "linked").symlink_to(outside / "sub")  # a linked folder
    os.mkfifo(notes / "pipe.txt")
    named_link = tmp_path / "named.txt"
    named_link.symlink_to(outside / "shadow")
    lib = tmp_path / "lib"
    lib.mkdir()  # an empty folder: the library is made there
    args = ["add", str(notes), str(named_link), "/proc/self/environ", "--library", str(lib),
            "--json"]
    res = CliRunner().invoke(corpus_group, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["added"] == 1 and report["corpus"]["documents"] == 1
    skipped = "\n".join(report["skipped"])
    for name in ("env.txt", "shadow.txt", "linked", "pipe.txt", "named.txt", "/proc/self/environ"):
        assert name in skipped, (name, skipped)
    assert "symbolic link" in skipped and "FIFO" in skipped and "kernel" in skipped
    stored = b"".join(p.read_bytes() for p in lib.rglob("*") if p.is_file())
    assert b"hunter2" not in stored and b"PATH=" not in stored
    docs = (lib / "corpus" / "default" / "documents.jsonl").read_text()
    assert "Eiffel" in docs and "environ" not in docs


def test_read_path_refuses_a_named_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    got: list[ReadReport] = []
    reader = threading.Thread(target=lambda: got.append(read_path(fifo)), daemon=True)
    reader.start()
    reader.join(10)  # opened with O_NONBLOCK and refused by fstat: it returns at once
    if reader.is_alive():  # blocked in open(): a writer end lets it go, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
        pytest.fail("reading a FIFO blocked")
    assert not got[0].docs and "FIFO" in got[0].skipped[0]


# --- 4. archive bombs are refused before memory grows -----------------------------------------

def _write_gz(path: Path, blocks: list[tuple[bytes, int]]) -> None:
    """A .tar.gz of raw tar blocks: each (header, count of zero bytes after it), the zeros
    streamed 1 MB at a time so the test itself stays small."""
    with gzip.open(path, "wb", compresslevel=1) as gz:
        for header, zeros in blocks:
            gz.write(header)
            chunk = b"\0" * (1 << 20)
            left = zeros
            while left > 0:
                gz.write(chunk[:min(left, len(chunk))])
                left -= len(chunk)
        gz.write(b"\0" * 1024)


def _ext_header(kind: bytes, size: int) -> bytes:
    info = tarfile.TarInfo("././@LongLink")
    info.type = kind
    info.size = size
    return info.tobuf(format=tarfile.USTAR_FORMAT)


RSS_PROBE = textwrap.dedent("""
    import json, resource, sys, time
    from pathlib import Path
    from whetstone.engine.errors import ConfigError
    from whetstone.library_store.transfer import read_folder
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    try:
        read_folder(Path(sys.argv[1]))
        outcome = "read"
    except ConfigError as exc:
        outcome = "refused: " + str(exc)
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"outcome": outcome, "grew_kb": grew,
                      "seconds": time.monotonic() - start}))
""")


def _probe(archive: Path) -> dict[str, object]:
    res = subprocess.run([sys.executable, "-c", RSS_PROBE, str(archive)], cwd=ROOT, check=False,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.integration
@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE])
def test_a_huge_long_name_or_pax_header_is_refused_with_bounded_memory(
        tmp_path: Path, kind: bytes) -> None:
    size = 256 << 20  # 256 MB of header in a ~1.2 MB archive (the code before: +220 MB RSS)
    archive = tmp_path / "bomb.tar.gz"
    _write_gz(archive, [(_ext_header(kind, size), size)])
    assert archive.stat().st_size < 2 << 20
    got = _probe(archive)
    assert int(got["grew_kb"]) < 16 * 1024, got  # the header was never read into memory
    assert str(got["outcome"]).startswith("refused") and "declares" in str(got["outcome"]), got
    assert float(got["seconds"]) < 10, got


def test_folder_entries_count_toward_max_files(tmp_path: Path) -> None:
    archive = tmp_path / "dirs.tar.gz"
    headers = []
    for i in range(25_000):
        info = tarfile.TarInfo(f"d{i:05d}")
        info.type = tarfile.DIRTYPE
        headers.append((info.tobuf(format=tarfile.USTAR_FORMAT), 0))
    _write_gz(archive, headers)
    start = time.monotonic()
    with pytest.raises(ConfigError, match="more than 20000 entries"):
        read_folder(archive)
    assert time.monotonic() - start < 10
    folder = tmp_path / "tree"
    for i in range(30):
        (folder / f"d{i}").mkdir(parents=True)
    with pytest.raises(ConfigError, match="more than 20 entries"):
        read_folder(folder, ReadLimits(max_files=20))


def test_an_archive_that_inflates_past_the_total_is_refused(tmp_path: Path) -> None:
    info = tarfile.TarInfo("big/SKILL.md")
    info.size = 8 << 20
    archive = tmp_path / "big.tar.gz"
    _write_gz(archive, [(info.tobuf(format=tarfile.USTAR_FORMAT), info.size)])
    with pytest.raises(ConfigError, match="inflates to more than"):
        read_folder(archive, ReadLimits(max_total_bytes=1 << 20, max_file_bytes=16 << 20))


# --- 6. export --force writes through no link -------------------------------------------------

def test_export_force_replaces_links_in_the_target_and_never_writes_through_them(
        tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_skill(src, "alpha", {"references/notes.md": "alpha notes\n"})
    lib_path = tmp_path / "lib"
    import_skills(Library.init(lib_path), src)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    victim_dir = tmp_path / "victim_dir"
    victim_dir.mkdir()
    out = tmp_path / "out"
    (out / "alpha").mkdir(parents=True)
    (out / "alpha" / "SKILL.md").symlink_to(victim)  # a file link
    (out / "alpha" / "references").symlink_to(victim_dir)  # a folder link
    res = lib_cmd("export", str(out), "--force", "--library", str(lib_path))
    assert res.exit_code == 0, res.output
    assert victim.read_text() == "precious\n" and not any(victim_dir.iterdir())
    for rel in ("alpha/SKILL.md", "alpha/references", "alpha/references/notes.md"):
        assert not (out / rel).is_symlink(), rel
    assert (out / "alpha" / "SKILL.md").read_text() == GOOD.format(name="alpha")
    assert (out / "alpha" / "references" / "notes.md").read_text() == "alpha notes\n"
    archive = tmp_path / "out.tar.gz"
    archive.symlink_to(victim)
    res = lib_cmd("export", str(archive), "--force", "--library", str(lib_path))
    assert res.exit_code == 0, res.output
    assert victim.read_text() == "precious\n" and not archive.is_symlink()
    with tarfile.open(archive) as tar:
        assert tar.getnames() == ["alpha/SKILL.md", "alpha/references/notes.md"]


# --- 7. an import racing a link swap never commits the link's target --------------------------

SWAPPER = textwrap.dedent("""
    import ctypes, os, sys, time
    secret, seconds, paths = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    pairs = []
    for path in paths:  # beside each file, a hidden link to the secret (imports skip it)
        other = os.path.join(os.path.dirname(path), ".swap")
        os.symlink(secret, other)
        pairs.append((path.encode(), other.encode()))
    libc = ctypes.CDLL(None, use_errno=True)
    exchange = getattr(libc, "renameat2", None)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for a, b in pairs:
            # One atomic exchange of the two names (RENAME_EXCHANGE): the path flips between
            # the regular file and the link every few microseconds, never missing.
            if exchange is None or exchange(-100, a, -100, b, 2) != 0:
                t = os.path.join(os.path.dirname(a), b".t")
                os.rename(a, t); os.rename(b, a); os.rename(t, b)
""")


@pytest.mark.integration
def test_swapping_a_file_and_a_link_during_import_never_commits_the_target(
        tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET + "\n")
    src = tmp_path / "src"
    names = [f"race{i}" for i in range(4)]
    for name in names:  # one swapping file per skill: a link seen first skips only that one
        write_skill(src, name, {"references/r.md": "plain notes\n"})
    lib = Library.init(tmp_path / "lib")
    swapped = [str(src / n / "references" / "r.md") for n in names]
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(secret), "120", *swapped])
    try:
        for i in range(40):  # bounded tries (the attacker needed 25)
            for name in names:
                (src / name / "SKILL.md").write_text(GOOD.format(name=name) + f"\ntry {i}\n")
            import_skills(lib, src)
    finally:
        swapper.kill()
        swapper.wait()
    assert len(lib.log()) > 1  # some imports did commit (the race did not just refuse all)
    assert SECRET.encode() not in every_committed_byte(lib)


# --- 13. names that look alike ----------------------------------------------------------------

def test_nfc_and_nfd_spellings_of_one_name_are_one_name(tmp_path: Path) -> None:
    nfc, nfd = "café.md", unicodedata.normalize("NFD", "café.md")
    assert nfc != nfd
    src = tmp_path / "src"
    write_skill(src, "good")
    both = write_skill(src, "both", {f"references/{nfc}": "one\n"})
    (both / "references" / nfd).write_text("two\n")
    write_skill(src, "decomposed", {f"references/{nfd}": "three\n"})
    lib = Library.init(tmp_path / "lib")
    report = import_skills(lib, src)
    assert sorted(report.imported) == ["decomposed", "good"]
    assert report.skipped_skills == ("both",)
    (err,) = report.skipped
    assert err.rule == "duplicate" and "two spellings of one name" in err.detail
    files = lib.snapshot().files()
    assert f"skills/decomposed/references/{nfc}" in files  # kept under its NFC name
    assert not any(unicodedata.normalize("NFC", p) != p for p in files)
    with pytest.raises(ValidationError, match="NFC"):
        check_path(f"skills/good/references/{nfd}")
    with pytest.raises(ValidationError) as exc:
        lib.commit({f"skills/good/references/{nfd}": "x"}, method="edit", message="x")
    assert exc.value.rule == "path-normalization"


@pytest.mark.parametrize("char", ["\u202e", "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff",
                                  "\u2066"])
def test_bidi_and_zero_width_characters_are_refused_in_names(tmp_path: Path,
                                                              char: str) -> None:
    src = tmp_path / "src"
    write_skill(src, "good")
    write_skill(src, "sneaky", {f"references/notes{char}dm.md": "x\n"})
    write_skill(src, "tooly", {f"scripts/add{char}.py": "def add(a: int) -> int:\n    return a\n"})
    archive = tmp_path / "skills.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.add(src, arcname=".")
    for source in (src, archive):
        lib = Library.init(tmp_path / f"lib-{source.name}")
        report = import_skills(lib, source)
        assert report.imported == ("good",), report.summary()
        assert sorted(report.skipped_skills) == ["sneaky", "tooly"]
        assert all(e.rule == "path-characters" and f"U+{ord(char):04X}" in e.detail
                   for e in report.skipped), report.skipped
        assert not any(char in p for p in lib.snapshot().files())
    with pytest.raises(ValidationError, match="invisible"):
        check_path(f"skills/good/SKILL{char}.md")


def test_the_tool_name_rule_has_no_trailing_newline() -> None:
    # `$` matches before a final newline: "count\n" passed the tool-name rule (other checks
    # caught it later; the rule itself must not).
    from whetstone.tools.learned import TOOL_NAME

    assert TOOL_NAME.match("count") and not TOOL_NAME.match("count\n")
