"""Methods that adapt the frozen model. Evolvers return a ``LibraryPatch`` that the caller
gates and applies (``whetstone.engine.evolution``); runtime methods are ``whetstone.engine.runtime.Plugin`` subclasses.
Both are found by name through ``registry.py``; the contracts are in ``base.py`` (see
docs/architecture.md, "Methods and where they live")."""

from .base import EvolveContext, Evolver, LibraryPatch

__all__ = ["EvolveContext", "Evolver", "LibraryPatch"]
