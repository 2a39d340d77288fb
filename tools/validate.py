"""The AST check a learned tool's code must pass before it is admitted to a library.

A learned tool is written by a model and runs on users' machines. The sandbox
(``tools/sandbox.py``) is the wall, and the only thing that stops a hostile tool: this check is
a courtesy in front of it. It refuses, with the rule and the line, code that reaches for what a
tool never needs, so a bad tool is turned away at admission with a reason the analyst can act
on instead of failing at run time. It reads names and attributes as written; it does not follow
values (``m = np; m.lib``), strings, containers or what a library function does inside, so code
that passes it is not thereby safe (docs/sandbox.md, "What is defended").

The rules (documented in docs/sandbox.md):
- imports only from ``ALLOWED_MODULES`` (a pure-computation stdlib subset, PIL and numpy), no
  relative or ``*`` imports, none of the ``DENIED_SUBMODULES`` (PIL's screen grabbing and
  viewers, numpy's compilers and C bridges), no private or ``DENIED_ATTRIBUTES`` name imported
  from them (``from PIL.Image import os``);
- none of the ``DENIED_NAMES`` builtins, referenced at all (``f = eval`` is as bad as a call):
  dynamic code (``eval``, ``exec``, ``compile``, ``__import__``), attribute access by string
  (``getattr``, ``setattr``, ``delattr``, ``vars``, ``globals``, ``locals``), file and console
  I/O (``open``, ``input``, ``print`` is allowed), interpreter control (``exit``, ``quit``,
  ``breakpoint``, ``help``);
- no dunder names, and no private or dunder attributes (``__class__``, ``__globals__``,
  ``random._os``): the usual roads from any object back to the interpreter;
- no attribute named like a module that the allowed modules hold but tools may not import
  (``typing.sys``, ``PIL.Image.os``, ``json.decoder.re.sys``, ``np.ctypeslib``: the
  ``DENIED_ATTRIBUTES``, kept complete for the installed numpy and PIL by a test), nor the
  helpers that read attributes by string or evaluate strings (``operator.attrgetter``,
  ``typing.get_type_hints``);
- the same attribute rules for a match pattern's keywords (``case object(gi_frame=f)``);
- no string written as a type (``x: "..."``, ``-> "T"``): ``get_type_hints`` evaluates it,
  and ``functools.singledispatch``'s ``register`` calls that (both are refused by name too);
  ``Annotated``'s marks and ``Literal``'s values are not types and stay allowed;
- no ``.format()`` / ``.format_map()`` calls (a format string can read attributes, dunders
  included; f-strings are checked like code and allowed);
- no file I/O through the allowed libraries (``Image.open``, ``img.save``, ``np.save``,
  ``np.fromfile``, ...), and no ``allow_pickle=`` other than ``False`` (unpickling runs code):
  a tool gets its inputs as arguments, images as ``PIL.Image.Image`` objects the harness
  opened for it, and returns its result.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from whetstone.engine.errors import ValidationError

MAX_SOURCE_BYTES = 64_000
MAX_NODES = 20_000

ALLOWED_MODULES = frozenset({
    "__future__", "math", "cmath", "statistics", "fractions", "decimal", "numbers",
    "itertools", "functools", "operator", "collections", "heapq", "bisect", "array",
    "re", "string", "textwrap", "unicodedata", "difflib", "json", "datetime", "calendar",
    "random", "typing", "dataclasses", "enum", "abc", "copy", "colorsys", "time",
    "PIL", "numpy",
})
DENIED_SUBMODULES = frozenset({
    "PIL.ImageGrab", "PIL.ImageShow", "PIL.ImageTk", "PIL.ImageQt", "PIL.ImageWin",
    "PIL.ImageCms", "numpy.f2py", "numpy.distutils", "numpy.ctypeslib", "numpy.testing",
    "numpy.lib.format", "numpy.lib.npyio",
})
DENIED_NAMES = {
    "eval": "runs code from a string", "exec": "runs code from a string",
    "compile": "builds code from a string", "__import__": "imports by name at run time",
    "getattr": "reads attributes by name (use the attribute)",
    "setattr": "writes attributes by name", "delattr": "deletes attributes by name",
    "vars": "exposes an object's namespace", "globals": "exposes the module's namespace",
    "locals": "exposes a frame's namespace", "open": "file I/O",
    "input": "reads the console", "breakpoint": "starts a debugger",
    "exit": "stops the interpreter", "quit": "stops the interpreter",
    "help": "starts the interactive help", "memoryview": "raw memory access",
}
_HELD_MODULE = "a module the allowed modules hold, which tools may not use"
# Attribute names under which ALLOWED_MODULES hold modules a tool may not import (found by
# walking numpy, PIL and the allowed stdlib; tests/test_attack_tasks_tools.py walks again),
# plus the usual escape hatches by name, and helpers that reach attributes or code by string.
DENIED_ATTRIBUTES: dict[str, str] = {
    **{name: _HELD_MODULE for name in (
        "atexit", "base64", "bltns", "builtins", "codecs", "contextlib", "copyreg",
        "ctypes", "ctypeslib", "f2py", "gc", "importlib", "inspect", "io", "keyword",
        "logging", "marshal", "mmap", "modules", "npyio", "os", "pathlib", "pickle", "posix",
        "shutil", "signal", "socket", "struct", "subprocess", "sys", "tempfile", "testing",
        "threading", "types", "warnings", "gzip", "zlib")},
    "attrgetter": "reads attributes by name", "methodcaller": "calls methods by name",
    "get_type_hints": "evaluates annotation strings as code",
    # `@f.register` reads the function's annotations through get_type_hints.
    **{name: "evaluates annotation strings as code (through get_type_hints)"
       for name in ("singledispatch", "singledispatchmethod")},
    "unsafe_eval": "evaluates a string as code (PIL.ImageMath)",
    # A generator's, coroutine's or traceback's frame holds the interpreter's builtins and
    # globals: `(i for i in [1]).gi_frame.f_builtins["__import__"]("os")`.
    **{name: "reaches an interpreter frame or code object (its builtins and globals)"
       for name in ("gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await",
                    "ag_frame", "ag_code", "ag_await", "f_builtins", "f_globals", "f_locals",
                    "f_back", "f_code", "tb_frame", "tb_next", "co_consts")},
}
FORMAT_CALLS = frozenset({"format", "format_map", "vformat", "get_field"})
FILE_IO_CALLS = frozenset({
    "open", "save", "tofile", "fromfile", "memmap", "savetxt", "loadtxt", "genfromtxt",
    "savez", "savez_compressed", "fromregex",
})
IO_HINT = ("a tool gets its inputs as arguments (images as PIL.Image.Image objects opened for "
           "it) and returns its result (an image as a PIL.Image.Image)")


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _attribute_problem(name: str) -> tuple[str, str, str] | None:
    """(rule, detail, hint) when a tool may not read the attribute (or import the name)."""
    if _is_dunder(name):
        return "dunder", f"reads the attribute {name}", "tools do not touch interpreter internals"
    if name.startswith("_"):
        return ("private", f"reads the private attribute {name}",
                "use the library's public API")
    if name in DENIED_ATTRIBUTES:
        return ("attribute", f"reads .{name}: {DENIED_ATTRIBUTES[name]}",
                "compute with the allowed modules' public functions")
    return None


def _named(node: ast.expr, name: str) -> bool:
    """Whether ``node`` is written as ``name`` or ``something.name``."""
    return (isinstance(node, ast.Name) and node.id == name) or (
        isinstance(node, ast.Attribute) and node.attr == name)


def _names_a_string(node: ast.expr) -> bool:
    """Whether ``node`` is a string literal or ``str`` itself (whose ``.format`` the attribute
    rule reports)."""
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)) or _named(node, "str")


def _module_problem(module: str) -> tuple[str, str] | None:
    """(detail, hint) when ``module`` may not be imported."""
    top = module.split(".")[0]
    if top not in ALLOWED_MODULES:
        return (f"imports {module!r}, which tools may not use",
                "tools may import only " + ", ".join(sorted(ALLOWED_MODULES - {"__future__"})))
    for denied in DENIED_SUBMODULES:
        if module == denied or module.startswith(denied + "."):
            return (f"imports {module!r} (screen, viewer, compiler or C access)",
                    "compute with the rest of PIL and numpy")
    return None


def _import_problems(node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, str, str]]:
    if isinstance(node, ast.ImportFrom):
        if node.level:
            yield "import", "relative import", "import allowed modules by their full name"
            return
        base = node.module or ""
        names = [f"{base}.{a.name}" for a in node.names]
        if any(a.name == "*" for a in node.names):
            yield "import", f"'from {base} import *' hides what is used", "import names one by one"
            return
        # `from PIL import ImageGrab` imports a submodule as much as `import PIL.ImageGrab`.
        for module in [base, *names]:
            found = _module_problem(module)
            if found:
                yield "import", *found
                return
        # `from PIL.Image import os` reads an attribute as much as `PIL.Image.os` does.
        for alias in node.names:
            held = _attribute_problem(alias.name)
            if held:
                yield held[0], f"imports {alias.name} from {base}: " + held[1], held[2]
                return
        return
    for alias in node.names:
        found = _module_problem(alias.name)
        if found:
            yield "import", *found


def _node_problems(node: ast.AST) -> Iterator[tuple[str, str, str]]:
    """(rule, detail, hint) for each rule ``node`` breaks."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield from _import_problems(node)
    elif isinstance(node, ast.Name):
        if node.id in DENIED_NAMES:
            yield "builtin", f"uses {node.id}: {DENIED_NAMES[node.id]}", "compute directly"
        elif _is_dunder(node.id):
            yield "dunder", f"uses {node.id}", "tools do not touch interpreter internals"
    elif isinstance(node, ast.Attribute):
        found = _attribute_problem(node.attr)
        if found:
            yield found
        elif node.attr == "format" and _named(node.value, "lib"):  # numpy.lib.format
            yield "attribute", "reads numpy.lib.format: it reads and writes .npy files", IO_HINT
        elif node.attr in FORMAT_CALLS and not isinstance(node.ctx, ast.Store) and (
                node.attr != "format" or _names_a_string(node.value)):
            # Read without a call (``f = "{0.x}".format``) it is the same road, later. A bare
            # ``.format`` stays allowed: images have one (``image.format == "PNG"``).
            yield "format", f".{node.attr}() can read attributes through its format string", \
                "use an f-string"
    elif isinstance(node, ast.MatchClass):
        # `case object(gi_frame=fr)` reads the attribute as much as `obj.gi_frame` does.
        for name in node.kwd_attrs:
            found = _attribute_problem(name)
            if found:
                yield found[0], f"matches on {found[1].removeprefix('reads ')}", found[2]
    elif isinstance(node, ast.Call):
        yield from _call_problems(node)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.AnnAssign, ast.arg)):
        yield from _annotation_problems(node)
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
        pass  # harmless inside one module
    elif isinstance(node, ast.alias) and _is_dunder(node.asname or ""):
        yield "dunder", f"imports as {node.asname}", "pick a plain name"


