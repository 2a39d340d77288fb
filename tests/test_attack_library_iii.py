"""Issue 36, findings 6, 8, 11 and 12, and a broken method entry point: what the third
attacker's pass got through import, the bigbench sdist, the corpus and the method registry.

Each test reproduces one attack; on the code before the fix (1468746) each one failed: pax
records tarfile parses one by one took minutes of CPU, look-alike names were imported, a
swapped sdist was extracted unhashed, a refused ``corpus add LINK`` removed a folder's
documents, and one broken entry point stopped every command.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from whetstone.library_store.store import Library
from whetstone.library_store.transfer import read_folder
from whetstone.skills.transfer import import_skills

ROOT = Path(__file__).resolve().parents[1]
GOOD = "---\nname: {name}\ndescription: A good skill called {name}.\n---\n\n# {name}\n\nDo it.\n"


def write_skill(root: Path, name: str, files: dict[str, str] | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(GOOD.format(name=name))
    for rel, body in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(body)
    return folder


# --- 6. pax records: the work per entry is bounded before tarfile parses them ----------------

def _record(key: str, value: str = "") -> bytes:
    body = f" {key}={value}\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return f"{n}{body}".encode()


def _pax(kind: bytes, records: bytes) -> bytes:
    """One extended header block and its records, padded to the tar block size."""
    info = tarfile.TarInfo("pax")
    info.type = kind
    info.size = len(records)
    return info.tobuf(format=tarfile.USTAR_FORMAT) + records + b"\0" * (-len(records) % 512)


def _folder(name: str) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _gz(path: Path, blocks: list[bytes]) -> Path:
    with gzip.open(path, "wb", compresslevel=6) as gz:
        for block in blocks:
            gz.write(block)
        gz.write(b"\0" * 1024)
    return path


TIMED = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from whetstone.engine.errors import ConfigError
    from whetstone.library_store.transfer import read_folder
    start = time.process_time()
    try:
        read_folder(Path(sys.argv[1]))
        outcome = "read"
    except ConfigError as exc:
        outcome = "refused: " + str(exc)
    print(json.dumps({"outcome": outcome, "cpu": time.process_time() - start}))
""")


def _read_timed(archive: Path) -> dict[str, object]:
    res = subprocess.run([sys.executable, "-c", TIMED, str(archive)], cwd=ROOT, check=False,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _global_keys_then_folders(tmp_path: Path) -> Path:
    # The shape, scaled down: 20,000 global keys (four headers under the 64 KiB cap),
    # then 2,000 folders; tarfile copied all the keys into every folder (10 s of CPU before).
    keys = [b"".join(_record(f"k{i}") for i in range(j, j + 5000)) for j in range(0, 20000, 5000)]
    return _gz(tmp_path / "global.tar.gz", [_pax(tarfile.XGLTYPE, r) for r in keys]
               + [_folder(f"d{i:05d}") for i in range(2000)])


def _records_per_entry(tmp_path: Path) -> Path:
    # 13,000 five-byte records in front of each of 300 folders: a 50 KB archive, 6 s of CPU.
    records = b"5 a=\n" * 13000
    blocks = []
    for i in range(300):
        blocks += [_pax(tarfile.XHDTYPE, records), _folder(f"d{i:05d}")]
    return _gz(tmp_path / "records.tar.gz", blocks)


def _globals_between_folders(tmp_path: Path) -> Path:
    # Small global headers, each setting 50 new keys, between 400 folders: the keys every
    # entry inherits grow with the archive.
    blocks = []
    for j in range(400):
        keys = b"".join(_record(f"g{j}x{i}") for i in range(50))
        blocks += [_pax(tarfile.XGLTYPE, keys), _folder(f"d{j:05d}")]
    return _gz(tmp_path / "globals.tar.gz", blocks)


def _chained_headers(tmp_path: Path) -> Path:
    # 100 pax headers of one record each in front of each of 1,000 folders (tarfile copies
    # the records at each link of the chain).
    chain = _pax(tarfile.XHDTYPE, _record("comment", "x")) * 100
    return _gz(tmp_path / "chain.tar.gz", [chain + _folder(f"d{i:05d}") for i in range(1000)])


@pytest.mark.integration
@pytest.mark.parametrize("build", [_global_keys_then_folders, _records_per_entry,
                                   _globals_between_folders, _chained_headers])
def test_pax_records_are_bounded_before_tarfile_parses_them(tmp_path: Path, build) -> None:
    archive = build(tmp_path)
    got = _read_timed(archive)
    assert str(got["outcome"]).startswith("refused"), got
    assert float(got["cpu"]) < 5, got  # the code before read them all, 6-10 s and growing


def test_archives_with_ordinary_pax_headers_still_import(tmp_path: Path) -> None:
    # git archive writes one global header (the commit id); GNU tar --posix and our own
    # export write a few records per member (times, a non-ASCII path).
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT,
                      pax_headers={"comment": "a" * 40}) as tar:
        for rel, text in (("plain/SKILL.md", GOOD.format(name="plain")),
                          ("plain/references/café-notes.md", "notes\n")):
            data = text.encode()
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.pax_headers = {"mtime": "1700000000.123456789", "atime": "1700000000.5",
                                "SCHILY.xattr.user.origin": "here"}
            tar.addfile(info, io.BytesIO(data))
    archive = tmp_path / "skills.tar.gz"
    archive.write_bytes(gzip.compress(buf.getvalue()))
    assert sorted(read_folder(archive).files) == ["plain/SKILL.md",
                                                  "plain/references/café-notes.md"]
    report = import_skills(Library.init(tmp_path / "lib"), archive)
    assert report.imported == ("plain",), report.summary()


