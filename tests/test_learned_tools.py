"""Learned tools: the AST gate (each refusal with its rule and line), the schema read from the
signature and docstring without importing the code, loading from skills, and running only in
the sandbox with images passed as checked files."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from whetstone.engine.errors import ToolError
from whetstone.engine.types import Skill
from whetstone.tools.base import Toolbox
from whetstone.tools.images import ImageFiles
from whetstone.tools.learned import define_tool, load_learned_tools, parse_docstring
from whetstone.tools.learned_run import learned_tool, run_learned
from whetstone.tools.sandbox import Sandbox
from whetstone.tools.validate import check_tool_code

COUNT_RED = textwrap.dedent('''
    import numpy as np
    from PIL import Image

    def count_red(image: Image.Image, threshold: int = 200) -> dict[str, int]:
        """Count the strongly red pixels of an image.

        Args:
            image: the picture to look at.
            threshold: how red a pixel must be (0-255).
        """
        rgb = np.asarray(image.convert("RGB")).astype(int)
        red = (rgb[..., 0] >= threshold) & (rgb[..., 1] < 80) & (rgb[..., 2] < 80)
        return {"red": int(red.sum()), "total": int(red.size)}
''')


def rules(source: str) -> list[tuple[str, int | None]]:
    return [(p.rule, p.line) for p in check_tool_code(textwrap.dedent(source))]


@pytest.mark.parametrize("source,rule,line,words", [
    ("import os\nos.system('id')", "import", 1, "imports 'os'"),
    ("import subprocess", "import", 1, "imports 'subprocess'"),
    ("from socket import socket", "import", 1, "imports 'socket'"),
    ("import ctypes", "import", 1, "'ctypes'"),
    ("import shutil", "import", 1, "'shutil'"),
    ("from pathlib import Path", "import", 1, "'pathlib'"),
    ("import importlib", "import", 1, "'importlib'"),
    ("import builtins", "import", 1, "'builtins'"),
    ("import sys", "import", 1, "'sys'"),
    ("from PIL import ImageGrab", "import", 1, "PIL.ImageGrab"),
    ("import numpy.ctypeslib", "import", 1, "numpy.ctypeslib"),
    ("from . import x", "import", 1, "relative import"),
    ("from math import *", "import", 1, "import *"),
    ("x = 1\n__import__('os')", "builtin", 2, "__import__"),
    ("eval('1+1')", "builtin", 1, "eval"),
    ("exec('x=1')", "builtin", 1, "exec"),
    ("compile('1', 'f', 'eval')", "builtin", 1, "compile"),
    ("f = open", "builtin", 1, "open: file I/O"),
    ("getattr(1, 'real')", "builtin", 1, "getattr"),
    ("x = ().__class__", "dunder", 1, "__class__"),
    ("def f():\n    return f.__globals__", "dunder", 2, "__globals__"),
    ("print(__builtins__)", "dunder", 1, "__builtins__"),
    ("'{0.real}'.format(1)", "format", 1, ".format()"),
    ("from PIL import Image\nImage.open('/etc/passwd')", "file-io", 2, ".open()"),
    ("import numpy as np\nnp.save('x', [1])", "file-io", 2, ".save()"),
    ("def f(:\n  pass", "syntax", 1, ""),
])
def test_the_gate_refuses_with_rule_and_line(source: str, rule: str, line: int,
                                             words: str) -> None:
    problems = check_tool_code(source, path="skills/s/scripts/t.py")
    assert problems, source
    first = problems[0]
    assert (first.rule, first.line) == (rule, line)
    assert words in first.detail
    assert str(first).startswith(f"skills/s/scripts/t.py:{line}: [{rule}]")


def test_the_gate_admits_plain_computation() -> None:
    source = textwrap.dedent('''
        import math, statistics, itertools, re, json, colorsys
        from collections import Counter
        from fractions import Fraction
        from typing import Literal
        import numpy as np
        from PIL import Image, ImageDraw, ImageOps

        def f(x: float) -> float:
            """Square root, the long way."""
            print(f"x is {x:.2f}")
            return float(np.sqrt(x)) + math.fsum([0.0]) + float(Fraction(0))
    ''')
    assert check_tool_code(source) == []


def test_code_using_os_system_subprocess_or_dunder_import_never_runs(tmp_path: Path) -> None:
    for body, rule in (("import os\n    os.system('touch /tmp/x')", "import"),
                       ("import subprocess\n    subprocess.run(['id'])", "import"),
                       ("__import__('os').system('id')", "builtin")):
        source = f'def bad() -> int:\n    """Do harm."""\n    {body}\n    return 1\n'
        definition, problems = define_tool(source, name="bad", skill="s")
        assert definition is None and problems[0].rule == rule and problems[0].line == 3


def test_the_schema_comes_from_the_signature_and_docstring() -> None:
    definition, problems = define_tool(COUNT_RED, name="count_red", skill="colours")
    assert problems == [] and definition is not None
    spec = definition.spec
    assert spec.name == "count_red" and spec.skill == "colours"
    assert spec.source == "skills/colours/scripts/count_red.py"
    assert spec.description == "Count the strongly red pixels of an image."
    props = spec.parameters["properties"]
    assert props["threshold"] == {"type": "integer", "description": "how red a pixel must be "
                                  "(0-255).", "default": 200}
    assert props["image"]["type"] == "string" and "image file" in props["image"]["description"]
    assert spec.parameters["required"] == ["image"]
    assert definition.image_params == ("image",) and not definition.returns_image


def test_schema_types() -> None:
    source = textwrap.dedent('''
        from typing import Literal, Optional
        from PIL import Image

        def t(a: list[int], b: dict[str, float], c: Literal["x", "y"], d: str | None = None,
              e: Optional[bool] = None, *, f: tuple[int, ...] = (1, 2)) -> Image.Image:
            """Types."""
    ''')
    definition, problems = define_tool(source, name="t", skill="s")
    assert problems == [] and definition is not None
    props = definition.spec.parameters["properties"]
    assert props["a"] == {"type": "array", "items": {"type": "integer"}}
    assert props["b"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert props["c"] == {"enum": ["x", "y"]}
    assert props["d"] == {"type": "string", "default": None}
    assert props["e"]["type"] == "boolean" and props["f"]["type"] == "array"
    assert definition.spec.parameters["required"] == ["a", "b", "c"]
    assert definition.returns_image


@pytest.mark.parametrize("source,detail", [
    ("def t(x):\n    '''Doc.'''\n", "parameter 'x': needs a type annotation"),
    ("def t(x: int):\n    '''Doc.'''\n", "return value: needs a type annotation"),
    ("def t(x: int) -> int:\n    return x\n", "needs a docstring"),
    ("def t(*xs: int) -> int:\n    '''Doc.'''\n", "named parameters only"),
    ("def t(x: set) -> int:\n    '''Doc.'''\n", "type 'set' is not a JSON type"),
    ("def t(x: int = print) -> int:\n    '''Doc.'''\n", "defaults must be JSON literals"),
    ("def other() -> int:\n    '''Doc.'''\n", "no top-level function named 't'"),
])
def test_a_bad_signature_is_refused_with_the_reason(source: str, detail: str) -> None:
    definition, problems = define_tool(source, name="t", skill="s")
    assert definition is None
    assert any(detail in p.detail for p in problems), [str(p) for p in problems]


def test_docstring_sections() -> None:
    doc = "Sum.\n\nMore.\n\nArgs:\n    a: first,\n        wrapped.\n    b (int): second.\n" \
          "Returns:\n    the sum\n"
    assert parse_docstring(doc) == ("Sum. More.", {"a": "first, wrapped.", "b": "second."})


def skill(name: str, files: dict[str, str]) -> Skill:
    return Skill(name=name, description=f"When to use {name}.", body="...", files=files)


def test_loading_from_skills_reports_bad_tools_and_loads_the_rest() -> None:
    loaded = load_learned_tools([
        skill("colours", {"scripts/count_red.py": COUNT_RED,
                          "scripts/helper.py": "X = 1\n",
                          "scripts/run.sh": "echo hi\n",
                          "references/notes.md": "notes"}),
        skill("evil", {"scripts/evil.py": "import os\ndef evil() -> int:\n    '''x'''\n"}),
        skill("dupe", {"scripts/count_red.py": COUNT_RED}),
        skill("shadow", {"scripts/python.py": "def python() -> int:\n    '''x'''\n"}),
    ], reserved=("python", "calculator"))
    assert [t.name for t in loaded.tools] == ["count_red"]
    assert loaded.tools[0].skill == "colours"
    assert {(p.path, p.rule) for p in loaded.problems} == {
        ("skills/evil/scripts/evil.py", "import"),
        ("skills/dupe/scripts/count_red.py", "tool-name"),
        ("skills/shadow/scripts/python.py", "tool-name")}
    assert loaded.skipped == [("skills/colours/scripts/helper.py: no function named 'helper'; "
                              "not a tool")]


@pytest.fixture
def red_square(tmp_path: Path) -> tuple[Path, ImageFiles]:
    from PIL import Image

    img = Image.new("RGB", (10, 10), "white")
    img.paste((255, 0, 0), (0, 0, 5, 4))
    path = tmp_path / "in" / "red.png"
    path.parent.mkdir()
    img.save(path)
    return path, ImageFiles(tmp_path / "out", (path.parent,))


def test_a_learned_tool_runs_in_the_sandbox(red_square: tuple[Path, ImageFiles]) -> None:
    path, files = red_square
    definition, _ = define_tool(COUNT_RED, name="count_red", skill="colours")
    assert definition is not None
    box = Toolbox.of([learned_tool(definition, images=files)])
    res = box.call("count_red", {"image": str(path)})
    assert res.ok and json.loads(res.output) == {"red": 20, "total": 100}
    assert res.metadata["sandbox"]["isolation"] in ("bwrap", "process")
    # The plain-text form fills the first parameter; a number written as text is coerced.
    assert json.loads(box.call("count_red", str(path)).output)["red"] == 20
    assert json.loads(box.call("count_red", {"image": str(path), "threshold": "256"})
                      .output)["red"] == 0


def test_image_results_come_back_as_png_files(red_square: tuple[Path, ImageFiles]) -> None:
    path, files = red_square
    source = textwrap.dedent('''
        from PIL import Image, ImageOps

        def mirror(image: Image.Image) -> Image.Image:
            """Mirror an image left to right."""
            return ImageOps.mirror(image)
    ''')
    definition, _ = define_tool(source, name="mirror", skill="s")
    assert definition is not None
    res = run_learned(definition, {"image": str(path)}, images=files)
    out = Path(json.loads(res.output))
    assert res.ok and out.parent == files.out_dir and res.metadata["images"] == [str(out)]
    from PIL import Image

    assert Image.open(out).getpixel((9, 0)) == (255, 0, 0)
    # ...and the result can be the next call's input.
    again = run_learned(definition, {"image": str(out)}, images=files)
    assert Image.open(json.loads(again.output)).getpixel((0, 0)) == (255, 0, 0)


def test_learned_tool_failures_are_observations(red_square: tuple[Path, ImageFiles],
                                                tmp_path: Path) -> None:
    path, files = red_square
    source = textwrap.dedent('''
        def divide(a: int, b: int) -> float:
            """Divide a by b."""
            return a / b
    ''')
    definition, _ = define_tool(source, name="divide", skill="s")
    assert definition is not None
    box = Toolbox.of([learned_tool(definition, images=files)])
    res = box.call("divide", {"a": 1, "b": 0})
    assert res.error == "ZeroDivisionError: division by zero" and "a / b" in res.output
    assert "missing argument(s) b" in (box.call("divide", {"a": 1}).error or "")
    assert "unknown argument(s) c" in (box.call("divide", {"a": 1, "b": 2, "c": 3}).error or "")
    assert "b must be integer" in (box.call("divide", {"a": 1, "b": "x"}).error or "")
    assert box.call("divide", {"a": 3, "b": 2}).output == "1.5"
    outside = tmp_path / "secret.png"
    outside.write_bytes(path.read_bytes())
    definition, _ = define_tool(COUNT_RED, name="count_red", skill="colours")
    assert definition is not None
    with pytest.raises(ToolError, match="not in a folder tools may read"):
        run_learned(definition, {"image": str(outside)}, images=files)
    link = path.parent / "link.png"
    link.symlink_to(outside)
    with pytest.raises(ToolError, match="is a link"):
        run_learned(definition, {"image": str(link)}, images=files)


def test_the_sandbox_is_the_wall_behind_the_gate(red_square: tuple[Path, ImageFiles]) -> None:
    # np.load passes the gate (it reads .npy files); in the sandbox there is no host file
    # to read, and in process mode (no bubblewrap) the result says isolation was weak.
    _, files = red_square
    source = textwrap.dedent('''
        import numpy as np

        def peek(path: str) -> str:
            """Read a file."""
            return str(np.load(path, allow_pickle=False))
    ''')
    definition, problems = define_tool(source, name="peek", skill="s")
    assert definition is not None, problems
    res = run_learned(definition, {"path": "/etc/passwd"}, images=files)
    if res.metadata["sandbox"]["isolation"] == "bwrap":
        assert res.error == "FileNotFoundError: [Errno 2] No such file or directory: " \
            "'/etc/passwd'"
    weak = Sandbox.detect(isolation="process")
    res = run_learned(definition, {"path": "/nonexistent"}, images=files, sandbox=weak)
    assert res.metadata["sandbox"]["isolation"] == "process"
    assert "bubblewrap is unavailable" in res.metadata["sandbox"]["warnings"][0]


def test_a_learned_tool_that_loops_is_killed(red_square: tuple[Path, ImageFiles]) -> None:
    _, files = red_square
    source = 'def spin(n: int) -> int:\n    """Spin."""\n    while True:\n        n += 1\n'
    definition, _ = define_tool(source, name="spin", skill="s")
    assert definition is not None
    res = run_learned(definition, {"n": 1}, images=files, timeout_s=1)
    assert res.timed_out and "timed out after 1 s" in (res.error or "")
