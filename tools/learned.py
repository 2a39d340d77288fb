"""Learned tools: the format, and turning a script into a ``ToolSpec`` without running it.

A learned tool is a Python function with a typed signature and a docstring, in
``skills/<skill>/scripts/<tool>.py`` inside the library skill whose SKILL.md says when to call
it (no tool without its when-to-use skill). The function is named like the file::

    from PIL import Image

    def count_red(image: Image.Image, threshold: int = 200) -> int:
        \"\"\"Count the strongly red pixels of an image.

        Args:
            image: the picture to look at.
            threshold: how red a pixel must be (0-255).
        \"\"\"
        ...

Two markers from ``typing.Annotated`` make a tool a small model can use without copying its
input (the tool reads the task itself) or its output (the tool's result is the answer)::

    def sort_words(question: Annotated[str, "task"]) -> Annotated[str, "answer"]:

A parameter ``Annotated[str, "task"]`` is filled by the runtime with the run's task text and
is not shown to the model (LangChain's ``InjectedToolArg``); a return ``Annotated[..., "answer"]``
says the output is the task's answer, so a run that calls the tool successfully ends with it
(LangChain's ``return_direct``). An evolver writes such tools only after checking their output
against labels.

Parameters and the return value are JSON types (``int``, ``float``, ``str``, ``bool``,
``list[...]``, ``dict[str, ...]``, ``Literal[...]``, ``X | None``) or ``PIL.Image.Image``: an image
argument is passed as a file path and opened for the tool; an image result comes back as a PNG
path. The JSON schema is read from the annotations and the docstring's ``Args:`` section in the
syntax tree: the host never imports a learned tool; it runs only in the sandbox
(``tools/learned_run.py``).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..engine.errors import ValidationError
from ..engine.types import Skill, ToolSpec
from .validate import parse_tool_source

SCRIPTS_DIR = "scripts"
# Where a method that learned a tool records how (its checks, its score), beside the skill.
PROVENANCE_FILE = "assets/provenance.json"
TOOL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")  # \Z: `$` would let "name\n" through
MAX_DESCRIPTION = 1024
IMAGE_ANNOTATIONS = frozenset({"Image.Image", "PIL.Image.Image", "Image"})
_SCALARS = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}
IMAGE_SCHEMA_NOTE = "path of an image file (PNG, JPEG, ...)"


INJECT_SOURCES = frozenset({"task"})  # Annotated[str, "task"]: the run's task text
ANSWER_MARK = "answer"  # -> Annotated[..., "answer"]: the output is the task's answer


@dataclass(frozen=True)
class ToolDefinition:
    """A learned tool as the library holds it: its code, its schema, and its skill."""

    name: str
    skill: str
    path: str  # skills/<skill>/scripts/<name>.py
    source: str
    spec: ToolSpec
    image_params: tuple[str, ...] = ()
    returns_image: bool = False


@dataclass
class LoadedTools:
    """The learned tools of some skills, the problems of those that failed the checks, and the
    scripts that are not tools (no function named like the file)."""

    tools: list[ToolDefinition] = field(default_factory=list)
    problems: list[ValidationError] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class _SchemaError(Exception):
    def __init__(self, detail: str, line: int | None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.line = line


def _dotted(node: ast.expr) -> str:
    return ast.unparse(node).replace(" ", "")


def _literal_values(node: ast.expr) -> list[Any]:
    elts = node.elts if isinstance(node, ast.Tuple) else [node]
    values = []
    for e in elts:
        if not isinstance(e, ast.Constant) or not isinstance(e.value, (str, int, float, bool)):
            raise _SchemaError("Literal[...] takes str, int, float or bool constants", e.lineno)
        values.append(e.value)
    return values


def _annotated(node: ast.expr | None) -> tuple[ast.expr, str] | None:
    """``(X, "mark")`` for ``Annotated[X, "mark"]`` (a single string mark), else None."""
    if not isinstance(node, ast.Subscript) or \
            _dotted(node.value) not in ("Annotated", "typing.Annotated"):
        return None
    elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else []
    if len(elts) != 2 or not isinstance(elts[1], ast.Constant) or \
            not isinstance(elts[1].value, str):
        raise _SchemaError('Annotated takes a type and one mark: Annotated[str, "task"] for '
                           'a parameter, Annotated[str, "answer"] for the return value',
                           node.lineno)
    return elts[0], elts[1].value


def _optional_inner(node: ast.expr) -> ast.expr | None:
    """``X`` for ``X | None`` / ``Optional[X]``, else None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [node.left, node.right]
        rest = [s for s in sides if not (isinstance(s, ast.Constant) and s.value is None)]
        if len(rest) == 1:
            return rest[0]
    if isinstance(node, ast.Subscript) and _dotted(node.value) in ("Optional", "typing.Optional"):
        return node.slice
    return None


