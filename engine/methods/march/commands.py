"""``whetstone verify``: check an answer for hallucination with MARCH (engine/methods/march/verifier.py).

    whetstone verify --question "Who founded the Oberoi group?" --answer "Mohan Singh Oberoi"
    whetstone verify -q "..." -a "..." --evidence "a passage" --evidence @notes.txt
    whetstone verify -q "..." --corpus halueval --policy revise     # no --answer: solve first

Exit codes: 0 the answer is supported, 9 it is flagged (a hallucination report is printed),
and the usual codes for errors (2 usage, 3 model missing, 4 backend, 5 corpus, ...).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from ...backends.registry import BackendOptions
from ...errors import ConfigError, LibraryError
from ..base import CommandKit

# `verify` exits with it when the answer is flagged (MARCH's MethodSpec.exit_codes says so).
EXIT_FLAGGED = 9
_MARK = {True: "[green]supported[/]", False: "[red]contradicted[/]",
         None: "[yellow]not supported[/]"}


def _evidence(items: tuple[str, ...]) -> list[str]:
    """``--evidence`` values: text, or ``@PATH`` for a file's text."""
    out = []
    for item in items:
        if item.startswith("@"):
            path = Path(item[1:])
            try:
                out.append(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
                raise LibraryError(f"cannot read evidence file {path}: {exc}",
                                   hint="give a readable UTF-8 text file after '@'") from exc
        else:
            out.append(item)
    if items and not any(e.strip() for e in out):
        raise ConfigError("the evidence given is empty", hint="--evidence TEXT or @FILE")
    return out


def _print(out: Any, result: Any) -> None:
    out.soft_wrap = True
    for i, r in enumerate(result.rounds):
        title = "answer" if i == 0 else f"revision {i}"
        out.print(f"[bold]{title}:[/] {escape(r.answer)}")
        if r.note:
            out.print(f"  [dim]{escape(r.note)}[/]")
        for v in r.verdicts:
            checked = f"; evidence says {escape(v.checked)!r}" if v.checked else ""
            out.print(f"  {_MARK[v.supported]}  {escape(v.claim)} — claimed "
                      f"{escape(v.claimed)!r}{checked}  [dim]votes {', '.join(v.votes)}[/]")
            if v.evidence:
                out.print(f"      [dim]“{escape(v.evidence)}”[/]")
    report = result.report()
    verdict = "[bold red]hallucination flagged[/]" if result.flagged else \
        "[bold green]supported by the evidence[/]"
    out.print(f"{verdict}: {report['flagged_claims']} of {len(report['claims'])} claim(s) "
              f"flagged · {report['tokens']} tokens · {result.seconds:.1f} s")
    if result.revised:
        out.print(f"[bold]revised answer:[/] {escape(result.answer)}")


def commands(kit: CommandKit) -> list[click.Command]:
    """What MARCH adds to the ``whetstone`` command line (its ``MethodSpec.commands``), built
    with the command line's kit."""

    @click.command("verify")
    @click.option("--question", "-q", required=True, help="The question that was answered.")
    @click.option("--answer", "-a", default=None,
                  help="The answer to check (default: MARCH's solver answers from the evidence).")
    @click.option("--evidence", "-e", multiple=True, metavar="TEXT|@FILE",
                  help="Evidence to check against (repeat for more); default: the corpus.")
    @click.option("--corpus", "corpus_name", envvar="WHETSTONE_CORPUS", default="default",
                  show_default=True, help="The library corpus evidence is retrieved from.")
    @click.option("-k", "k", type=click.IntRange(min=1), default=4, show_default=True,
                  help="Passages retrieved from the corpus.")
    @click.option("--policy", type=click.Choice(["report", "revise"]), default="report",
                  show_default=True, help="Report hallucinations, or revise the answer.")
    @click.option("--rounds", type=click.IntRange(min=0), default=1, show_default=True,
                  help="Most revisions under --policy revise.")
    @click.option("--samples", type=click.IntRange(min=1), default=3, show_default=True,
                  help="Checker samples (majority vote).")
    @click.option("--analyst", default=None,
                  help="Model spec of the proposer and checker (default: --model).")
    @click.option("--seed", type=int, default=0, show_default=True)
    @kit.model_option
    @kit.library_option
    @click.option("--api-key", envvar="OPENAI_API_KEY", default=None, help="For openai: specs.")
    @kit.json_option
    @kit.handle_errors
    def verify(question: str, answer: str | None, evidence: tuple[str, ...], corpus_name: str,
               k: int, policy: str, rounds: int, samples: int, analyst: str | None, seed: int,
               model: str, library_path: Path | None, api_key: str | None, as_json: bool) -> None:
        """Check an answer claim by claim against evidence: a proposer turns it into questions, a
        checker that never sees the answer answers them from the evidence, and claims whose
        answers disagree (or that the evidence cannot settle) are flagged."""
        given = _evidence(evidence)
        out = kit.console(stderr=True)
        with out.status(f"loading {model} …", spinner="dots"):
            engine = kit.engine(model, library=library_path, skills=False, checkpointing=False,
                                backend_options=BackendOptions(api_key=api_key), corpus=corpus_name)
        try:
            with out.status("checking claims …", spinner="dots"):
                result = engine.endpoint(
                    "verify", question=question, answer=answer, evidence=given or None,
                    analyst=analyst, options={"k": k, "policy": policy, "rounds": rounds,
                                              "samples": samples, "seed": seed})
        finally:
            engine.close()
        if as_json:
            kit.emit_json({**result.to_dict(), "report": result.report()})
        else:
            _print(kit.console(), result)
        if result.flagged:
            sys.exit(EXIT_FLAGGED)

    return [verify]
