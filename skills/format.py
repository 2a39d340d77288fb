"""``Skill`` <-> ``SKILL.md``, per the Agent Skills specification (agentskills.io).

A ``SKILL.md`` is YAML front matter between ``---`` lines, then a markdown body. Rules checked
here (each problem is a ``ValidationError`` naming the file, the line and the rule):

- front matter: ``name`` (1-64 chars of a-z, 0-9 and single hyphens, not at either end,
  equal to the folder name), ``description`` (1-1024 chars), optional ``license``,
  ``compatibility`` (1-500 chars), ``metadata`` (string -> string), ``allowed-tools``
  (space-separated); no other fields;
- body: at most 500 lines;
- the folder: ``SKILL.md`` plus optional ``scripts/``, ``references/`` and ``assets/``, each
  one level deep; a reference file holds at most 300 lines (``check_skill_files``);
- worked examples (``references/examples.md``, and a library's ``memory/<name>.md``): one
  ``## Example <trace id>`` section each, a ``Task:`` paragraph, then the model's own output in
  a fence of at least four backticks (``parse_examples`` / ``render_examples``).

Limits that keep any input cheap to check, applied before anything is parsed or rendered:
``SKILL.md`` at most ``MAX_SKILL_MD_BYTES``, its front matter at most
``MAX_FRONT_MATTER_BYTES`` and at most ``MAX_YAML_NODES`` YAML nodes once aliases are
expanded, nested at most ``MAX_YAML_DEPTH`` deep (a YAML alias bomb is refused, never built);
a skill folder at most ``MAX_SKILL_FILES`` files of at most ``MAX_FILE_BYTES`` each and
``MAX_SKILL_BYTES`` in all, each path one the library can keep (``whetstone.library_store.paths``).

This module is the one home of these rules: the loader, imports, and the evolvers that keep an
evolved skill inside them all check through it.

Hand-written files round-trip byte for byte: rendering a skill with its original text keeps
that text, and when only some fields change, only their lines are rewritten.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import yaml

from whetstone.engine.errors import ValidationError
from whetstone.engine.printing import control_chars
from whetstone.engine.types import Skill
from whetstone.library_store.paths import MAX_FILE_BYTES, path_problems, shown

NAME_RE = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")  # use fullmatch: '$' allows a final '\n'
FIELDS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")
MAX_NAME = 64
MAX_DESCRIPTION = 1024
MAX_COMPATIBILITY = 500
MAX_BODY_LINES = 500
SKILL_FILE = "SKILL.md"
SKILL_DIRS = ("scripts", "references", "assets")  # bundled files live one level deep in these
MAX_REFERENCE_LINES = 300
MAX_SKILL_MD_BYTES = 256 * 1024
MAX_FRONT_MATTER_BYTES = 64 * 1024
MAX_YAML_NODES = 2_000  # counted with every alias expanded where it is used
MAX_YAML_DEPTH = 16
MAX_SKILL_FILES = 256
MAX_SKILL_BYTES = 32 * 1024 * 1024
EXAMPLES_FILE = "references/examples.md"  # a skill's worked examples
MAX_EXAMPLE_LINES = 60  # one example's solution; longer runs teach little and cost much

try:  # libyaml is ~10x faster; the pure-Python loader gives the same results
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader


@dataclass(frozen=True)
class ParsedSkill:
    """A parsed ``SKILL.md``: the skill (None when it could not be built), the text as read,
    and every problem found. ``front_matter_lines`` is (first, last) file line of the YAML."""

    skill: Skill | None
    text: str
    path: str
    problems: tuple[ValidationError, ...] = ()
    front_matter_lines: tuple[int, int] = (0, 0)
    body_start: int = 0  # character offset of the body in ``text``
    name: str | None = None  # the front matter's name, even when the skill is not built

    @property
    def ok(self) -> bool:
        return self.skill is not None and not self.problems


def count_lines(text: str) -> int:
    """Lines in ``text`` (a last line without a newline still counts)."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def _split(text: str, path: str) -> tuple[str, int, int, int] | ValidationError:
    """(front matter YAML, its first line, its last line, body offset) or the problem."""
    lines = text.splitlines(keepends=True)
    first = lines[0].lstrip("\ufeff").rstrip("\r\n").rstrip() if lines else ""
    if first != "---":
        return ValidationError(path, "front-matter", "SKILL.md must start with a '---' line "
                               "followed by YAML front matter", line=1,
                               hint="add '---', name: and description:, then '---' at the top")
    offset = len(lines[0])
    for i, line in enumerate(lines[1:], start=2):
        if line.rstrip("\r\n").rstrip() == "---":
            yaml_text = "".join(lines[1:i - 1])
            body_start = offset + len(line)
            # One blank line after the closing '---' is layout, not body.
            rest = text[body_start:]
            if rest.startswith("\r\n"):
                body_start += 2
            elif rest.startswith("\n"):
                body_start += 1
            return yaml_text, 2, i - 1, body_start
        offset += len(line)
    return ValidationError(path, "front-matter", "the front matter is not closed by a '---' "
                           "line", line=1, hint="add a '---' line after the YAML fields")


