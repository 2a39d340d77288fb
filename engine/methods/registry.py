"""Methods by name: every method is one package that declares what it owns.

A method package (``whetstone/engine/methods/<name>/``) holds its code and, in its
``__init__.py``, one ``MethodSpec``: its evolver and runtime plugin (by import path, so
nothing is imported until the method is asked for), the library folders it owns with their
validators, and its commands. ``BUILTIN_METHODS`` below lists the built-in packages, one line
each; nothing outside a method's package names it. Another package adds a method without
touching ours through an entry point naming its spec:

    [project.entry-points."whetstone.methods"]
    my-method = "my_package:METHOD"

(The older groups ``whetstone.evolvers`` and ``whetstone.runtime_methods``, naming one class
each, still work.) An evolver class follows ``whetstone.engine.methods.base.Evolver``; a
runtime method class is a ``whetstone.engine.runtime.Plugin`` with a ``config_class`` and
``build(config, env)``. See docs/architecture.md, "Adding a method".
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from whetstone.engine.errors import ConfigError
from whetstone.engine.methods.base import Evolver, make_config

if TYPE_CHECKING:
    from pathlib import Path

    from whetstone.engine.errors import ValidationError
    from whetstone.engine.methods.base import CommandKit
    from whetstone.engine.prompts import Prompts
    from whetstone.engine.runtime.plugins import MethodEnv, Plugin
    from whetstone.engine.types import Trace
    from whetstone.library_store.store import Library, Snapshot
    from whetstone.library_store.validation import Validator

log = logging.getLogger("whetstone.methods")
_WARNED: set[str] = set()  # each broken entry point is reported once per process

Kind = Literal["evolver", "runtime"]
ENTRY_POINT_GROUPS: dict[Kind, str] = {"evolver": "whetstone.evolvers",
                                       "runtime": "whetstone.runtime_methods"}
METHODS_ENTRY_POINT = "whetstone.methods"

# The built-in method packages, one line each (each one's __init__.py holds its MethodSpec).
BUILTIN_METHODS: tuple[str, ...] = (
    "whetstone.engine.methods.trace2skill",
    "whetstone.engine.methods.dynamo",
    "whetstone.engine.methods.nlpg",
    "whetstone.engine.methods.co_react",
    "whetstone.engine.methods.horizon",
    "whetstone.engine.methods.march",
    "whetstone.engine.methods.memory",
    "whetstone.engine.methods.self_consistency",
    "whetstone.engine.methods.latent",
    "whetstone.engine.methods.workflows",
)


class Verification(Protocol):
    """What the function a ``MethodSpec.verify`` names returns: the report the faces show
    (``whetstone verify``, the server's verification switch), and the check as a trace
    (``make_trace("verify", ...)``) that ``Engine.verify`` stores."""

    def report(self) -> dict[str, Any]: ...

    def trace(self, *, model: str = "") -> Trace: ...


@dataclass(frozen=True)
class LibraryRoot:
    """A top-level library folder a method owns (beside ``skills/``): versioned, exported and
    checked on every commit like the skills. ``validator`` (``"module:function"``, called as
    ``f(snapshot, changed_paths)`` and returning ``ValidationError``s) checks its files;
    ``layout`` says in one line what the folder holds."""

    name: str
    layout: str
    validator: str | None = None


@dataclass(frozen=True)
class KnobOption:
    """A command-line shortcut a method declares for one of its runtime knobs: ``run`` and
    ``eval`` take ``flag VALUE`` as ``--method-config <method>.<knob>=VALUE`` (the method must
    be among ``--methods``)."""

    flag: str  # e.g. "--rubric-model"
    knob: str  # a field of the method's config_class
    help: str
    metavar: str = "VALUE"


@dataclass(frozen=True)
class MethodSpec:
    """What one method package owns. Targets are import paths (``"module:attr"``):
    ``evolver`` and ``runtime`` name classes; ``commands`` names a function that takes the
    faces' ``CommandKit`` (``whetstone.engine.methods.base``) and returns the ``click``
    commands to mount on the ``whetstone`` command line; ``prompts`` is its prompt files
    (``Prompts(__name__)``: the ``prompts/`` folder of its package). ``verify`` names the
    function ``Engine.verify`` calls to check an answer, ``f(env: MethodEnv, question,
    answer, *, evidence, analyst, options) -> Verification`` (``env`` gives the engine's
    model, second models and evidence corpora; ``options`` are the method's knobs).

    What the faces show of the method is its own too: ``step_kinds`` maps each step kind its
    runtime records to the printer of such a step (``f(console, step)``; ``engine/printing.py``
    has the helpers), ``summary`` names ``f(report) -> lines`` that says what an evolve did
    (its ``LibraryPatch.details``), ``exit_codes`` the codes its commands exit with (code ->
    when: docs/cli.md lists them), ``options`` its command-line shortcuts for runtime knobs."""

    name: str
    evolver: str | None = None
    runtime: str | None = None
    roots: tuple[LibraryRoot, ...] = ()
    commands: str | None = None
    step_kinds: Mapping[str, str] = field(default_factory=dict)
    summary: str | None = None
    exit_codes: Mapping[int, str] = field(default_factory=dict)
    options: tuple[KnobOption, ...] = ()
    prompts: Prompts | None = None
    verify: str | None = None

    def entries(self) -> list[MethodEntry]:
        out = []
        if self.evolver:
            out.append(MethodEntry(self.name, "evolver", self.evolver))
        if self.runtime:
            out.append(MethodEntry(self.name, "runtime", self.runtime))
        return out


@dataclass(frozen=True)
class MethodEntry:
    """One registered method: its name, kind and class (``"module:Class"``)."""

    name: str
    kind: Kind
    target: str

    def load(self) -> Any:
        """The method's class (its module is imported now)."""
        return load_target(self.target, f"method {self.name!r}")

    def summary(self) -> str:
        """The first sentence of the class's docstring (its first paragraph when that has no
        full stop)."""
        doc = (self.load().__doc__ or "").strip()
        first = " ".join(doc.split("\n\n")[0].split())
        end = first.find(". ")
        return first[:end + 1] if end >= 0 else first


# Not a method package: the core runtime plugin every agent starts with (skill retrieval).
_CORE = (MethodEntry("skills", "runtime", "whetstone.engine.runtime.skills_plugin:SkillsPlugin"),)


def load_target(target: str, what: str) -> Any:
    """The object an import path (``"module:attr"``) names, or a ``ConfigError`` saying so."""
    module, _, attr = target.partition(":")
    try:
        obj = importlib.import_module(module)
        return getattr(obj, attr) if attr else obj
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{what} cannot be loaded from {target}: {exc}",
                          hint="reinstall the package that provides it") from exc
    except Exception as exc:  # a package whose import raises (a bug in it): still a ConfigError
        raise ConfigError(f"{what} cannot be loaded from {target}: importing it raised "
                          f"{type(exc).__name__}: {exc}",
                          hint="reinstall or uninstall the package that provides it") from exc


def load_spec(target: str) -> MethodSpec:
    """The ``MethodSpec`` a method package declares: ``"package"`` reads its ``METHOD``
    (importing only its ``__init__``), ``"package:NAME"`` another name (an entry point's)."""
    target = target if ":" in target else f"{target}:METHOD"
    spec = load_target(target, f"method {target}")
    if not isinstance(spec, MethodSpec):
        raise ConfigError(f"{target} is a {type(spec).__name__}, not a MethodSpec",
                          hint="declare METHOD = MethodSpec(...) in the package's __init__.py "
                               "and point the whetstone.methods entry point at it")
    return spec


class MethodRegistry:
    """Name -> ``MethodEntry``, per kind. Build one with ``default_registry()``."""

    def __init__(self, entries: tuple[MethodEntry, ...] = (),
                 specs: tuple[MethodSpec, ...] = ()) -> None:
        self._entries: dict[Kind, dict[str, MethodEntry]] = {"evolver": {}, "runtime": {}}
        self._specs: dict[str, MethodSpec] = {}
        self.skipped: dict[str, str] = {}  # an installed method that could not load -> why
        for e in entries:
            self.register(e)
        for spec in specs:
            self.add(spec)

    def register(self, entry: MethodEntry) -> None:
        self._entries[entry.kind][entry.name] = entry

    def add(self, spec: MethodSpec) -> None:
        """Register a method package's spec (a later one of the same name replaces it)."""
        self._specs[spec.name] = spec
        for entry in spec.entries():
            self.register(entry)

    def specs(self) -> list[MethodSpec]:
        return list(self._specs.values())

    def skip(self, name: str, why: str) -> None:
        """Leave out an installed method that cannot load, with a warning: one broken
        package never stops the commands that do not need it."""
        self.skipped[name] = why
        if why not in _WARNED:
            _WARNED.add(why)
            log.warning("skipped the installed method %r: %s (reinstall or uninstall the "
                        "package that provides it)", name, why)

    def roots(self) -> dict[str, LibraryRoot]:
        """The library folders the methods own, by name (a folder two methods claim is a
        ``ConfigError``: they would overwrite each other's files)."""
        out: dict[str, LibraryRoot] = {}
        owner: dict[str, str] = {}
        for spec in self._specs.values():
            for root in spec.roots:
                if root.name in owner and owner[root.name] != spec.name:
                    raise ConfigError(f"library folder {root.name!r} is claimed by both "
                                      f"{owner[root.name]} and {spec.name}",
                                      hint="uninstall one of the two methods")
                out[root.name], owner[root.name] = root, spec.name
        return out

    def verifier(self) -> tuple[str, Any]:
        """The method that verifies answers (the last registered with ``verify``) and its
        function; ``ConfigError`` when no installed method does."""
        found = [s for s in self._specs.values() if s.verify]
        if not found:
            raise ConfigError("no installed method verifies answers",
                              hint="install a method whose MethodSpec names a verify function "
                                   "(`whetstone methods` lists those installed)")
        spec = found[-1]
        return spec.name, load_target(spec.verify or "", f"the verifier of {spec.name}")

    def root_validators(self) -> list[Validator]:
        """The validators of the methods' library folders, loaded now."""
        return [load_target(r.validator, f"the validator of {r.name}/")
                for r in self.roots().values() if r.validator]

    def library_validator(self) -> Validator:
        """What every commit of a library opened by the faces runs: the Agent Skills rules and
        the learned-tool check (``validate_library``), then each method's folder validator."""
        # lazy: loads filelock, yaml and 53 more of our modules
        from whetstone.engine.runtime.library_tools import validate_library

        extra = self.root_validators()

        def validate(snapshot: Snapshot, changed: Sequence[str] | None = None
                     ) -> list[ValidationError]:
            problems = list(validate_library(snapshot, changed))
            for check in extra:
                problems += check(snapshot, changed)
            return problems

        return validate

    def open_library(self, path: Path | str, **kwargs: Any) -> Library:
        """``Library.open`` with these methods' folders and validators: how every face opens
        a library (``create=True`` makes a missing one)."""
        # lazy: loads filelock and 19 more of our modules
        from whetstone.library_store.store import Library

        kwargs.setdefault("validator", self.library_validator())
        return Library.open(path, roots=tuple(self.roots()), **kwargs)

    def commands(self, kit: CommandKit) -> list[Any]:
        """The ``click`` commands the methods add to the command line, built with the faces'
        ``kit`` (a method whose commands cannot load is skipped with a warning)."""
        out = []
        for spec in self._specs.values():
            try:
                out += self.commands_of(spec, kit)
            except ConfigError as exc:
                self.skip(spec.name, exc.message)
        return out

    @staticmethod
    def commands_of(spec: MethodSpec, kit: CommandKit) -> list[Any]:
        """The ``click`` commands one method adds (loaded now)."""
        if not spec.commands:
            return []
        return list(load_target(spec.commands, f"the commands of {spec.name}")(kit))

    def step_printers(self) -> dict[str, Any]:
        """Step kind -> its printer, for the kinds the methods add (loaded now; a printer
        that cannot load is left out: its steps print as one short line)."""
        out: dict[str, Any] = {}
        for spec in self._specs.values():
            for kind, target in spec.step_kinds.items():
                try:
                    out[kind] = load_target(target, f"the {kind} printer of {spec.name}")
                except ConfigError as exc:
                    self.skip(spec.name, exc.message)
        return out

    def summary_of(self, method: str) -> Any | None:
        """``f(report) -> lines`` saying what an evolve of ``method`` did, or None."""
        spec = self._specs.get(method)
        if spec is None or not spec.summary:
            return None
        return load_target(spec.summary, f"the evolve summary of {method}")

    def exit_codes(self) -> dict[int, tuple[str, str]]:
        """Exit code -> (method, when) for the codes the methods' commands exit with; a
        code two methods claim is a ``ConfigError``."""
        out: dict[int, tuple[str, str]] = {}
        for spec in self._specs.values():
            for code, when in spec.exit_codes.items():
                if code in out and out[code][0] != spec.name:
                    raise ConfigError(f"exit code {code} is claimed by both {out[code][0]} "
                                      f"and {spec.name}", hint="uninstall one of the two")
                out[code] = (spec.name, when)
        return out

    def knob_options(self) -> list[tuple[str, KnobOption]]:
        """(method, shortcut) for every runtime method's command-line shortcuts."""
        return [(spec.name, opt) for spec in self._specs.values() if spec.runtime
                for opt in spec.options]

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
    """The built-in method packages plus those installed under the ``whetstone.methods``
    entry point (a spec) or the ``whetstone.evolvers`` / ``whetstone.runtime_methods`` ones
    (a class); an installed method of the same name replaces a built-in. An installed spec
    that cannot load is skipped with a warning (``skipped`` says why)."""
    registry = MethodRegistry(_CORE, tuple(load_spec(p) for p in BUILTIN_METHODS))
    for ep in importlib.metadata.entry_points(group=METHODS_ENTRY_POINT):
        try:
            registry.add(load_spec(ep.value))
        except ConfigError as exc:
            registry.skip(ep.name, exc.message)
    for kind, group in ENTRY_POINT_GROUPS.items():
        for ep in importlib.metadata.entry_points(group=group):
            registry.register(MethodEntry(ep.name, kind, ep.value))
    return registry

