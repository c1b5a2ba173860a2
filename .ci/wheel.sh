#!/usr/bin/env bash
# CI for the package as a user receives it: build the sdist, and the wheel from that
# sdist (python -m build does both, in that order), install the wheel -- not editable --
# in a fresh virtual environment, then run `synkhronos --check` and the command line's
# tests (marked "cli") from a folder outside the checkout, so that they import the
# installed files. A module, data file or entry point missing from the sdist or the
# wheel fails here. Needs `build` and the test extra in the calling environment (the
# `dev` dependency group has build; its pytest lists the modules marked "cli", since the
# wheel's environment has no test extra to collect the whole suite with).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

rm -rf build/dist build/venv-wheel
mkdir -p build
python -m build --outdir build/dist . >build/wheel-build.log 2>&1 || {
    cat build/wheel-build.log; exit 1; }
sdists=(build/dist/synkhronos-*.tar.gz)
wheels=(build/dist/synkhronos-*.whl)
echo "built ${sdists[0]##*/} and ${wheels[0]##*/}"

python3 -m venv build/venv-wheel
venv=$root/build/venv-wheel
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "${wheels[0]}" pytest pytest-timeout

listing=$(bash .ci/marked_modules cli)
mapfile -t modules <<<"$listing"

outside=$(mktemp -d)
trap 'rm -rf "$outside"' EXIT
cp -r tests "$outside/tests"
cp pyproject.toml "$outside/"  # pytest's settings: the markers, the timeout
cd "$outside"
# the installed package, not the checkout
"$venv/bin/python" -c "
import synkhronos, sys
sys.exit(0 if synkhronos.__file__.startswith('$venv/') else
         f'imported {synkhronos.__file__}, not the wheel installed in $venv')"
"$venv/bin/synkhronos" --check
"$venv/bin/python" -m pytest -q -m cli "${modules[@]}"
