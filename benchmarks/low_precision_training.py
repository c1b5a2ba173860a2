"""A training curve with the low-precision exchange: the digits MLP, exact against bf16 and fp16.

Usage::

    python benchmarks/low_precision_training.py [--n 2] [--epochs 12] [--batch 64]
        [--model custom_mlp:2,800,0,0] [--rule nesterov_momentum] [--learning-rate 0.01]
        [--seed 0] [--out benchmarks/results]

The network of ``demos/lasagne_mnist`` (by default two dense layers of 800 rectifier
units without dropout: 64-800-800-10, 0.7 M float32 parameters) on scikit-learn's 8x8
digits (1197 training, 300 validation, 300 test images), trained by
``make_train_function`` (Nesterov momentum 0.9, as the demo) once per exchange in one
session of ``--n`` processes: ``exact`` (``exchange=None``), ``bf16`` and ``fp16``.
Every variant starts from the same weights and sees the same shuffled minibatches, so
the curves differ by the rounding of the gradients alone.

Reported per variant: each epoch's mean training loss, validation loss and accuracy;
the final test loss and accuracy; the median step time (the variants take turns step
by step, in a new order every step, so that the machine's load falls on them alike);
and, against the exact run, the largest difference of the curves and of the final
parameters.

Prints the report as JSON and writes ``low_precision_training.json`` into ``--out``.
Needs scikit-learn (the ``demos`` extra).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "demos"))
import _harness  # noqa: E402

EXCHANGES = {"exact": None, "bf16": "bf16", "fp16": "fp16"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--model", default="custom_mlp:2,800,0,0")
    parser.add_argument("--rule", default="nesterov_momentum")
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()

    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk
    from synkhronos.extensions import make_train_function

    pytensor.config.floatX = "float32"
    from lasagne_mnist.common import build_objectives, load_dataset

    X_train, y_train, X_val, y_val, X_test, y_test = load_dataset(None)
    n = synk.fork(args.n)
    try:
        hyper = {"learning_rate": args.learning_rate}
        if args.rule in ("momentum", "nesterov_momentum"):
            hyper["momentum"] = 0.9
        runs = {}
        for name, exchange in EXCHANGES.items():
            np.random.seed(args.seed)  # the same initial weights for every variant
            x, y = pt.tensor4("inputs"), pt.ivector("targets")
            loss, params, test_loss, test_acc = build_objectives(args.model, x, y,
                                                                 X_train.shape[1:])
            train = make_train_function(loss, params, [x, y], args.rule, exchange=exchange,
                                        **hyper)
            check = synk.function([x, y], [test_loss, test_acc], name=f"check_{name}")
            runs[name] = {"train": train, "check": check, "params": params}
        synk.distribute()
        some_check = runs["exact"]["check"]
        data = {split: some_check.build_inputs(xs, ys) for split, (xs, ys) in
                {"train": (X_train, y_train), "val": (X_val, y_val),
                 "test": (X_test, y_test)}.items()}
        order = np.random.default_rng(args.seed)
        epochs = [[idx for idx in np.array_split(order.permutation(len(y_train)),
                                                 len(y_train) // args.batch)]
                  for _ in range(args.epochs)]
        # the variants take turns step by step (in a new order every step), so that a
        # change in the machine's load falls on their step times alike
        curves: dict = {name: [] for name in runs}
        step_times: dict = {name: [] for name in runs}
        turns = np.random.default_rng(args.seed + 1)
        for minibatches in epochs:
            losses: dict = {name: [] for name in runs}
            for idx in minibatches:
                for name in turns.permutation(list(runs)):
                    start = time.perf_counter()
                    losses[name].append(float(runs[name]["train"](*data["train"], batch=idx)))
                    step_times[name].append(time.perf_counter() - start)
            for name, run in runs.items():
                val_loss, val_acc = run["check"](*data["val"], num_slices=2)
                curves[name].append({"train_loss": float(np.mean(losses[name])),
                                     "val_loss": float(val_loss), "val_acc": float(val_acc)})
        report_runs: dict = {}
        finals: dict = {}  # each variant's parameters at the end (the master's)
        for name, run in runs.items():
            test_loss_value, test_acc_value = run["check"](*data["test"], num_slices=2)
            report_runs[name] = {
                "curve": curves[name], "test_loss": float(test_loss_value),
                "test_acc": float(test_acc_value),
                "step_median_ms": round(float(np.median(step_times[name][1:])) * 1e3, 3),
            }
            finals[name] = [np.array(p.get_value()) for p in run["params"]]
    finally:
        synk.close()

    exact = report_runs["exact"]["curve"]
    summary = {}
    for name, result in report_runs.items():
        last = result["curve"][-1]
        summary[name] = {"final_train_loss": last["train_loss"],
                         "final_val_loss": last["val_loss"], "final_val_acc": last["val_acc"],
                         "test_loss": result["test_loss"], "test_acc": result["test_acc"],
                         "step_median_ms": result["step_median_ms"]}
        if name != "exact":
            pairs = list(zip(result["curve"], exact, strict=True))
            summary[name].update(
                max_train_loss_diff=max(abs(a["train_loss"] - b["train_loss"])
                                        for a, b in pairs),
                max_val_acc_diff=max(abs(a["val_acc"] - b["val_acc"]) for a, b in pairs),
                params_max_abs_diff=max(float(np.abs(a - b).max()) for a, b in
                                        zip(finals[name], finals["exact"], strict=True)))
    report = {"benchmark": "low_precision_training", "n": n, "model": args.model,
              "rule": args.rule, "hyper": hyper, "batch": args.batch,
              "epochs": args.epochs, "steps": sum(len(e) for e in epochs),
              "machine": _harness.machine(), "summary": summary, "runs": report_runs}
    _harness.write_report(report, args.out, "low_precision_training.json")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
