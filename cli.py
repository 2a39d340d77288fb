"""``whetstone`` — the command line. Thin: each command is a call into ``engine.api``.

Exit codes: 0 answered / ok; 1 failure; 2 usage or config; 3 model missing; 4 backend failed;
5 library; 6 not found; 7 eval; 8 the run stopped without an answer (horizon, budget, time);
130 interrupted.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from engine.commands.common import (
    console,
    emit_json,
    handle_errors,
    json_option,
    library_option,
    model_option,
)

EXIT_NO_ANSWER = 8


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="whetstone-engine")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Whetstone: adapt frozen models at inference time with skills, tools and notes
    learned from their own traces."""
    ctx.ensure_object(dict).setdefault("solver_factory", _solver_factory())


def _solver_factory() -> Any:
    """``(model, library_path, version) -> solver`` for `whetstone eval`; one backend per spec,
    so comparing two library versions loads the model once."""
    backends: dict[str, Any] = {}

    def factory(model: str, library_path: Path | None, version: str | None) -> Any:
        from engine.api import Engine
        from engine.backends.registry import get_backend

        if model not in backends:
            backends[model] = get_backend(model)
        engine = Engine(backends[model], library=library_path, version=version,
                        checkpointing=False)
        return engine.solver()

    return factory


# -- run ---------------------------------------------------------------------------------------


def _short(value: Any, limit: int = 400) -> str:
    """Model or tool text, cut to ``limit`` and escaped for rich markup: a reply that contains
    ``[/b]`` or ``[red]`` is printed as written, not parsed (or crashed on) as a style."""
    from rich.markup import escape

    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.strip()
    return escape(text if len(text) <= limit else text[:limit] + " …")


def _print_step(out: Any, step: Any) -> None:
    """One line (or a few) per step, in the ReAct vocabulary users know."""
    if step.kind == "think" and step.output:
        thought = (step.output.get("thought") or "").strip()
        answer_only = step.output.get("parsed") == "answer" and \
            thought == (step.output.get("completion", {}).get("text") or "").strip()
        if thought and not answer_only:
            out.print(f"[cyan]Thought:[/] {_short(thought, 1200)}", markup=True, soft_wrap=True)
        meta = step.meta or {}
        out.print(f"[dim]  ({meta.get('completion_tokens', 0)} tokens, "
                  f"{meta.get('latency_s', 0):.1f} s)[/]", markup=True)
    elif step.kind == "think" and step.error:
        out.print(f"[red]Model call failed:[/] {_short(step.error, 2000)}", markup=True)
    elif step.kind == "act":
        if not step.output or not step.output.get("observation"):
            out.print(f"[magenta]Action:[/] {_short(step.input.get('tool'))}"
                      f"({_short(step.input.get('arguments'))})", markup=True)
            return
        args = step.input.get("arguments")
        out.print(f"[magenta]Action:[/] {_short(step.input.get('tool'))}\\[{_short(args)}]",
                  markup=True, soft_wrap=True)
        style = "red" if step.error else "green"
        out.print(f"[{style}]Observation:[/] {_short(step.output.get('observation'), 800)}",
                  markup=True, soft_wrap=True)
    elif step.kind == "observe":
        error = step.error or ""  # already says "unparseable reply: ..."
        out.print(f"[yellow]{_short(error[:1].upper() + error[1:], 2000)}[/]", markup=True,
                  soft_wrap=True)


def _print_result(out: Any, trace: Any) -> None:
    took = (trace.ended or time.time()) - trace.started
    if trace.outcome == "answered":
        out.print(f"[bold green]Answer:[/] {_short(trace.answer, 100_000)}", markup=True,
                  soft_wrap=True)
    else:
        reason = _short(trace.meta.get("reason", ""), 2000)
        out.print(f"[bold yellow]No answer[/] ({trace.outcome}): {reason}",
                  markup=True, soft_wrap=True)
    out.print(f"[dim]trace {trace.id} · {trace.total_tokens} tokens · {took:.1f} s · "
              f"`whetstone traces show {trace.id}`[/]", markup=True)


@cli.command()
@click.argument("task", required=False)
@model_option
@library_option
@click.option("--max-steps", type=int, default=8, show_default=True,
              help="Horizon: the most model calls in one run.")
@click.option("--max-tokens", type=int, default=512, show_default=True,
              help="Most tokens the model may write per call.")
@click.option("--token-budget", type=int, default=24_000, show_default=True,
              help="Most tokens (prompt + completion) one run may use.")
@click.option("--timeout", type=float, default=600.0, show_default=True,
              help="Wall-clock limit for the run, in seconds.")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--tools", default="calculator,python", show_default=True,
              help="Comma-separated built-in tools ('' for none).")
@click.option("--resume", "resume_id", default=None, help="Continue an interrupted run by id.")
@click.option("--version", "library_version", default=None,
              help="Library version to use (default: the current one).")
