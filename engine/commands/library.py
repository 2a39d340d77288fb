"""``whetstone library ...`` and ``whetstone skill new``: look after the versioned library.

Thin: every command is one call into ``library_store`` / ``skills``. Human-readable output with
rich, ``--json`` for machines; errors become a message, a hint and the exit code of their class.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ...library_store.manifest import gate_record
from ...library_store.store import Library, Manifest
from ...skills.index import LibraryIndex
from ...skills.loader import SKILLS_DIR, load_skills, skill_names, skill_path
from ...skills.retrieval import read_skill
from ...skills.transfer import (
    export_skills,
    import_skills,
    new_skill_changes,
    scaffold_skill,
)
from ..errors import LibraryError, NotFound, ValidationError
from ..library.checks import import_check, library_validator, validate_library
from ..library.opening import open_library
from ..methods.base import LibraryPatch
from ..methods.registry import default_registry
from .canary import canary_group, step_text, steps_by_base
from .common import (
    EXIT_PARTIAL,
    console,
    default_library_path,
    echo_text,
    emit_json,
    handle_errors,
    json_option,
    library_option,
)
from .decisions import gate_line, print_record
from .gating import (
    GatedWrite,
    apply_candidate,
    commit_edits,
    config_cmd,
    gate_options,
    open_library_for,
    print_result,
    refused,
    result_dict,
    roll_back,
    run_write,
)

_open = open_library_for


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _manifest_dict(m: Manifest) -> dict[str, Any]:
    return {"id": m.id, "parent": m.parent, "created": m.created, "method": m.method,
            "message": m.message, "scores": dict(m.scores), "costs": dict(m.costs),
            "counts": dict(m.counts), "gate": gate_record(m)}


def _problem_dict(e: ValidationError) -> dict[str, Any]:
    return {"path": e.path, "line": e.line, "rule": e.rule, "detail": e.detail, "hint": e.hint}


def _print_problems(problems: Sequence[ValidationError], *, title: str) -> None:
    out = console()
    out.print(f"[bold red]{title}[/] ({len(problems)})", markup=True)
    for e in problems:
        where = f"{e.path}:{e.line}" if e.line is not None else e.path
        out.print(f"  {escape(where)}: [yellow]\\[{e.rule}][/] {escape(e.detail)}", markup=True,
                  soft_wrap=True)


@click.group("library")
def library_group() -> None:
    """The versioned library of skills and policy notes (init, ls, log, diff, rollback, ...)."""


library_group.add_command(config_cmd)
library_group.add_command(canary_group)


@library_group.command("init")
@library_option
@json_option
@handle_errors
def init_cmd(library_path: Path | None, as_json: bool) -> None:
    """Create an empty library (nothing happens if one exists)."""
    path = library_path or default_library_path()
    existed = Library(path).is_initialized()
    lib = open_library(path, default_registry().folders(), create=True)
    if as_json:
        emit_json({"library": str(lib.root), "version": lib.current_id(), "created": not existed})
        return
    verb = "already exists" if existed else "created"
    console().print(f"library {verb} at [bold]{escape(str(lib.root))}[/] "
                    f"(version {lib.current_id()})", markup=True)


@library_group.command("ls")
@click.option("--version", "version", default=None, help="Version to list (default: current).")
@library_option
@json_option
@handle_errors
def ls_cmd(version: str | None, library_path: Path | None, as_json: bool) -> None:
    """List the skills of a version, and the files of the folders methods own (policy notes,
    memory)."""
    lib = _open(library_path)
    snap = lib.snapshot(version)
    loaded = load_skills(snap)
    # each method-owned folder by its name (JSON: "policies": [...], "memory": [...])
    owned = {root: sorted(snap.files(f"{root}/")) for root in lib.roots if root != SKILLS_DIR}
    if as_json:
        emit_json({"version": snap.id,
                   "skills": [{"name": s.name, "description": s.description,
                               "files": sorted(s.files)} for s in loaded.skills.values()],
                   **owned,
                   "problems": [_problem_dict(e) for e in loaded.problems]})
        return
    table = Table(title=f"skills in {snap.id} ({len(loaded.skills)})", show_lines=False)
    table.add_column("name", style="bold")
    table.add_column("description")
    table.add_column("files", justify="right")
    for s in loaded.skills.values():
        desc = " ".join(s.description.split())
        table.add_row(s.name, desc if len(desc) <= 90 else desc[:89] + "…", str(len(s.files)))
    console().print(table)
    for root, files in owned.items():
        if files:
            console().print(f"{root}: " + ", ".join(files))
    if loaded.problems:
        _print_problems(loaded.problems, title="skills that could not be loaded")


@library_group.command("show")
@click.argument("name")
@click.option("--file", "file", default=None, help="Show one of the skill's files instead.")
@click.option("--version", "version", default=None, help="Version to read (default: current).")
@library_option
@json_option
@handle_errors
def show_cmd(name: str, file: str | None, version: str | None, library_path: Path | None,
             as_json: bool) -> None:
    """Show a skill (its SKILL.md or one file), or a version when NAME is a version id."""
    lib = _open(library_path)
    snap = lib.snapshot(version)
    if not snap.unit(f"{SKILLS_DIR}/{name}") and (name.startswith("v") or name == "current"):
        try:
            m = lib.manifest(name)
        except NotFound:
            m = None
        if m is not None:
            changes = lib.changes(m.id)
            if as_json:
                emit_json({**_manifest_dict(m), "changes": {
                    p: ("deleted" if new is None else "added" if old is None else "modified")
                    for p, (old, new) in changes.items()}})
                return
            out = console()
            out.print(f"[bold]{m.id}[/] parent {m.parent or '-'}  {_when(m.created)}  "
                      f"[cyan]{escape(m.method)}[/]  {escape(m.message)}", markup=True,
                      soft_wrap=True)
            print_record(out, m.scores, m.costs)
            for p, (old, new) in changes.items():
                mark = "-" if new is None else "+" if old is None else "M"
                out.print(f"  {mark} {p}", markup=False)
            return
    if file is not None:
        text = read_skill(snap, name, file)
    else:
        text = snap.read_text(skill_path(name)) if snap.exists(skill_path(name)) else \
            read_skill(snap, name)  # raises NotFound listing the skills
    if as_json:
        emit_json({"version": snap.id, "skill": name, "file": file or "SKILL.md", "text": text,
                   "files": sorted(p.split("/", 2)[2] for p in snap.unit(f"skills/{name}"))})
        return
    echo_text(text, nl=not text.endswith("\n"))


@library_group.command("log")
@click.option("--limit", "-n", type=int, default=None, help="Show at most N versions.")
@library_option
@json_option
@handle_errors
def log_cmd(limit: int | None, library_path: Path | None, as_json: bool) -> None:
    """The versions, newest first, each with the learner's steps while it was current."""
    lib = _open(library_path)
    versions = lib.log(limit)
    steps = steps_by_base(lib)  # a learner's steps, under the version current then
    if as_json:
        emit_json([{**_manifest_dict(m), **({"learning": [s.to_dict() for s in steps[m.id]]}
                                            if m.id in steps else {})} for m in versions])
        return
    table = Table(title=f"library log ({lib.root})")
    for col in ("version", "parent", "time", "method", "files", "change", "message", "gate"):
        table.add_column(col, no_wrap=col in ("version", "gate"))
    for m in versions:
        c = m.counts
        change = f"+{c.get('added', 0)} ~{c.get('modified', 0)} -{c.get('deleted', 0)}"
        for step in steps.get(m.id, ()):
            table.add_row("", "", _when(step.time), "learn", "", "", step_text(step), "")
        table.add_row(m.id, m.parent or "-", _when(m.created), m.method,
                      str(c.get("files", "")), change, m.message[:60], gate_line(m))
    console().print(table)


