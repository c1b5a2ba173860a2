"""The Deep Learning Tutorials' LSTM trained serially and with synkhronos, side by side.

The model and its ADADELTA are the ports', taken from
``demos/tutorials/lstm_serial.py`` (plain ``pytensor.function``) and
``demos/tutorials/lstm.py`` (``synk.function``, the minibatches scattered along their
sequence axis with ``in_axes``): word embeddings of ``--dim-proj`` (the tutorial's 128),
an LSTM by ``scan``, mean pooling, a softmax; float64 unless ``floatX`` says
otherwise; no dropout. An "epoch" here is a fixed number of training minibatches
(``--minibatches``, of ``--batch-size`` sequences, the tutorial's 16) of the synthetic
IMDB (``demos/tutorials/lstm_data.py``), drawn as the tutorial draws them (shuffled,
padded to their longest sequence: about 57 steps) and prepared once; each call gets
the numpy arrays, as the tutorial passes them (synkhronos copies them into shared
memory). Three peers, in interleaved rounds (their order rotating), one thread per
process:

- ``serial``: the serial program's update, ``f_grad_shared(x, mask, y)`` then
  ``f_update(lrate, n)``, in the master (which ``fork`` has held to one BLAS and
  Numba thread, as each worker is);
- ``synk``: the ported program's update: ``f_grad_shared`` (each process on its
  sequences), ``synk.all_reduce(gshared, op="sum")``, ``f_update``: three commands;
- ``synk_steps``: the same three as one command (``synk.steps.run``).

Before the rounds, one update of each synkhronos peer is checked against the serial
update from the same state (the cost, and the parameters after it), and each peer
runs one untimed epoch (Numba compiles at the first calls). After the rounds, one
more epoch of each synkhronos peer runs inside ``synk.profile()``: where the time
went.

    python benchmarks/lstm.py [--backend numba|c] [--n-parallel 2] [--rounds 5]
        [--minibatches 20] [--batch-size 16] [--dim-proj 128] [--out DIR]

``--backend numba`` compiles with PyTensor 3's default, ``c`` with its C backend
(``linker=cvm``, set before ``fork`` so that the workers compile alike). Prints one
JSON object (and writes it to ``--out``/lstm_<backend>.json): seconds per epoch and
per minibatch for each peer (medians over rounds, and each round's), the ratio
serial / synkhronos per round and its median, the compile times, and the profile.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk

TUTORIALS = Path(__file__).resolve().parents[1] / "demos" / "tutorials"
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(TUTORIALS))  # lstm_data, for the ports
import _harness  # noqa: E402
from lstm_data import N_WORDS, load_data, prepare_data  # noqa: E402

PEERS = ("serial", "synk", "synk_steps")
LRATE = 0.0001  # the tutorial's (unused by ADADELTA)
SEED = 123


def port(name: str):
    """``demos/tutorials/<name>.py`` as a module (under a name of its own: this
    script is ``lstm.py`` too)."""
    spec = importlib.util.spec_from_file_location(f"{name}_port", TUTORIALS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("numba", "c"), default="numba")
    parser.add_argument("--n-parallel", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--minibatches", type=int, default=20,
                        help="minibatches in one timed epoch")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dim-proj", type=int, default=128)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def training(module, dim_proj: int):
    """``(tparams, f_grad_shared, f_update, gshared)`` of the program ``module``, from
    the tutorial's seed (the two programs start from equal parameters)."""
    np.random.seed(SEED)
    options = dict(dim_proj=dim_proj, n_words=N_WORDS, use_dropout=False, ydim=2)
    tparams = module.init_tparams(module.init_params(options))
    _, x, mask, y, _, _, cost, noise_updates = module.build_model(tparams, options)
    grads = pt.grad(cost * x.shape[1], wrt=list(tparams.values()))
    lr, n_rows = pt.scalar(name="lr"), pt.scalar(name="n_rows")
    f_grad_shared, f_update, gshared = module.adadelta(lr, n_rows, tparams, grads, x, mask,
                                                       y, cost, noise_updates)
    return tparams, f_grad_shared, f_update, gshared


def minibatches(count: int, batch_size: int) -> list[tuple]:
    """``count`` training minibatches as the tutorial draws them: ``(x, mask, y)``."""
    np.random.seed(SEED)
    train, _, _ = load_data()
    order = np.random.permutation(len(train[0]))
    batches = []
    for i in range(count):
        index = order[(i * batch_size) % len(order):][:batch_size]
        batches.append(prepare_data([train[0][t] for t in index],
                                    [train[1][t] for t in index]))
    return batches


