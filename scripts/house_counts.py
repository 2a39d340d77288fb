"""The numbers issue 47 is judged by, for any checkout (this one, or an older tree):

    .venv/bin/python scripts/house_counts.py [--repo PATH]

- ``arrows``: what a tool that reads files draws (``scripts/structure.py``: arrows between
  files, following no link), and the same with ``whetstone.`` read away (the structure the
  code has, whichever way its imports are written);
- ``serve_climbs``: the calls on ``whetstone serve``'s way to its library version (the library
  opened, the engine and its chat adapter built as ``serve`` does before it listens; then what
  the server reads of it: ``/health``'s version and gate, one request adapted) whose callee sits on a higher floor of that structure than its
  caller: a lower part reaching back up (a callback, a closure handed down). Each is listed
  once, as ``caller -> callee``;
- ``engine``: ``Engine``'s public methods and properties, and its constructor's parameters.

The run happens in a subprocess with ``PYTHONPATH`` at ``--repo``, on a ``scripted:`` model, in
a temporary home; nothing is served (the server's ``serve`` is replaced by a stub).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

WALK = r'''
import json, os, sys
from pathlib import Path
repo = Path(sys.argv[1]).resolve()
floors = json.loads(sys.argv[2])
sys.path.insert(0, str(Path(sys.argv[3])))
from structure import part_of

def rel_of(filename):
    try:
        p = Path(os.path.realpath(filename))
        return p.relative_to(repo).as_posix()
    except (ValueError, OSError):
        return None

climbs = {}
def profile(frame, event, arg):
    if event != "call" or frame.f_back is None:
        return
    callee = rel_of(frame.f_code.co_filename)
    caller = rel_of(frame.f_back.f_code.co_filename)
    if not callee or not caller or callee == caller or callee.startswith(("tests/", "scripts/")):
        return
    a, b = floors.get(part_of(caller)), floors.get(part_of(callee))
    if a is not None and b is not None and b > a:
        key = (f"{caller}:{frame.f_back.f_code.co_name}", f"{callee}:{frame.f_code.co_name}")
        climbs[key] = climbs.get(key, 0) + 1

from click.testing import CliRunner
import whetstone.cli as cli_module
import whetstone.engine.server.app as app
lib = Path(sys.argv[4])
runner = CliRunner()
res = runner.invoke(cli_module.cli, ["library", "init", "--library", str(lib)])
assert res.exit_code == 0, res.output
script = lib.parent / "replies.json"
script.write_text(json.dumps({"replies": ["4"]}))
served = {}
app.serve = lambda *a, **k: served.update(k)  # stop where the server would start listening
sys.setprofile(profile)
res = runner.invoke(cli_module.cli, ["serve", "--model", f"scripted:{script}", "--library",
                                     str(lib), "--gated-only", "--port", "0"])
# what the server reads of that version: /health's version and gate, one adapted request
adapter = served["adapter"]
adapter.library_version(), adapter.library_gate()
from whetstone.engine.types import Message, Request
adapter.adapt(Request(messages=(Message(role="user", content="What is 2 + 2?"),)))
sys.setprofile(None)
assert res.exit_code == 0, (res.output, res.exception)
print(json.dumps({"climbs": [f"{a} -> {b}" for a, b in sorted(climbs)],
                  "calls": sum(climbs.values())}))
'''


def engine_surface(repo: Path) -> dict[str, object]:
    tree = ast.parse((repo / "engine" / "api.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    public = [n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
              and not n.name.startswith("_")]
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    params = [a.arg for a in [*init.args.args[1:], *init.args.kwonlyargs]]
    return {"public": len(public), "public_names": public, "init_params": len(params),
            "init_names": params}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=HERE.parent)
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    sys.path.insert(0, str(HERE))
    import structure  # the file-reading tool beside this script

    out: dict[str, object] = {
        "arrows": structure.summary(repo)["arrows"],
        "arrows_prefix_read_away": structure.summary(repo, strip_prefix=True)["arrows"],
    }
    arrows, _ = structure.graph(repo, strip_prefix=True)
    floors = structure.floors(arrows)
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(PYTHONPATH=str(repo), WHETSTONE_HOME=str(Path(tmp) / "home"),
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        res = subprocess.run([sys.executable, "-c", WALK, str(repo), json.dumps(floors),
                              str(HERE), str(Path(tmp) / "lib")], env=env, cwd=tmp,
                             capture_output=True, text=True, timeout=600, check=False)
    if res.returncode != 0:
        print(res.stdout[-3000:], res.stderr[-3000:], file=sys.stderr)
        return 1
    walk = json.loads(res.stdout.strip().splitlines()[-1])
    out["serve_climbs"] = len(walk["climbs"])
    out["serve_climb_calls"] = walk["calls"]
    out["serve_climb_list"] = walk["climbs"]
    out["engine"] = engine_surface(repo)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