# --- 8. names that pass for other names ---------------------------------------------------------

LOOKALIKES = {  # each beside the plain name it passes for
    "readme\u034f.md": "readme.md", "readme\u17b4.md": "readme.md",
    "\u3164readme.md": "readme.md", "readme\ufe0f.md": "readme.md",
    "readme\u2800.md": "readme.md", "readme\u00a0.md": "readme.md",
    "readme\u2028.md": "readme.md", "re\u0430dme.md": "readme.md",  # a Cyrillic а
    "\ufb01le.md": "file.md",  # the fi ligature
}


@pytest.mark.parametrize("name", sorted(LOOKALIKES))
def test_names_that_pass_for_another_are_refused(tmp_path: Path, name: str) -> None:
    from whetstone.engine.errors import ValidationError
    from whetstone.library_store.paths import check_path

    src = tmp_path / "src"
    write_skill(src, "good")
    write_skill(src, "sneaky", {f"references/{LOOKALIKES[name]}": "plain\n",
                                f"references/{name}": "look-alike\n"})
    archive = tmp_path / "skills.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.add(src, arcname=".")
    for source in (src, archive):
        lib = Library.init(tmp_path / f"lib-{source.name}")
        report = import_skills(lib, source)
        assert report.imported == ("good",), report.summary()
        assert report.skipped_skills == ("sneaky",)
        (err,) = report.skipped
        assert err.rule in ("path-characters", "path-normalization", "path-script"), err
        assert not any(name in p for p in lib.snapshot().files())
    with pytest.raises(ValidationError):
        check_path(f"skills/good/references/{name}")


@pytest.mark.parametrize("name", ["café.md", "заметки.md", "Ελληνικά.md", "日本語ファイル.md",
                                  "한국어 notes.md", "मराठी.md", "a b-c_d (1).md", "v2.0~x.md"])
def test_plain_names_in_any_one_script_still_import(tmp_path: Path, name: str) -> None:
    src = tmp_path / "src"
    write_skill(src, "good", {f"references/{name}": "notes\n"})
    report = import_skills(Library.init(tmp_path / "lib"), src)
    assert report.imported == ("good",), report.summary()


# --- 11. the sdist is hashed and extracted through one descriptor -----------------------------

