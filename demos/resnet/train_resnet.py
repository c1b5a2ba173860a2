"""Train a ResNet on digits (or MNIST) on every core, with PyTensor's JAX backend.

The original demo of this name trained ResNet-50 on several GPUs; this one trains a
small bottleneck ResNet (one block per stage, widths 8 to 64, the digits upscaled to
32x32) on CPU processes, and ``--resnet50`` builds the full ResNet-50 (see
``common.py``). The synkhronos lines are marked ``# synk``:

1. ``synk.fork()`` first, before any graph and before JAX starts (a process forked
   from one that runs JAX hangs);
2. the update rule from ``synkhronos.extensions.updates`` gives a gradient function
   and an apply function; each step passes the whole training set in shared memory
   (``synk.data``) with ``batch=`` a shuffled index array, all-reduces the flat
   gradient, and applies the update in every process;
3. batch normalization normalizes each process's rows by their own statistics and
   updates each process's own running averages (Lasagne's default updates); before
   validating, ``synk.all_reduce`` averages those running averages over the
   processes, so every process validates with the same network;
4. validation passes the whole validation set, each process running its rows in
   ``num_slices`` pieces.

Why JAX (``mode="JAX"``, passed through ``synk.function`` to ``pytensor.function``):
Numba, PyTensor's default backend, compiles each function on first use, and a
ResNet's gradient takes it many minutes on two cores (about 17 minutes measured for
a network of this demo's depth); JAX compiles it in tens of seconds. JAX compiles
once per input shape, so the minibatch is the same for every process and every
step (``--batch-size`` rows per process; the short last minibatch is dropped).

Every process gets the same rows per step, so the averaged gradient is that of the
whole minibatch; what differs from the serial program (``train_resnet_pytensor.py``)
is only batch normalization, which sees each process's rows apart.

At the end it checks that every process holds the same parameters and running
averages and that the parallel validation equals the plain PyTensor function on
the whole validation set, and exits with status 1 if not (or if the accuracy stays
below ``--min-accuracy``).

    python demos/resnet/train_resnet.py [--n-parallel N] [--epochs 3] [--batch-size 32]
        [--max-steps S] [--resnet50] [--mode JAX|NUMBA] [--mnist PATH/mnist.npz]
        [--quiet] [--plot run.png] [--device gpu]

``--device gpu`` forks with ``synk.fork(device="gpu")``: one process per GPU, the
parameters and gradients on the GPUs (JAX), collectives on the device buffers; with
``SYNKHRONOS_GPU_PLATFORM=cpu`` in the environment it runs the same path on JAX's CPU
platform, without a GPU.

Needs ``pip install -e .[demos]`` (jax, scikit-learn for the digits, tqdm for the
progress bar, matplotlib for ``--plot``).
"""

import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytensor

import synkhronos as synk
from synkhronos.extensions import updates

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # demos/
from resnet.common import (  # noqa: E402
    Curves,
    build_resnet,
    epoch_steps,
    iter_mb_idxs,
    lasagne,
    load_images,
    objectives,
    parse_args,
    progress,
    require_backend,
)

L = lasagne.layers
pytensor.config.floatX = "float32"
# JAX drops PyTensor's run-time shape checks and says so once per function.
warnings.filterwarnings("ignore", message="Skipping Assert", category=UserWarning)


def build_training(resnet, params, update_rule, mode, **update_kwargs):
    x, y, loss, v_loss, v_acc = objectives(resnet)
    grad_updates, param_updates, grad_shared = update_rule(loss, params, **update_kwargs)
    f_grad_shared = synk.function(inputs=[x, y], outputs=loss,  # synk
                                  updates=grad_updates, mode=mode)
    f_param_update = synk.function(inputs=[], updates=param_updates, mode=mode)  # synk

    def f_train_minibatch(x_data, y_data, batch):
        train_loss = f_grad_shared(x_data, y_data, batch=batch)  # synk: each its rows
        synk.all_reduce(grad_shared, op="avg")  # synk: equal rows, so the exact mean
        f_param_update()  # synk
        return train_loss

    f_predict = synk.function(inputs=[x, y], outputs=[v_loss, v_acc], mode=mode)  # synk
    return f_train_minibatch, f_predict


def check_result(params, averages, f_predict, x_valid, y_valid, valid_loss, valid_acc):
    for param, per_rank in zip(params + averages, synk.gather(params + averages),  # synk
                               strict=True):
        for rank, value in enumerate(per_rank):
            np.testing.assert_array_equal(value, np.asarray(param.get_value()),
                                          err_msg=f"{param.name} differs in rank {rank}")
    want_loss, want_acc = f_predict.as_pytensor(x_valid.data, y_valid.data)
    np.testing.assert_allclose(valid_loss, want_loss, rtol=1e-4)
    np.testing.assert_allclose(valid_acc, want_acc, rtol=1e-4)
    print("Checked: parameters and running averages equal in all processes; validation "
          "equals the plain PyTensor function")


