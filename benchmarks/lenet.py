"""The Deep Learning Tutorials' LeNet trained serially and with synkhronos, side by side.

The model is the tutorial's, taken from ``demos/tutorials/convolutional_mlp_serial.py``
(two convolution and max-pooling layers of ``nkerns`` filters, a tanh layer of 500,
a logistic regression; float64 unless ``floatX`` says otherwise), trained by SGD on
minibatches sliced out of shared variables by ``givens``, as the tutorial does. An
"epoch" here is a fixed number of minibatches (``--minibatches``, of ``--batch-size``
rows, the tutorial's 500 by default) of generated images: the time of a step does not
depend on the pixels. Three peers, in interleaved rounds (their order rotating), one
thread per process:

- ``serial``: the serial program's ``train_model(i)``, a plain ``pytensor.function``
  in the master (which ``fork`` has held to one BLAS and Numba thread, as each worker
  is), its reshape written with the batch size as in the tutorial;
- ``synk``: the ported program's step, ``train_model(i)`` by ``synk.function`` (each
  process on its block of the minibatch) then ``synk.all_reduce(params)``: two
  commands;
- ``synk_steps``: the same call and all-reduce as one command
  (``synk.steps.run``), which saves one wake-up of the workers per step.

Before the rounds, one step of each from the same parameters is checked against the
serial step (costs, and the parameters after the all-reduce), and each peer runs one
untimed epoch (under Numba the first calls after the first still compiled, for over a
minute on a cold cache, in a trial on two cores). After the rounds, one more
epoch of each synkhronos peer runs inside ``synk.profile()``: where the time went
(``summary()`` for both, and ``per_rank()``, each rank's phases, for the step).

    python benchmarks/lenet.py [--backend c|numba] [--n-parallel 2] [--rounds 5]
        [--minibatches 10] [--batch-size 500] [--nkerns 20,50] [--out DIR]

``--backend c`` compiles with PyTensor's C backend (``Mode(linker="cvm")``), ``numba``
with PyTensor 3's default; Numba's first compilation of LeNet's gradient takes
minutes. Prints one JSON object (and writes it to ``--out``/lenet_<backend>.json):
seconds per epoch and per minibatch for each peer (medians over rounds, and each
round's), the ratio serial / synkhronos per round and its median, the compile times,
and the profile.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.mode import Mode, get_mode

import synkhronos as synk

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "demos" / "tutorials"))
import _harness  # noqa: E402
from convolutional_mlp_serial import LeNetConvPoolLayer  # noqa: E402
from logistic_sgd_serial import LogisticRegression  # noqa: E402
from mlp_serial import HiddenLayer  # noqa: E402

PEERS = ("serial", "synk", "synk_steps")
LEARNING_RATE = 0.1  # the tutorial's


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("c", "numba"), default="c")
    parser.add_argument("--n-parallel", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--minibatches", type=int, default=10,
                        help="minibatches in one timed epoch")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--nkerns", default="20,50",
                        help="the two convolution layers' numbers of filters")
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def lenet(x, y, batch, nkerns, rows_from_x):
    """The tutorial's LeNet on the rows ``x``: (cost, params). ``rows_from_x``: the
    ported program's reshape (``x.shape[0]``) rather than the serial one's (``batch``)."""
    rng = np.random.RandomState(23455)  # the tutorial's seed: equal initial parameters
    rows = x.shape[0] if rows_from_x else batch
    layer0 = LeNetConvPoolLayer(rng, input=x.reshape((rows, 1, 28, 28)),
                                image_shape=(batch, 1, 28, 28),
                                filter_shape=(nkerns[0], 1, 5, 5), poolsize=(2, 2))
    layer1 = LeNetConvPoolLayer(rng, input=layer0.output,
                                image_shape=(batch, nkerns[0], 12, 12),
                                filter_shape=(nkerns[1], nkerns[0], 5, 5), poolsize=(2, 2))
    layer2 = HiddenLayer(rng, input=layer1.output.flatten(2), n_in=nkerns[1] * 4 * 4,
                         n_out=500, activation=pt.tanh)
    layer3 = LogisticRegression(input=layer2.output, n_in=500, n_out=10)
    params = layer3.params + layer2.params + layer1.params + layer0.params
    return layer3.negative_log_likelihood(y), params


def training(make, data_x, data_y, batch, nkerns, rows_from_x, mode):
    """``(train_model, params)``: the tutorial's SGD step on minibatch ``index``."""
    index, x, y = pt.lscalar("index"), pt.matrix("x"), pt.ivector("y")
    cost, params = lenet(x, y, batch, nkerns, rows_from_x)
    grads = pytensor.grad(cost, params)
    updates = [(p, p - LEARNING_RATE * g) for p, g in zip(params, grads, strict=True)]
    labels = pt.cast(data_y, "int32")
    train_model = make([index], cost, updates=updates, mode=mode,
                       givens={x: data_x[index * batch:(index + 1) * batch],
                               y: labels[index * batch:(index + 1) * batch]})
    return train_model, params