def annotation_schema(node: ast.expr | None) -> tuple[dict[str, Any], bool]:
    """(JSON schema, is an image) for a parameter or return annotation."""
    if node is None:
        raise _SchemaError("needs a type annotation", None)
    line = getattr(node, "lineno", None)
    name = _dotted(node)
    if name in IMAGE_ANNOTATIONS:
        return {"type": "string", "description": IMAGE_SCHEMA_NOTE}, True
    if isinstance(node, ast.Name) and node.id in _SCALARS:
        return {"type": _SCALARS[node.id]}, False
    inner = _optional_inner(node)
    if inner is not None:
        schema, image = annotation_schema(inner)
        return schema, image
    if isinstance(node, ast.Subscript):
        base = _dotted(node.value)
        if base in ("Literal", "typing.Literal"):
            values = _literal_values(node.slice)
            return {"enum": values}, False
        if base in ("list", "List", "typing.List", "Sequence", "tuple"):
            item = node.slice
            if isinstance(item, ast.Tuple):  # tuple[int, ...] or tuple[int, int]
                item = item.elts[0]
            schema, image = annotation_schema(item)
            if image:
                raise _SchemaError("a list of images is not supported; take one image", line)
            return {"type": "array", "items": schema}, False
        if base in ("dict", "Dict", "typing.Dict", "Mapping"):
            if not isinstance(node.slice, ast.Tuple) or _dotted(node.slice.elts[0]) != "str":
                raise _SchemaError("dict keys must be str (JSON objects)", line)
            schema, image = annotation_schema(node.slice.elts[1])
            if image:
                raise _SchemaError("images inside a dict are not supported", line)
            return {"type": "object", "additionalProperties": schema}, False
    if name in ("list", "dict"):
        return {"type": "array" if name == "list" else "object"}, False
    raise _SchemaError(f"type {name!r} is not a JSON type or PIL.Image.Image", line)


_SECTION = re.compile(r"(Args|Arguments|Parameters|Returns|Raises|Examples?|Notes?):")
_ARG_SECTIONS = ("Args", "Arguments", "Parameters")
_PARAM_LINE = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, parameter -> description) from a Google-style docstring: the text
    before the first section, and the ``Args:`` entries (continuation lines indented more)."""
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    param_indent: int | None = None
    for raw in doc.expandtabs().splitlines():
        stripped = raw.strip()
        indent = len(raw) - len(raw.lstrip())
        if _SECTION.fullmatch(stripped):
            section, current, param_indent = stripped[:-1], None, None
        elif section is None:
            summary.append(stripped)
        elif section in _ARG_SECTIONS and stripped:
            match = _PARAM_LINE.match(stripped)
            if match and (param_indent is None or indent <= param_indent):
                param_indent, current = indent, match.group(1)
                params[current] = match.group(2)
            elif current is not None:
                params[current] = f"{params[current]} {stripped}".strip()
    return re.sub(r"\s+", " ", " ".join(summary)).strip(), params


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _default(node: ast.expr) -> Any:
    try:
        value = ast.literal_eval(node)
    except ValueError as exc:
        raise _SchemaError("defaults must be JSON literals", node.lineno) from exc
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, (str, int, float, bool, list, dict, type(None))):
        raise _SchemaError("defaults must be JSON literals", node.lineno)
    return value


@dataclass(frozen=True)
class _Signature:
    description: str
    schema: dict[str, Any]  # what the model sees: injected parameters left out
    images: tuple[str, ...]
    returns_image: bool
    inject: dict[str, str]
    returns_answer: bool


def _param(p: ast.arg) -> tuple[ast.expr | None, str | None]:
    """A parameter's type annotation and its injection source (None: the model fills it)."""
    marked = _annotated(p.annotation)
    if marked is None:
        return p.annotation, None
    inner, mark = marked
    if mark not in INJECT_SOURCES:
        raise _SchemaError(f'parameter {p.arg!r}: unknown mark {mark!r}; a parameter may be '
                           'Annotated[str, "task"] (the runtime passes the task text)', p.lineno)
    if _dotted(inner) != "str":
        raise _SchemaError(f'parameter {p.arg!r}: the task text is a str: '
                           'Annotated[str, "task"]', p.lineno)
    return inner, mark


