"""What the three MNIST programs share: data, networks, minibatches, flags and reports.

Nothing here knows about synkhronos; it is the serial half of the programs, written
with the Lasagne-style module ``demos/lasagne_like`` (imported as ``lasagne``):

- :func:`build_network` makes one of three classifiers, chosen by name as in the
  original demos: ``"mlp"`` (dropout 20%, two dense layers of 800 rectifier units
  each with dropout 50%, softmax), ``"custom_mlp:DEPTH,WIDTH,DROP_IN,DROP_HID"``
  (the same with other sizes; ``custom_mlp:2,800,0,0`` has no dropout, so a
  data-parallel run can be compared number for number with the serial one), and
  ``"cnn"`` (two convolution + max-pool stages, a dense layer of 256 with dropout,
  softmax; 5x5 filters on MNIST's 28x28, 3x3 'same' filters on the digits' 8x8).
- :func:`iterate_minibatch_indices`: one epoch of (shuffled) index arrays, only full
  minibatches, drawn from ``numpy.random`` so that a program seeded with
  ``np.random.seed`` repeats its initial weights and its shuffles exactly.
- :func:`parse_args`, :func:`report_epoch`, :func:`report_result`: the command line
  and the printed lines (the last line is what ``run_lasagne_demos.py`` and the tests
  read: ``result: {...}`` with the final numbers as JSON); a progress bar over each
  epoch's minibatches (``--quiet``: none) and ``--plot PNG`` (the curves, and the
  result as JSON beside them) come from ``demos/progress.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # demos/
import lasagne_like as lasagne  # noqa: E402
from data import add_data_arguments, describe, load_dataset  # noqa: E402
from progress import Curves, add_progress_arguments, progress  # noqa: E402

__all__ = ["build_network", "iterate_minibatch_indices", "parse_args", "report_epoch",
           "report_result", "load_dataset", "describe", "lasagne", "Curves", "progress"]


def build_mlp(input_var, image_shape, depth=2, width=800, drop_input=0.2, drop_hidden=0.5):
    """Dense rectifier layers with dropout, and a softmax over the 10 classes."""
    network = lasagne.layers.InputLayer(shape=(None, *image_shape), input_var=input_var)
    if drop_input:
        network = lasagne.layers.DropoutLayer(network, p=drop_input)
    for _ in range(depth):
        network = lasagne.layers.DenseLayer(network, num_units=width,
                                            nonlinearity=lasagne.nonlinearities.rectify,
                                            W=lasagne.init.GlorotUniform())
        if drop_hidden:
            network = lasagne.layers.DropoutLayer(network, p=drop_hidden)
    return lasagne.layers.DenseLayer(network, num_units=10,
                                     nonlinearity=lasagne.nonlinearities.softmax)


def build_cnn(input_var, image_shape):
    """Two stages of 32 filters and 2x2 max pooling, then dense 256 and softmax."""
    small = image_shape[1] < 20  # the digits' 8x8: keep the size through each convolution
    filter_size, pad = (3, "same") if small else (5, 0)
    network = lasagne.layers.InputLayer(shape=(None, *image_shape), input_var=input_var)
    for _ in range(2):
        network = lasagne.layers.Conv2DLayer(network, num_filters=32, filter_size=filter_size,
                                             pad=pad,
                                             nonlinearity=lasagne.nonlinearities.rectify)
        network = lasagne.layers.MaxPool2DLayer(network, pool_size=(2, 2))
    network = lasagne.layers.DenseLayer(lasagne.layers.dropout(network, p=0.5), num_units=256,
                                        nonlinearity=lasagne.nonlinearities.rectify)
    return lasagne.layers.DenseLayer(lasagne.layers.dropout(network, p=0.5), num_units=10,
                                     nonlinearity=lasagne.nonlinearities.softmax)


def build_network(model, input_var, image_shape):
    """The classifier named ``model`` on images of ``image_shape`` (channels, h, w)."""
    if model == "mlp":
        return build_mlp(input_var, image_shape)
    if model.startswith("custom_mlp:"):
        try:
            depth, width, drop_in, drop_hid = model.split(":", 1)[1].split(",")
            sizes = int(depth), int(width), float(drop_in), float(drop_hid)
        except ValueError as exc:
            raise SystemExit(f"model {model!r}: expected custom_mlp:DEPTH,WIDTH,DROP_IN,"
                             "DROP_HID, e.g. custom_mlp:2,800,0.2,0.5") from exc
        return build_mlp(input_var, image_shape, *sizes)
    if model == "cnn":
        return build_cnn(input_var, image_shape)
    raise SystemExit(f"unknown model {model!r}: use mlp, custom_mlp:DEPTH,WIDTH,DROP_IN,"
                     "DROP_HID or cnn")


def build_objectives(model, input_var, target_var, image_shape):
    """The network named ``model`` and what the programs train and validate: the
    training loss (dropout on), the trainable parameters, and the test loss and
    accuracy (dropout off)."""
    network = build_network(model, input_var, image_shape)
    prediction = lasagne.layers.get_output(network)
    loss = lasagne.objectives.categorical_crossentropy(prediction, target_var).mean()
    params = lasagne.layers.get_all_params(network, trainable=True)
    test_prediction = lasagne.layers.get_output(network, deterministic=True)
    test_loss = lasagne.objectives.categorical_crossentropy(test_prediction, target_var).mean()
    test_acc = T.mean(T.eq(T.argmax(test_prediction, axis=1), target_var),
                      dtype=pytensor.config.floatX)
    return loss, params, test_loss, test_acc


def check_same_params(params):
    """Every process holds the master's values of ``params`` (the data-parallel demos)."""
    import synkhronos as synk

    for param, per_rank in zip(params, synk.gather(params), strict=True):
        for rank, value in enumerate(per_rank):
            np.testing.assert_array_equal(value, param.get_value(),
                                          err_msg=f"{param.name} differs in rank {rank}")