@library_group.command("diff")
@click.argument("v1")
@click.argument("v2", required=False, default="current")
@library_option
@json_option
@handle_errors
def diff_cmd(v1: str, v2: str, library_path: Path | None, as_json: bool) -> None:
    """Unified diff of the files between two versions (V2 defaults to the current one)."""
    lib = _open(library_path)
    text = lib.diff(v1, v2)
    if as_json:
        emit_json({"from": lib.resolve(v1), "to": lib.resolve(v2), "diff": text})
        return
    echo_text(text or f"no differences between {lib.resolve(v1)} and {lib.resolve(v2)}",
              nl=not text.endswith("\n"))


@library_group.command("rollback")
@click.argument("version")
@click.option("--message", "-m", default="", help="Why (stored in the new version).")
@library_option
@json_option
@handle_errors
@gate_options
def rollback_cmd(version: str, message: str, library_path: Path | None, as_json: bool,
                 gate: GatedWrite) -> None:
    """Make a new version whose files equal VERSION's (history is kept). With --gate-tasks
    it must pass the gate; without, it goes live unmeasured, marked ungated."""
    lib = _open(library_path)
    target = lib.resolve(version)
    result = roll_back(lib, target, message, gate, as_json=as_json)
    if as_json:
        emit_json({**result_dict(result), "rolled_back_to": target})
    else:
        print_result(result, done=f"rolled back to {target} as new")
    refused(result)