def _annotation_problems(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.AnnAssign
                         | ast.arg) -> Iterator[tuple[str, str, str]]:
    """A string written as a type (``x: "..."``): code the check cannot read, which
    ``get_type_hints`` (and so ``singledispatch``) would evaluate. ``Annotated``'s marks
    (``Annotated[str, "task"]``) and ``Literal``'s values are data, never evaluated, and
    stay allowed."""
    annotation = node.returns if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
        else node.annotation
    if annotation is not None and _has_string_type(annotation):
        yield ("annotation", "writes a type as a string, which is evaluated as code",
               "write the type itself (str, list[int]), not a string")


def _has_string_type(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Subscript) and _named(node.value, "Literal"):
        return False  # Literal["x", "y"]: values, never evaluated
    if isinstance(node, ast.Subscript) and _named(node.value, "Annotated"):
        inner = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) and node.slice.elts \
            else node.slice
        return _has_string_type(inner)
    return any(_has_string_type(child) for child in ast.iter_child_nodes(node))


def _call_problems(node: ast.Call) -> Iterator[tuple[str, str, str]]:
    for kw in node.keywords:
        if kw.arg == "allow_pickle" and not (isinstance(kw.value, ast.Constant)
                                             and kw.value.value is False):
            yield "pickle", "allow_pickle= other than False: unpickling runs code", IO_HINT
    if not isinstance(node.func, ast.Attribute):
        return
    attr = node.func.attr
    if attr == "format" and not _names_a_string(node.func.value):
        yield "format", ".format() can read attributes through its format string", \
            "use an f-string"
    elif attr in FILE_IO_CALLS:
        yield "file-io", f".{attr}() does file I/O", IO_HINT


def parse_tool_source(source: str, *, path: str) -> tuple[ast.Module | None,
                                                         list[ValidationError]]:
    """Parse and check ``source``; the tree is None when it cannot be parsed at all."""
    if len(source.encode("utf-8")) > MAX_SOURCE_BYTES:
        return None, [ValidationError(path, "size", f"more than {MAX_SOURCE_BYTES} bytes",
                                      hint="a tool is one short function")]
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        return None, [ValidationError(path, "syntax", exc.msg or "invalid syntax",
                                      line=exc.lineno)]
    problems: list[ValidationError] = []
    for count, node in enumerate(ast.walk(tree)):
        if count > MAX_NODES:
            problems.append(ValidationError(path, "size", f"more than {MAX_NODES} syntax nodes",
                                            hint="a tool is one short function"))
            break
        for rule, detail, hint in _node_problems(node):
            problems.append(ValidationError(path, rule, detail,
                                            line=getattr(node, "lineno", None), hint=hint))
    return tree, problems


def check_tool_code(source: str, *, path: str = "tool.py") -> list[ValidationError]:
    """Every rule ``source`` breaks, each with its line; empty when it may be admitted."""
    return parse_tool_source(source, path=path)[1]
