"""Methods that adapt the frozen model. Evolvers return a ``LibraryPatch``; the caller gates
and applies it. Run-time methods are ``engine.runtime.Plugin`` subclasses."""

from engine.methods.base import LibraryPatch

__all__ = ["LibraryPatch"]
