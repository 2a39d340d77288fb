"""Where Whetstone keeps its files. Pure functions of the environment; nothing is created here."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def whetstone_home(env: Mapping[str, str] | None = None) -> Path:
    """``$WHETSTONE_HOME`` or ``~/.whetstone``."""
    env = os.environ if env is None else env
    return Path(env.get("WHETSTONE_HOME") or Path.home() / ".whetstone").expanduser()


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Derived, rebuildable data (dequantized model copies): ``$WHETSTONE_CACHE`` or home/cache."""
    env = os.environ if env is None else env
    if env.get("WHETSTONE_CACHE"):
        return Path(env["WHETSTONE_CACHE"]).expanduser()
    return whetstone_home(env) / "cache"
