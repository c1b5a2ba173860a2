"""Train a classifier on digits (or MNIST) on every core: data in shared memory, shuffled ``batch``.

``train_mnist_pytensor.py`` with the synkhronos lines added (marked ``# synk``), as
the original demo of the same name:

1. ``synk.fork()`` before any graph is built;
2. the update rule comes from ``synkhronos.extensions.updates`` and is split in two
   functions: ``train_grad_fn`` writes each process's gradient into one flat shared
   vector, ``synk.all_reduce`` averages it over the processes, and
   ``train_update_fn`` applies Nesterov momentum identically everywhere;
3. ``synk.distribute()`` ships the functions to the workers;
4. the data sets go into OS shared memory once (``val_fn.build_inputs``: the uint8
   labels are cast to the int32 targets, a safe cast);
5. each step passes the whole training set and ``batch=`` a shuffled index array:
   each process copies its own share of those rows out of shared memory itself;
6. validation and test pass the whole set at once, each process running its rows in
   ``num_slices=4`` pieces (a bound on memory); ``"avg"`` outputs are weighted by
   rows, so the numbers are those of one call on all rows.

The all-reduce averages the processes' gradients with equal weights, which is the
minibatch's gradient when every process has the same number of rows: the minibatch
size is rounded down to a multiple of the number of processes (and said so).
Seeded like the serial program (``--seed``), a model without dropout
(``custom_mlp:2,800,0,0``) follows it step for step, to float32 rounding; dropout
masks are drawn per process, so with dropout the runs differ by chance only.

At the end it checks that every process holds the same parameters and that the
parallel validation equals the plain PyTensor function on the same rows; it exits
with status 1 if not, or if the accuracy stays below ``--min-accuracy``.

    python demos/lasagne_mnist/train_mnist_cpu_data.py [MODEL [BATCH_SIZE [EPOCHS]]]
        [--n-parallel N] [--seed 0] [--mnist PATH/mnist.npz] [--mode JAX] [--device gpu]
        [--quiet] [--plot run.png]

Needs ``pip install -e .[demos]`` (scikit-learn for the digits, tqdm for the progress
bar, matplotlib for ``--plot``).
"""

import sys
import time
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as T

import synkhronos as synk
from synkhronos.extensions import updates

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # demos/
from lasagne_mnist.common import (  # noqa: E402
    Curves,
    build_objectives,
    check_same_params,
    describe,
    iterate_minibatch_indices,
    load_dataset,
    parse_args,
    progress,
    report_epoch,
    report_result,
)

pytensor.config.floatX = "float32"  # what THEANO_FLAGS=floatX=float32 did for the original


def check_result(params, val_fn, X_val, y_val, val_err, val_acc):
    """Same parameters in every process; the parallel validation equals the plain one."""
    check_same_params(params)  # synk.gather of every parameter
    want_err, want_acc = val_fn.as_pytensor(X_val.data, y_val.data)  # the master alone
    np.testing.assert_allclose(val_err, want_err, rtol=1e-5)
    np.testing.assert_allclose(val_acc, want_acc, rtol=1e-5)
    print("Checked: parameters equal in all processes; validation equals the plain "
          "PyTensor function")


def main(args):
    X_train, y_train, X_val, y_val, X_test, y_test = load_dataset(args.mnist)
    print(describe(args.mnist, X_train, X_val, X_test))
    n_parallel = synk.fork(args.n_parallel, device=args.device)  # synk: before any graph
    np.random.seed(args.seed)  # initial weights, dropout seeds and shuffles

    input_var = T.tensor4("inputs")
    target_var = T.ivector("targets")
    loss, params, test_loss, test_acc = build_objectives(args.model, input_var, target_var,
                                                         X_train.shape[1:])
    grad_updates, param_updates, grad_shared = updates.nesterov_momentum(  # synk
        loss, params, learning_rate=args.learning_rate, momentum=0.9)

    train_grad_fn = synk.function([input_var, target_var], outputs=loss,  # synk
                                  updates=grad_updates, mode=args.mode)
    train_update_fn = synk.function([], updates=param_updates, mode=args.mode)  # synk
    val_fn = synk.function([input_var, target_var], outputs=[test_loss, test_acc],  # synk
                           mode=args.mode)
    synk.distribute()  # synk: the workers get all three functions

    X_train, y_train = val_fn.build_inputs(X_train, y_train)  # synk: shared memory
    X_val, y_val = val_fn.build_inputs(X_val, y_val)  # synk
    X_test, y_test = val_fn.build_inputs(X_test, y_test)  # synk

    batch_size = max(n_parallel, args.batch_size // n_parallel * n_parallel)
    if batch_size != args.batch_size:
        print(f"(batch size {args.batch_size} -> {batch_size}, a multiple of {n_parallel} "
              "processes, so the averaged gradient is the minibatch's)")
    print(f"Training {args.model}, batch {batch_size}, on {n_parallel} processes...")
    train_time, steps = 0.0, 0  # seconds of all steps but the first (it compiles)
    curves = Curves("train_mnist_cpu_data")
    for epoch in range(args.num_epochs):
        train_err, train_batches, start = 0.0, 0, time.perf_counter()
        minibatches = iterate_minibatch_indices(len(y_train), batch_size, shuffle=True)
        bar = f"epoch {epoch + 1}/{args.num_epochs}"
        for batch in progress(minibatches, len(y_train) // batch_size, args, bar):
            step_start = time.perf_counter()
            train_err += train_grad_fn(X_train, y_train, batch=batch)  # synk: rows by index
            synk.all_reduce(grad_shared, op="avg")  # synk: the mean gradient, everywhere
            train_update_fn()  # synk: the same update in every process
            train_batches += 1
            if steps:
                train_time += time.perf_counter() - step_start
            steps += 1
        val_err, val_acc = val_fn(X_val, y_val, num_slices=4)  # synk: whole set, sliced
        report_epoch(epoch + 1, args.num_epochs, time.perf_counter() - start,
                     train_err / train_batches, val_err, val_acc, curves)

    check_result(params, val_fn, X_val, y_val, val_err, val_acc)
    test_err, test_acc = val_fn(X_test, y_test, num_slices=4)  # synk
    report_result("train_mnist_cpu_data", n_parallel, args, train_err / train_batches,
                  val_err, val_acc, test_err, test_acc, train_time, curves)
    synk.close()  # synk (also runs at exit)


if __name__ == "__main__":
    main(parse_args(__doc__))
