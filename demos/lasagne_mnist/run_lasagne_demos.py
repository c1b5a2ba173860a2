"""Run the three MNIST programs with the same arguments and compare them; fail if any fails.

Runs ``train_mnist_pytensor.py`` (serial), ``train_mnist_cpu_data.py`` and
``train_mnist_gpu_data.py`` one after the other, each in its own Python process with
``[MODEL [BATCH_SIZE [EPOCHS]]]`` and the flags given here, reads the ``result:``
line each prints, and shows a table of their losses, accuracies and training times
(all steps but the first, which compiles; the speed-up is the serial program's time
over the parallel one's). Try larger batch sizes to see the speed-up grow, as with
the original.

It exits with status 1 if a program fails (each checks itself: equal parameters in
every process, validation equal to the plain PyTensor function, the accuracy floor),
or if a data-parallel result does not match the serial one:

- ``train_mnist_cpu_data`` with a model without dropout (``custom_mlp:D,W,0,0``) and
  a batch size that the processes divide takes the serial program's exact steps:
  its losses must equal the serial ones to ``--rtol`` (float32 rounding);
- otherwise dropout masks (drawn per process) or the scattered program's own
  minibatches make the runs differ by chance: the validation accuracy must be within
  ``--accuracy-margin`` of the serial one.

    python demos/lasagne_mnist/run_lasagne_demos.py [MODEL [BATCH_SIZE [EPOCHS]]]
        [--n-parallel N] [--seed 0] [--mnist PATH/mnist.npz] [--mode JAX] [--device gpu]
        [--quiet]

``--device gpu`` runs the data-parallel programs with ``synk.fork(device="gpu")`` and
all three with PyTensor's JAX backend (``SYNKHRONOS_GPU_PLATFORM=cpu`` in the
environment: on JAX's CPU platform, without a GPU).
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # demos/
from lasagne_mnist.common import has_dropout  # noqa: E402

SCRIPTS = ["train_mnist_pytensor", "train_mnist_cpu_data", "train_mnist_gpu_data"]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("model", nargs="?", default="mlp")
    parser.add_argument("batch_size", nargs="?", type=int, default=120)
    parser.add_argument("num_epochs", nargs="?", type=int, default=10)
    parser.add_argument("--n-parallel", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mnist", default=None)
    parser.add_argument("--mode", choices=["NUMBA", "JAX"], default=None)
    parser.add_argument("--device", choices=["cpu", "gpu"], default=None)
    parser.add_argument("--min-accuracy", type=float, default=None)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--rtol", type=float, default=1e-3,
                        help="losses of an exact run vs the serial one (default 1e-3)")
    parser.add_argument("--accuracy-margin", type=float, default=0.05,
                        help="accuracy of a run that differs by chance (default 0.05)")
    return parser.parse_args()


def launch(script, args):
    """Run one program; return its result dict (None if it failed) and wall seconds."""
    command = [sys.executable, str(HERE / f"{script}.py"), args.model, str(args.batch_size),
               str(args.num_epochs), "--seed", str(args.seed)]
    for flag in ("mnist", "mode", "min_accuracy", "device"):
        if getattr(args, flag) is not None:
            command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.quiet:
        command.append("--quiet")
    if script != "train_mnist_pytensor" and args.n_parallel is not None:
        command += ["--n-parallel", str(args.n_parallel)]
    print(f"\n$ {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    out, _ = process.communicate()
    seconds = time.perf_counter() - start
    sys.stdout.write(out)
    print(f"({script}: exit status {process.returncode}, pid {process.pid}, {seconds:.1f} s)")
    results = [line for line in out.splitlines() if line.startswith("result: ")]
    if process.returncode != 0 or not results:
        print(f"!! {script} failed")
        return None, seconds
    return json.loads(results[-1].removeprefix("result: ")), seconds


def compare(serial, result, exact, args):
    """Problems of ``result`` against the serial program's numbers (empty: it matches)."""
    problems = []
    if exact:
        for key in ("train_loss", "val_loss", "test_loss"):
            if abs(result[key] - serial[key]) > args.rtol * abs(serial[key]):
                problems.append(f"{key} {result[key]:.6f} vs serial {serial[key]:.6f} "
                                f"(rtol {args.rtol})")
    if abs(result["val_acc"] - serial["val_acc"]) > args.accuracy_margin + 1e-9:
        problems.append(f"validation accuracy {result['val_acc']:.2%} vs serial "
                        f"{serial['val_acc']:.2%} (margin {args.accuracy_margin:.0%})")
    return problems


def main():
    args = parse_args()
    runs = {script: launch(script, args) for script in SCRIPTS}
    print(f"\n{'program':<22}{'procs':>6}{'val loss':>10}{'val acc':>9}{'test acc':>9}"
          f"{'step s':>9}{'speed-up':>9}{'wall s':>8}  match")
    serial = runs["train_mnist_pytensor"][0]
    failed = [script for script, (result, _) in runs.items() if result is None]
    for script, (result, wall) in runs.items():
        if result is None:
            print(f"{script:<22}{'failed':>6}")
            continue
        verdict, problems = "(reference)", []
        if script != "train_mnist_pytensor" and serial is not None:
            exact = (script == "train_mnist_cpu_data" and not has_dropout(args.model)
                     and args.batch_size % result["n_parallel"] == 0)
            problems = compare(serial, result, exact, args)
            verdict = ("exact" if exact else "by accuracy") if not problems else "NO"
            if problems:
                failed.append(script)
        speedup = (serial["train_seconds"] / result["train_seconds"]
                   if serial is not None and result["train_seconds"] > 0 else float("nan"))
        print(f"{script:<22}{result['n_parallel']:>6}{result['val_loss']:>10.4f}"
              f"{result['val_acc']:>9.2%}{result['test_acc']:>9.2%}"
              f"{result['train_seconds']:>9.2f}{speedup:>9.2f}{wall:>8.1f}  {verdict}")
        for problem in problems:
            print(f"    {problem}")
    if failed:
        raise SystemExit(f"run_lasagne_demos: failed: {', '.join(failed)}")
    print("run_lasagne_demos passed: all three programs ran and the parallel ones match "
          "the serial one")


if __name__ == "__main__":
    main()
