"""docs/cli.md agrees with the code: its exit-code table names every error class with the
code the class carries (read from the code, so a new class or ``EXIT_*`` constant fails here
until it is documented), every code a command exits with is in the table, and every
``WHETSTONE_*`` variable the code reads is documented."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from whetstone.engine import errors

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "cli.md"
PACKAGES = ("engine", "skills", "tools", "library_store")


def documented_codes() -> dict[int, str]:
    """Code -> its row of the table under '## Exit codes'."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {int(m.group(1)): m.group(0) for m in
            re.finditer(r"^\| (\d+) \|.*\|$", section, flags=re.MULTILINE)}
    assert rows, "no exit-code table found in docs/cli.md"
    return rows


def sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))] + \
        [REPO / "cli.py"]


def error_classes() -> dict[str, int]:
    """Every WhetstoneError subclass defined anywhere in the code, by name, with its exit
    code: its own ``exit_code = N``, else its base's."""
    defs: dict[str, tuple[list[str], int | None]] = {}
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                     if isinstance(b, (ast.Name, ast.Attribute))]
            own = next((s.value.value for s in node.body if isinstance(s, ast.Assign)
                        and any(isinstance(t, ast.Name) and t.id == "exit_code"
                                for t in s.targets)
                        and isinstance(s.value, ast.Constant)), None)
            defs[node.name] = (bases, own)

    def code(name: str, seen: frozenset[str] = frozenset()) -> int | None:
        if name == "WhetstoneError":
            return errors.WhetstoneError.exit_code
        if name not in defs or name in seen:
            return None
        bases, own = defs[name]
        inherited = [c for c in (code(b, seen | {name}) for b in bases) if c is not None]
        if not inherited:
            return None  # not a WhetstoneError
        return own if own is not None else inherited[0]

    found = {n: code(n) for n in defs}
    return {n: c for n, c in found.items() if c is not None}


def exit_constants() -> dict[str, int]:
    return {n: v for n, v in vars(errors).items() if n.startswith("EXIT_")}


def method_exit_codes() -> dict[int, tuple[str, str]]:
    """Code -> (method, when) for the codes the installed methods' commands exit with."""
    from whetstone.engine.methods.registry import default_registry

    return default_registry().exit_codes()


def cli_exit_codes() -> set[int]:
    """Codes passed to sys.exit / SystemExit / ctx.exit in cli.py and engine/commands,
    evaluated in their module (both branches of an ``a if c else b``); ``exc.exit_code``
    style arguments (an error's own code) are covered by the class check."""
    out: set[int] = set()
    files = [REPO / "cli.py", *sorted((REPO / "engine" / "commands").glob("*.py")),
             *sorted((REPO / "engine" / "methods").glob("*/commands.py"))]
    for path in files:
        module = importlib.import_module(  # under its installed name, as the product is
            ".".join(("whetstone", *path.relative_to(REPO).with_suffix("").parts)))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and node.args and (
                    (isinstance(node.func, ast.Attribute) and node.func.attr == "exit")
                    or (isinstance(node.func, ast.Name) and node.func.id == "SystemExit"))):
                continue
            pending, exprs = [node.args[0]], []
            while pending:
                e = pending.pop()
                if isinstance(e, ast.IfExp):
                    pending += [e.body, e.orelse]
                else:
                    exprs.append(e)
            for e in exprs:
                try:
                    value = eval(compile(ast.Expression(e), str(path), "eval"),
                                 vars(module))
                except NameError:
                    continue  # a local (the caught error): its class is checked above
                assert isinstance(value, int), f"{path.name}: exit({ast.unparse(e)})"
                out.add(value)
    return out


def test_every_error_class_is_in_the_table_with_its_code() -> None:
    rows = documented_codes()
    classes = error_classes()
    assert {"ConfigError", "NotFound", "ViewError"} <= set(classes)
    for name, code in classes.items():
        assert code in rows, f"{name} exits {code}, which docs/cli.md does not list"
        assert f"`{name}`" in rows[code], f"docs/cli.md's row {code} does not name {name}"


