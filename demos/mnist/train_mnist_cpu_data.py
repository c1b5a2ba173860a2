"""Train an MLP on digits (or MNIST) on every core, with the data in shared memory.

The CPU-data pattern of the original Synkhronos demos: the whole training set is
written once into ``synk.data`` (operating-system shared memory every process
maps); each step passes the whole arrays and a shuffled list of row indices as
``batch``, and every process gathers its own share of those rows, in parallel.
``make_train_function`` builds the step: a gradient function, an all-reduce of one
flat gradient vector, and an update function (momentum here); it equals the same
rule run serially, however the rows split. Each epoch ends with a validation call
over the whole validation set, run in ``num_slices`` pieces per process, whose
outputs are reduced with ops "avg" (the loss, weighted by rows) and "sum" (the
count of correct answers).

The program is the serial PyTensor one with the lines marked ``# synk`` changed.
At the end it checks that every process holds the same parameters, that the
parallel validation equals the plain PyTensor function, and that the network
learned (``--min-accuracy``). A progress bar per epoch goes to stderr.

    python demos/mnist/train_mnist_cpu_data.py [--n-parallel N] [--epochs 10]
        [--batch-size 64] [--mnist PATH/mnist.npz]

Needs ``pip install -e .[demos]`` (scikit-learn for the digits, tqdm). On a 2-core
machine the default run (10 epochs of digits, 98% validation accuracy) takes about
45 s with a cold PyTensor compile cache (three Numba graphs: gradient, update,
validation) and 5 s with a warm one. An 8x8-pixel MLP is far too small to gain
from more processes: each step costs three round trips to the workers. Try
``--mnist`` with a larger ``--batch-size`` and ``--hidden`` to see scaling.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.extensions import make_train_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # demos/: layers.py, data.py
from data import load  # noqa: E402
from layers import correct, cross_entropy  # noqa: E402
from mlp import (  # noqa: E402
    build_mlp,
    check_result,
    minibatches,
    parse_args,
    progress,
    report_epoch,
)


def main() -> None:
    args = parse_args(__doc__)
    n = synk.fork(args.n_parallel)  # synk: one process per core, before building graphs
    rng = np.random.default_rng(args.seed)
    data = load(args.mnist)

    x, y = pt.matrix("x", dtype=data.x_train.dtype), pt.lvector("y")
    network, params = build_mlp(data.n_features, args.hidden, data.n_classes, rng)
    logits = network(x)
    loss, hits = cross_entropy(logits, y), correct(logits, y)
    train = make_train_function(loss, params, [x, y], "momentum",  # synk
                                learning_rate=args.learning_rate, momentum=0.9)
    validate = synk.function([x, y], [(loss, "avg"), (hits, "sum")], name="validate")  # synk
    synk.distribute()  # synk: ship both to the workers

    x_train, y_train = synk.data(data.x_train), synk.data(data.y_train)  # synk
    x_val, y_val = synk.data(data.x_val), synk.data(data.y_val)  # synk
    print(f"{data}; MLP {data.n_features}-{args.hidden}-{data.n_classes}, momentum, "
          f"batch {args.batch_size}, on {n} processes")

    train_time, samples = 0.0, 0
    for epoch in range(1, args.epochs + 1):
        batches = minibatches(len(x_train), args.batch_size, rng)
        start, losses = time.perf_counter(), []
        for batch in progress(batches, epoch, len(batches)):
            losses.append(train(x_train, y_train, batch=batch))  # synk: batch= indices
            if epoch == 1 and len(losses) == 1:  # the first step warms up every process
                start = time.perf_counter()
            else:
                samples += len(batch)
        train_time += time.perf_counter() - start
        val_loss, val_hits = validate(x_val, y_val, num_slices=args.val_slices)
        accuracy = val_hits / len(x_val)
        report_epoch(epoch, losses, val_loss, accuracy, time.perf_counter() - start)

    check_result(params, validate, x_val, y_val, val_loss, val_hits, accuracy,
                 args.min_accuracy, data.name)
    print(f"train_mnist_cpu_data passed on {n} processes: validation accuracy "
          f"{accuracy:.2%} after {args.epochs} epochs, {samples / train_time:,.0f} samples/s")
    synk.close()


if __name__ == "__main__":
    main()