def main(args):
    start = time.perf_counter()
    require_backend(args.mode)
    n_parallel = synk.fork(args.n_parallel, device=args.device)  # synk: first of all
    np.random.seed(args.seed)
    X_train, y_train, X_valid, y_valid, X_test, y_test = load_images(args)
    x_train, y_train = synk.data(X_train), synk.data(y_train)  # synk: shared memory
    x_valid, y_valid = synk.data(X_valid), synk.data(y_valid)  # synk

    full_mb_size = args.batch_size * n_parallel
    learning_rate = args.learning_rate * n_parallel  # a larger minibatch, a larger step
    valid_slices = max(1, len(x_valid) // n_parallel // args.batch_size)

    resnet = build_resnet(X_train.shape[1:], 10, args.blocks, args.width)
    params = L.get_all_params(resnet, trainable=True)
    averages = L.get_all_params(resnet, trainable=False)  # batch norm's running averages
    print(f"ResNet blocks {args.blocks}, width {args.width}: "
          f"{L.count_params(resnet, trainable=True):,} parameters; minibatch {full_mb_size} "
          f"({args.batch_size} per process), {args.mode}, on {n_parallel} processes")
    f_train_minibatch, f_predict = build_training(
        resnet, params, updates.momentum, args.mode, learning_rate=learning_rate, momentum=0.9)
    synk.distribute()  # synk
    synk.broadcast(params)  # synk: the same initial values everywhere (as the original)

    # An untrained baseline (and the validation function compiled before training).
    valid_loss, valid_acc = f_predict(x_valid, y_valid, num_slices=valid_slices)  # synk
    print(f"untrained: validation loss {float(valid_loss):.3f}, accuracy "
          f"{float(valid_acc):.2%}; setup {time.perf_counter() - start:.1f} s")

    train_time, images, steps = 0.0, 0, 0  # time and images of the epochs after the first
    curves = Curves("train_resnet")
    for epoch in range(args.epochs):
        epoch_start, train_loss, i = time.perf_counter(), 0.0, 0
        minibatches = iter_mb_idxs(full_mb_size, len(x_train), shuffle=True)
        total = epoch_steps(full_mb_size, len(x_train), args.max_steps)
        for mb_idxs in progress(minibatches, total, args, f"epoch {epoch}/{args.epochs}"):
            step_start = time.perf_counter()
            train_loss += float(f_train_minibatch(x_train, y_train, batch=mb_idxs))
            if steps == 0:
                print(f"first step done {time.perf_counter() - start:.1f} s after start "
                      "(includes compiling)", flush=True)
            if epoch > 0:  # the first epoch compiles (JAX: again at the second step)
                train_time += time.perf_counter() - step_start
                images += full_mb_size
            i, steps = i + 1, steps + 1
            if args.max_steps is not None and i >= args.max_steps:
                break
        synk.all_reduce(averages, op="avg")  # synk: one set of running averages
        valid_loss, valid_acc = f_predict(x_valid, y_valid, num_slices=valid_slices)  # synk
        print(f"Epoch {epoch}: training loss {train_loss / i:.3f}, validation loss "
              f"{float(valid_loss):.3f}, accuracy {float(valid_acc):.2%} "
              f"({time.perf_counter() - epoch_start:.1f} s)")
        curves.add(train_loss=train_loss / i, valid_loss=valid_loss, valid_acc=valid_acc,
                   seconds=time.perf_counter() - epoch_start)

    check_result(params, averages, f_predict, x_valid, y_valid, valid_loss, valid_acc)
    if args.plot is not None:
        result = {"script": "train_resnet", "n_parallel": n_parallel, "blocks": list(args.blocks),
                  "width": args.width, "epochs": args.epochs, "mode": args.mode,
                  "valid_loss": float(valid_loss), "valid_acc": float(valid_acc),
                  "images_per_second": images / train_time if train_time > 0 else None}
        png, record = curves.write(args.plot, result)
        print(f"wrote {png} and {record}")
    if float(valid_acc) < args.min_accuracy:
        raise SystemExit(f"validation accuracy {float(valid_acc):.2%} is below "
                         f"--min-accuracy {args.min_accuracy:.0%}")
    rate = f"{images / train_time:,.0f} images/s" if train_time > 0 else "n/a (one epoch)"
    print(f"train_resnet passed on {n_parallel} processes: validation accuracy "
          f"{float(valid_acc):.2%} after {args.epochs} epochs; training after the first epoch "
          f"{rate}; total {time.perf_counter() - start:.1f} s")
    synk.close()


if __name__ == "__main__":
    main(parse_args(__doc__))