EXCHANGER = textwrap.dedent("""
    import ctypes, os, sys, time
    a, b, seconds = sys.argv[1].encode(), sys.argv[2].encode(), float(sys.argv[3])
    libc = ctypes.CDLL(None, use_errno=True)
    exchange = getattr(libc, "renameat2", None)
    end = time.monotonic() + seconds
    flips = 0
    while time.monotonic() < end:  # flip the two files atomically (RENAME_EXCHANGE)
        if exchange is None or exchange(-100, a, -100, b, 2) != 0:
            t = a + b".t"
            os.rename(a, t); os.rename(b, a); os.rename(t, b)
        flips += 1
        if flips == 2:
            print("racing", flush=True)
""")


def _bigbench_sdist(path: Path, sorting_task: bytes) -> str:
    import hashlib

    fixture = ROOT / "tests" / "fixtures" / "bigbench" / "bigbench"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(fixture, arcname="bigbench-1.0.0/bigbench")
        info = tarfile.TarInfo("bigbench-1.0.0/bigbench/benchmark_tasks/toy_sorting/task.json")
        info.size = len(sorting_task)
        tar.addfile(info, io.BytesIO(sorting_task))  # a second copy: the last one wins
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.integration
def test_a_swapped_sdist_is_never_extracted(tmp_path: Path) -> None:
    # A real racer flipping the path between the pinned sdist and another: whether it wins
    # on the code before depends on scheduling; the next test puts it at its best moment.
    from whetstone.engine.errors import EvalError
    from whetstone.engine.evaluation import bigbench

    good = (ROOT / "tests/fixtures/bigbench/bigbench/benchmark_tasks/toy_sorting/task.json")
    sdist = tmp_path / "bigbench-1.0.0.tar.gz"
    digest = _bigbench_sdist(sdist, good.read_bytes())
    _bigbench_sdist(tmp_path / "evil.tar.gz", b'{"name": "EVIL", "examples": []}')
    cache = tmp_path / "cache"
    task = cache / "bigbench-1.0.0" / "benchmark_tasks" / "toy_sorting" / "task.json"
    racer = subprocess.Popen([sys.executable, "-c", EXCHANGER, str(sdist),
                              str(tmp_path / "evil.tar.gz"), "60"], stdout=subprocess.PIPE)
    assert racer.stdout is not None and racer.stdout.readline() == b"racing\n"
    installed = refused = 0
    try:
        end = time.monotonic() + 30  # the racer won on the second try
        while time.monotonic() < end and not (installed >= 40 and refused >= 10):
            try:
                bigbench.install_sdist(sdist, cache, sha256=digest, force=True)
            except EvalError as exc:
                assert "expected" in str(exc)
                refused += 1
                continue
            installed += 1
            assert b"EVIL" not in task.read_bytes()
    finally:
        racer.kill()
        racer.wait()
    assert installed and refused, (installed, refused)  # the race ran both ways


@pytest.mark.parametrize("how", ["swap", "rewrite"])
def test_an_sdist_changed_right_after_its_check_is_never_extracted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    # The racer at its best moment: the cache folder is looked up after the check and before
    # the extraction, so the file is swapped (or rewritten in place) right there.
    from whetstone.engine.errors import EvalError
    from whetstone.engine.evaluation import bigbench

    good = (ROOT / "tests/fixtures/bigbench/bigbench/benchmark_tasks/toy_sorting/task.json")
    sdist = tmp_path / "bigbench-1.0.0.tar.gz"
    digest = _bigbench_sdist(sdist, good.read_bytes())
    evil = tmp_path / "evil.tar.gz"
    _bigbench_sdist(evil, b'{"name": "EVIL", "examples": []}')
    real_data_dir = bigbench.data_dir

    def racing_data_dir(cache: Path | None = None) -> Path:
        if how == "swap":
            os.replace(evil, sdist)
        else:
            with open(sdist, "r+b") as f:
                f.write(evil.read_bytes())
                f.truncate()
        return real_data_dir(cache)

    monkeypatch.setattr(bigbench, "data_dir", racing_data_dir)
    refused = pytest.raises(EvalError, match="expected")
    with refused if how == "rewrite" else contextlib.nullcontext():
        bigbench.install_sdist(sdist, tmp_path / "cache", sha256=digest)
    task = tmp_path / "cache" / "bigbench-1.0.0" / "benchmark_tasks" / "toy_sorting" / "task.json"
    if how == "swap":  # the descriptor opened and checked is the one extracted
        assert task.read_bytes() == good.read_bytes()
    else:  # same file, new bytes: the second hash fails and nothing is installed
        assert not (tmp_path / "cache" / "bigbench-1.0.0").exists()
        assert [p.name for p in (tmp_path / "cache").iterdir()] == []


