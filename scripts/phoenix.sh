#!/usr/bin/env bash
# A real Arize Phoenix for tests/test_phoenix_real.py (issue 39): arize-phoenix, pinned, in a
# virtualenv of its own (~140 packages, ~860 MB; never in Whetstone's .venv, never in CI).
# Idempotent: an existing virtualenv with the pinned version is kept.
#
#   scripts/phoenix.sh            install (or keep) the virtualenv
#   scripts/phoenix.sh test       install, then run the real-Phoenix tests
#
# Environment (all optional):
#   WHETSTONE_PHOENIX_VENV  where (default: .cache/phoenix-venv; the test reads the same variable)
#   PHOENIX_PACKAGE         what pip installs (default: arize-phoenix==20.26.1, the version tested)
#   WHETSTONE_PY            Whetstone's python, for `test` (default: .venv/bin/python)
#
# Costs, on 2 cores: the install took 36 s from a nearby package index; the server starts in
# ~8 s (SQLite, a fresh database); the tests take ~14 s in all.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$HERE"
VENV="${WHETSTONE_PHOENIX_VENV:-$HERE/.cache/phoenix-venv}"
PACKAGE="${PHOENIX_PACKAGE:-arize-phoenix==20.26.1}"
PY="${WHETSTONE_PY:-$HERE/.venv/bin/python}"

want="${PACKAGE#*==}"
have="$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("arize-phoenix"))' 2>/dev/null || true)"
if [ -x "$VENV/bin/phoenix" ] && { [ "$want" = "$PACKAGE" ] || [ "$have" = "$want" ]; }; then
  echo "Phoenix $have is in $VENV"
else
  echo "installing $PACKAGE into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "$PACKAGE"
  echo "Phoenix $("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("arize-phoenix"))') is in $VENV"
fi

if [ "${1:-}" = "test" ]; then
  WHETSTONE_TEST_PHOENIX=1 WHETSTONE_PHOENIX_VENV="$VENV" \
    "$PY" -m pytest -q -rs -m slow tests/test_phoenix_real.py
fi