def has_dropout(model):
    """Whether ``model`` draws random dropout masks (so runs differ beyond rounding)."""
    if model.startswith("custom_mlp:"):
        return any(float(p) > 0 for p in model.split(":", 1)[1].split(",")[2:])
    return True


def iterate_minibatch_indices(data_len, batch_size, shuffle=False):
    """Index arrays (or slices, unshuffled) of ``batch_size`` rows; the remainder is dropped."""
    if shuffle:
        indices = np.arange(data_len)
        np.random.shuffle(indices)
    for start in range(0, data_len - batch_size + 1, batch_size):
        yield indices[start:start + batch_size] if shuffle else slice(start, start + batch_size)


def parse_args(doc, parallel=True):
    """``[MODEL [BATCH_SIZE [EPOCHS]]]`` as in the original, plus flags."""
    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="mlp",
                        help="mlp, custom_mlp:DEPTH,WIDTH,DROP_IN,DROP_HID or cnn (default mlp)")
    parser.add_argument("batch_size", nargs="?", type=int, default=120,
                        help="rows per training step, all processes together (default 120)")
    parser.add_argument("num_epochs", nargs="?", type=int, default=10,
                        help="passes over the training set (default 10)")
    if parallel:
        parser.add_argument("--n-parallel", type=int, default=None,
                            help="processes (default: one per usable core, or GPU)")
        parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                            help="synk.fork(device=...): gpu compiles with JAX (with "
                                 "SYNKHRONOS_GPU_PLATFORM=cpu, on JAX's CPU platform)")
    else:
        parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                            help="gpu: compile with JAX (the backend of device='gpu'), "
                                 "for comparison with the parallel programs")
    parser.add_argument("--seed", type=int, default=0,
                        help="numpy.random seed: initial weights, dropout seeds, shuffles")
    parser.add_argument("--learning-rate", type=float, default=0.05,
                        help="Nesterov momentum step (default 0.05; the original used 0.01 "
                             "on MNIST, which has ten times more steps per epoch)")
    parser.add_argument("--min-accuracy", type=float, default=0.9,
                        help="fail unless the final validation accuracy reaches this")
    parser.add_argument("--mode", choices=["NUMBA", "JAX"], default=None,
                        help="PyTensor backend (default: PyTensor's, Numba); JAX needs a "
                             "model without dropout (PyTensor cannot unpickle a JAX "
                             "function that holds a random generator)")
    add_data_arguments(parser)
    add_progress_arguments(parser)
    args = parser.parse_args()
    if args.device == "gpu":  # device="gpu" compiles with PyTensor's JAX backend
        if args.mode == "NUMBA":
            parser.error("--device gpu compiles with JAX: leave --mode out or pass JAX")
        args.mode = "JAX"
    return args


def report_epoch(epoch, num_epochs, seconds, train_loss, val_loss, val_acc, curves=None):
    """The epoch's lines; its numbers also go into ``curves`` (for ``--plot``)."""
    if curves is not None:
        curves.add(train_loss=train_loss, val_loss=val_loss, val_acc=val_acc, seconds=seconds)
    print(f"Epoch {epoch} of {num_epochs} took {seconds:.3f}s")
    print(f"  training loss:\t\t{train_loss:.6f}")
    print(f"  validation loss:\t\t{val_loss:.6f}")
    print(f"  validation accuracy:\t\t{val_acc * 100:.2f} %")


def report_result(script, n, args, train_loss, val_loss, val_acc, test_loss, test_acc,
                  seconds, curves=None):
    """The final numbers, as text and as one JSON line; exit 1 below ``--min-accuracy``.

    ``seconds``: the training steps but the first (which compiles the functions). With
    ``--plot``, ``curves`` and the result are written there (PNG and JSON).
    """
    print("Final results:")
    print(f"  test loss:\t\t\t{test_loss:.6f}")
    print(f"  test accuracy:\t\t{test_acc * 100:.2f} %")
    result = {"script": script, "n_parallel": n, "model": args.model,
              "batch_size": args.batch_size, "epochs": args.num_epochs,
              "train_loss": float(train_loss), "val_loss": float(val_loss),
              "val_acc": float(val_acc), "test_loss": float(test_loss),
              "test_acc": float(test_acc), "train_seconds": round(seconds, 3)}
    if args.plot is not None and curves is not None:
        png, record = curves.write(args.plot, result)
        print(f"wrote {png} and {record}")
    print("result: " + json.dumps(result))
    if val_acc < args.min_accuracy:
        raise SystemExit(f"{script}: validation accuracy {val_acc:.2%} is below "
                         f"--min-accuracy {args.min_accuracy:.0%}: the network did not learn")
