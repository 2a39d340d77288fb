"""The ``CommandKit`` the command line hands each method's commands (``MethodSpec.commands``):
the shared options, error handling and output of ``engine/commands/common.py`` and the
``Engine`` the other commands build, so a method package imports no face."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...library_store.store import Library
from . import common


class Kit:
    """The command line's kit (``whetstone.engine.methods.base.CommandKit``)."""

    json_option = staticmethod(common.json_option)
    library_option = staticmethod(common.library_option)
    model_option = staticmethod(common.model_option)
    handle_errors = staticmethod(common.handle_errors)
    console = staticmethod(common.console)
    emit_json = staticmethod(common.emit_json)

    def open_library(self, path: Path | None, *, create: bool | None = None) -> Library:
        # lazy: loads numpy and 65 more of our modules
        from ..api import open_library

        return open_library(path or common.default_library_path(), create=create)

    def engine(self, model: str, **options: Any) -> Any:
        from ..api import Engine  # lazy: loads numpy and 65 more of our modules

        return Engine(model, **options)
