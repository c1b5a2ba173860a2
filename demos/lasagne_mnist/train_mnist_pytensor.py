"""Train a classifier on digits (or MNIST) in one process: the serial program the others match.

This is plain PyTensor with the Lasagne-style layers, as the original demo
``train_mnist_theano.py`` was plain Theano with Lasagne: build the network, one
training function with Nesterov-momentum updates, one validation function, and loop
over shuffled minibatches. ``train_mnist_cpu_data.py`` and ``train_mnist_gpu_data.py``
are this program with the synkhronos lines added; ``run_lasagne_demos.py`` runs all
three and compares their numbers.

Validation and test use every row (one call on the whole set), so their numbers
are the same quantity the data-parallel programs compute.

    python demos/lasagne_mnist/train_mnist_pytensor.py [MODEL [BATCH_SIZE [EPOCHS]]]
        [--seed 0] [--mnist PATH/mnist.npz] [--mode JAX] [--device gpu]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # demos/
from lasagne_mnist.common import (  # noqa: E402
    Curves,
    build_objectives,
    describe,
    iterate_minibatch_indices,
    lasagne,
    load_dataset,
    parse_args,
    progress,
    report_epoch,
    report_result,
)

pytensor.config.floatX = "float32"  # what THEANO_FLAGS=floatX=float32 did for the original


def main(args):
    X_train, y_train, X_val, y_val, X_test, y_test = load_dataset(args.mnist)
    print(describe(args.mnist, X_train, X_val, X_test))
    np.random.seed(args.seed)  # initial weights, dropout seeds and shuffles

    input_var = T.tensor4("inputs")
    target_var = T.ivector("targets")
    loss, params, test_loss, test_acc = build_objectives(args.model, input_var, target_var,
                                                         X_train.shape[1:])
    updates = lasagne.updates.nesterov_momentum(loss, params, learning_rate=args.learning_rate,
                                                momentum=0.9)

    train_fn = pytensor.function([input_var, target_var], loss, updates=updates, mode=args.mode)
    val_fn = pytensor.function([input_var, target_var], [test_loss, test_acc], mode=args.mode)

    print(f"Training {args.model}, batch {args.batch_size}, in one process...")
    train_time, steps = 0.0, 0  # seconds of all steps but the first (it compiles)
    curves = Curves("train_mnist_pytensor")
    for epoch in range(args.num_epochs):
        train_err, train_batches, start = 0.0, 0, time.perf_counter()
        minibatches = iterate_minibatch_indices(len(X_train), args.batch_size, shuffle=True)
        bar = f"epoch {epoch + 1}/{args.num_epochs}"
        for batch in progress(minibatches, len(X_train) // args.batch_size, args, bar):
            step_start = time.perf_counter()
            train_err += train_fn(X_train[batch], y_train[batch])
            train_batches += 1
            if steps:
                train_time += time.perf_counter() - step_start
            steps += 1
        val_err, val_acc = val_fn(X_val, y_val)
        report_epoch(epoch + 1, args.num_epochs, time.perf_counter() - start,
                     train_err / train_batches, val_err, val_acc, curves)

    test_err, test_acc = val_fn(X_test, y_test)
    report_result("train_mnist_pytensor", 1, args, train_err / train_batches, val_err, val_acc,
                  test_err, test_acc, train_time, curves)


if __name__ == "__main__":
    main(parse_args(__doc__, parallel=False))
