"""Train an MLP on digits (or MNIST) with the training set scattered once into every process.

The scattered-data pattern of the original Synkhronos demos (``train_mnist_gpu_data``):
the training set is held in shared variables ``x_train`` and ``y_train``, and
``synk.scatter`` gives each process its own block of rows, once. The gradient
function takes no inputs at all: it reads those variables, declared as
``sliceable_shareds``, and each call picks its rows inside each process with
``batch_s``, here a list of index arrays, one per process, so every process
shuffles its own rows. No training data moves after the scatter.

The step is built by hand from an update rule of ``synkhronos.extensions.updates``,
as the original did: the gradient function writes one flat gradient vector,
``synk.all_reduce`` averages it over the processes, and the apply function updates
the parameters (momentum here) identically everywhere. Every process takes the
same number of rows per step (``batch_size // n``), so the plain average over
processes is exactly the gradient of the whole minibatch. Validation is the same
as in ``train_mnist_cpu_data.py``: the whole validation set as an input, in
``num_slices`` pieces, reduced with "avg" and "sum".

At the end it checks that the scatter split the rows as documented, that every
process holds the same parameters, that the parallel validation equals the plain
PyTensor function, and that the network learned (``--min-accuracy``).

    python demos/mnist/train_mnist_scattered_data.py [--n-parallel N] [--epochs 10]
        [--batch-size 64] [--mnist PATH/mnist.npz]

Needs ``pip install -e .[demos]`` (scikit-learn for the digits, tqdm).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.extensions import updates

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # demos/: layers.py, data.py
from data import load  # noqa: E402
from layers import correct, cross_entropy  # noqa: E402
from mlp import build_mlp, check_result, parse_args, progress, report_epoch  # noqa: E402


def main() -> None:
    args = parse_args(__doc__)
    n = synk.fork(args.n_parallel)  # synk: one process per core, before building graphs
    rng = np.random.default_rng(args.seed)
    data = load(args.mnist)
    network, params = build_mlp(data.n_features, args.hidden, data.n_classes, rng)

    # The training set lives in shared variables; synk.scatter fills them below.
    x_train = pytensor.shared(data.x_train[:0], name="x_train")
    y_train = pytensor.shared(data.y_train[:0], name="y_train")
    train_loss = cross_entropy(network(x_train), y_train)
    grad_updates, param_updates, grad_shared = updates.momentum(
        train_loss, params, learning_rate=args.learning_rate, momentum=0.9)
    train_grad = synk.function([], train_loss, updates=grad_updates,  # synk
                               sliceable_shareds=[x_train, y_train], name="train_grad")
    train_apply = synk.function([], updates=param_updates, name="train_apply")  # synk

    x, y = pt.matrix("x", dtype=data.x_train.dtype), pt.lvector("y")
    logits = network(x)
    validate = synk.function([x, y], [(cross_entropy(logits, y), "avg"),  # synk
                                      (correct(logits, y), "sum")], name="validate")
    synk.distribute()  # synk: ship all three, and the shared variables, to the workers

    synk.scatter([x_train, y_train], [data.x_train, data.y_train])  # synk: once
    lengths = synk.get_lengths(x_train)  # synk: rows held by each process
    np.testing.assert_array_equal(synk.gather(x_train, nd_up=0), data.x_train)
    x_val, y_val = synk.data(data.x_val), synk.data(data.y_val)  # synk
    local = max(1, args.batch_size // n)  # rows per process per step
    steps = min(lengths) // local
    if steps == 0:
        raise SystemExit(f"--batch-size {args.batch_size} asks {local} rows of each process; "
                         f"the smallest holds {min(lengths)}")
    print(f"{data}; MLP {data.n_features}-{args.hidden}-{data.n_classes}, momentum; rows "
          f"per process {lengths}, {local} of them per step, on {n} processes")

    train_time, samples = 0.0, 0
    for epoch in range(1, args.epochs + 1):
        orders = [rng.permutation(length) for length in lengths]  # each process its own
        start, losses = time.perf_counter(), []
        for step in progress(range(steps), epoch, steps):
            batch_s = [order[step * local:(step + 1) * local] for order in orders]
            losses.append(train_grad(batch_s=batch_s))  # synk: one index array per process
            synk.all_reduce(grad_shared, op="avg")  # synk: equal rows, so the exact mean
            train_apply()  # synk
            if epoch == 1 and step == 0:  # the first step warms up every process
                start = time.perf_counter()
            else:
                samples += local * n
        train_time += time.perf_counter() - start
        val_loss, val_hits = validate(x_val, y_val, num_slices=args.val_slices)
        accuracy = val_hits / len(x_val)
        report_epoch(epoch, losses, val_loss, accuracy, time.perf_counter() - start)

    check_result(params, validate, x_val, y_val, val_loss, val_hits, accuracy,
                 args.min_accuracy, data.name)
    rate = samples / train_time if train_time > 0 else float("nan")
    print(f"train_mnist_scattered_data passed on {n} processes: validation accuracy "
          f"{accuracy:.2%} after {args.epochs} epochs, {rate:,.0f} samples/s")
    synk.close()


if __name__ == "__main__":
    main()
