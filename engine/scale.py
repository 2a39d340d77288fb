"""Eval and evolve on a Ray cluster: ``RayExecutor`` (``--executor ray``, ``--ray-address`` or
``RAY_ADDRESS``; without either, a Ray started on this machine).

    with RayExecutor(address="10.0.0.5:6379") as cluster:
        engine.evolve("trace2skill", tasks="gsm8k@train:0:40", skill="word-math",
                      cluster=cluster)

The runs (eval's tasks, an evolve's collection runs, an evolver's check runs, the gate's two
runs) go to a ``ray_pool.SolverPool``: each worker builds an ``Engine`` once and answers tasks
with the library version it is asked for; the traces come back and are scored and stored here.
An evolver's map phase (Trace2Skill's analysts) runs on the same cluster.

What reaches a worker, and how:
- the model: its spec, rebuilt in the worker: ``openai:NAME@URL`` calls that upstream from each
  worker (vLLM or any OpenAI-compatible server: the usual deployment), ``embedded`` and ``hf:``
  load the model in each worker from that node's own cache; a backend object that pickles (a
  scripted double) travels as it is. Credentials (``OPENAI_API_KEY``) come from each node's
  environment, never from this process.
- the library: with a PostgreSQL store (``--store``) each worker opens it itself and needs no
  shared folder; with the folder store the workers open the same path, so they must see it
  (one machine, or a shared file system).
- a version that is not committed (the gate's candidate) travels as its manifest: its files
  are blobs the preview already wrote to the store.
- methods and tools by name (with their options); a ready object travels only if it pickles.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Self

from ..library_store.manifest import Manifest
from ..library_store.pg_connect import STORE_ENV
from ..library_store.store import Library, Snapshot
from .api import Engine, MethodSpec
from .backends.base import Backend
from .errors import ConfigError
from .evaluation.ray_pool import (
    SolverPool,
    cluster_cpus,
    connect,
    disconnect,
)
from .evaluation.runner import Solver
from .runtime import RunConfig

EXECUTORS = ("local", "ray")
_MANIFEST = "manifest:"


def snapshot_key(snap: Snapshot) -> str:
    """How a worker finds ``snap``: its version id, or for a version never committed (a
    preview) its manifest."""
    if "+" not in snap.id:
        return snap.id
    return _MANIFEST + snap.manifest.to_json().decode("utf-8")


def snapshot_of(library: Library, key: str) -> Snapshot:
    """The snapshot ``snapshot_key`` (or a version reference, ``candidate:NAME``) names."""
    if key.startswith(_MANIFEST):
        return Snapshot(library, Manifest.from_json(key[len(_MANIFEST):].encode("utf-8")))
    if key.startswith("candidate:"):
        return library.candidates.snapshot(key.split(":", 1)[1])
    return library.snapshot(None if key == "current" else key)


def ray_solvers(model: Backend | str, library: str | None, methods: tuple[Any, ...],
                tools: tuple[Any, ...], config: RunConfig | None, corpus: str,
                kind: str) -> Callable[[str], Solver]:
    """In a Ray worker: one ``Engine``, and the solver over each version key it is asked
    about (``SolverPool``'s ``make``)."""
    engine = Engine(model, library=library, methods=methods, tools=tools, config=config,
                    checkpointing=False, corpus=corpus, solver=kind, otel=False)
    return lambda key: engine.solver(snapshot=snapshot_of(engine.library, key), kind=kind)


def _travelling(what: str, value: Any) -> Any:
    """``value`` when it pickles (it must reach the workers), else a ``ConfigError``."""
    try:
        pickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 -- locks, sockets, sessions: cannot travel
        raise ConfigError(f"{what} cannot be sent to Ray workers ({type(exc).__name__}: "
                          f"{exc})", hint="name it (a registered method, a built-in tool) "
                          "instead of passing an object, or drop --executor ray") from None
    return value


def _model(backend: Backend | str) -> Backend | str:
    """The backend itself when it pickles, else its spec (rebuilt in each worker)."""
    if isinstance(backend, str):
        return backend
    try:
        pickle.dumps(backend)
        return backend
    except Exception:  # noqa: BLE001 -- loaded models, sockets: rebuilt from the spec
        return backend.spec


class RayExecutor:
    """Runs eval and evolve on Ray (the module). ``workers``: actors (default: the cluster's
    CPUs). Use it as a context manager, or ``close()`` it: its actors are stopped, and a Ray
    it started is shut down."""

    kind = "ray"
    # Evolver config fields it sets (Trace2Skill's map): read-only.
    shared: Mapping[str, str] = MappingProxyType({"executor": "ray"})

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        self._started = connect(address, local_cpus=workers or 2)
        self.workers = workers or cluster_cpus()
        self._pools: list[SolverPool] = []

    def _pool(self, model: Backend | str, library: Library | Path | None,
              methods: Sequence[Any], tools: Sequence[Any], config: RunConfig | None,
              corpus: str, kind: str) -> SolverPool:
        lib = library if isinstance(library, Library) else None
        store = lib.store if lib is not None else None
        # With a store, each worker opens its own default folder for it: nothing is shared.
        where = None if store or library is None else str(
            lib.root if lib is not None else library)
        args = (_model(model), where, _travelling("the runtime methods", tuple(methods)),
                _travelling("the tools", tuple(tools)), config, corpus, kind)
        pool = SolverPool(ray_solvers, args, workers=self.workers,
                          env={STORE_ENV: store or ""} if lib is not None else {})
        self._pools.append(pool)
        return pool

    def make_solver(self, engine: Engine, kind: str, methods: Sequence[Any] | None = None
                    ) -> Callable[[Snapshot | None], Solver]:
        """``Engine.evolve``'s ``make_solver`` on the cluster: a snapshot's solver (None:
        the current version when asked), with ``methods`` (default: the engine's)."""
        pool = self._pool(engine.backend, engine.library,
                          engine.methods if methods is None else methods, engine.tool_specs,
                          engine.config, engine.corpus_name, kind)
        return lambda snap: pool.solver(snapshot_key(snap or engine.library.snapshot()))

    def eval_factory(self, *, methods: Sequence[MethodSpec] = (),
                     tools: Sequence[Any] = ("calculator", "python"),
                     config: RunConfig | None = None, corpus: str = "default",
                     solver: str = "agent") -> Callable[[str, Path | None, str | None], Solver]:
        """``whetstone eval``'s ``(model, library_path, version) -> solver`` on the cluster
        (``api.solver_factory``'s contract): one pool per model, a version resolved here."""
        pools: dict[tuple[str, str], SolverPool] = {}

        def factory(model: str, library_path: Path | None, version: str | None) -> Solver:
            lib = Library(library_path) if library_path is not None else None
            key = (model, str(library_path))
            if key not in pools:
                pools[key] = self._pool(model, lib if lib is not None else library_path,
                                        methods, tools, config, corpus, solver)
            if version and version.startswith("candidate:"):
                ref = version
            elif lib is not None and lib.is_initialized():
                ref = lib.resolve(version)  # every worker answers with the same version
            else:
                ref = "current"
            return pools[key].solver(ref)

        return factory

    def close(self) -> None:
        for pool in self._pools:
            pool.close()
        self._pools = []
        disconnect(self._started)
        self._started = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