def _schema(fn: ast.FunctionDef) -> _Signature:
    """The signature as the model sees it, and what the runtime adds."""
    doc = ast.get_docstring(fn)
    if not doc:
        raise _SchemaError("needs a docstring saying what it computes", fn.lineno)
    description, param_docs = parse_docstring(doc)
    if not description:
        raise _SchemaError("the docstring needs a summary line", fn.lineno)
    a = fn.args
    if a.vararg or a.kwarg or a.posonlyargs:
        raise _SchemaError("takes named parameters only (no *args, **kwargs or /)", fn.lineno)
    params = a.args + a.kwonlyargs
    defaults = dict(zip([p.arg for p in a.args][len(a.args) - len(a.defaults):], a.defaults,
                        strict=True))
    defaults.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
                     if d is not None})
    props: dict[str, Any] = {}
    images = []
    inject: dict[str, str] = {}
    for p in params:
        annotation, source = _param(p)
        if source is not None:
            inject[p.arg] = source
            continue
        try:
            schema, image = annotation_schema(annotation)
        except _SchemaError as exc:
            raise _SchemaError(f"parameter {p.arg!r}: {exc.detail}", p.lineno) from exc
        if param_docs.get(p.arg):
            schema["description"] = (f"{param_docs[p.arg]} ({IMAGE_SCHEMA_NOTE})" if image
                                     else param_docs[p.arg])
        if p.arg in defaults:
            schema["default"] = _default(defaults[p.arg])
        props[p.arg] = schema
        images += [p.arg] if image else []
    returns, returns_answer = fn.returns, False
    marked = _annotated(fn.returns)
    if marked is not None:
        if marked[1] != ANSWER_MARK:
            raise _SchemaError(f'return value: unknown mark {marked[1]!r}; use '
                               'Annotated[str, "answer"] when the output is the answer',
                               fn.lineno)
        returns, returns_answer = marked[0], True
    try:
        _, returns_image = annotation_schema(returns)
    except _SchemaError as exc:
        raise _SchemaError(f"return value: {exc.detail}", fn.lineno) from exc
    required = [p.arg for p in params if p.arg not in defaults and p.arg not in inject]
    schema = {"type": "object", "properties": props, "required": required}
    return _Signature(description[:MAX_DESCRIPTION], schema, tuple(images), returns_image,
                      inject, returns_answer)


def define_tool(source: str, *, name: str, skill: str, path: str | None = None
                ) -> tuple[ToolDefinition | None, list[ValidationError]]:
    """Check a tool script and read its definition. Returns (definition, []) or (None,
    problems), each problem with its rule and line."""
    path = path or f"skills/{skill}/{SCRIPTS_DIR}/{name}.py"
    if not TOOL_NAME.match(name):
        return None, [ValidationError(path, "tool-name", f"{name!r} is not a tool name",
                                      hint="use a-z, 0-9 and _, starting with a letter")]
    tree, problems = parse_tool_source(source, path=path)
    if tree is None:
        return None, problems
    fn = _function(tree, name)
    if fn is None:
        return None, problems + [ValidationError(
            path, "tool-function", f"no top-level function named {name!r}",
            hint=f"define `def {name}(...)` in {name}.py")]
    try:
        sig = _schema(fn)
    except _SchemaError as exc:
        problems.append(ValidationError(path, "signature", exc.detail, line=exc.line,
                                        hint="type every parameter and the return value with "
                                             "JSON types or PIL.Image.Image; document them"))
    if problems:
        return None, problems
    spec = ToolSpec(name=name, description=sig.description, parameters=sig.schema, source=path,
                    skill=skill, inject=sig.inject, returns_answer=sig.returns_answer)
    return ToolDefinition(name, skill, path, source, spec, sig.images, sig.returns_image), []