def check_steps(steps: dict, batches: list, serial_params, synk_params) -> dict:
    """``synk``'s update on minibatch 0 and ``synk_steps``' on minibatch 1, each beside
    the serial update on the same minibatch from the same state: the costs and the
    parameters after them (the master's)."""
    costs: dict[str, list[float]] = {name: [] for name in PEERS}
    worst = 0.0
    for batch, name in zip(batches[:2], PEERS[1:], strict=True):
        costs["serial"].append(float(steps["serial"](batch)))
        costs[name].append(float(steps[name](batch)))
        if not np.isclose(costs[name][-1], costs["serial"][-1], rtol=1e-9, atol=0):
            raise SystemExit(f"{name}'s cost {costs[name][-1]!r} is not the serial "
                             f"update's {costs['serial'][-1]!r}")
        for mine, theirs in zip(synk_params.values(), serial_params.values(), strict=True):
            value = theirs.get_value()
            scale = float(np.max(np.abs(value))) or 1.0
            worst = max(worst, float(np.max(np.abs(mine.get_value() - value))) / scale)
    if worst > 1e-9:
        raise SystemExit(f"the parameters after an update differ from the serial update's "
                         f"by {worst:.3g} (relative to their largest entry)")
    return {"costs": costs, "max_param_difference_relative": worst}


def epoch(step, batches: list) -> float:
    """Seconds of one epoch: ``step(batch)`` for each minibatch."""
    start = time.perf_counter()
    for batch in batches:
        step(batch)
    return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    if args.backend == "c":
        pytensor.config.linker = "cvm"  # before fork: the workers compile alike
    n = synk.fork(args.n_parallel)
    serial, parallel = port("lstm_serial"), port("lstm")
    batches = minibatches(args.minibatches, args.batch_size)

    compile_s = {}
    start = time.perf_counter()
    serial_params, serial_grad, serial_update, _ = training(serial, args.dim_proj)
    serial_grad(*batches[0])  # Numba compiles at the first call (it stores a gradient only)
    compile_s["serial"] = time.perf_counter() - start
    start = time.perf_counter()
    synk_params, synk_grad, synk_update, gshared = training(parallel, args.dim_proj)
    synk.distribute()
    synk_grad(*batches[0])
    compile_s["synk"] = time.perf_counter() - start

    def serial_step(batch):
        cost = serial_grad(*batch)
        serial_update(LRATE, batch[0].shape[1])
        return cost

    def synk_step(batch):
        cost = synk_grad(*batch)
        synk.all_reduce(gshared, op="sum")
        synk_update(LRATE, batch[0].shape[1])
        return cost

    def synk_steps_step(batch):
        return synk.steps.run([synk.steps.call(synk_grad, *batch),
                               synk.steps.all_reduce(gshared, op="sum"),
                               synk.steps.call(synk_update, LRATE, batch[0].shape[1])])[0]

    steps = {"serial": serial_step, "synk": synk_step, "synk_steps": synk_steps_step}
    check = check_steps(steps, batches, serial_params, synk_params)

    for name in PEERS:  # untimed: the first calls of each shape of input
        epoch(steps[name], batches)
    load_before = _harness.load()
    times: dict[str, list[float]] = {name: [] for name in PEERS}
    for r in range(args.rounds):
        order = PEERS[r % len(PEERS):] + PEERS[:r % len(PEERS)]
        for name in order:
            times[name].append(epoch(steps[name], batches))

    profiles = {}
    for name in ("synk", "synk_steps"):
        with synk.profile() as prof:
            epoch(steps[name], batches)
        profiles[name] = {"summary": _harness.rounded(prof.summary())}
        if name == "synk_steps":
            profiles[name]["per_rank"] = [_harness.rounded(entry) for entry in prof.per_rank()]
    synk.close()

    peers, ratios = _harness.peers_per_epoch({name: times[name] for name in PEERS},
                                             args.minibatches)
    steps_per_batch = [int(batch[0].shape[0]) for batch in batches]
    report = {"benchmark": "lstm", "backend": args.backend, "n_parallel": n,
              "batch_size": args.batch_size, "sequences_per_process": args.batch_size / n,
              "time_steps_median": float(np.median(steps_per_batch)),
              "minibatches_per_epoch": args.minibatches, "rounds": args.rounds,
              "dim_proj": args.dim_proj, "n_words": N_WORDS,
              "dtype": pytensor.config.floatX,
              "machine": _harness.machine(load_before=load_before),
              "versions": _harness.versions("pytensor", "numba", "numpy"),
              "compile_s": {k: round(v, 2) for k, v in compile_s.items()},
              "first_step_check": check, "peers": peers,
              "ratio_serial_over_synk": ratios, "profile": profiles}
    report["machine"]["load_after"] = _harness.load()
    print(json.dumps(report, indent=1, default=str))
    if args.out is not None:
        _harness.write_report(report, args.out, f"lstm_{args.backend}.json")


if __name__ == "__main__":
    main()
