#!/usr/bin/env bash
# CI for device="gpu" without a GPU: the tests marked "device" (tests/conftest.py marks
# the function, data, collective, steps, training, shares and checkpoint suites: SPEC
# sections 3-7) on the stand-in (SYNKHRONOS_GPU_PLATFORM=cpu: JAX's CPU platform in every process, collectives
# staged through shared memory), at n_parallel 1 and 3: 1 is the master alone, 3 has
# workers and splits rows unevenly; 2 adds nothing on the device the CPU suite does not
# test at every size (the split of rows is the library's, the same on both devices),
# and each size costs a pytest process per module that starts JAX.
#
# A master that ran JAX cannot fork again, so each (module, size) is its own pytest
# process (SYNKHRONOS_TEST_SIZES; .ci/marked_modules lists the modules); PYTENSOR_FLAGS=mode=JAX makes the tests' plain
# reference functions read device values too (tests/conftest.py). One JAX persistent
# compile cache, in a temporary directory removed at the end, lets the workers of a
# session (and later processes) reuse the compiles of the first. Prints each run's
# time and a total; any failing run fails the step, after all runs have been tried.
#
# Called from .ci/run inside its first virtual environment (jax comes with the test
# extra); `PYTHON=... bash .ci/gpu_standin.sh` picks another interpreter.
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python}"

listing=$(PYTHON="$python" bash .ci/marked_modules device) || exit 1
mapfile -t modules <<<"$listing"

cache="$(mktemp -d "${TMPDIR:-/tmp}/synk-jax-cache.XXXXXX")"
trap 'rm -rf "$cache"' EXIT
export SYNKHRONOS_TEST_DEVICE=gpu SYNKHRONOS_GPU_PLATFORM=cpu PYTENSOR_FLAGS=mode=JAX
export JAX_COMPILATION_CACHE_DIR="$cache" JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0

failed=()
timings=()
start_all=$SECONDS
for module in "${modules[@]}"; do
    for n in 1 3; do
        echo "== device=gpu stand-in: $module at n_parallel=$n"
        start=$SECONDS
        if SYNKHRONOS_TEST_SIZES=$n "$python" -m pytest -q -m device "$module"; then
            status=passed
        else
            status=FAILED
            failed+=("$module n=$n")
        fi
        timings+=("$(printf '%4d s  %-6s %s n=%d' $((SECONDS - start)) "$status" "$module" "$n")")
    done
done
echo "== device=gpu stand-in: timings"
printf '%s\n' "${timings[@]}"
echo "total $((SECONDS - start_all)) s"
if [ ${#failed[@]} -gt 0 ]; then
    printf 'FAILED on the stand-in: %s\n' "${failed[@]}" >&2
    exit 1
fi