@library_group.command("export")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--version", "version", default=None, help="Version to export (default: current).")
@click.option("--force", is_flag=True, help="Write into an existing non-empty folder.")
@library_option
@json_option
@handle_errors
def export_cmd(path: Path, version: str | None, force: bool, library_path: Path | None,
               as_json: bool) -> None:
    """Export the skills as plain SKILL.md folders (PATH ending in .tar.gz: an archive)."""
    lib = _open(library_path)
    dest, problems = export_skills(lib, path, version=version, overwrite=force)
    n = len(skill_names(lib.snapshot(version)))
    if as_json:
        emit_json({"path": str(dest), "version": lib.resolve(version), "skills": n,
                   "problems": [_problem_dict(e) for e in problems]})
    else:
        console().print(f"exported {n} skill(s) from {lib.resolve(version)} to "
                        f"[bold]{escape(str(dest))}[/]", markup=True)
        if problems:
            _print_problems(problems, title="exported skills that break the Agent Skills rules")
    if problems:
        raise SystemExit(LibraryError.exit_code)


@library_group.command("import")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--strict", is_flag=True, help="Reject the whole import if any skill is malformed.")
@click.option("--message", "-m", default="", help="Message of the new version.")
@library_option
@json_option
@handle_errors
@gate_options
def import_cmd(path: Path, strict: bool, message: str, library_path: Path | None,
               as_json: bool, gate: GatedWrite) -> None:
    """Import a folder (or .tar.gz) of SKILL.md skills as one new version. Malformed skills
    are skipped and listed while the valid ones are committed: exit code 11 (partial), or 5
    when nothing was committed. With --strict a malformed skill rejects the whole import.
    With --gate-tasks the import must pass the gate (refused: kept as a candidate); without,
    it goes live unmeasured, marked ungated."""
    lib = _open(library_path)
    report = import_skills(lib, path, strict=strict, message=message, commit=False,
                           check_unit=import_check(lib.snapshot()))
    result = None
    if report.changes:
        result = run_write(lib, LibraryPatch("import", report.changes, report.message),
                           by="library import", gate=gate, expect_parent=lib.current_id(),
                           as_json=as_json, how_to_gate=f"whetstone library import "
                                                        f"{shlex.quote(str(path))} "
                                                        "--gate-tasks SET@dev")
        report = replace(report, version=result.version)
    if as_json:
        emit_json({**report.to_dict(), **(result_dict(result) if result else {})})
    else:
        if result is not None:
            print_result(result, done="imported as")
        out = console()
        out.print(report.summary(), markup=False)
        if report.unchanged:
            out.print(f"unchanged: {', '.join(report.unchanged)}", markup=False)
        if report.ignored:
            out.print(f"ignored (not in a skill folder): {', '.join(report.ignored)}",
                      markup=False)
        if report.skipped:
            _print_problems(list(report.skipped), title="skipped malformed skills")
    if report.skipped:
        # With a version committed without the skipped skills it is neither a failure (5) nor
        # a clean import (0); with nothing committed, the import failed.
        raise SystemExit(EXIT_PARTIAL if report.version is not None else LibraryError.exit_code)
    refused(result)


@library_group.command("validate")
@click.option("--version", "version", default=None, help="Version to check (default: current).")
@library_option
@json_option
@handle_errors
def validate_cmd(version: str | None, library_path: Path | None, as_json: bool) -> None:
    """Check every skill against the Agent Skills rules, every learned tool against the
    admission check, and every file against its hash; without --version also the hand edits
    and drafts not committed yet (`skill new`), as `library commit` would check them."""
    lib = _open(library_path)
    snap = lib.snapshot(version)
    check = lib.validator or validate_library
    problems = check(snap, None)
    integrity = lib.verify(snap.id)
    drafts = lib.view_changes(snap) if version is None else {}
    draft_problems = check(lib.preview(drafts, label="hand-edits"), sorted(drafts)) \
        if drafts else []
    ok = not problems and not integrity and not draft_problems
    if as_json:
        emit_json({"version": snap.id, "ok": ok,
                   "problems": [_problem_dict(e) for e in problems], "integrity": integrity,
                   "hand_edits": sorted(drafts),
                   "hand_edit_problems": [_problem_dict(e) for e in draft_problems]})
    else:
        out = console()
        if problems:
            _print_problems(problems, title=f"problems in {snap.id}")
        for line in integrity:
            out.print(f"[bold red]integrity:[/] {escape(line)}", markup=True)
        if draft_problems:
            _print_problems(draft_problems, title="problems in the hand edits and drafts not "
                                                  "committed yet (`library commit` refuses them)")
        if not problems and not integrity:
            n = len(skill_names(snap))
            out.print(f"[green]ok[/]: {snap.id} holds {n} valid skill(s); every file matches "
                      "its hash", markup=True)
        if drafts and not draft_problems:
            out.print(f"[green]ok[/]: the {len(drafts)} hand-edited or drafted file(s) not "
                      "committed yet pass too", markup=True)
    if not ok:
        raise SystemExit(LibraryError.exit_code)


