"""The tool maker's WRITE phase, on the analyst's side: its reply read as one tool function
(the entry found, the task and answer parameters marked, missing imports named)."""

from __future__ import annotations

import ast
import re

from ....tools.learned import TOOL_NAME, ToolDefinition, define_tool
from ....tools.validate import ALLOWED_MODULES
from ...errors import ParseError
from . import PROMPTS
from .parts import (
    Repairs,
    code_block,
    skill_name,
)

TASK_MARK = 'Annotated[str, "task"]'
ANSWER_MARK = 'Annotated[str, "answer"]'
FALLBACK_DOC = "Answer the task from its text."


def entry_function(tree: ast.Module) -> ast.FunctionDef | None:
    """The function the tool is: the one with a task parameter, else the last top-level
    function of one parameter (helpers come first), else the last one."""
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    marked = [f for f in fns if f.args.args and f.args.args[0].annotation is not None
              and "task" in ast.unparse(f.args.args[0].annotation)]
    single = [f for f in fns if len(f.args.args) == 1]
    found = marked or single or fns
    return found[-1] if found else None


def normalise_tool(code: str, taken: set[str], repairs: Repairs) -> tuple[str, str]:
    """``(name, source)`` of a task tool from the analyst's code: the entry function gets the
    task-reading signature, a docstring and the ``Annotated`` import where it lacks them, and
    top-level statements that are not definitions (demo calls, prints) are dropped; each
    repair is counted. ``ParseError`` says what is missing."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise ParseError(f"the code does not parse: line {exc.lineno}: {exc.msg}", code) from exc
    fn = entry_function(tree)
    if fn is None:
        raise ParseError("the code defines no function", code)
    if len(fn.args.args) != 1 or fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs:
        raise ParseError(f"{fn.name}() must take exactly one parameter, the task text "
                         "(question)", code)
    kept: list[ast.stmt] = [n for n in tree.body if isinstance(n, (
        ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign))]
    if len(kept) != len(tree.body):
        repairs.add("maker-statements-dropped", len(tree.body) - len(kept))
    tree.body = kept
    arg = fn.args.args[0]
    if arg.annotation is None or ast.unparse(arg.annotation) != TASK_MARK:
        arg.annotation = ast.parse(TASK_MARK, mode="eval").body
        repairs.add("maker-signature")
    if fn.returns is None or ast.unparse(fn.returns) != ANSWER_MARK:
        fn.returns = ast.parse(ANSWER_MARK, mode="eval").body
        repairs.add("maker-signature")
    if ast.get_docstring(fn) is None:
        fn.body.insert(0, ast.Expr(ast.Constant(FALLBACK_DOC)))
        repairs.add("maker-docstring")
    missing = unimported_modules(tree)
    for module in missing:  # `re.findall(...)` with no `import re`: a NameError on every task
        tree.body.insert(0, ast.Import([ast.alias(module)]))
        repairs.add("maker-import-added")
    imports = {a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "typing"
               for a in n.names}
    if "Annotated" not in imports:
        tree.body.insert(0, ast.ImportFrom("typing", [ast.alias("Annotated")], 0))
    name = fn.name.lower()
    if not TOOL_NAME.match(name):
        name = "answer_task"
        repairs.add("maker-renamed")
    if name in taken:
        name = next(f"{name}_{i}" for i in range(2, 999) if f"{name}_{i}" not in taken)
        repairs.add("maker-renamed")
    fn.name = name
    return name, ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def unimported_modules(tree: ast.Module) -> list[str]:
    """Allowed modules the code uses by name (``re.sub``) but never imports or binds."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    used = {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and isinstance(n.value.ctx, ast.Load)}
    return sorted(m for m in used - bound if m in ALLOWED_MODULES)


def parse_made(raw: str, taken: set[str], repairs: Repairs) -> ToolDefinition:
    """A task tool from a maker reply (``ParseError`` / ``ValidationError`` say what to fix)."""
    code = code_block(raw)
    if "def " not in code:
        raise ParseError(PROMPTS.render("parts.yaml#maker_missing_code"), raw)
    name, source = normalise_tool(code, taken, repairs)
    definition, problems = define_tool(source, name=name, skill="dynamo-draft")
    if definition is None:
        raise ParseError("the function breaks the tool rules: " + "; ".join(
            f"line {p.line}: {p.detail}" if p.line else p.detail for p in problems[:4]), raw)
    return definition


def parse_naming(raw: str, repairs: Repairs) -> tuple[str, str]:
    """``(name, use when)`` from the two-line naming reply; "" for a line it lacks."""
    found = {m.group(1).lower(): " ".join(m.group(2).split()).strip("`*\"' ") for m in
             re.finditer(r"^[\s*#-]*(name|use when)\s*[:=-]\s*(.+)$", raw, re.IGNORECASE | re.MULTILINE)}
    name = skill_name(found.get("name", ""), "", repairs)
    return name, found.get("use when", "")


def renamed(old: str, source: str, new: str, taken: set[str]) -> tuple[str, str]:
    """``(name, source)`` with the tool function renamed to ``new`` where that name is free
    and the renamed code still passes the checks; else unchanged."""
    if new == old or new in taken or not TOOL_NAME.match(new) or re.search(
            rf"\b{new}\b", source):
        return old, source
    renamed = re.sub(rf"\b{old}(?=\s*\()", new, source)
    definition, _ = define_tool(renamed, name=new, skill="dynamo-draft")
    return (new, renamed) if definition is not None else (old, source)

