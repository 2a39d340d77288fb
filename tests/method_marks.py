"""Which built-in methods each test uses, read from its source (issue 47), and the markers it
carries: the removal test (tests/test_method_removal.py) needs every test that uses a method to
carry that method's marker (``@pytest.mark.march``), so that a tree without the method runs
every other test.

A test uses a method when its code, or a fixture or helper it reaches in its own module or a
support module of tests/, does any of:

- imports the method's package (``from whetstone.engine.methods.march import ...``);
- names it where a method is chosen: ``methods=["memory"]`` / ``[("memory", {...})]``,
  ``evolve("dynamo")``, ``entry("runtime", "march")``, a command line holding ``--methods``
  or ``evolve`` before it, ``--methods nlpg``, ``--method-config march.corpus=x``;
- holds the name as a word in a string (``"whetstone evolve trace2skill"``), for the names that
  are no plain word of the core (``memory`` and ``horizon`` are: the sandbox's limit, the step
  limit a run stops at; those count only where a method is chosen, as above).

A name that is only data in a test (a step recorded as ``module="co_react"``, a fake source
the guard reads) is declared so on a comment inside the test: ``# names, not uses: co_react``.
What this cannot see (a default that picks a method, a library folder a method owns), the
removal copies find: such a test fails in the tree without the method, or in the tree that
holds only the methods it is marked with.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
METHODS_PACKAGE = "whetstone.engine.methods."
# Method names that are also words of the core: counted only where a method is chosen.
GENERIC_WORDS = frozenset({"memory", "horizon"})
# Calls whose first argument names a method.
CHOOSERS = frozenset({"evolve", "evolver", "entry", "runtime_method", "load_spec",
                      "summary_of", "commands_of"})


def builtin_methods(repo: Path = REPO) -> list[str]:
    """The built-in methods' names, read from ``BUILTIN_METHODS`` in the registry's source
    (the copies have it without the method removed)."""
    tree = ast.parse((repo / "engine/methods/registry.py").read_text(encoding="utf-8"))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "BUILTIN_METHODS" and node.value:
            return [p.rsplit(".", 1)[1] for p in ast.literal_eval(node.value)]
    raise AssertionError("engine/methods/registry.py defines no BUILTIN_METHODS")


_DATA = re.compile(r"#\s*names, not uses:\s*([\w, ]+)")


def _word(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])")


@dataclass
class _Symbol:
    """A module-level function, class or assignment: what it uses directly and the names of
    the module it refers to."""

    uses: set[str] = field(default_factory=set)
    refs: set[str] = field(default_factory=set)
    local_imports: set[str] = field(default_factory=set)  # names imports inside it bind


def _chosen_in_call(node: ast.Call, methods: Iterable[str]) -> set[str]:
    found: set[str] = set()
    names = set(methods)
    func = node.func.attr if isinstance(node.func, ast.Attribute) else (
        node.func.id if isinstance(node.func, ast.Name) else "")
    args = list(node.args)
    if func in CHOOSERS:
        for arg in args[:2]:  # evolve("x"), entry("runtime", "x")
            if isinstance(arg, ast.Constant) and arg.value in names:
                found.add(arg.value)
    for kw in node.keywords:
        if kw.arg in ("methods", "method"):
            found |= _constants_in(kw.value) & names
    # a command line given as the call's arguments: run("whetstone", "--methods", "x")
    found |= _chosen_in_sequence(ast.Tuple(elts=args), names)
    return found


def _constants_in(node: ast.AST) -> set[str]:
    """String constants in ``node`` that are whole words (list and tuple items included)."""
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)}


def _chosen_in_sequence(node: ast.List | ast.Tuple, methods: Iterable[str]) -> set[str]:
    """A command line: the item after ``--methods`` (a comma list) or ``evolve``."""
    found: set[str] = set()
    items = [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None
             for e in node.elts]
    for before, item in itertools.pairwise(items):
        if item is None:
            continue
        if before == "--methods":
            found |= set(re.split(r"[,\s]+", item)) & set(methods)
        elif before == "evolve" and item in methods:
            found.add(item)
    return found


def _chosen_in_text(text: str, methods: Iterable[str]) -> set[str]:
    """``--methods a,b``, ``evolve x`` and ``--method-config x.k=v`` written in one string."""
    found: set[str] = set()
    for name in methods:
        n = re.escape(name)
        if re.search(rf"--methods[ =]([\w,]*,)?{n}\b", text) or re.search(
                rf"\bevolve[ (\"']+{n}\b", text) or re.search(rf"(^|[\s=\"']){n}\.\w+=", text):
            found.add(name)
    return found


class ModuleUses:
    """What each name of one module uses, directly or through the names it refers to."""

    def __init__(self, path: Path, methods: list[str],
                 support: dict[str, ModuleUses] | None = None) -> None:
        self.path = path
        self.methods = methods
        self.tree = ast.parse(path.read_text(encoding="utf-8"))
        self.support = support or {}
        self.symbols: dict[str, _Symbol] = {}
        self.module = _Symbol()  # module-level code outside the symbols (pytestmark, imports)
        self._imported: dict[str, str] = {}  # bound name -> the method its import names
        self._from_support: dict[str, tuple[str, str]] = {}  # name -> (support module, name)
        self._bound: set[str] = set()  # every name an import binds at module level
        self.file_uses: set[str] = set()  # methods imported at module level: every test's
        self._read()
        self._cache: dict[str, set[str]] = {}

    # -- reading --------------------------------------------------------------------------

    def _read(self) -> None:
        for node in self.tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                self._bind_import(node)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.symbols[node.name] = self._symbol(node)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                sym = self._symbol(node)
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            self.symbols[n.id] = sym
            else:
                sym = self._symbol(node)
                self.module.uses |= sym.uses
                self.module.refs |= sym.refs

    def _bind_import(self, node: ast.Import | ast.ImportFrom) -> None:
        self._bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module, *(f"{node.module}.{a.name}" for a in node.names)] if node.module
            else [])
        # the file cannot even be collected without them
        self.file_uses |= {m for m in map(self._method_of, modules) if m}
        for module in modules:
            if module in self.support:
                self.file_uses |= self.support[module].file_uses
        if isinstance(node, ast.ImportFrom) and node.module:
            method = self._method_of(node.module)
            for a in node.names:
                bound = a.asname or a.name
                sub = self._method_of(f"{node.module}.{a.name}")
                if method or sub:
                    self._imported[bound] = method or sub or ""
                elif node.module in self.support:
                    self._from_support[bound] = (node.module, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                method = self._method_of(a.name)
                if method:
                    self._imported[(a.asname or a.name).split(".")[0]] = method

    def _method_of(self, module: str) -> str | None:
        if module.startswith(METHODS_PACKAGE):
            name = module[len(METHODS_PACKAGE):].split(".")[0]
            return name if name in self.methods else None
        return None

    def _symbol(self, node: ast.AST) -> _Symbol:
        sym = _Symbol()
        for d in getattr(node, "decorator_list", []):  # parametrized over method names
            if isinstance(d, ast.Call) and ast.unparse(d.func).endswith("parametrize"):
                sym.uses |= _constants_in(d) & set(self.methods)
        for n in ast.walk(node):
            if isinstance(n, ast.Import | ast.ImportFrom):  # an import inside a function
                sym.local_imports |= {(a.asname or a.name).split(".")[0] for a in n.names}
                if isinstance(n, ast.ImportFrom) and n.module:
                    sym.local_imports.add(n.module.split(".")[0])
                modules = [a.name for a in n.names] if isinstance(n, ast.Import) else (
                    [n.module, *(f"{n.module}.{a.name}" for a in n.names)] if n.module else [])
                sym.uses |= {m for m in map(self._method_of, modules) if m}
            elif isinstance(n, ast.Name):
                sym.refs.add(n.id)
            elif isinstance(n, ast.arg):  # a fixture named as a parameter
                sym.refs.add(n.arg)
            elif isinstance(n, ast.Call):
                sym.uses |= _chosen_in_call(n, self.methods)
            elif isinstance(n, ast.List | ast.Tuple):
                sym.uses |= _chosen_in_sequence(n, self.methods)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                sym.uses |= _chosen_in_text(n.value, self.methods)
                sym.uses |= {m for m in self.methods if m not in GENERIC_WORDS
                             and _word(m).search(n.value)}
        return sym

    # -- resolving ------------------------------------------------------------------------

    def uses_of(self, name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """The methods the module-level ``name`` uses, through everything it refers to."""
        if name in self._cache:
            return self._cache[name]
        if name in seen:
            return set()
        out: set[str] = set()
        if name in self._imported:
            out.add(self._imported[name])
        elif name in self._from_support:
            module, attr = self._from_support[name]
            out |= self.support[module].uses_of(attr)
        elif name in self.symbols:
            sym = self.symbols[name]
            out |= sym.uses
            for ref in sym.refs - {name}:
                out |= self.uses_of(ref, seen | {name})
        if not seen:
            self._cache[name] = out
        return out

    def reached(self, name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """The imported names ``name`` reaches through the module's symbols and the support
        modules' (``subprocess``, ``Servers`` ...); an import inside a function counts."""
        if name in seen:
            return set()
        out: set[str] = set()
        if name in self._from_support:
            module, attr = self._from_support[name]
            out |= {name} | self.support[module].reached(attr)
        elif name in self._bound:
            out.add(name)
        elif name in self.symbols:
            sym = self.symbols[name]
            out |= sym.local_imports
            for ref in sym.refs - {name}:
                out |= self.reached(ref, seen | {name})
        return out

    def tests_reaching(self, names: frozenset[str]) -> set[str]:
        """The tests that reach any of ``names`` (fixtures and helpers included)."""
        out: set[str] = set()
        autouse = set()
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef) and any(
                    "autouse" in ast.unparse(d) for d in node.decorator_list):
                autouse |= self.reached(node.name)
        for test in self.tests():
            top = test.split("::")[0]
            if (self.reached(top) | autouse) & names:
                out.add(test)
        return out

    def tests(self) -> dict[str, set[str]]:
        """Test id (``test_x`` or ``TestY::test_x``) -> the methods it uses."""
        out: dict[str, set[str]] = {}
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                    node.name.startswith("test"):
                out[node.name] = self.uses_of(node.name)
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                whole = self.uses_of(node.name)
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and \
                            item.name.startswith("test"):
                        out[f"{node.name}::{item.name}"] = whole
        autouse = self._autouse_uses() | self.file_uses
        return {k: (v | autouse) - self._data_names(k) for k, v in out.items()}

    def _data_names(self, test: str) -> set[str]:
        """The methods a ``# names, not uses: a, b`` comment inside ``test`` declares."""
        node = self._node(test)
        if node is None:
            return set()
        lines = self.path.read_text(encoding="utf-8").splitlines()
        out: set[str] = set()
        for line in lines[node.lineno - 1:node.end_lineno]:
            m = _DATA.search(line)
            if m:
                out |= {n.strip() for n in m.group(1).split(",")}
        return out

    def _node(self, test: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        cls, _, name = test.rpartition("::")
        for node in self.tree.body:
            if not cls and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                    and node.name == name:
                return node
            if cls and isinstance(node, ast.ClassDef) and node.name == cls:
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and \
                            item.name == name:
                        return item
        return None

    def _autouse_uses(self) -> set[str]:
        out: set[str] = set()
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef) and any(
                    "autouse" in ast.unparse(d) for d in node.decorator_list):
                out |= self.uses_of(node.name)
        return out

    # -- the markers it carries -----------------------------------------------------------

    def marks(self) -> dict[str, set[str]]:
        """Test id -> the markers on it (its own, its class's, the module's ``pytestmark``,
        and those of its ``pytest.param`` cases)."""
        module = set()
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
                module |= self._marks_in(node.value)
        out: dict[str, set[str]] = {}
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                    node.name.startswith("test"):
                out[node.name] = module | self._decorated(node)
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                cls = module | self._decorated(node)
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and \
                            item.name.startswith("test"):
                        out[f"{node.name}::{item.name}"] = cls | self._decorated(item)
        return out

    def _decorated(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
                   ) -> set[str]:
        out: set[str] = set()
        for d in node.decorator_list:
            out |= self._marks_in(d)
        return out

    def _marks_in(self, node: ast.AST) -> set[str]:
        """``pytest.mark.<name>`` anywhere in ``node`` (a decorator, a list, a param)."""
        return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}


