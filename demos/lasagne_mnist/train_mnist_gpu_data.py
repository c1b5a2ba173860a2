"""Train a classifier on digits (or MNIST) with the data scattered once into every process.

The original demo of this name kept the data sets in GPU memory, in Theano shared
variables; the pattern is the same on CPU processes and keeps the name (every
process holds its own block of rows in its own shared variables, and no data moves
after the scatter). The synkhronos lines are marked ``# synk``:

1. the training and validation sets go into shared variables (``s_input_train``...),
   which ``synk.scatter`` splits along their rows, each process keeping its block
   (the four values have different lengths; each is split on its own);
2. the training and validation functions take no inputs: ``givens`` puts the shared
   variables in place of the network's input and target variables, and
   ``sliceable_shareds`` declares them as data rows, subject to ``batch_s`` and to
   ``num_slices``;
3. each step passes ``batch_s=``, one shuffled array of local row indices that every
   process applies to its own block (so each step uses ``n * (batch_size // n)``
   rows, none of them copied between processes);
4. as in ``train_mnist_cpu_data.py``: a flat gradient, ``synk.all_reduce``, the same
   Nesterov update in every process; the test set is passed as an input.

Every process draws the same local indices, so a step's rows are not those of the
serial program's step: the runs are comparable in accuracy, not number for number
(``train_mnist_cpu_data.py`` is the one that follows the serial program exactly).

At the end it checks that the scatter split the rows as documented, that every
process holds the same parameters, and that the parallel validation on the
scattered rows equals the plain PyTensor function on the whole validation set; it
exits with status 1 if not, or if the accuracy stays below ``--min-accuracy``.

    python demos/lasagne_mnist/train_mnist_gpu_data.py [MODEL [BATCH_SIZE [EPOCHS]]]
        [--n-parallel N] [--seed 0] [--mnist PATH/mnist.npz] [--mode JAX] [--device gpu]
        [--quiet] [--plot run.png]

Needs ``pip install -e .[demos]`` (scikit-learn for the digits).
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


def check_result(params, scattered, val_fn, test_fn, X_val, y_val, val_err, val_acc):
    """Rows where they should be; same parameters everywhere; validation equals serial."""
    for var, value in scattered:
        np.testing.assert_array_equal(synk.gather(var, nd_up=0), value,  # synk
                                      err_msg=f"{var.name} does not hold the scattered rows")
    check_same_params(params)  # synk.gather of every parameter
    # test_fn is the same graph with inputs: its plain PyTensor function on all the rows
    want_err, want_acc = test_fn.as_pytensor(X_val, y_val)
    np.testing.assert_allclose(val_err, want_err, rtol=1e-5)
    np.testing.assert_allclose(val_acc, want_acc, rtol=1e-5)
    print("Checked: scattered rows, parameters equal in all processes, validation on the "
          "scattered rows equals the plain PyTensor function")


def main(args):
    X_train, y_train, X_val, y_val, X_test, y_test = load_dataset(args.mnist)
    print(describe(args.mnist, X_train, X_val, X_test))
    y_train, y_val = y_train.astype("int32"), y_val.astype("int32")  # shared vars: exact type
    n_parallel = synk.fork(args.n_parallel, device=args.device)  # synk: before any graph
    np.random.seed(args.seed)

    input_var = T.tensor4("inputs")
    target_var = T.ivector("targets")
    loss, params, test_loss, test_acc = build_objectives(args.model, input_var, target_var,
                                                         X_train.shape[1:])
    grad_updates, param_updates, grad_shared = updates.nesterov_momentum(  # synk
        loss, params, learning_rate=args.learning_rate, momentum=0.9)

    # Shared variables for the data; their first values only set dtype and ndim.
    s_input_train = pytensor.shared(X_train[:len(X_train) // n_parallel], name="s_input_train")
    s_target_train = pytensor.shared(y_train[:len(y_train) // n_parallel], name="s_target_train")
    s_input_val = pytensor.shared(X_val[:len(X_val) // n_parallel], name="s_input_val")
    s_target_val = pytensor.shared(y_val[:len(y_val) // n_parallel], name="s_target_val")

    train_grad_fn = synk.function(inputs=[], outputs=loss,  # synk
                                  givens=[(input_var, s_input_train),
                                          (target_var, s_target_train)],
                                  sliceable_shareds=[s_input_train, s_target_train],
                                  updates=grad_updates, mode=args.mode)
    train_update_fn = synk.function([], updates=param_updates, mode=args.mode)  # synk
    val_fn = synk.function(inputs=[], outputs=[test_loss, test_acc],  # synk
                           givens=[(input_var, s_input_val), (target_var, s_target_val)],
                           sliceable_shareds=[s_input_val, s_target_val], mode=args.mode)
    test_fn = synk.function([input_var, target_var], outputs=[test_loss, test_acc],  # synk
                            mode=args.mode)
    synk.distribute()  # synk: functions and shared variables to the workers

    scattered = [(s_input_train, X_train), (s_target_train, y_train),
                 (s_input_val, X_val), (s_target_val, y_val)]
    synk.scatter([var for var, _ in scattered], [value for _, value in scattered])  # synk
    lengths = synk.get_lengths(s_target_train)  # synk: rows each process holds
    worker_len = min(lengths)
    worker_batch_size = max(1, args.batch_size // n_parallel)
    X_test, y_test = test_fn.build_inputs(X_test, y_test)  # synk: shared memory

    print(f"Training {args.model}: rows per process {lengths}, {worker_batch_size} of them "
          f"per process per step, on {n_parallel} processes...")
    train_time, steps = 0.0, 0  # seconds of all steps but the first (it compiles)
    curves = Curves("train_mnist_gpu_data")
    for epoch in range(args.num_epochs):
        train_err, train_batches, start = 0.0, 0, time.perf_counter()
        minibatches = iterate_minibatch_indices(worker_len, worker_batch_size, shuffle=True)
        bar = f"epoch {epoch + 1}/{args.num_epochs}"
        for batch in progress(minibatches, worker_len // worker_batch_size, args, bar):
            step_start = time.perf_counter()
            train_err += train_grad_fn(batch_s=batch)  # synk: local rows, in every process
            synk.all_reduce(grad_shared, op="avg")  # synk
            train_update_fn()  # synk
            train_batches += 1
            if steps:
                train_time += time.perf_counter() - step_start
            steps += 1
        val_err, val_acc = val_fn(num_slices=4)  # synk: every process, all its rows
        report_epoch(epoch + 1, args.num_epochs, time.perf_counter() - start,
                     train_err / train_batches, val_err, val_acc, curves)

    check_result(params, scattered, val_fn, test_fn, X_val, y_val, val_err, val_acc)
    test_err, test_acc = test_fn(X_test, y_test, num_slices=4)  # synk
    report_result("train_mnist_gpu_data", n_parallel, args, train_err / train_batches,
                  val_err, val_acc, test_err, test_acc, train_time, curves)
    synk.close()


if __name__ == "__main__":
    main(parse_args(__doc__))
