"""``whetstone run``: an agent on one task, its steps streamed as they happen."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ..backends.registry import BackendOptions
from ..errors import BackendError, ConfigError
from ..runtime import RunConfig, RunFinished, StepEvent, new_trace_id
from .common import (
    EXIT_NO_ANSWER,
    MethodCommand,
    console,
    emit_json,
    handle_errors,
    json_option,
    library_option,
    methods_option,
    model_option,
    otel_options,
    parse_methods,
)
from .display import print_result, print_step
from .tool_options import tool_options
from .traces import trace_store


@click.command("run", cls=MethodCommand)
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
              help="Comma-separated built-in tools ('' for none; 'search' reads --corpus) "
                   "and your functions (module:function or file.py:function).")
@click.option("--corpus", "corpus_name", envvar="WHETSTONE_CORPUS", default="default",
              show_default=True, help="The evidence corpus 'search' reads (whetstone corpus).")
@click.option("--resume", "resume_id", default=None, help="Continue an interrupted run by id.")
@click.option("--version", "library_version", default=None,
              help="Library version to use (default: the current one).")
@click.option("--no-skills", is_flag=True, help="Do not retrieve skills from the library.")
@click.option("--api-key", envvar="OPENAI_API_KEY", default=None, help="For openai: specs.")
@methods_option
@json_option
@click.pass_context
@handle_errors
@tool_options(with_tools=False)
@otel_options
def run(ctx: click.Context, task: str | None, model: str, library_path: Path | None, max_steps: int,
        max_tokens: int, token_budget: int, timeout: float, temperature: float, seed: int,
        tools: str, corpus_name: str, resume_id: str | None, library_version: str | None,
        no_skills: bool,
        api_key: str | None, methods: str, method_config: tuple[str, ...],
        as_json: bool, agent_tools: list[Any], otel: Any) -> None:
    """Run an agent on TASK and stream its steps; the trace is stored."""
    # lazy: numpy and 78 more of our modules; `whetstone --help` imports every command module
    from ..api import Engine

    if not task and not resume_id:
        raise ConfigError("give a TASK or --resume ID", hint='whetstone run "What is 17 * 23?"')
    if resume_id and ctx.get_parameter_source("model") == click.core.ParameterSource.DEFAULT:
        model = trace_store(library_path).get(resume_id).model or model  # the same model
    config = RunConfig(max_steps=max_steps, max_tokens_per_call=max_tokens,
                       max_total_tokens=token_budget, timeout_s=timeout,
                       temperature=temperature, seed=seed)
    chosen = parse_methods(methods, method_config)
    out = console(stderr=as_json)
    with out.status(f"loading {model} …", spinner="dots"):
        engine = Engine(model, library=library_path, config=config, version=library_version,
                        skills=not no_skills, methods=chosen, tools=agent_tools,
                        backend_options=BackendOptions(api_key=api_key), corpus=corpus_name,
                        otel=otel)
        ctx.call_on_close(engine.close)  # stops the MCP servers it started
        engine.agent  # noqa: B018 - build it (and open its checkpoints) under the spinner
    trace = _stream(engine, out, task, resume_id, show_steps=not as_json)
    if as_json:
        emit_json(trace.to_dict())
    else:
        print_result(out, trace)
    if trace.outcome != "answered":
        sys.exit(BackendError.exit_code if trace.outcome == "error" else EXIT_NO_ANSWER)


def _stream(engine: Any, out: Any, task: str | None, resume_id: str | None, *,
            show_steps: bool) -> Any:
    """Run (or resume) through ``engine``, printing each step as it happens; the trace."""
    trace_id = resume_id or new_trace_id()
    events = (engine.resume_stream(resume_id) if resume_id
              else engine.stream(task or "", trace_id=trace_id))
    trace = None
    printers = engine.registry.step_printers() if show_steps else {}
    try:
        with out.status("model is thinking …", spinner="dots") as status:
            for event in events:
                if isinstance(event, StepEvent):
                    if show_steps:
                        print_step(out, event.step, printers)
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
        engine.agent.close()
    assert trace is not None
    return trace
