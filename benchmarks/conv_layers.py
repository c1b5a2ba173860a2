"""Milliseconds per row of LeNet's convolution layers, forward and backward.

The two convolution layers of the Deep Learning Tutorials' LeNet, each timed as one
function that returns ``sum(out ** 2)`` and its gradients with respect to the
filters and the images (what a training step computes for the layer):

- ``lenet1``: 20 filters of 5x5 on 1x28x28 images;
- ``lenet2``: 50 filters of 5x5 on 20x12x12 images.

Peers, in interleaved rounds, one thread (BLAS and Numba):

- ``conv2d``: :func:`synkhronos.extensions.conv2d`, under PyTensor's default backend
  (Numba) and, where there is a C compiler, its C backend (``cvm``);
- ``convolve2d``: ``pytensor.tensor.signal.convolve2d(x[:, None], W[None],
  mode="valid").sum(axis=2)``, the same numbers, on fewer rows (it is slow);
- ``reference``: with ``--reference-demos DIR``, the ``Conv2DLayer`` of
  ``DIR/lasagne_like`` (say, an earlier revision's demos, checked out with
  ``git worktree add``, whose layer had its own im2col).

    python benchmarks/conv_layers.py [--rows 128] [--rounds 7] [--convolve2d-rows 8]
        [--reference-demos DIR] [--out DIR]

Prints one JSON object (and writes it to ``--out``/conv_layers.json): per peer, the
median milliseconds per row of CPU time (the process runs one thread, and its CPU
time is what other work on the machine disturbs least) and of wall time. Every
peer's results are checked against ``conv2d``'s first.
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
from pytensor.compile.mode import Mode

from synkhronos.extensions import conv2d

sys.path.insert(0, str(Path(__file__).parent))
import _harness  # noqa: E402

LAYERS = {"lenet1": (1, 28, 20), "lenet2": (20, 12, 50)}  # channels, image size, filters
SIZE = 5


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--convolve2d-rows", type=int, default=8,
                        help="rows for PyTensor's convolve2d (0: leave it out)")
    parser.add_argument("--reference-demos", type=Path, default=None,
                        help="a demos/ folder whose lasagne_like Conv2DLayer is timed too")
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def training_function(out, x, w, mode):
    loss = (out ** 2).sum()
    return pytensor.function([x], [loss, *pytensor.grad(loss, [w, x])], mode=mode)


def build_peers(args, channels, size, n_filters):
    """``{peer: (function, rows)}`` for one layer."""
    rng = np.random.default_rng(n_filters)
    w_val = rng.normal(size=(n_filters, channels, SIZE, SIZE)) * 0.1
    peers = {}

    def make(name, build, mode=None, rows=args.rows):
        x = pt.tensor4("x", dtype="float64")
        w = pytensor.shared(w_val, name="W", shape=w_val.shape)
        peers[name] = (training_function(build(x, w), x, w, mode), rows)

    make("conv2d_numba", lambda x, w: conv2d(x, w, input_shape=(None, channels, size, size)))
    if pytensor.config.cxx:
        make("conv2d_c", lambda x, w: conv2d(x, w, input_shape=(None, channels, size, size)),
             mode=Mode(linker="cvm", optimizer="fast_run"))
    if args.convolve2d_rows:
        from pytensor.tensor.signal import convolve2d

        make("convolve2d_numba",
             lambda x, w: convolve2d(x[:, None], w[None], mode="valid").sum(axis=2),
             rows=args.convolve2d_rows)
    if args.reference_demos is not None:
        sys.path.insert(0, str(args.reference_demos.resolve()))
        import lasagne_like

        def reference(x, w):
            layer = lasagne_like.layers.Conv2DLayer(
                lasagne_like.layers.InputLayer((None, channels, size, size), x), n_filters,
                SIZE, W=w, b=None, nonlinearity=None)
            return lasagne_like.layers.get_output(layer)

        make("reference_numba", reference)
    return peers


def main() -> None:
    args = parse_args()
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    import numba

    numba.set_num_threads(1)
    report = {"benchmark": "conv_layers", "rows": args.rows, "rounds": args.rounds,
              "filter_size": SIZE, "dtype": "float64",
              "reference_demos": None if args.reference_demos is None else str(
                  args.reference_demos),
              "machine": _harness.machine(),
              "versions": _harness.versions("pytensor", "numba", "numpy"), "layers": {}}
    for layer, (channels, size, n_filters) in LAYERS.items():
        peers = build_peers(args, channels, size, n_filters)
        data = np.random.default_rng(0).normal(size=(args.rows, channels, size, size))
        for name, (function, rows) in peers.items():  # compile, and check the numbers
            want = peers["conv2d_numba"][0](data[:rows])
            for got, expected in zip(function(data[:rows]), want, strict=True):
                np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9, err_msg=name)
        wall: dict[str, list[float]] = {name: [] for name in peers}
        cpu: dict[str, list[float]] = {name: [] for name in peers}
        for _ in range(args.rounds):
            for name, (function, rows) in peers.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                function(data[:rows])
                cpu[name].append((time.process_time() - start_cpu) / rows * 1e3)
                wall[name].append((time.perf_counter() - start) / rows * 1e3)
        # The CPU time of this one-thread process is what a busy machine disturbs least.
        summary = {name: {"rows": peers[name][1],
                          "cpu_ms_per_row_median": round(float(np.median(cpu[name])), 4),
                          "wall_ms_per_row_median": round(float(np.median(wall[name])), 4),
                          "cpu_ms_per_row_rounds": [round(v, 4) for v in cpu[name]]}
                   for name in peers}
        base = summary["conv2d_numba"]["cpu_ms_per_row_median"]
        for entry in summary.values():
            entry["cpu_relative_to_conv2d_numba"] = round(
                entry["cpu_ms_per_row_median"] / base, 2)
        report["layers"][layer] = {"channels": channels, "image": size,
                                   "filters": n_filters, "peers": summary}
    report["machine"]["load_after"] = _harness.load()
    print(json.dumps(report, indent=1))
    if args.out is not None:
        _harness.write_report(report, args.out, "conv_layers.json")


if __name__ == "__main__":
    main()
