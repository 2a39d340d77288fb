"""Click command groups mounted by ``cli.py``. Thin: each command is a call into the package."""
