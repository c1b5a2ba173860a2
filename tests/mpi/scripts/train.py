"""An Appendix-A-style training script, the same under mpiexec and on one machine.

``python train.py --out DIR --processes 4`` runs alone with 4 processes;
``mpiexec -n 2 python train.py --out DIR --processes 2`` runs 2 machines x 2 processes
(``--processes`` is per machine, as ``synk.fork``'s ``n_parallel``). A float32 MLP
trained with Adam (``make_train_function``, sharded), on ``synk.Data`` inputs and
shuffled minibatches of uneven sizes, then on numpy minibatches split by skewed
``shares``. The master writes the final parameters, the
losses, and every process's copy of the parameters into ``DIR/train.npz``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos import testing
from synkhronos.extensions import make_train_function


def mlp(hidden: int, inputs: int, classes: int):
    init = np.random.default_rng(1)
    params = [
        pytensor.shared(init.normal(0, 0.3, (inputs, hidden)).astype("float32"), name="W1"),
        pytensor.shared(np.zeros(hidden, "float32"), name="b1"),
        pytensor.shared(init.normal(0, 0.3, (hidden, classes)).astype("float32"), name="W2"),
        pytensor.shared(np.zeros(classes, "float32"), name="b2"),
    ]
    x, y = pt.fmatrix("x"), pt.lvector("y")
    hidden_layer = pt.tanh(x.dot(params[0]) + params[1])
    logits = hidden_layer.dot(params[2]) + params[3]
    logp = logits - pt.logsumexp(logits, axis=1, keepdims=True)
    loss = -logp[pt.arange(y.shape[0]), y].mean()
    return params, [x, y], loss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--reduction", default="fast", choices=["fast", "exact"])
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()

    n = synk.fork(args.processes, reduction=args.reduction)
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(500, 20)) * 3).astype("float32")
    Y = rng.integers(0, 4, size=500)
    params, inputs, loss = mlp(args.hidden, 20, 4)
    train = make_train_function(loss, params, inputs, "adam", learning_rate=0.01)
    x_data, y_data = synk.data(X), synk.data(Y)
    losses = []
    sizes = [61, 37, 90, 5, 3, 70]  # uneven, two shorter than the processes
    for step in range(args.steps):
        idx = rng.permutation(len(X))[: sizes[step % len(sizes)]]
        losses.append(float(train(x_data, y_data, batch=idx)))
    # numpy minibatches split by skewed shares: staged, each machine sent only the rows
    # its processes take (which the shares decide)
    shares = [1.0 + 2 * r for r in range(n)]
    for start, stop in ((0, 64), (100, 131), (200, 207)):
        losses.append(float(train(X[start:stop], Y[start:stop], shares=shares)))
    saved = {f"param{i}": p.get_value() for i, p in enumerate(params)}
    for i, p in enumerate(params):
        saved[f"ranks{i}"] = np.stack([synk.get_value(r, p) for r in range(n)])
    saved["losses"] = np.array(losses)
    np.savez(args.out / "train.npz", **saved)
    (args.out / "train.json").write_text(json.dumps({
        "n_parallel": n, "hosts": testing.rank_hosts(), "pids": testing.process_pids()}))
    synk.close()


if __name__ == "__main__":
    main()
