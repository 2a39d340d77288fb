"""The one loader of a user's function named ``module:function`` or ``path/to/file.py:function``
(``--tools``, ``Engine(tools=...)``, ``--scorer``): the faces' one way to turn such a name into
a callable, each saying in its own words what it loads."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import ConfigError, WhetstoneError

FORMS = "path/to/file.py:function or module:function"


def _find_in_cwd(module_name: str) -> None:
    """Put the current folder on ``sys.path`` when ``module_name`` is found nowhere else but
    there, as ``python -m`` does: the ``whetstone`` script's own folder is on the path, the
    folder it was started in is not, and ``--tools mytools:lookup`` beside ``mytools.py``
    must find it."""
    top = module_name.partition(".")[0]
    cwd = Path.cwd()
    here = (cwd / f"{top}.py").is_file() or (cwd / top).is_dir()
    if here and importlib.util.find_spec(top) is None and str(cwd) not in sys.path:
        sys.path.insert(0, str(cwd))
        importlib.invalidate_caches()


def load_function(ref: str, *, what: str, error: type[WhetstoneError] = ConfigError,
                  hint: str = f"name a function as {FORMS}") -> Callable[..., Any]:
    """The function ``ref`` names; ``error`` (with ``hint``) saying what a ``what`` (``tool``,
    ``scorer``) could not be loaded from, otherwise. A ``.py`` file is run as a module of its
    own; a module name is imported (from the current folder too, as ``python -m`` would)."""
    module_name, sep, attr = ref.strip().rpartition(":")
    if not sep or not module_name or not attr:
        raise error(f"cannot read the {what} {ref!r}", hint=f"name a function as {FORMS}")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).expanduser()
            if not path.is_file():
                raise error(f"{what} file {path} does not exist", hint=f"give {FORMS}")
            spec = importlib.util.spec_from_file_location(path.stem, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            _find_in_cwd(module_name)
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise error(f"cannot import {what} module {module_name!r} ({exc})",
                    hint="check the module is importable (on PYTHONPATH) or give a .py path"
                    ) from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise error(f"{module_name!r} has no function {attr!r}", hint=hint)
    if not callable(fn):
        raise error(f"{ref.strip()} is not a function", hint=hint)
    return fn  # type: ignore[no-any-return]
