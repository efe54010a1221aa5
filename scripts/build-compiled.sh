#!/usr/bin/env bash
# Builds the compiled gateway: tokenplane installed (not editable) into .venv-compiled with the
# request path's modules compiled by mypyc (setup.py's COMPILED_MODULES). Needs a C compiler and
# Python's headers (both on this machine; Debian: apt-get install gcc python3-dev).
#
#   scripts/build-compiled.sh                       # 4-5 minutes on 2 cores
#   .venv-compiled/bin/tokenplane serve gateway.yaml
#   .venv-compiled/bin/pytest tests/gateway         # the tests, run against the compiled modules
#   COMPILED_VENV=/some/dir scripts/build-compiled.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${COMPILED_VENV:-.venv-compiled}"
start=$(date +%s)
python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# This machine's pip config names local index folders that may be absent: drop pip's warnings about them.
exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
# The dependencies first (with a pure build, replaced below): mypy type-checks the compiled
# modules against them (aiohttp's types, pydantic's plugin), and mypyc comes with mypy.
"${PIP[@]}" install "setuptools>=68" wheel '.[dev]'
# Not editable: the extension modules go to site-packages, never beside the sources they shadow.
# A fresh build/ folder: setuptools would otherwise pack what an earlier build left there.
rm -rf build
TOKENPLANE_COMPILE=1 "${PIP[@]}" install --no-build-isolation --force-reinstall --no-deps .
# Every module setup.py lists must import from its extension module, not from source.
TOKENPLANE_EXPECT_COMPILED=1 "$VENV/bin/pytest" -q -p no:cacheprovider tests/test_compiled.py
echo "== compiled build in $VENV in $(( $(date +%s) - start )) s"
