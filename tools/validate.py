"""The AST check a learned tool's code must pass before it is admitted to a library.

A learned tool is written by a model and runs on users' machines. The sandbox
(``tools/sandbox.py``) is the wall; this check is the gate in front of it: it refuses, with the
rule and the line, code that reaches for what a tool never needs, so a bad tool is turned away
at admission with a reason the analyst can act on instead of failing at run time.

The rules (documented in docs/sandbox.md):
- imports only from ``ALLOWED_MODULES`` (a pure-computation stdlib subset, PIL and numpy), no
  relative or ``*`` imports, none of the ``DENIED_SUBMODULES`` (PIL's screen grabbing and
  viewers, numpy's compilers and C bridges);
- none of the ``DENIED_NAMES`` builtins, referenced at all (``f = eval`` is as bad as a call):
  dynamic code (``eval``, ``exec``, ``compile``, ``__import__``), attribute access by string
  (``getattr``, ``setattr``, ``delattr``, ``vars``, ``globals``, ``locals``), file and console
  I/O (``open``, ``input``, ``print`` is allowed), interpreter control (``exit``, ``quit``,
  ``breakpoint``, ``help``);
- no dunder names or attributes (``__class__``, ``__globals__``, ``__builtins__``): the usual
  road from any object back to the interpreter;
- no ``.format()`` / ``.format_map()`` calls (a format string can read attributes, dunders
  included; f-strings are checked like code and allowed);
- no file I/O through the allowed libraries (``Image.open``, ``img.save``, ``np.save``,
  ``np.fromfile``, ...): a tool gets its inputs as arguments, images as ``PIL.Image.Image``
  objects the harness opened for it, and returns its result.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from engine.errors import ValidationError

MAX_SOURCE_BYTES = 64_000
MAX_NODES = 20_000

ALLOWED_MODULES = frozenset({
    "__future__", "math", "cmath", "statistics", "fractions", "decimal", "numbers",
    "itertools", "functools", "operator", "collections", "heapq", "bisect", "array",
    "re", "string", "textwrap", "unicodedata", "difflib", "json", "datetime", "calendar",
    "random", "typing", "dataclasses", "enum", "abc", "copy", "colorsys",
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
FORMAT_CALLS = frozenset({"format", "format_map", "vformat", "get_field"})
FILE_IO_CALLS = frozenset({
    "open", "save", "tofile", "fromfile", "memmap", "savetxt", "loadtxt", "genfromtxt",
    "savez", "savez_compressed", "fromregex",
})
IO_HINT = ("a tool gets its inputs as arguments (images as PIL.Image.Image objects opened for "
           "it) and returns its result (an image as a PIL.Image.Image)")


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


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
    elif isinstance(node, ast.Attribute) and _is_dunder(node.attr):
        yield "dunder", f"reads the attribute {node.attr}", \
            "tools do not touch interpreter internals"
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        attr = node.func.attr
        if attr in FORMAT_CALLS:
            yield "format", f".{attr}() can read attributes through its format string", \
                "use an f-string"
        elif attr in FILE_IO_CALLS:
            yield "file-io", f".{attr}() does file I/O", IO_HINT
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
        pass  # harmless inside one module
    elif isinstance(node, ast.alias) and _is_dunder(node.asname or ""):
        yield "dunder", f"imports as {node.asname}", "pick a plain name"


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
