"""Run Trace2Skill's MAP phase on a Ray cluster (``--executor ray``, the cluster at
``--ray-address`` / ``RAY_ADDRESS``, else a local Ray; ``pip install 'whetstone-engine[scale]'``).

Each worker is an actor holding its own analyst backend: built from the spec inside the worker
when the backend cannot travel (a loaded local model), or shipped as is when it can (remote
APIs, the scripted double). Batches keep their index, so seeds — and results — match the
local asyncio executor. A worker killed mid-map is restarted and its batches analysed again
(``ray_pool.MAX_RESTARTS``): a batch's result depends only on the batch and its seed. The
evolver reaches this module, never the other way: what the map needs of it is
``BatchAnalyst``, and its class travels to the workers by reference (Ray pickles a class by its
import path).
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ...backends.base import Backend
from ...backends.registry import get_backend
from ...evaluation.ray_pool import actor_options, connect, disconnect, ray_module
from ...types import Trace
from .edits import SkillPatch


class BatchAnalyst(Protocol):
    """What the Ray map needs of the evolver: its config (``workers``, ``seed``), its report
    (``map``: the analysts' costs), its progress callback, and the analysis of one batch."""

    config: Any
    report: Any
    on_progress: Callable[[str, int, int], None]

    async def _analyse(self, batch: Sequence[Trace], files: Mapping[str, str],
                       analyst: Backend, labels: Mapping[str, str] | None,
                       seed: int) -> SkillPatch | None: ...


def _portable(analyst: Backend) -> Backend | str:
    """The backend itself when it pickles, else its spec (rebuilt in the worker)."""
    try:
        pickle.dumps(analyst)
        return analyst
    except Exception:  # noqa: BLE001 -- locks, loaded models, sockets: rebuild from the spec instead
        return analyst.spec


class _Worker:
    """One analyst per actor; built lazily inside the worker process."""

    def __init__(self, evolver_class: Callable[[Any], BatchAnalyst], config: Any,
                 analyst: Backend | str) -> None:
        self.t2s = evolver_class(config)
        self._analyst = analyst

    def _backend(self) -> Backend:
        if isinstance(self._analyst, str):
            self._analyst = get_backend(self._analyst)
        return self._analyst

    def analyse(self, index: int, batch: list[Trace], base: dict[str, str],
                labels: dict[str, str] | None) -> tuple[int, Any, Any]:
        self.t2s.report = type(self.t2s.report)()  # this call's costs only
        patch = asyncio.run(self.t2s._analyse(batch, base, self._backend(), labels,
                                              self.t2s.config.seed + index))
        return index, patch, self.t2s.report.map


def map_on_ray(t2s: BatchAnalyst, batches: Sequence[list[Trace]], base: Mapping[str, str],
               analyst: Backend, labels: Mapping[str, str] | None) -> list[SkillPatch | None]:
    """Analyse every batch on Ray with ``t2s.config.workers`` actors; results in batch order."""
    ray = ray_module()
    started_here = connect(local_cpus=t2s.config.workers)
    try:
        Actor = ray.remote(**actor_options())(_Worker)
        shipped = _portable(analyst)
        actors = [Actor.remote(type(t2s), t2s.config, shipped) for _ in range(t2s.config.workers)]
        pending = [actors[i % len(actors)].analyse.remote(i, batch, dict(base),
                                                          dict(labels) if labels else None)
                   for i, batch in enumerate(batches)]
        results: list[Any] = [None] * len(batches)
        done = 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            index, patch, stats = ray.get(ready[0])
            results[index] = patch
            t2s.report.map.add(stats)
            done += 1
            t2s.on_progress("map", done, len(batches))
        for actor in actors:
            ray.kill(actor)
        return results
    finally:
        disconnect(started_here)
