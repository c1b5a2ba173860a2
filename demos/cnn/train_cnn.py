"""Train a small convolutional network on digits (or MNIST) on every core, with JAX.

The network is conv 3x3 (im2col) -> relu -> max-pool 2 -> dense -> softmax, from
``demos/layers.py``. The step is the original Synkhronos recipe written out: an
update rule of ``synkhronos.extensions.updates`` (Adam here) gives a gradient
function that writes one flat gradient vector, ``synk.all_reduce`` averages it,
and an apply function updates the parameters identically in every process. Data
sit in ``synk.data``; each step passes a shuffled ``batch`` of row indices.
Validation runs the whole validation set in ``num_slices`` pieces per process.

Why JAX: the functions compile with ``mode="JAX"`` (a keyword argument that
``synk.function`` passes on to ``pytensor.function``) because PyTensor's default
backend, Numba, needs about a minute to compile this small network's gradient on
a cold cache (minutes for a deeper one), and this demo must start training
within a minute. Measured on a busy 2-core machine (digits, 16 filters, batch 64,
2 processes; ``--mode NUMBA`` runs the same demo on Numba):

===========  ===================================  ==========================
backend      first step after start (cold/warm)   steady training
===========  ===================================  ==========================
Numba        65 s / 9 s (gradient alone: 57 s)    ~100,000 samples/s
JAX          7-8 s / 8-10 s (no disk cache)       ~20,000-30,000 samples/s
===========  ===================================  ==========================

Numba steps faster on a network this small, but only after its compile has been
cached; JAX compiles in seconds every time, which is what a first run needs.

JAX compiles once per input shape, so two rules keep it to a few compilations:
the global batch is a multiple of ``n_parallel`` and the short last minibatch of
an epoch is dropped, so every process always gets the same number of rows (one
shape, and the plain average of the processes' gradients is exactly the
minibatch's gradient); images have static height, width and channels
(``pt.tensor4(shape=(None, h, w, 1))``), and every reshape takes its rows from
the input's own shape, which JAX sees as a concrete number (see
``demos/layers.py``). JAX must not run before ``synk.fork()``: a forked child of
a process that started JAX hangs, so fork comes first, as always.

It checks that every process holds the same parameters, that the parallel
validation equals the plain PyTensor function, and that the network learned.

    python demos/cnn/train_cnn.py [--n-parallel N] [--epochs 5] [--batch-size 64]
        [--filters 16] [--mnist PATH/mnist.npz] [--mode JAX|NUMBA]

Needs ``pip install -e .[demos]`` (jax, scikit-learn for the digits, tqdm).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.extensions import updates

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # demos/: layers.py, data.py
from data import add_data_arguments, load  # noqa: E402
from layers import Conv2D, Dense, correct, cross_entropy, flatten, max_pool, relu  # noqa: E402

try:
    from tqdm import tqdm
except ImportError as exc:
    raise SystemExit("the training demos need tqdm: pip install -e .[demos]") from exc

# JAX drops PyTensor's run-time broadcast checks (rows of x against rows of y) and
# says so once per function; the shapes here are right by construction.
warnings.filterwarnings("ignore", message="Skipping Assert", category=UserWarning)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-parallel", type=int, default=None,
                        help="processes (default: one per usable core)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64,
                        help="rows per step over all processes (rounded down to a "
                             "multiple of the number of processes)")
    parser.add_argument("--filters", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--val-slices", type=int, default=2)
    parser.add_argument("--min-accuracy", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", choices=["JAX", "NUMBA"], default="JAX",
                        help="PyTensor backend (NUMBA: no jax needed; a minute or more to "
                             "compile on a cold cache)")
    add_data_arguments(parser)
    return parser.parse_args()


def progress(items, epoch: int):
    """A progress bar on stderr for one epoch (stdout keeps the report)."""
    return tqdm(items, desc=f"epoch {epoch}", unit="step", file=sys.stderr, leave=False,
                dynamic_ncols=True)


def main() -> None:
    start = time.perf_counter()
    args = parse_args()
    if args.mode == "JAX" and importlib.util.find_spec("jax") is None:
        raise SystemExit("--mode JAX needs jax (pip install -e .[demos]); or use --mode NUMBA")
    n = synk.fork(args.n_parallel)  # synk: before building graphs, before any JAX
    rng = np.random.default_rng(args.seed)
    data = load(args.mnist, images=True)
    height, width, channels = data.image_shape

    x = pt.tensor4("x", dtype=data.x_train.dtype, shape=(None, height, width, channels))
    y = pt.lvector("y")
    conv = Conv2D(channels, args.filters, 3, rng)
    features = flatten(max_pool(relu(conv(x))))
    dense = Dense(features.type.shape[1], data.n_classes, rng, name="dense")
    logits = dense(features)
    params = conv.params + dense.params
    loss, hits = cross_entropy(logits, y), correct(logits, y)

    grad_updates, param_updates, grad_shared = updates.adam(
        loss, params, learning_rate=args.learning_rate)
    mode = args.mode  # passed on to pytensor.function
    train_grad = synk.function([x, y], loss, updates=grad_updates, mode=mode)  # synk
    train_apply = synk.function([], updates=param_updates, mode=mode)  # synk
    validate = synk.function([x, y], [(loss, "avg"), (hits, "sum")], mode=mode)  # synk
    synk.distribute()  # synk

    x_train, y_train = synk.data(data.x_train), synk.data(data.y_train)  # synk
    x_val, y_val = synk.data(data.x_val), synk.data(data.y_val)  # synk
    batch_size = max(n, args.batch_size // n * n)
    steps = len(x_train) // batch_size  # the short last minibatch is dropped
    print(f"{data}; CNN conv3x3x{args.filters}-relu-pool2-dense{data.n_classes}, Adam, "
          f"batch {batch_size}, {mode}, on {n} processes")

    # An untrained baseline. Calling with num_slices > 1 also builds and distributes
    # the sliced variant of validate now, while the shared values are still numpy
    # arrays: once JAX updates have made them JAX arrays, distributing a new function
    # fails in the workers (PyTensor's unpickler compares values with ==).
    val_loss, val_hits = validate(x_val, y_val, num_slices=args.val_slices)
    print(f"epoch   0: validation loss {val_loss:.4f}  accuracy {val_hits / len(x_val):.2%}")

    first_step = None
    train_time, samples = 0.0, 0
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(x_train))
        epoch_start, losses = time.perf_counter(), []
        for step in progress(range(steps), epoch):
            batch = order[step * batch_size:(step + 1) * batch_size]
            losses.append(train_grad(x_train, y_train, batch=batch))  # synk: batch= indices
            synk.all_reduce(grad_shared, op="avg")  # synk: even split, so the exact mean
            train_apply()  # synk
            if first_step is None:
                first_step = time.perf_counter() - start
            if epoch > 1:  # epoch 1 also compiles (JAX traces the first calls)
                samples += batch_size
        if epoch > 1:
            train_time += time.perf_counter() - epoch_start
        val_loss, val_hits = validate(x_val, y_val, num_slices=args.val_slices)
        accuracy = val_hits / len(x_val)
        print(f"epoch {epoch:>3}: train loss {np.mean(losses):.4f}  validation loss "
              f"{val_loss:.4f}  accuracy {accuracy:.2%}  "
              f"({time.perf_counter() - epoch_start:.1f} s)")

    per_rank = synk.gather(params)  # every process's copy, stacked by rank
    for param, stacked in zip(params, per_rank, strict=True):
        for rank in range(n):
            np.testing.assert_array_equal(stacked[rank], np.asarray(param.get_value()),
                                          err_msg=f"{param.name} differs in rank {rank}")
    want_loss, want_hits = validate.as_pytensor(x_val.data, y_val.data)
    np.testing.assert_allclose(val_loss, want_loss, rtol=1e-4)
    assert val_hits == want_hits, (val_hits, want_hits)
    if accuracy < args.min_accuracy:
        raise SystemExit(f"validation accuracy {accuracy:.2%} on {data.name} is below "
                         f"--min-accuracy {args.min_accuracy:.0%}: the network did not learn")
    rate = f"{samples / train_time:,.0f} samples/s" if train_time else "no timed epoch"
    print(f"train_cnn passed on {n} processes: validation accuracy {accuracy:.2%} after "
          f"{args.epochs} epochs; first step {first_step:.1f} s after start; {rate}")
    synk.close()


if __name__ == "__main__":
    main()