def check_first_step(steps: dict, initial: list, serial_params, synk_params) -> dict:
    """One step of each peer from the ``initial`` parameters: its cost and the
    parameters after it (the master's, after the all-reduce) against the serial
    step's."""
    for param, value in zip(serial_params, initial, strict=True):
        param.set_value(value)
    costs = {"serial": float(steps["serial"](0))}
    want = [p.get_value() for p in serial_params]
    worst = 0.0
    for name in PEERS[1:]:
        synk.broadcast(synk_params, initial)  # every process from the same values
        costs[name] = float(steps[name](0))
        if not np.isclose(costs[name], costs["serial"], rtol=1e-9, atol=0):
            raise SystemExit(f"{name}'s first cost {costs[name]!r} is not the serial "
                             f"step's {costs['serial']!r}")
        for param, value in zip(synk_params, want, strict=True):
            scale = float(np.max(np.abs(value))) or 1.0
            worst = max(worst, float(np.max(np.abs(param.get_value() - value))) / scale)
    if worst > 1e-9:
        raise SystemExit(f"the parameters after one step differ from the serial step's by "
                         f"{worst:.3g} (relative to their largest entry)")
    return {"costs": costs, "max_param_difference_relative": worst}


def account(summary: dict, minibatches: int) -> dict:
    """A profiled epoch's time per minibatch, split: the function in the mean rank,
    the slowest rank's excess over it (imbalance), the all-reduce, and the rest (the
    master's staging and reduction, waking the workers and collecting their replies).
    Set beside the serial step divided by the processes, it says where the time
    beyond a perfect split goes."""
    total, function, slowest = summary["total"], summary["function"], summary["function_max"]
    # A step's all-reduce is inside the step; the port's is a command of its own.
    collective = summary["collective"]
    per = {"total": total, "function_mean_rank": function, "imbalance": slowest - function,
           "all_reduce": collective, "rest": total - slowest - collective}
    return {key: round(value / minibatches, 5) for key, value in per.items()}


def epoch(step, minibatches: int) -> float:
    """Seconds of one epoch: ``step(i)`` for each minibatch."""
    start = time.perf_counter()
    for i in range(minibatches):
        step(i)
    return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    nkerns = [int(k) for k in args.nkerns.split(",")]
    mode = Mode(linker="cvm", optimizer="fast_run") if args.backend == "c" else get_mode(
        "NUMBA")
    n = synk.fork(args.n_parallel)
    rng = np.random.default_rng(0)
    rows = args.minibatches * args.batch_size
    data_x = pytensor.shared(rng.uniform(size=(rows, 784)).astype(pytensor.config.floatX),
                             name="data_x")
    data_y = pytensor.shared(rng.integers(0, 10, size=rows).astype(pytensor.config.floatX),
                             name="data_y")

    compile_s = {}
    start = time.perf_counter()
    serial_train, serial_params = training(pytensor.function, data_x, data_y,
                                           args.batch_size, nkerns, False, mode)
    initial = [param.get_value().copy() for param in serial_params]
    serial_train(0)  # Numba compiles at the first call
    compile_s["serial"] = time.perf_counter() - start
    start = time.perf_counter()
    synk_train, synk_params = training(synk.function, data_x, data_y, args.batch_size,
                                       nkerns, True, mode)
    synk.distribute()
    synk_train(0)
    compile_s["synk"] = time.perf_counter() - start

    def synk_step(i):
        cost = synk_train(i)
        synk.all_reduce(synk_params)
        return cost

    def synk_steps_step(i):
        return synk.steps.run([synk.steps.call(synk_train, i),
                               synk.steps.all_reduce(synk_params)])[0]

    steps = {"serial": serial_train, "synk": synk_step, "synk_steps": synk_steps_step}
    check = check_first_step(steps, initial, serial_params, synk_params)

    for name in PEERS:  # untimed: Numba still compiles parts in the first few calls
        epoch(steps[name], args.minibatches)
    load_before = _harness.load()
    times: dict[str, list[float]] = {name: [] for name in PEERS}
    for r in range(args.rounds):
        order = PEERS[r % len(PEERS):] + PEERS[:r % len(PEERS)]
        for name in order:
            times[name].append(epoch(steps[name], args.minibatches))

    profiles = {}
    for name in ("synk", "synk_steps"):
        with synk.profile() as prof:
            epoch(steps[name], args.minibatches)
        summary = prof.summary()
        profiles[name] = {"summary": _harness.rounded(summary),
                          "account_per_minibatch_s": account(summary, args.minibatches)}
        if name == "synk_steps":
            profiles[name]["per_rank"] = [_harness.rounded(entry) for entry in prof.per_rank()]
    synk.close()

    peers, ratios = _harness.peers_per_epoch({name: times[name] for name in PEERS},
                                             args.minibatches)
    report = {"benchmark": "lenet", "backend": args.backend, "n_parallel": n,
              "batch_size": args.batch_size, "rows_per_process": args.batch_size / n,
              "minibatches_per_epoch": args.minibatches, "rounds": args.rounds,
              "nkerns": nkerns, "dtype": pytensor.config.floatX,
              "machine": _harness.machine(load_before=load_before),
              "versions": _harness.versions("pytensor", "numba", "numpy"),
              "compile_s": {k: round(v, 2) for k, v in compile_s.items()},
              "first_step_check": check, "peers": peers,
              "ratio_serial_over_synk": ratios, "profile": profiles}
    report["machine"]["load_after"] = _harness.load()
    print(json.dumps(report, indent=1, default=str))
    if args.out is not None:
        _harness.write_report(report, args.out, f"lenet_{args.backend}.json")


if __name__ == "__main__":
    main()
