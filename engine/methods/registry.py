"""Methods by name: the built-in evolvers and runtime methods, plus installed plugins.

The same mechanism as backends (``whetstone.engine.backends.registry``): each entry names its class by
import path, so nothing is imported until that method is asked for. Another package adds a
method through an entry point naming its class:

    [project.entry-points."whetstone.evolvers"]
    my-evolver = "my_package.evolver:MyEvolver"
    [project.entry-points."whetstone.runtime_methods"]
    my-method = "my_package.method:MyMethod"

An evolver class follows ``whetstone.engine.methods.base.Evolver``; a runtime method class is an
``whetstone.engine.runtime.Plugin`` with a ``config_class`` and ``build(config, env)``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from whetstone.engine.errors import ConfigError
from whetstone.engine.methods.base import Evolver, make_config

if TYPE_CHECKING:
    from whetstone.engine.runtime.plugins import MethodEnv, Plugin

Kind = Literal["evolver", "runtime"]
ENTRY_POINT_GROUPS: dict[Kind, str] = {"evolver": "whetstone.evolvers",
                                       "runtime": "whetstone.runtime_methods"}


@dataclass(frozen=True)
class MethodEntry:
    """One registered method: its name, kind and class (``"module:Class"``)."""

    name: str
    kind: Kind
    target: str

    def load(self) -> Any:
        """The method's class (its module is imported now)."""
        module, _, attr = self.target.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"method {self.name!r} cannot be loaded from {self.target}: {exc}",
                              hint="reinstall the package that registers it") from exc

    def summary(self) -> str:
        """The first line of the class's docstring."""
        doc = (self.load().__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""


_BUILTINS: tuple[MethodEntry, ...] = (
    MethodEntry("trace2skill", "evolver", "whetstone.engine.methods.trace2skill:Trace2Skill"),
    MethodEntry("dynamo", "evolver", "whetstone.engine.methods.dynamo:Dynamo"),
    MethodEntry("skills", "runtime", "whetstone.engine.runtime.skills_plugin:SkillsPlugin"),
    MethodEntry("nlpg", "evolver", "whetstone.engine.methods.nlpg:NLPG"),
    MethodEntry("nlpg", "runtime", "whetstone.engine.methods.nlpg:NLPGPlugin"),
    MethodEntry("co_react", "runtime", "whetstone.engine.methods.co_react:CoReAct"),
    MethodEntry("horizon", "runtime", "whetstone.engine.methods.horizon:ElasticHorizon"),
    MethodEntry("march", "runtime", "whetstone.engine.methods.march:March"),
    MethodEntry("memory", "evolver", "whetstone.engine.methods.memory:Memory"),
    MethodEntry("memory", "runtime", "whetstone.engine.methods.memory:MemoryPlugin"),
    MethodEntry("self_consistency", "runtime",
                "whetstone.engine.methods.self_consistency:SelfConsistency"),
    MethodEntry("latent", "runtime", "whetstone.engine.methods.latent:LatentTTS"),
)


class MethodRegistry:
    """Name -> ``MethodEntry``, per kind. Build one with ``default_registry()``."""

    def __init__(self, entries: tuple[MethodEntry, ...] = ()) -> None:
        self._entries: dict[Kind, dict[str, MethodEntry]] = {"evolver": {}, "runtime": {}}
        for e in entries:
            self.register(e)

    def register(self, entry: MethodEntry) -> None:
        self._entries[entry.kind][entry.name] = entry

    def names(self, kind: Kind) -> list[str]:
        return list(self._entries[kind])

    def entry(self, kind: Kind, name: str) -> MethodEntry:
        found = self._entries[kind].get(name)
        if found is None:
            what = "evolver" if kind == "evolver" else "runtime method"
            known = ", ".join(self._entries[kind]) or "none"
            raise ConfigError(f"unknown {what} {name!r}", hint=f"{what}s: {known}")
        return found

    def evolver(self, name: str, options: Mapping[str, Any] | None = None, *,
                shared: Mapping[str, Any] | None = None) -> Evolver:
        """A ready evolver: its class built with its config from ``options``. ``shared``
        values (the run's ``seed``) fill config fields of the same name not in ``options``."""
        cls = self.entry("evolver", name).load()
        merged = dict(options or {})
        names = {f.name for f in dataclasses.fields(cls.config_class)}
        for key, value in (shared or {}).items():
            if key in names:
                merged.setdefault(key, value)
        return cls(make_config(cls.config_class, merged, method=name))

    def runtime_method(self, name: str, options: Mapping[str, Any] | None,
                       env: MethodEnv) -> Plugin:
        """A ready runtime method for one agent, built with ``build(config, env)``."""
        cls = self.entry("runtime", name).load()
        config = make_config(cls.config_class, dict(options or {}), method=name)
        return cls.build(config, env)


def default_registry() -> MethodRegistry:
    """The built-in methods plus those installed under the ``whetstone.evolvers`` and
    ``whetstone.runtime_methods`` entry points (a plugin of the same name replaces a
    built-in)."""
    registry = MethodRegistry(_BUILTINS)
    for kind, group in ENTRY_POINT_GROUPS.items():
        for ep in importlib.metadata.entry_points(group=group):
            registry.register(MethodEntry(ep.name, kind, ep.value))
    return registry
