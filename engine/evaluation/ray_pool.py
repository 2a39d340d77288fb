"""Running tasks on a Ray cluster (``--executor ray``, ``--ray-address`` or ``RAY_ADDRESS``).

``SolverPool`` keeps one Ray actor per worker. Each actor builds what solves tasks once, from
a picklable recipe (``make(*args)``, a module-level function the workers import: the faces
pass ``whetstone.engine.api.ray_solvers``), and keeps a solver per library version it is asked
about. ``pool.solver(key)`` is an ordinary ``Solver`` (``(task, seed) -> Trace``): ``evaluate``
calls it from its threads, one call per actor at a time, so eval, an evolver's check runs and
the gate run on the cluster unchanged, and each task's trace comes back to be scored and stored
where the run was started, as a local run stores it. A task runs with the seed it would get
locally, so a Ray run's scores and traces equal a local run's.

Faults: actors restart (``MAX_RESTARTS``) and Ray runs again the calls a killed worker had in
flight (``max_task_retries``); a call is a pure function of its task and seed, so a run that
lost a worker ends as a clean run does.

The model reaches the workers as its spec (``openai:...`` calls the upstream from each worker;
``embedded`` or ``hf:`` loads the model in each worker from that node's cache) or, when it
pickles (a scripted double), as the backend itself.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ModelNotInstalled
from ..types import Trace
from .runner import Solver, with_concurrency
from .tasks import TaskRecord

RAY_ADDRESS_ENV = "RAY_ADDRESS"
MAX_RESTARTS = 4


def ray_module() -> Any:
    """The ray module; ``ModelNotInstalled`` (exit 3) saying how to install it."""
    try:
        import ray  # optional extra: scale (ray)
    except ImportError:
        raise ModelNotInstalled(
            "--executor ray needs the 'ray' package",
            hint="pip install 'whetstone-engine[scale]', or drop --executor to run locally"
        ) from None
    return ray


def connect(address: str | None = None, *, local_cpus: int = 2) -> bool:
    """Join the cluster at ``address`` (else ``$RAY_ADDRESS``), or start a local Ray with
    ``local_cpus`` when neither is given. True when this call started Ray (the caller shuts
    it down with ``disconnect``)."""
    ray = ray_module()
    if ray.is_initialized():
        return False
    address = address or os.environ.get(RAY_ADDRESS_ENV) or None
    if address:
        ray.init(address=address, log_to_driver=False, ignore_reinit_error=True)
    else:
        ray.init(num_cpus=max(1, local_cpus), include_dashboard=False, log_to_driver=False,
                 ignore_reinit_error=True)
    return True


def disconnect(started: bool) -> None:
    if started:
        ray_module().shutdown()


def cluster_cpus() -> int:
    return max(1, int(ray_module().cluster_resources().get("CPU", 1)))


def actor_options() -> dict[str, Any]:
    """How a worker actor is placed and kept: spread over the nodes, holding no CPU while it
    lives (Ray's default for actors: an idle pool must not starve another one of CPUs, as the
    gate's solvers would an evolver's analysts), restarted and its calls run again when its
    process dies."""
    return {"scheduling_strategy": "SPREAD", "max_restarts": MAX_RESTARTS,
            "max_task_retries": MAX_RESTARTS}


class _SolverActor:
    """One worker: what solves tasks, built once from the recipe, and a solver per key."""

    def __init__(self, make: Callable[..., Callable[[str], Solver]], args: tuple[Any, ...],
                 env: Mapping[str, str]) -> None:
        os.environ.update(env)  # this worker process is the actor's alone
        self._make, self._args = make, args
        self._solvers_for: Callable[[str], Solver] | None = None
        self._solvers: dict[str, Solver] = {}

    def solve(self, key: str, task: TaskRecord, seed: int) -> Trace:
        if self._solvers_for is None:
            self._solvers_for = self._make(*self._args)
        solver = self._solvers.get(key)
        if solver is None:
            solver = self._solvers[key] = self._solvers_for(key)
        return solver(task, seed)

    def pid(self) -> int:
        return os.getpid()


class SolverPool:
    """``workers`` actors on the connected cluster (``connect`` first); see the module."""

    def __init__(self, make: Callable[..., Callable[[str], Solver]], args: tuple[Any, ...],
                 *, workers: int, env: Mapping[str, str] | None = None) -> None:
        ray = ray_module()
        self.workers = max(1, workers)
        actor = ray.remote(**actor_options())(_SolverActor)
        self.actors = [actor.remote(make, args, dict(env or {})) for _ in range(self.workers)]
        self._idle: queue.Queue[Any] = queue.Queue()
        for a in self.actors:
            self._idle.put(a)

    def solver(self, key: str) -> Solver:
        """The solver of library version ``key`` (what ``make``'s result understands),
        tagged to run ``workers`` tasks at once."""
        ray = ray_module()

        def solve(task: TaskRecord, seed: int) -> Trace:
            actor = self._idle.get()
            try:
                return ray.get(actor.solve.remote(key, task, seed))
            finally:
                self._idle.put(actor)

        return with_concurrency(solve, self.workers)

    def close(self) -> None:
        ray = ray_module()
        for a in self.actors:
            ray.kill(a)
        self.actors = []