@library_group.command("reindex")
@library_option
@json_option
@handle_errors
def reindex_cmd(library_path: Path | None, as_json: bool) -> None:
    """Rebuild the retrieval index from the files of the current version."""
    lib = _open(library_path)
    start = time.perf_counter()
    with console(stderr=True).status("embedding and indexing ...", spinner="dots"):
        index = LibraryIndex(lib)
        try:
            counts = index.rebuild()
        finally:
            index.close()
    took = time.perf_counter() - start
    if as_json:
        emit_json({"version": lib.current_id(), "documents": counts, "seconds": round(took, 3)})
        return
    summary = ", ".join(f"{n} {kind}(s)" for kind, n in counts.items()) or "no documents"
    console().print(f"index rebuilt for {lib.current_id()}: {summary} in {took:.1f} s",
                    markup=False)


@library_group.command("repair")
@library_option
@json_option
@handle_errors
def repair_cmd(library_path: Path | None, as_json: bool) -> None:
    """Write skills/ and policies/ again from the current version (after a crash, a full
    disk or a file that could not be written)."""
    registry = default_registry()
    lib = Library(library_path or default_library_path(), roots=tuple(registry.roots()),
                  validator=library_validator(registry.root_validators()))
    if not lib.is_initialized():
        lib = Library.open(lib.root)  # raises: no library there
    stashed = lib.repair_view()  # blocking: a file that still fails raises ViewError
    if as_json:
        emit_json({"version": lib.current_id(), "stashed": stashed})
        return
    console().print(f"the view matches {lib.current_id()}"
                    + (f"; hand edits moved to .state/stash: {', '.join(stashed)}"
                       if stashed else ""), markup=False)


@library_group.command("status")
@library_option
@json_option
@handle_errors
def status_cmd(library_path: Path | None, as_json: bool) -> None:
    """Files under skills/ and policies/ edited by hand since the current version."""
    lib = _open(library_path)
    edits = lib.edits()
    if as_json:
        emit_json({"version": lib.current_id(), **edits.to_dict()})
        return
    if not edits:
        console().print(f"no hand edits: the files match {lib.current_id()}", markup=False)
        return
    for mark, paths in (("M", edits.modified), ("+", edits.added), ("-", edits.deleted)):
        for p in paths:
            echo_text(f"{mark} {p}")


@library_group.command("commit")
@click.option("--message", "-m", required=True, help="What the hand edits change, and why.")
@library_option
@json_option
@handle_errors
@gate_options
def commit_cmd(message: str, library_path: Path | None, as_json: bool,
               gate: GatedWrite) -> None:
    """Make a version from hand edits under skills/ and policies/ (validated first). With
    --gate-tasks it must pass the gate (as `evolve`); refused, it is kept as a candidate and
    the edits stay in the folder. Without, it goes live unmeasured, marked ungated."""
    result = commit_edits(_open(library_path), message, gate, as_json=as_json)
    if as_json:
        emit_json(result_dict(result))
    else:
        print_result(result, done="committed hand edits as")
    refused(result)


# -- candidates ---------------------------------------------------------------------------


@library_group.group("candidates")
def candidates_group() -> None:
    """Changes the regression gate rejected, kept to inspect or apply by hand."""


@candidates_group.command("ls")
@library_option
@json_option
@handle_errors
def candidates_ls(library_path: Path | None, as_json: bool) -> None:
    """List the kept candidates."""
    found = _open(library_path).candidates.list()
    if as_json:
        emit_json([c.to_dict() for c in found])
        return
    if not found:
        console().print("no candidates", markup=False)
        return
    table = Table(title="candidates")
    # The name is what `candidates show|apply NAME` takes: never cut or folded.
    table.add_column("name", no_wrap=True, min_width=max(len(c.name) for c in found))
    for col in ("base", "time", "method", "files", "scores", "message"):
        table.add_column(col)
    for c in found:
        table.add_row(c.name, c.base, _when(c.created), c.method, str(len(c.changes)),
                      escape(_scores_text(c.scores)), escape(c.message[:60]))
    console().print(table)