# --- 12. a refused corpus input changes nothing -------------------------------------------------

def _corpus_add(*args: str) -> dict[str, object]:
    from click.testing import CliRunner

    from whetstone.engine.commands.corpus import corpus_group

    res = CliRunner().invoke(corpus_group, ["add", *args, "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_corpus_add_of_a_link_to_an_added_folder_removes_nothing(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "paris.md").write_text("# Paris\n\nThe Eiffel Tower was completed in 1889.\n")
    (notes / "rome.md").write_text("# Rome\n\nThe Colosseum was completed in 80 AD.\n")
    lib = str(tmp_path / "lib")
    Path(lib).mkdir()  # an empty folder: the library is made there
    first = _corpus_add(str(notes), "--library", lib)
    assert first["added"] == 2
    link = tmp_path / "link"
    link.symlink_to(notes)
    again = _corpus_add(str(link), "--library", lib)  # refused as a link ...
    assert "symbolic link" in "\n".join(again["skipped"])  # type: ignore[arg-type]
    assert again["removed"] == 0 and again["corpus"]["documents"] == 2, again  # ... and inert
    # A file of the folder swapped for a link is refused on a re-add: its document stays.
    (notes / "rome.md").unlink()
    (notes / "rome.md").symlink_to(tmp_path / "elsewhere.md")
    third = _corpus_add(str(notes), "--library", lib)
    assert third["removed"] == 0 and third["corpus"]["documents"] == 2, third
    (notes / "paris.md").unlink()  # a file really gone is still dropped
    fourth = _corpus_add(str(notes), "--library", lib)
    assert fourth["removed"] == 1 and fourth["corpus"]["documents"] == 1, fourth


# --- Also: one broken method package never stops the other commands ---------------------------

@pytest.mark.integration
@pytest.mark.trace2skill
@pytest.mark.parametrize("broken", ["missing", "raises"])
def test_a_broken_method_entry_point_is_skipped_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str) -> None:
    from click.testing import CliRunner

    from whetstone.cli import cli
    from whetstone.engine.methods.registry import default_registry

    dist = tmp_path / "broken_method-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-method\nVersion: 0.1\n")
    target = "no_such_pkg:METHOD" if broken == "missing" else "broken_method_pkg:METHOD"
    (dist / "entry_points.txt").write_text(f"[whetstone.methods]\nbroken = {target}\n")
    (tmp_path / "broken_method_pkg.py").write_text("raise RuntimeError('half installed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_method_pkg", raising=False)
    registry = default_registry()
    assert "trace2skill" in registry.names("evolver") and "broken" in registry.skipped
    assert ("half installed" if broken == "raises" else "no_such_pkg") in registry.skipped["broken"]
    lib = str(tmp_path / "lib")
    for args in (["library", "init", "--library", lib], ["library", "ls", "--library", lib],
                 ["methods", "--json"], ["evolve", "--help"], ["--help"]):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 0, (args, res.output)
    listing = json.loads(CliRunner().invoke(cli, ["methods", "--json"]).stdout)
    (row,) = [r for r in listing if r["name"] == "broken"]
    assert row["summary"].startswith("unusable:")
    warned = subprocess.run([sys.executable, "-m", "whetstone", "methods"],
                            capture_output=True, text=True, check=False, timeout=120,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                [str(tmp_path), str(ROOT)])})
    assert warned.returncode == 0, warned.stderr[-2000:]
    assert "skipped the installed method 'broken'" in warned.stderr
