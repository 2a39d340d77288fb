"""``whetstone serve``: the library in front of a model, over an OpenAI-compatible API."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click

from ...library_store.change_control import newest_gated
from ...library_store.manifest import gate_record
from ..backends.redact import redact_spec
from ..backends.registry import BackendOptions, get_backend
from ..errors import ConfigError
from .common import (
    check_exposed_bind,
    console,
    handle_errors,
    library_option,
    methods_option,
    otel_options,
    parse_methods,
    skills_config,
    skills_options,
    web_options,
)


def _newest_gated(library_path: Path | None, version: str | None, no_library: bool,
                  out: Any) -> str:
    """The version ``--gated-only`` serves, said on ``out``: the newest a gate accepted."""
    # lazy: filelock, yaml and 30 more modules; `whetstone --help` imports every command
    from ..library.opening import open_library
    from ..methods.registry import default_registry

    if version is not None or no_library:
        raise ConfigError(f"--gated-only picks the version itself; it cannot go with "
                          f"{'--version' if version is not None else '--no-library'}",
                          hint="drop one of the two")
    lib = open_library(library_path, default_registry().folders())
    chosen, current = newest_gated(lib), lib.current_id()
    if gate_record(chosen)["gated"] is None:
        said = (f"no version has passed a gate: serving {chosen.id}, the empty library it "
                "started as")
    else:
        said = f"serving {chosen.id}, the newest version a gate accepted"
        below = [m.id for m in lib.log() if m.number < chosen.number
                 and gate_record(m)["gated"] is False]
        if below:
            said += (f" (it builds on ungated {', '.join(below[:5])}: the gate measured its "
                     "own change, not theirs; `library config require_gate true` keeps that "
                     "from happening)")
    if chosen.id != current:
        said += (f"; the current version {current} went live ungated (or came after it) and "
                 "is not served: `whetstone library log` shows how each was gated")
    out.print(f"gated only: {said}; a version gated later is served after a restart",
              markup=False, soft_wrap=True)
    return chosen.id


def canary_router(engine: Any) -> Any:
    """The replica's ``CanaryRouter``: a learner's canary gets the adapter the current version
    has (the same skills options and methods), reading only the canary's files."""
    # lazy: FastAPI and 20 more of our modules, only when serving
    from ..server.canary import CanaryRouter

    def build(snapshot: Any) -> Any:
        adapter = engine.chat_adapter(snapshot=snapshot)
        adapter.warm_up()  # its retrieval index is synced before its first answer
        return adapter

    return CanaryRouter(engine.library, build)


@click.command("serve")
@click.option("--upstream", "--model", "-m", "upstream", envvar="WHETSTONE_MODEL",
              default="embedded", show_default=True,
              help="The model that answers: a spec (see `whetstone models`), e.g. "
                   "openai:qwen@http://127.0.0.1:8001/v1. --model is the same option.")
@library_option
@click.option("--version", "library_version", default=None,
              help="Pin a library version (default: follow the current one as it moves).")
@click.option("--gated-only", is_flag=True,
              help="Serve only a version a gate accepted: the newest one, pinned (said at "
                   "start; a version gated later is served after a restart). Versions that "
                   "went live ungated are not served.")
@click.option("--no-library", is_flag=True,
              help="Do not inject the library (a plain proxy that still records traces).")
@click.option("--no-record", is_flag=True, help="Do not store exchanges as traces.")
@click.option("--corpus", "corpus_name", envvar="WHETSTONE_CORPUS", default="default",
              show_default=True, help=("The evidence corpus the methods read (the endpoints a "
                                       'request names in {"whetstone": {"endpoints": [...]}}).'))
@skills_options("Skills retrieved for each request (the k nearest).",
                "The lowest retrieval score (cosine) a skill needs to be shown")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address to listen on; one other than 127.0.0.1/localhost needs "
                   "--api-key (or --insecure).")
@click.option("--port", type=int, default=8000, show_default=True)
@web_options
@click.option("--served-name", default=None,
              help="Model name clients use (default: the upstream's own model name, e.g. "
                   "qwen for openai:qwen@http://host:8001/v1; never its address).")
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
@click.option("--retrieval-workers", type=click.IntRange(min=1, max=64), default=4,
              show_default=True, help="Threads that embed queries for the library.")
@click.option("--queue", "max_queue", type=click.IntRange(min=0), default=256,
              show_default=True, help="Requests that may wait for a slot; beyond it: 429.")
@click.option("--upstream-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds a request may take in all, the wait for a free slot included, "
                   "before a 504; also the upstream call's timeout (default: 300 in all, the "
                   "upstream keeping its own per-call timeout).")
@click.option("--stream-idle-timeout", type=click.FloatRange(min=0, min_open=True),
              default=120.0, show_default=True,
              help="Seconds a stream may go without a chunk before it is cut (an upstream "
                   "sending keep-alives only).")
@click.option("--header-timeout", type=click.FloatRange(min=0, min_open=True),
              default=10.0, show_default=True,
              help="Seconds a client may take to send a request's headers (from connecting, "
                   "or from the first byte after the previous reply) before a 408 and close.")
@click.option("--max-connections", type=click.IntRange(min=0), default=None,
              help="Client connections open at once; more are refused with a 503 as soon as "
                   "accepted (default: 1024, or half the open-file limit if lower; 0: no cap).")
@click.option("--max-connections-per-ip", type=click.IntRange(min=0), default=256,
              show_default=True,
              help="Connections open at once from one client address (0: no cap); behind a "
                   "reverse proxy every client has its address: raise it or use 0.")