def _scores_text(scores: Mapping[str, Any]) -> str:
    """A candidate's scores in a few words: a gate decision as its verdict and two scores
    (``candidates show`` has the rest), anything else cut short."""
    parts = []
    for key, value in scores.items():
        if isinstance(value, Mapping) and "accepted" in value:
            verdict = "accepted" if value.get("accepted") else "rejected"
            cand, cur = value.get("candidate_score"), value.get("current_score")
            both = isinstance(cand, (int, float)) and isinstance(cur, (int, float))
            parts.append(f"{key} {verdict}" + (f" {cand:.3f} vs {cur:.3f}" if both else ""))
        else:
            text = " ".join(str(value).split())
            parts.append(f"{key}: {text if len(text) <= 60 else text[:59] + '…'}")
    return "; ".join(parts)


@candidates_group.command("show")
@click.argument("name")
@library_option
@json_option
@handle_errors
def candidates_show(name: str, library_path: Path | None, as_json: bool) -> None:
    """A candidate's scores and its diff against the current version."""
    store = _open(library_path).candidates
    cand = store.get(name)
    diff, conflicts = store.diff(name), store.conflicts(name)
    if as_json:
        emit_json({**cand.to_dict(), "diff": diff, "conflicts": conflicts})
        return
    out = console()
    out.print(f"[bold]{escape(cand.name)}[/] ({escape(cand.method)}, based on {cand.base}, "
              f"{_when(cand.created)}) {escape(cand.message)}", markup=True, soft_wrap=True)
    print_record(out, cand.scores, cand.costs)
    if conflicts:
        out.print(f"[yellow]changed since {cand.base}:[/] {', '.join(conflicts)}", markup=True)
    echo_text(diff or "(no difference from the current version)")


@candidates_group.command("apply")
@click.argument("name")
@click.option("--force", is_flag=True, help="Apply even if its files changed since its base.")
@library_option
@json_option
@handle_errors
@gate_options
def candidates_apply(name: str, force: bool, library_path: Path | None, as_json: bool,
                     gate: GatedWrite) -> None:
    """Commit a candidate as a new version (validated like any commit). With --gate-tasks it
    must pass the gate now (refused, the candidate is kept with the new decision); without,
    it goes live unmeasured, marked ungated, whatever its gate said before."""
    result = apply_candidate(_open(library_path), name, gate, force=force, as_json=as_json)
    if as_json:
        emit_json({**result_dict(result), "applied": name})
    else:
        print_result(result, done=f"applied candidate {escape(name)} as")
    refused(result)


@candidates_group.command("drop")
@click.argument("name")
@library_option
@json_option
@handle_errors
def candidates_drop(name: str, library_path: Path | None, as_json: bool) -> None:
    """Forget a candidate."""
    _open(library_path).candidates.drop(name)
    if as_json:
        emit_json({"dropped": name})
        return
    console().print(f"dropped candidate {escape(name)}", markup=True)


# -- skill ----------------------------------------------------------------------------------


@click.group("skill")
def skill_group() -> None:
    """Create skills."""


@skill_group.command("new")
@click.argument("name")
@click.option("--description", "-d", default=None, help="What the skill does and when to use it.")
@library_option
@json_option
@handle_errors
def skill_new(name: str, description: str | None, library_path: Path | None,
              as_json: bool) -> None:
    """Draft a scaffolded skill NAME under skills/NAME/SKILL.md: a hand edit, not a version,
    so nothing serves it until you edit it and run `whetstone library commit`."""
    lib = _open(library_path)
    if lib.snapshot().unit(f"{SKILLS_DIR}/{name}"):
        raise LibraryError(f"skill {name!r} already exists",
                           hint=f"edit {lib.root / skill_path(name)} and run "
                                "`whetstone library commit -m ...`")
    skill = scaffold_skill(name, description)
    (target,) = lib.draft(new_skill_changes(skill))
    if as_json:
        emit_json({"version": lib.current_id(), "skill": name, "path": str(target),
                   "draft": True})
        return
    console().print(f"drafted skill [bold]{name}[/] at {escape(str(target))}; it is not live "
                    f"(still {lib.current_id()}): edit it, then `whetstone library commit -m "
                    f"\"add {name}\"` makes it a version", markup=True, soft_wrap=True)