@click.option("--no-skills", is_flag=True, help="Do not retrieve skills from the library.")
@click.option("--api-key", envvar="OPENAI_API_KEY", default=None, help="For openai: specs.")
@json_option
@click.pass_context
@handle_errors
def run(ctx: click.Context, task: str | None, model: str, library_path: Path | None, max_steps: int,
        max_tokens: int, token_budget: int, timeout: float, temperature: float, seed: int,
        tools: str, resume_id: str | None, library_version: str | None, no_skills: bool,
        api_key: str | None, as_json: bool) -> None:
    """Run an agent on TASK and stream its steps; the trace is stored."""
    from engine.api import Engine
    from engine.backends.registry import BackendOptions
    from engine.errors import ConfigError
    from engine.runtime import RunConfig, RunFinished, StepEvent, new_trace_id

    if not task and not resume_id:
        raise ConfigError("give a TASK or --resume ID", hint='whetstone run "What is 17 * 23?"')
    if resume_id and ctx.get_parameter_source("model") == click.core.ParameterSource.DEFAULT:
        model = _store(library_path).get(resume_id).model or model  # resume on the same model
    config = RunConfig(max_steps=max_steps, max_tokens_per_call=max_tokens,
                       max_total_tokens=token_budget, timeout_s=timeout,
                       temperature=temperature, seed=seed)
    out = console(stderr=as_json)
    with out.status(f"loading {model} …", spinner="dots"):
        engine = Engine(model, library=library_path, config=config, version=library_version,
                        skills=not no_skills,
                        tools=tuple(t for t in tools.split(",") if t.strip()),
                        backend_options=BackendOptions(api_key=api_key))
        agent = engine.agent
    trace_id = resume_id or new_trace_id()
    events = (engine.resume_stream(resume_id) if resume_id
              else engine.stream(task or "", trace_id=trace_id))
    trace = None
    try:
        with out.status("model is thinking …", spinner="dots") as status:
            for event in events:
                if isinstance(event, StepEvent):
                    if not as_json:
                        _print_step(out, event.step)
                    status.update("tool is running …" if event.step.route == "act"
                                  else "model is thinking …")
                elif isinstance(event, RunFinished):
                    trace = event.trace
    except KeyboardInterrupt:
        events.close()  # records the interrupted trace now, whichever frame Ctrl-C landed in
        out.print(f"\n[yellow]interrupted[/]; resume with: whetstone run --resume {trace_id}",
                  markup=True)
        raise
    finally:
        agent.close()
    assert trace is not None
    if as_json:
        emit_json(trace.to_dict())
    else:
        _print_result(out, trace)
    if trace.outcome != "answered":
        sys.exit(4 if trace.outcome == "error" else EXIT_NO_ANSWER)


# -- traces ------------------------------------------------------------------------------------


@cli.group()
def traces() -> None:
    """Recorded traces: the input of every evolver."""


def _store(library_path: Path | None) -> Any:
    from engine.commands.common import default_library_path
    from library_store.traces import TraceStore

    return TraceStore((library_path or default_library_path()) / "traces")


@traces.command("ls")
@library_option
@click.option("--outcome", default=None, help="answered | horizon | budget | timeout | "
                                               "interrupted | error | running")
@click.option("--task", "task_filter", default=None, help="Substring of the task.")
@click.option("--limit", type=int, default=20, show_default=True)
@json_option
@handle_errors
def traces_ls(library_path: Path | None, outcome: str | None, task_filter: str | None,
              limit: int, as_json: bool) -> None:
    """List traces, newest last."""
    from rich.table import Table

    from library_store.traces import TraceQuery

    store = _store(library_path)
    found = store.query(TraceQuery(outcome=outcome, task=task_filter, limit=limit))
    for problem in store.problems:
        console(stderr=True).print(f"[yellow]warning:[/] {_short(problem, 2000)}", markup=True)
    if as_json:
        emit_json([{"id": t.id, "task": t.task, "outcome": t.outcome, "answer": t.answer,
                    "score": t.score, "tokens": t.total_tokens, "started": t.started,
                    "model": t.model} for t in found])
        return
    table = Table("id", "started", "outcome", "score", "tokens", "task", "answer")
    for t in found:
        table.add_row(t.id, time.strftime("%Y-%m-%d %H:%M", time.localtime(t.started)),
                      t.outcome, "" if t.score is None else f"{t.score:g}",
                      str(t.total_tokens), _short(t.task, 50), _short(t.answer or "", 30))
    console().print(table)


@traces.command("show")
@click.argument("trace_id")
@library_option
@json_option
@handle_errors
def traces_show(trace_id: str, library_path: Path | None, as_json: bool) -> None:
    """Show one trace (an id prefix is enough)."""
    trace = _store(library_path).get(trace_id)
    if as_json:
        emit_json(trace.to_dict())
        return
    out = console()
    out.print(f"[bold]{trace.id}[/] · {_short(trace.model)} · library {trace.library_version or '-'}",
              markup=True)
    out.print(f"[bold]Task:[/] {_short(trace.task, 100_000)}", markup=True, soft_wrap=True)
    for step in trace.steps:
        _print_step(out, step)
    _print_result(out, trace)


