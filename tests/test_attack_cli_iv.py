"""Issue 44 (Hardening IV), the command line and the server: terminal escapes in library text
(finding 6), relayed upstream errors (7), a task line's scorer (12) and ``corpus add``
through a linked folder (14).
"""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.errors import ValidationError
from whetstone.engine.library.checks import validate_library
from whetstone.library_store.store import Library

# --- finding 6: terminal escapes -----------------------------------------------------------

ESCAPES = ("\033]0;pwned\a", "\033[2J", "\u202etxt.exe", "\x9b31m")
HOSTILE = textwrap.dedent("""\
    ---
    name: tidy
    description: "Tidy a table. \\e]0;pwned\\a\\e[2J \\u202etxt.exe \\x9b31m"
    ---
    # Tidy
    Sort the rows. \033[2J
    """)


def _raw(text: str) -> list[str]:
    return [c for c in ("\033", "\a", "\u202e", "\x9b") if c in text]


def test_the_validator_refuses_control_characters_in_a_description(tmp_path: Path) -> None:
    lib = Library.open(tmp_path / "lib", create=True)
    with pytest.raises(ValidationError) as err:
        lib.commit({"skills/tidy/SKILL.md": HOSTILE}, method="test", validate=validate_library)
    assert err.value.rule == "description-characters"
    assert "'\\x1b'" in err.value.detail and "'\\u202e'" in err.value.detail
    assert not _raw(err.value.detail)
    src = tmp_path / "src" / "tidy"
    src.mkdir(parents=True)
    (src / "SKILL.md").write_text(HOSTILE)
    res = CliRunner().invoke(cli, ["library", "import", str(tmp_path / "src"), "--library",
                                   str(lib.root), "--json"])
    report = json.loads(res.stdout)
    assert report["imported"] == [] and report["skipped"][0]["rule"] == \
        "description-characters"


def test_listings_print_control_characters_escaped(tmp_path: Path) -> None:
    lib = Library.open(tmp_path / "lib", create=True)
    # Landed without the validator, as a library written before the rule or edited by hand.
    lib.commit({"skills/tidy/SKILL.md": HOSTILE}, method="test\033[2J",
               message="\033]0;pwned\a")
    runner = CliRunner()
    for args in (["library", "ls"], ["library", "show", "tidy"], ["library", "log"],
                 ["library", "diff", "v1"], ["library", "show", "v2"]):
        res = runner.invoke(cli, [*args, "--library", str(lib.root)])
        assert res.exit_code == 0, res.output
        assert not _raw(res.output), (args, res.output)
        assert "\\x1b" in res.output, (args, res.output)
    ls = runner.invoke(cli, ["library", "ls", "--library", str(lib.root)]).output
    assert "\\u202e" in ls


def test_warnings_and_errors_print_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """The log handler and the error printer go through the same console."""
    from whetstone.engine.commands.common import configure_logging, fail
    from whetstone.engine.errors import ConfigError

    configure_logging(0, False, None)
    logging.getLogger("whetstone.test").warning("model said \033]0;x\a")
    with pytest.raises(SystemExit):
        fail(ConfigError("bad \033[2J", hint="\u202eno"))
    text = capsys.readouterr().err
    # (rich drops the bell itself; the escape is what we write out)
    assert "said \\x1b]0;x" in text and "bad \\x1b[2J" in text
    assert "\\u202eno" in text and not _raw(text)


# --- finding 12: a task line's scorer as a list or a dict ----------------------------------

@pytest.mark.parametrize("scorer,kind", [(["exact", "a:b"], "list"), ({"name": "f1"}, "dict"),
                                         (7, "int")])
def test_a_scorer_that_is_not_a_string_is_refused_with_its_line(tmp_path: Path,
                                                                 scorer: object,
                                                                 kind: str) -> None:
    from whetstone.engine.evaluation.benchmarks import load_tasks

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t0", "question": "1+1?", "expected": "2"}) + "\n"
                     + json.dumps({"id": "t1", "question": "2+2?", "expected": "4",
                                   "scorer": scorer}) + "\n")
    loaded = load_tasks(str(tasks))
    assert [t.id for t in loaded.tasks] == ["t0"]
    [problem] = loaded.problems
    assert problem.startswith(f"{tasks}:2: ") and "`scorer` must be a string" in problem
    assert kind in problem
    replies = tmp_path / "r.json"
    replies.write_text(json.dumps(["Final answer: 2"]))
    res = CliRunner().invoke(cli, ["eval", "--tasks", str(tasks), "--model",
                                   f"scripted:{replies}", "-j", "1"])
    assert res.exit_code == 0 and res.exception is None, res.output
    assert f"{tasks}:2" in res.output and "accuracy 1.000" in res.output


