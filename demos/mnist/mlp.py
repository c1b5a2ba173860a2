"""What the two MNIST demos share: flags, the network, minibatches, and the report.

None of this knows about synkhronos: it is the serial half of the programs. The
network is a multi-layer perceptron (dense, relu, dense, log-softmax) built from
``demos/layers.py``; the data come from ``demos/data.py``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pytensor.tensor as pt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # demos/: layers.py, data.py

from data import add_data_arguments  # noqa: E402
from layers import Dense, params_of, relu  # noqa: E402

try:
    from tqdm import tqdm
except ImportError as exc:
    raise SystemExit("the training demos need tqdm: pip install -e .[demos]") from exc

__all__ = ["parse_args", "build_mlp", "minibatches", "progress", "check_accuracy"]


def parse_args(doc: str) -> argparse.Namespace:
    """The flags both demos take."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--n-parallel", type=int, default=None,
                        help="processes (default: one per usable core)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64,
                        help="rows per training step, over all processes together")
    parser.add_argument("--hidden", type=int, default=128, help="units of the hidden layer")
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--val-slices", type=int, default=4,
                        help="num_slices of the validation call (bounds its memory)")
    parser.add_argument("--min-accuracy", type=float, default=0.9,
                        help="fail unless the last validation accuracy reaches this")
    parser.add_argument("--seed", type=int, default=0)
    add_data_arguments(parser)
    return parser.parse_args()


def build_mlp(n_in: int, n_hidden: int, n_classes: int, rng: np.random.Generator
              ) -> tuple[Callable[[pt.TensorVariable], pt.TensorVariable], list]:
    """The network ``x -> logits = dense(relu(dense(x)))`` and its parameters.

    The network is a function, so the same parameters can serve several inputs (a
    training set held in a shared variable and a validation input, say).
    """
    hidden = Dense(n_in, n_hidden, rng, name="hidden")
    output = Dense(n_hidden, n_classes, rng, name="output")

    def network(x: pt.TensorVariable) -> pt.TensorVariable:
        return output(relu(hidden(x)))

    return network, params_of(hidden, output)


def minibatches(n_rows: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch of shuffled row indices, ``batch_size`` at a time (the last may be short)."""
    order = rng.permutation(n_rows)
    return [order[start:start + batch_size] for start in range(0, n_rows, batch_size)]


def progress(items: Iterable, epoch: int, total: int) -> Iterator:
    """A progress bar on stderr for one epoch (stdout keeps the report)."""
    return iter(tqdm(items, desc=f"epoch {epoch}", total=total, unit="step", file=sys.stderr,
                     leave=False, dynamic_ncols=True))


def check_accuracy(accuracy: float, minimum: float, dataset: str) -> None:
    """Fail (exit status 1) unless the network learned."""
    if accuracy < minimum:
        raise SystemExit(f"validation accuracy {accuracy:.2%} on {dataset} is below "
                         f"--min-accuracy {minimum:.0%}: the network did not learn")


def report_epoch(epoch: int, losses: list, val_loss: float, accuracy: float,
                 seconds: float) -> None:
    print(f"epoch {epoch:>3}: train loss {np.mean(losses):.4f}  validation loss "
          f"{val_loss:.4f}  accuracy {accuracy:.2%}  ({seconds:.1f} s)")


def check_result(params: list, validate, x_val, y_val, val_loss: float, val_hits: float,
                 accuracy: float, minimum: float, dataset: str) -> None:
    """Every process holds the master's parameters; parallel validation equals serial."""
    import synkhronos as synk

    per_rank = synk.gather(params)  # every process's copy, stacked by rank
    for param, stacked in zip(params, per_rank, strict=True):
        for rank in range(len(stacked)):
            np.testing.assert_array_equal(stacked[rank], param.get_value(),
                                          err_msg=f"{param.name} differs in rank {rank}")
    want_loss, want_hits = validate.as_pytensor(x_val.data, y_val.data)
    np.testing.assert_allclose(val_loss, want_loss, rtol=1e-4)
    assert val_hits == want_hits, (val_hits, want_hits)
    check_accuracy(accuracy, minimum, dataset)