# -- models ------------------------------------------------------------------------------------


@cli.command()
@json_option
@handle_errors
def models(as_json: bool) -> None:
    """Every model spec, installed or not, and how to install it."""
    from rich.table import Table

    from engine.api import describe_models

    rows = describe_models()
    if as_json:
        emit_json(rows)
        return
    table = Table("spec", "installed", "white-box", "what", "install")
    for r in rows:
        table.add_row(r["spec"], "yes" if r["installed"] else "[red]no[/]",
                      "yes" if r["white_box"] else "", r["summary"],
                      "" if r["installed"] else r["install"])
    console().print(table)


# -- serve -------------------------------------------------------------------------------------


@cli.command()
@click.option("--upstream", "--model", "-m", "upstream", envvar="WHETSTONE_MODEL",
              default="embedded", show_default=True,
              help="The model that answers: a spec (see `whetstone models`), e.g. "
                   "openai:qwen@http://127.0.0.1:8001/v1. --model is the same option.")
@library_option
@click.option("--version", "library_version", default=None,
              help="Pin a library version (default: follow the current one as it moves).")
@click.option("--no-library", is_flag=True,
              help="Do not inject the library (a plain proxy that still records traces).")
@click.option("--no-record", is_flag=True, help="Do not store exchanges as traces.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--served-name", default=None,
              help="Model name clients use (default: the upstream spec).")
@click.option("--api-key", "api_keys", multiple=True, envvar="WHETSTONE_API_KEY",
              help="Require this key from clients (Authorization: Bearer); repeat for more.")
@click.option("--api-keys-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="A file of accepted keys, one per line ('#' comments).")
@click.option("--upstream-api-key", "upstream_key", envvar="OPENAI_API_KEY", default=None,
              help="Key for an openai: upstream.")
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=16 * 1024 * 1024,
              show_default=True, help="Larger request bodies get 413.")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=None,
              help="Upstream calls in flight (default: the upstream's own limit).")
@click.option("--queue", "max_queue", type=click.IntRange(min=0), default=256,
              show_default=True, help="Requests that may wait for a slot; beyond it: 429.")
@click.option("--upstream-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds per request before answering 504 (default: the upstream's own).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True,
              help="uvicorn's log level ('warning' drops the per-request access log).")
@handle_errors
def serve(upstream: str, library_path: Path | None, library_version: str | None,
          no_library: bool, no_record: bool, host: str, port: int, served_name: str | None,
          api_keys: tuple[str, ...], api_keys_file: Path | None, upstream_key: str | None,
          max_body_bytes: int, max_concurrency: int | None, max_queue: int,
          upstream_timeout: float | None, log_level: str) -> None:
    """Serve UPSTREAM over an OpenAI-compatible API with the library applied to each request
    (/v1/chat/completions, /v1/models, /v1/feedback, /health, /metrics)."""
    from engine.api import Engine
    from engine.backends.registry import BackendOptions, get_backend
    from engine.server import serve as run_server
    from engine.server_middleware import load_api_keys

    out = console(stderr=True)
    keys = load_api_keys(api_keys, api_keys_file)
    options = BackendOptions(api_key=upstream_key, **(
        {"timeout_s": upstream_timeout} if upstream_timeout is not None else {}))
    with out.status(f"loading {upstream} …", spinner="dots"):
        engine = Engine(get_backend(upstream, options), library=library_path,
                        version=library_version, skills=not no_library, checkpointing=False)
        adapter = None if no_library else engine.chat_adapter()
        if adapter is not None:
            adapter.warm_up()  # load the embedder and sync the index before the first request
    version = adapter.library_version() if adapter is not None else None
    out.print(f"serving [bold]{upstream}[/] on http://{host}:{port}/v1 · library "
              f"{engine.library_path} ({'off' if no_library else version}) · traces "
              f"{'off' if no_record else 'on'} · API keys {len(keys) or 'off'}", markup=True)
    try:
        run_server(engine.backend, host=host, port=port, log_level=log_level,
                   model_name=served_name or upstream,
                   adapter=adapter, traces=None if no_record else engine.traces,
                   api_keys=keys, max_body_bytes=max_body_bytes, max_concurrency=max_concurrency,
                   max_queue=max_queue, request_timeout_s=upstream_timeout)
    finally:
        engine.close()


def _mount() -> None:
    from engine.commands.eval import eval_cmd
    from engine.commands.evolve import evolve_group
    from engine.commands.library import library_group, skill_group

    for group in (library_group, skill_group, eval_cmd, evolve_group):
        cli.add_command(group)


_mount()


def main() -> None:
    # The CLI shows its own spinner and progress; transformers' "Loading weights" bar would
    # only interleave with it. Set HF_HUB_DISABLE_PROGRESS_BARS=0 to have it back.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    cli(prog_name="whetstone")


if __name__ == "__main__":
    main()