def _key_lines(node: yaml.Node | None, first_line: int
               ) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """File line of each top-level key, and (key, line) of keys repeated later."""
    lines: dict[str, int] = {}
    dupes: list[tuple[str, int]] = []
    if isinstance(node, yaml.MappingNode):
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode):
                continue  # a collection as a key: the constructor refuses it
            k = key.value
            if k in lines:
                dupes.append((k, key.start_mark.line + first_line))
            lines.setdefault(k, key.start_mark.line + first_line)
    return lines, dupes


def _yaml_size_problem(root: yaml.Node) -> str | None:
    """Why a composed front matter is too big to build, or None. Aliases are followed each
    time they are used, so nine lists of nine aliases count 9**depth nodes (and a recursive
    alias never ends): the walk stops at the limit instead of building them."""
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_YAML_NODES:
            return (f"the front matter expands to more than {MAX_YAML_NODES} YAML values "
                    "(each use of an alias counts)")
        if depth > MAX_YAML_DEPTH:
            return f"the front matter is nested more than {MAX_YAML_DEPTH} levels deep"
        if isinstance(node, yaml.MappingNode):
            stack.extend((n, depth + 1) for pair in node.value for n in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((n, depth + 1) for n in node.value)
    return None


def _load_front_matter(yaml_text: str, path: str, first: int
                       ) -> tuple[Any, yaml.Node | None] | ValidationError:
    """(data, node) of the front matter, built only once it is known to be small."""
    size = len(yaml_text.encode("utf-8", "surrogatepass"))
    if size > MAX_FRONT_MATTER_BYTES:
        return ValidationError(path, "front-matter-size", f"the front matter is {size} bytes; "
                               f"at most {MAX_FRONT_MATTER_BYTES}", line=first,
                               hint="keep name, description and short metadata up there")
    loader = _Loader(yaml_text)
    try:
        node = loader.get_single_node()
        problem = _yaml_size_problem(node) if node is not None else None
        if problem is not None:
            return ValidationError(path, "yaml-limits", problem, line=first,
                                   hint="write the values out instead of using YAML aliases")
        return (loader.construct_document(node) if node is not None else None), node
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + first if mark is not None else first
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return ValidationError(path, "yaml", f"the front matter is not valid YAML: {problem}",
                               line=line, hint="quote values that contain ': ' or start with "
                               "a special character")
    except (RecursionError, TypeError, ValueError) as exc:  # nesting, unhashable keys, dates
        return ValidationError(path, "yaml", f"the front matter cannot be read: "
                               f"{type(exc).__name__}", line=first)
    finally:
        loader.dispose()


def check_name(name: Any, *, path: str, line: int | None, folder: str | None
               ) -> list[ValidationError]:
    """The ``name`` rules; ``folder`` is the skill's folder name when known."""
    if not isinstance(name, str) or not name:
        return [ValidationError(path, "name-missing" if name in (None, "") else "name-type",
                                "'name' must be a non-empty string", line=line)]
    out = []
    if len(name) > MAX_NAME:
        out.append(ValidationError(path, "name-length", f"'name' is {len(name)} characters; "
                                   f"the limit is {MAX_NAME}", line=line))
    if not NAME_RE.fullmatch(name):
        out.append(ValidationError(
            path, "name-format", f"'name' {shown(name)!r} may hold only a-z, 0-9 and single "
            "hyphens, and may not start or end with a hyphen", line=line,
            hint="e.g. pdf-extract or csv-cleanup"))
    if folder is not None and folder != name:
        out.append(ValidationError(path, "name-folder", f"'name' {shown(name)!r} does not "
                                   f"match its folder {shown(folder)!r}", line=line,
                                   hint="rename the folder or the skill so they are equal"))
    return out


def _check_fields(data: Mapping[str, Any], keys: Mapping[str, int], *, path: str,
                  folder: str | None, fm_line: int) -> list[ValidationError]:
    out: list[ValidationError] = []
    for key in data:
        if key not in FIELDS:
            out.append(ValidationError(
                path, "unknown-field", f"field {key!r} is not part of the Agent Skills front "
                f"matter", line=keys.get(str(key)),
                hint="move it under 'metadata:' (string values) or remove it"))
    if "name" not in data:
        out.append(ValidationError(path, "name-missing", "the front matter has no 'name'",
                                   line=fm_line, hint="add name: <folder name>"))
    else:
        out += check_name(data["name"], path=path, line=keys.get("name"), folder=folder)
    desc = data.get("description")
    if "description" not in data:
        out.append(ValidationError(path, "description-missing", "the front matter has no "
                                   "'description'", line=fm_line,
                                   hint="say what the skill does and when to use it"))
    elif not isinstance(desc, str) or not desc.strip():
        out.append(ValidationError(path, "description-type", "'description' must be a "
                                   "non-empty string", line=keys.get("description")))
    elif len(desc) > MAX_DESCRIPTION:
        out.append(ValidationError(path, "description-length", f"'description' is {len(desc)} "
                                   f"characters; the limit is {MAX_DESCRIPTION}",
                                   line=keys.get("description"),
                                   hint="keep what and when; move detail into the body"))
    elif bad := control_chars(desc):
        # A listing prints the description: an escape could retitle or clear the terminal,
        # a bidi control reorder what the user reads.
        out.append(ValidationError(
            path, "description-characters", "'description' holds the control character(s) "
            + ", ".join(ascii(c) for c in bad), line=keys.get("description"),
            hint="write plain text: no escapes (\\033), bell, carriage return or bidi "
                 "controls"))
    for key in ("license", "compatibility"):
        if key in data and not isinstance(data[key], str):
            out.append(ValidationError(path, f"{key}-type", f"'{key}' must be a string",
                                       line=keys.get(key)))
    comp = data.get("compatibility")
    if isinstance(comp, str) and not comp.strip():
        out.append(ValidationError(path, "compatibility-empty", "'compatibility' is empty; "
                                   f"when given it must be 1-{MAX_COMPATIBILITY} characters",
                                   line=keys.get("compatibility"),
                                   hint="say what the skill needs (e.g. python3, network), or "
                                        "remove the field"))
    elif isinstance(comp, str) and len(comp) > MAX_COMPATIBILITY:
        out.append(ValidationError(path, "compatibility-length", f"'compatibility' is "
                                   f"{len(comp)} characters; the limit is {MAX_COMPATIBILITY}",
                                   line=keys.get("compatibility")))
    meta = data.get("metadata")
    if "metadata" in data and not (isinstance(meta, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items())):
        out.append(ValidationError(path, "metadata-type", "'metadata' must map strings to "
                                   "strings", line=keys.get("metadata"),
                                   hint="quote values such as version: \"1.0\""))
    tools = data.get("allowed-tools")
    if "allowed-tools" in data and not (isinstance(tools, str) or (
            isinstance(tools, list) and all(isinstance(t, str) for t in tools))):
        out.append(ValidationError(path, "allowed-tools-type", "'allowed-tools' must be a "
                                   "space-separated string of tool names",
                                   line=keys.get("allowed-tools")))
    return out


def parse_skill_md(text: str, *, path: str = "SKILL.md", folder: str | None = None
                   ) -> ParsedSkill:
    """Parse a ``SKILL.md``, collecting every problem instead of stopping at the first.

    The size limits are checked first; a value of the wrong type is reported and left out of
    the ``Skill``, never rendered."""
    if len(text) > MAX_SKILL_MD_BYTES:  # characters: a lower bound of the bytes
        err = ValidationError(path, "skill-md-size", f"SKILL.md is {len(text)} characters; at "
                              f"most {MAX_SKILL_MD_BYTES} bytes",
                              hint="move detail into references/*.md")
        return ParsedSkill(None, text, path, (err,))
    split = _split(text, path)
    if isinstance(split, ValidationError):
        return ParsedSkill(None, text, path, (split,))
    yaml_text, first, last, body_start = split
    loaded = _load_front_matter(yaml_text, path, first)
    if isinstance(loaded, ValidationError):
        return ParsedSkill(None, text, path, (loaded,), (first, last), body_start)
    data, node = loaded
    keys, dupes = _key_lines(node, first)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        err = ValidationError(path, "front-matter", "the front matter must be a mapping of "
                              "fields", line=first)
        return ParsedSkill(None, text, path, (err,), (first, last), body_start)
    problems = [ValidationError(path, "duplicate-field", f"field {k!r} appears more than once",
                                line=line) for k, line in dupes]
    problems += _check_fields(data, keys, path=path, folder=folder, fm_line=first - 1)
    body = text[body_start:]
    n = count_lines(body)
    if n > MAX_BODY_LINES:
        body_line = count_lines(text[:body_start]) + 1
        problems.append(ValidationError(
            path, "body-length", f"the body has {n} lines; the limit is {MAX_BODY_LINES}",
            line=body_line + MAX_BODY_LINES, hint="move detail into references/*.md"))
    skill = _skill_of(data, body) if isinstance(data.get("name"), str) and isinstance(
        data.get("description"), str) else None
    return ParsedSkill(skill, text, path, tuple(problems), (first, last), body_start,
                       _str_or_none(data.get("name")))


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _skill_of(data: Mapping[str, Any], body: str) -> Skill:
    """The ``Skill`` of checked front matter: a field of the wrong type (already reported) is
    left out, never converted with ``str()``."""
    meta = data.get("metadata")
    tools = data.get("allowed-tools")
    if isinstance(tools, list):
        tools = " ".join(tools) if all(isinstance(t, str) for t in tools) else None
    return Skill(
        name=data["name"], description=data["description"], body=body,
        license=_str_or_none(data.get("license")),
        compatibility=_str_or_none(data.get("compatibility")),
        metadata=dict(meta) if isinstance(meta, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()) else {},
        allowed_tools=_str_or_none(tools))


def _fields(skill: Skill) -> dict[str, Any]:
    out: dict[str, Any] = {"name": skill.name, "description": skill.description}
    if skill.license is not None:
        out["license"] = skill.license
    if skill.compatibility is not None:
        out["compatibility"] = skill.compatibility
    if skill.metadata:
        out["metadata"] = {str(k): str(v) for k, v in skill.metadata.items()}
    if skill.allowed_tools is not None:
        out["allowed-tools"] = skill.allowed_tools
    return out


def _dump(fields: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(fields), sort_keys=False, allow_unicode=True,
                          default_flow_style=False, width=10_000)


def render_skill_md(skill: Skill, *, original: str | None = None) -> str:
    """The ``SKILL.md`` text of ``skill``.

    With ``original`` (the file as read), unchanged parts keep their exact bytes: the same
    skill renders to ``original`` itself, a new body keeps the front matter, and changed
    fields rewrite only their own lines (comments and quoting elsewhere survive).
    """
    if original is not None:
        parsed = parse_skill_md(original)
        old = parsed.skill
        if old is not None and not [p for p in parsed.problems if p.rule == "duplicate-field"]:
            same_fields = _fields(replace(old, body="")) == _fields(replace(skill, body=""))
            if same_fields and old.body == skill.body:
                return original
            head = original[:parsed.body_start]
            if same_fields:
                sep = "\n" if not head.endswith(("\n\n", "\r\n\r\n")) and \
                    skill.body.startswith(("\n", "\r\n")) else ""
                return head + sep + skill.body
            return _patch_fields(original, parsed, old, skill) + skill.body
    return "---\n" + _dump(_fields(skill)) + "---\n\n" + skill.body


def _patch_fields(original: str, parsed: ParsedSkill, old: Skill, new: Skill) -> str:
    """The original head with only the changed top-level fields rewritten."""
    lines = original[:parsed.body_start].splitlines(keepends=True)
    first, last = parsed.front_matter_lines
    yaml_text = "".join(lines[first - 1:last])
    node = yaml.compose(yaml_text, Loader=_Loader)  # parse_skill_md checked its size
    starts = [(str(k.value), k.start_mark.line) for k, _ in node.value] if isinstance(
        node, yaml.MappingNode) else []
    spans: dict[str, tuple[int, int]] = {}
    yaml_lines = yaml_text.splitlines(keepends=True)
    for i, (key, start) in enumerate(starts):
        end = starts[i + 1][1] if i + 1 < len(starts) else len(yaml_lines)
        spans[key] = (start, end)
    old_f, new_f = _fields(old), _fields(new)
    out: list[str] = yaml_lines[:starts[0][1]] if starts else []  # comments before the fields
    for key, (start, end) in spans.items():
        if key in old_f and key not in new_f:
            continue  # removed field
        if key in new_f and old_f.get(key) != new_f[key]:
            out.append(_dump({key: new_f[key]}))
        else:
            out.extend(yaml_lines[start:end])
    out.extend(_dump({k: v}) for k, v in new_f.items() if k not in spans)
    newline = "\r\n" if lines[0].endswith("\r\n") else "\n"
    text = "".join(lines[:first - 1]) + "".join(out)
    if not text.endswith(("\n", "\r")):
        text += newline
    tail = "".join(lines[last:])  # the closing '---' and the blank line after it
    return text + tail


def _size_problems(files: Mapping[str, bytes], base: str) -> list[ValidationError]:
    """The folder's count and size limits (checked before any file is parsed)."""
    out: list[ValidationError] = []
    if len(files) > MAX_SKILL_FILES:
        out.append(ValidationError(f"{base}/", "file-count", f"the skill holds {len(files)} "
                                   f"files; at most {MAX_SKILL_FILES}",
                                   hint="keep large collections outside the skill"))
    total = sum(len(d) for d in files.values())
    if total > MAX_SKILL_BYTES:
        out.append(ValidationError(f"{base}/", "skill-size", f"the skill's files hold {total} "
                                   f"bytes; at most {MAX_SKILL_BYTES}"))
    for rel, data in sorted(files.items()):
        limit = MAX_SKILL_MD_BYTES if rel == SKILL_FILE else MAX_FILE_BYTES
        if len(data) > limit:
            out.append(ValidationError(f"{base}/{shown(rel, 200)}", "file-size",
                                       f"{len(data)} bytes; at most {limit}",
                                       hint="move detail into references/*.md"
                                       if rel == SKILL_FILE else None))
    return out


def _file_problems(name: str, rel: str, data: bytes, base: str) -> list[ValidationError]:
    """Where one bundled file sits (layout, nesting, its path) and a reference's length."""
    parts = rel.split("/")
    where = f"{base}/{shown(rel, 200)}"
    out = [ValidationError(where, rule, detail, hint="rename it with a shorter, plain name")
           for rule, detail in path_problems(f"skills/{name}/{rel}")]
    if parts[0] not in SKILL_DIRS:
        if len(parts) > 1:
            out.append(ValidationError(
                where, "layout", f"unknown folder {shown(parts[0])}/: a skill holds SKILL.md "
                "and optionally scripts/, references/ and assets/",
                hint="move the file into one of those folders"))
        return out
    if len(parts) != 2:
        out.append(ValidationError(
            where, "nesting", f"files in {parts[0]}/ must sit directly in it (one level deep)",
            hint=f"move it to {parts[0]}/{shown(parts[-1])}"))
    elif parts[0] == "references":
        try:
            n = count_lines(data.decode("utf-8"))
        except UnicodeDecodeError:
            return [*out, ValidationError(where, "encoding", "a reference file must be UTF-8 "
                                          "text")]
        if rel == EXAMPLES_FILE:
            out += parse_examples(data.decode("utf-8"), path=where)[1]
        if n > MAX_REFERENCE_LINES:
            out.append(ValidationError(
                where, "reference-length", f"{n} lines; a reference file holds at most "
                f"{MAX_REFERENCE_LINES}", line=MAX_REFERENCE_LINES + 1,
                hint="split it into several reference files"))
    return out


def check_skill_files(name: str, files: Mapping[str, bytes], *, base: str
                      ) -> tuple[ParsedSkill | None, list[ValidationError]]:
    """Validate one skill folder given as relative path -> bytes. ``base`` prefixes the paths
    in error messages (``skills/<name>`` in a library, a folder on disk for an import).
    Counts and sizes are checked first: an oversized SKILL.md is reported, never parsed."""
    skill_md = f"{base}/{SKILL_FILE}"
    problems = _size_problems(files, base)
    parsed: ParsedSkill | None = None
    if SKILL_FILE not in files:
        problems.append(ValidationError(skill_md, "skill-md-missing", "the skill folder has no "
                                        "SKILL.md", hint="`whetstone skill new NAME` scaffolds one"))
    elif len(files[SKILL_FILE]) <= MAX_SKILL_MD_BYTES:
        try:
            text = files[SKILL_FILE].decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(ValidationError(skill_md, "encoding", f"SKILL.md is not UTF-8 ({exc})"))
        else:
            parsed = parse_skill_md(text, path=skill_md, folder=name)
            problems.extend(parsed.problems)
    if len(files) <= MAX_SKILL_FILES:  # past it, the count is the one problem worth reading
        for rel, data in sorted(files.items()):
            if rel != SKILL_FILE:
                problems.extend(_file_problems(name, rel, data, base))
    return parsed, problems


# -- worked examples ---------------------------------------------------------------------------

_EXAMPLE_HEAD = re.compile(r"^## Example (\S+)\s*$")
_FENCE = re.compile(r"^(`{4,})\s*$")


@dataclass(frozen=True)
class Example:
    """One worked example: the task and the model's own output for it (verified by the
    scorer when it was taken), with the id of the trace it came from."""

    trace_id: str
    task: str
    solution: str


def render_examples(examples: list[Example] | tuple[Example, ...], *, title: str = "Examples",
                    intro: str = "") -> str:
    """The examples file for ``examples``. Each solution goes in a fence one backtick longer
    than any run of backticks inside it (at least four), so fenced code survives."""
    out = [f"# {title}", ""] + ([intro.strip(), ""] if intro.strip() else [])
    for ex in examples:
        longest = max((len(m) for m in re.findall(r"`+", ex.solution)), default=0)
        fence = "`" * max(4, longest + 1)
        out += [f"## Example {ex.trace_id}", "", "Task: " + " ".join(ex.task.split()), "",
                fence, ex.solution.strip("\n"), fence, ""]
    return "\n".join(out).rstrip("\n") + "\n"


def parse_examples(text: str, *, path: str = EXAMPLES_FILE
                   ) -> tuple[list[Example], list[ValidationError]]:
    """The examples in ``text`` (``render_examples``' format) and the problems of any section
    that is not one: no ``Task:`` line, no closed fence, a solution over
    ``MAX_EXAMPLE_LINES`` lines, a trace id given twice. Text outside the sections is prose."""
    lines = text.split("\n")
    examples: list[Example] = []
    problems: list[ValidationError] = []
    seen: set[str] = set()
    i = 0
    while i < len(lines):
        head = _EXAMPLE_HEAD.match(lines[i])
        if not head:
            i += 1
            continue
        start, trace_id = i + 1, head.group(1)
        j = start
        while j < len(lines) and not _FENCE.match(lines[j]) and not _EXAMPLE_HEAD.match(lines[j]):
            j += 1
        task = " ".join(" ".join(lines[start:j]).split())
        fence = _FENCE.match(lines[j]) if j < len(lines) else None
        end = next((k for k in range(j + 1, len(lines)) if fence and lines[k].strip() ==
                    fence.group(1)), None)
        problem = None
        if not task.startswith("Task:") or not task[5:].strip():
            problem = "an example needs a 'Task: ...' line before its solution"
        elif fence is None or end is None:
            problem = "an example's solution goes in a closed fence of four or more backticks"
        elif end - j - 1 > MAX_EXAMPLE_LINES:
            problem = f"the solution has {end - j - 1} lines; at most {MAX_EXAMPLE_LINES}"
        elif trace_id in seen:
            problem = f"trace {trace_id} gives two examples"
        if problem:
            problems.append(ValidationError(path, "example", problem, line=i + 1,
                                            hint="see skills/format.py for the examples format"))
            i = j if fence is None or end is None else end + 1
            continue
        assert end is not None
        seen.add(trace_id)
        examples.append(Example(trace_id, task[5:].strip(), "\n".join(lines[j + 1:end])))
        i = end + 1
    return examples, problems