def test_every_exit_constant_and_every_code_a_command_exits_with_is_documented() -> None:
    rows = documented_codes()
    for name, code in exit_constants().items():
        assert code in rows, f"{name} = {code} is missing from docs/cli.md"
        assert code == 0 or f"`{name}`" in rows[code], f"row {code} does not name {name}"
    methods = method_exit_codes()
    core = set(error_classes().values()) | set(exit_constants().values())
    for code, (method, _) in methods.items():
        assert code not in core, f"{method} claims exit code {code}, which the core uses"
        assert code in rows and f"`{method}`" in rows[code], \
            f"{method}'s exit code {code} is missing from docs/cli.md or does not name it"
    used = cli_exit_codes()
    assert {errors.EXIT_PARTIAL, errors.EXIT_NO_ANSWER, errors.LibraryError.exit_code} <= used
    assert used <= set(rows), f"undocumented exit codes: {sorted(used - set(rows))}"
    # a row a method owns ("the `march` method's own") names a method that may not be installed
    owned = {code for code, row in rows.items()
             if re.search(r"the `(\w+)` method's own", row)}
    known = core | set(methods) | used
    assert set(rows) - owned <= known, \
        f"documented codes nothing exits with: {set(rows) - owned - known}"


def test_every_environment_variable_is_documented() -> None:
    doc = DOC.read_text(encoding="utf-8")
    names = {m for p in sources() for m in
             re.findall(r"WHETSTONE_[A-Z_]+[A-Z]", p.read_text(encoding="utf-8"))}
    assert {"WHETSTONE_HOME", "WHETSTONE_LOG_LEVEL"} <= names
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert not missing, f"docs/cli.md does not document {missing}"


def test_the_readme_links_the_page() -> None:
    assert "docs/cli.md" in (REPO / "README.md").read_text(encoding="utf-8")


# --- method options as the docs write them -------------------------------------------------

_KNOB = re.compile(r"`(?:--method-config\s+)?([A-Za-z_][\w.]*)\.(\w+)=([^`\s]+)`")
_FLAG = re.compile(r"--method-config[ =]([A-Za-z_][\w.]*)\.(\w+)=(\S+?)[`\"'\s)]")


def documented_knobs() -> list[tuple[str, str, str, str]]:
    """(where, method, knob, value) for each ``method.knob=value`` the docs, the README and
    the product's own text write as a ``--method-config`` option."""
    files = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md", *sources()]
    out = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        for m in [*_KNOB.finditer(text), *_FLAG.finditer(text)]:
            out.append((str(path.relative_to(REPO)), *m.groups()))
    return out


def test_every_documented_method_option_is_one_the_method_takes() -> None:
    """``--method-config skills.examples=3`` as written works: the method is a runtime method
    (the skills one included), the knob a field of its config, the value one it accepts. The
    namespace's name is no part of it (``whetstone.skills.examples`` was written once)."""
    from whetstone.engine.commands.common import parse_methods
    from whetstone.engine.methods.base import make_config
    from whetstone.engine.methods.registry import default_registry

    registry = default_registry()
    runtime = set(registry.names("runtime"))
    bad, checked = [], 0
    for where, method, knob, value in documented_knobs():
        if method.startswith("whetstone."):
            bad.append(f"{where}: {method}.{knob} (the option is {method.split('.')[-1]}.{knob})")
        if method not in runtime or knob.isupper():
            continue  # another dotted name (a span attribute), or a placeholder (KEY=VALUE)
        cls = registry.entry("runtime", method).load()
        option = f"{method}.{knob}={value}"
        try:
            if value.isupper():  # a placeholder (N, NAME): the knob must exist
                make_config(cls.config_class, {knob: None}, method=method)
            else:
                ((_, options),) = parse_methods("" if method == "skills" else method,
                                                (option,))
                make_config(cls.config_class, options, method=method)
            checked += 1
        except Exception as exc:  # noqa: BLE001 - each failure is listed with its reason
            bad.append(f"{where}: --method-config {option}: {exc}")
    assert not bad, "\n".join(bad)
    assert checked >= 1  # the skills method's own options at least (docs/architecture.md)