def support_modules(methods: list[str], tests: Path = TESTS) -> dict[str, ModuleUses]:
    """The modules of tests/ a test may import from (helpers, ``conftest``, other test
    files), read once."""
    out: dict[str, ModuleUses] = {}
    for path in sorted(tests.glob("*.py")):  # test modules too: one may import another's
        out[path.stem] = ModuleUses(path, methods)
    for module in out.values():  # support modules may import each other
        module.support = out
    return out


def test_files(tests: Path = TESTS) -> list[Path]:
    return sorted(tests.glob("test_*.py"))


# --- integration tests --------------------------------------------------------------------

# What makes a test an integration test (``make test`` runs it, ``make test-fast`` does not):
# it starts processes (a command line, an MCP server over stdio, a wheel build, ruff, mypy)
# or servers on a port, reached through these names in it or its helpers...
INTEGRATION_NAMES = frozenset({
    "subprocess", "Popen", "create_subprocess_exec", "multiprocessing", "uvicorn",
    "running_server", "Servers", "wait_healthy", "McpServer", "stdio_client",
    "sdk_server_command", "http_test_server"})
# ...or it crashes, loads or removes on purpose, whatever it calls.
INTEGRATION_FILES = frozenset({
    "test_library_crash.py", "test_middleware_load.py", "test_soak.py", "test_replicas.py",
    "test_method_removal.py", "test_library_concurrency.py"})


def missing_marks(tests: Path = TESTS, repo: Path = REPO) -> dict[str, list[str]]:
    """``file::test`` -> the markers it should carry and does not: the methods it uses, and
    ``integration`` where it starts processes or servers (``INTEGRATION_NAMES``)."""
    methods = builtin_methods(repo)
    support = support_modules(methods, tests)
    out: dict[str, list[str]] = {}
    for path in test_files(tests):
        mod = ModuleUses(path, methods, support)
        marks = mod.marks()
        integration = set(mod.tests()) if path.name in INTEGRATION_FILES else \
            mod.tests_reaching(INTEGRATION_NAMES)
        for test, uses in mod.tests().items():
            want = uses | ({"integration"} if test in integration else set())
            lacking = sorted(want - marks.get(test, set()))
            if lacking:
                out[f"{path.name}::{test}"] = lacking
    return out