@click.option("--traces-max-bytes", type=click.IntRange(min=0), default=None,
              help="Keep at most this many bytes of traces, dropping the oldest files after "
                   "each write (default: library.json's trace_max_bytes, else 1 GiB; 0: no "
                   "cap). `whetstone traces prune` applies it by hand.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True,
              help="uvicorn's log level ('warning' drops the per-request access log).")
# 600: engine/server/feedback.py's DEFAULT_RATE_PER_MIN (not imported: `whetstone --help`
# imports every command module, and this one loads none of the server's).
@click.option("--feedback-rate", type=click.FloatRange(min=0), default=600.0,
              show_default=True, help="Labels a minute one key may send to /v1/feedback "
                                      "(429 past it; 0: no limit).")
@click.option("--feedback-weights", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help='How much each key\'s feedback counts: a JSON object '
                                 '{"<key>": 2, "sha256:<hex>": 0.5, "*": 1}.')
@click.option("--no-canary", is_flag=True,
              help="Serve the current version to every conversation, whatever canary a "
                   "learner runs (`whetstone learn`).")
@methods_option
@handle_errors
@otel_options
def serve(upstream: str, library_path: Path | None, library_version: str | None,
          gated_only: bool, no_library: bool, no_record: bool, corpus_name: str, skills_k: int,
          skills_min_score: float | None, host: str, port: int,
          allowed_hosts: tuple[str, ...], allowed_origins: tuple[str, ...], insecure: bool,
          served_name: str | None,
          api_keys: tuple[str, ...], api_keys_file: Path | None, upstream_key: str | None,
          max_body_bytes: int, max_concurrency: int | None,
          retrieval_workers: int, max_queue: int,
          upstream_timeout: float | None, stream_idle_timeout: float,
          header_timeout: float, max_connections: int | None, max_connections_per_ip: int,
          traces_max_bytes: int | None, log_level: str, feedback_rate: float,
          feedback_weights: Path | None, no_canary: bool, methods: str,
          method_config: tuple[str, ...], otel: Any) -> None:
    """Serve UPSTREAM over an OpenAI-compatible API with the library applied to each request
    (/v1/chat/completions, /v1/models, /v1/feedback, /health, /metrics); /v1/embeddings and
    /v1/completions pass through to an openai: upstream as sent."""
    # lazy: numpy and 47 more of our modules; `whetstone --help` imports every command module
    from ..api import Engine

    # heavy: FastAPI, pydantic and starlette, only when serving
    from ..server.app import bind
    from ..server.app import serve as run_server

    # lazy: 6 of our modules, `whetstone --help` imports every command module
    from ..server.connections import ConnectionLimits

    # lazy: 6 of our modules, `whetstone --help` imports every command module
    from ..server.feedback import FeedbackPolicy, load_feedback_weights
    from ..server.guard import load_api_keys

    out = console(stderr=True)
    if gated_only:
        library_version = _newest_gated(library_path, library_version, no_library, out)
    policy = FeedbackPolicy(feedback_rate, load_feedback_weights(feedback_weights)
                            if feedback_weights is not None else None)
    chosen = [m for m in parse_methods(methods, method_config) if m[0] != "skills"]
    keys = load_api_keys(api_keys, api_keys_file)
    check_exposed_bind(host, keys, insecure, "serve")
    limits = ConnectionLimits(header_timeout_s=header_timeout, max_connections=max_connections,
                              max_per_ip=max_connections_per_ip)
    options = BackendOptions(api_key=upstream_key)
    if upstream_timeout is not None:
        options = dataclasses.replace(options, timeout_s=upstream_timeout)
    skills = skills_config(skills_k, skills_min_score)
    sock = bind(host, port)  # a port in use fails now, not after the model has loaded
    engine: Engine | None = None
    try:
        shown = redact_spec(upstream)  # never print the credentials of its URL
        with out.status(f"loading {shown} …", spinner="dots"):
            engine = Engine(get_backend(upstream, options), library=library_path,
                            version=library_version, skills=not no_library,
                            checkpointing=False, corpus=corpus_name,
                            methods=() if no_library else [("skills", skills), *chosen],
                            otel=otel)
            adapter = None if no_library else engine.chat_adapter()
            if adapter is not None:
                adapter.warm_up()  # load the embedder and sync the index before a request
        # A pinned version (--version, --gated-only) is what this replica serves, canary or not.
        canary = None if adapter is None or no_canary or library_version is not None \
            else canary_router(engine)
        version = adapter.library_version() if adapter is not None else None
        traces = None if no_record else engine.traces
        if traces is not None and traces_max_bytes is not None:
            traces.max_bytes = traces_max_bytes
        out.print(f"serving [bold]{shown}[/] on http://{host}:{port}/v1 · library "
                  f"{engine.library_path} ({'off' if no_library else version}) · traces "
                  f"{'off' if no_record else 'on'} · API keys {len(keys) or 'off'}",
                  markup=True)
        run_server(engine.backend, host=host, port=port, log_level=log_level, sock=sock,
                   limits=limits, allowed_hosts=allowed_hosts, allowed_origins=allowed_origins,
                   model_name=served_name, adapter=adapter, traces=traces,
                   endpoints=engine.endpoints(),
                   api_keys=keys, max_body_bytes=max_body_bytes, max_concurrency=max_concurrency,
                   max_queue=max_queue, request_timeout_s=upstream_timeout,
                   retrieval_workers=retrieval_workers,
                   stream_idle_s=stream_idle_timeout, canary=canary, feedback_policy=policy)
    finally:
        sock.close()
        if engine is not None:
            engine.close()