def _script_names(skill: Skill) -> list[tuple[str, str]]:
    """(tool name, relative path) of the Python scripts of a skill."""
    out = []
    for rel in sorted(skill.files):
        parts = rel.split("/")
        if len(parts) == 2 and parts[0] == SCRIPTS_DIR and parts[1].endswith(".py"):
            out.append((parts[1][:-3], rel))
    return out


def is_tool_script(source: str, name: str) -> bool:
    """Whether a script defines a top-level function named like its file (then it is meant as
    a tool and must pass the checks); other scripts are a skill's plain helpers."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return True  # meant or not, it must be reported
    return _function(tree, name) is not None


def load_learned_tools(skills: Iterable[Skill], *, reserved: Iterable[str] = ()
                       ) -> LoadedTools:
    """The learned tools of ``skills`` (each a valid, loaded skill: the pairing holds by
    construction). A bad tool is reported and the rest load; a name already taken (by a
    built-in in ``reserved`` or by another skill's tool) is a problem too."""
    loaded = LoadedTools()
    taken = set(reserved)
    for skill in skills:
        for name, rel in _script_names(skill):
            source = skill.files[rel]
            path = f"skills/{skill.name}/{rel}"
            if not is_tool_script(source, name):
                loaded.skipped.append(f"{path}: no function named {name!r}; not a tool")
                continue
            definition, problems = define_tool(source, name=name, skill=skill.name, path=path)
            if definition is not None and name in taken:
                problems = [ValidationError(path, "tool-name", f"a tool named {name!r} exists "
                                            "already", hint="rename the script and function")]
                definition = None
            if definition is None:
                loaded.problems.extend(problems)
                continue
            taken.add(name)
            loaded.tools.append(definition)
    return loaded


def answer_text(output: str) -> str:
    """The answer an answer tool (``-> Annotated[str, "answer"]``) gives a run: its result is
    JSON, and a string result is the answer's text itself."""
    try:
        value = json.loads(output)
    except json.JSONDecodeError:
        return output.strip()
    return value.strip() if isinstance(value, str) else output.strip()


def check_arguments(definition: ToolDefinition, args: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments, coerced where the model wrote a number as text; ``ValueError`` names
    what is missing, unknown or of the wrong type."""
    return check_spec_arguments(definition.spec, args)


def check_spec_arguments(spec: ToolSpec, args: Mapping[str, Any]) -> dict[str, Any]:
    """``check_arguments`` for any tool whose spec was read from a typed signature (a learned
    tool's, or a Python function's: ``whetstone.tools.functions``)."""
    props: Mapping[str, Any] = spec.parameters.get("properties", {})
    injected = {k: v for k, v in args.items() if k in spec.inject}
    args = {k: v for k, v in args.items() if k not in injected}
    missing_injected = sorted(set(spec.inject) - set(injected))
    if missing_injected:
        raise ValueError(f"{spec.name} reads the task text ({', '.join(missing_injected)})"
                         "; it runs inside an agent run, which passes it")
    unknown = sorted(set(args) - set(props))
    if unknown:
        raise ValueError(f"unknown argument(s) {', '.join(unknown)}; {spec.name} takes "
                         f"{', '.join(props) or 'no arguments'}")
    missing = [p for p in spec.parameters.get("required", []) if p not in args]
    if missing:
        raise ValueError(f"missing argument(s) {', '.join(missing)}")
    return {**{k: _coerce(k, v, props[k]) for k, v in args.items()},
            **{k: str(v) for k, v in injected.items()}}


def _coerce(name: str, value: Any, schema: Mapping[str, Any]) -> Any:
    kind = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        raise ValueError(f"{name} must be one of {schema['enum']}, not {value!r}")
    if value is None or kind is None:
        return value
    if kind == "integer" and isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    if kind == "number" and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    types: dict[str, type | tuple[type, ...]] = {
        "integer": int, "number": (int, float), "string": str, "boolean": bool, "array": list,
        "object": dict}
    python = types[kind]
    if not isinstance(value, python) or (kind in ("integer", "number")
                                         and isinstance(value, bool)):
        raise ValueError(f"{name} must be {kind}, not {type(value).__name__}")
    return value