# --- finding 14: corpus add through a linked folder ----------------------------------------

def test_corpus_add_refuses_a_path_through_a_linked_folder(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    # A marker no hash or embedding byte run matches by chance (a bare "4711" sits in
    # hex digests about once in a few thousand libraries).
    secret.write_text("the vault code is kestrel-quartz-4711\n")
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "up").symlink_to(tmp_path / "outside")  # a linked middle folder
    (tmp_path / "notes.md").write_text("# Paris\n\nThe Eiffel Tower was completed in 1889.\n")
    lib = tmp_path / "lib"
    lib.mkdir()
    monkeypatch.chdir(tmp_path)
    for typed in ("evil/up/secret.txt", str(tmp_path / "evil" / "up" / "secret.txt"),
                  "evil/up", "evil/up/../outside/secret.txt"):
        res = CliRunner().invoke(cli, ["corpus", "add", typed, "notes.md", "--library",
                                       str(lib), "--json"])
        assert res.exit_code == 0, res.output
        report = json.loads(res.stdout)
        assert report["corpus"]["documents"] == 1, (typed, report)
        assert any("evil/up" in s and "symbolic link" in s for s in report["skipped"]), report
    stored = b"".join(p.read_bytes() for p in lib.rglob("*") if p.is_file())
    assert b"kestrel-quartz" not in stored
    # The real path is read.
    res = CliRunner().invoke(cli, ["corpus", "add", str(secret), "--library", str(lib),
                                   "--json"])
    assert json.loads(res.stdout)["corpus"]["documents"] == 2


# --- finding 7: a relayed upstream 4xx keeps no address ------------------------------------

@pytest.mark.integration
def test_a_relayed_upstream_error_names_no_upstream_address() -> None:
    import httpx
    from servers import Servers
    from starlette.applications import Starlette
    from starlette.requests import Request as HttpRequest
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from whetstone.engine.backends.registry import BackendOptions, get_backend
    from whetstone.engine.server import create_app

    where: dict[str, str] = {}

    async def refuse(request: HttpRequest) -> Response:
        host = where["upstream"].removeprefix("http://")
        path = request.url.path
        if path.endswith("/embeddings"):  # vLLM-style: the route's full URL in the message
            return JSONResponse({"error": {"message": f"model not found at "
                                           f"{where['upstream']}{path}", "type": "NotFound"}},
                                status_code=404)
        return JSONResponse({"error": {
            "message": f"context too long for a request from {host} (peer 10.0.0.7:9101; "
                       f"see {where['upstream']}/v1/docs)", "type": "BadRequestError",
            "param": f"{where['upstream']}/v1/chat/completions"}}, status_code=400)

    upstream_app = Starlette(routes=[Route("/v1/chat/completions", refuse, methods=["POST"]),
                                     Route("/v1/embeddings", refuse, methods=["POST"])])
    with Servers() as servers:
        where["upstream"] = servers.start(upstream_app)
        backend = get_backend(f"openai:tiny@{where['upstream']}/v1",
                              BackendOptions(max_retries=0))
        servers.callback(backend.close)
        url = servers.start(create_app(backend))
        chat = httpx.post(url + "/v1/chat/completions", timeout=15, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
        embed = httpx.post(url + "/v1/embeddings", timeout=15,
                           json={"model": "other-embedder", "input": "hi"})
    port = where["upstream"].rsplit(":", 1)[1]
    assert chat.status_code == 400 and embed.status_code == 404, (chat.text, embed.text)
    for reply in (chat, embed):
        for leak in (port, "127.0.0.1", "10.0.0.7", "9101", "http://"):
            assert leak not in reply.text, (leak, reply.text)
    err = chat.json()["error"]
    assert err["message"].startswith("context too long for a request from <upstream>")
    assert err["param"] == "<upstream>" and err["type"] == "BadRequestError"
    assert "model not found at <upstream>" in embed.json()["error"]["message"]
