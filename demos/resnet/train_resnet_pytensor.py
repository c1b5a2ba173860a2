"""Train a ResNet on digits (or MNIST) in one process: the serial twin of ``train_resnet.py``.

The same network, data, update rule and minibatches as ``train_resnet.py``, with
plain ``pytensor.function`` (the rule of ``synkhronos.extensions.updates`` still
splits the step in two functions, with nothing in between; the original's
``train_resnet_theano.py`` did the same). Its minibatch is ``--batch-size`` rows
(64, the parallel demo's 32 per process on two processes), its learning rate is
scaled as the parallel demo scales it (by the minibatch's multiple of 32 rows), and
it validates on the whole validation set in one call.

    python demos/resnet/train_resnet_pytensor.py [--epochs 3] [--batch-size 64]
        [--max-steps S] [--resnet50] [--mode JAX|NUMBA] [--mnist PATH/mnist.npz]
        [--quiet] [--plot run.png]

Needs ``pip install -e .[demos]`` (jax, scikit-learn for the digits, tqdm for the
progress bar, matplotlib for ``--plot``).
"""

import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytensor

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
warnings.filterwarnings("ignore", message="Skipping Assert", category=UserWarning)


def build_training(resnet, params, update_rule, mode, **update_kwargs):
    x, y, loss, v_loss, v_acc = objectives(resnet)
    grad_updates, param_updates, grad_shared = update_rule(loss, params, **update_kwargs)
    f_grad_shared = pytensor.function([x, y], loss, updates=grad_updates, mode=mode)
    f_param_update = pytensor.function([], updates=param_updates, mode=mode)

    def f_train_minibatch(x_data, y_data):
        train_loss = f_grad_shared(x_data, y_data)  # one process: nothing to all-reduce
        f_param_update()
        return train_loss

    f_predict = pytensor.function([x, y], [v_loss, v_acc], mode=mode)
    return f_train_minibatch, f_predict


def main(args):
    start = time.perf_counter()
    require_backend(args.mode)
    np.random.seed(args.seed)
    x_train, y_train, x_valid, y_valid, x_test, y_test = load_images(args)
    resnet = build_resnet(x_train.shape[1:], 10, args.blocks, args.width)
    params = L.get_all_params(resnet, trainable=True)
    print(f"ResNet blocks {args.blocks}, width {args.width}: "
          f"{L.count_params(resnet, trainable=True):,} parameters; minibatch "
          f"{args.batch_size}, {args.mode}, in one process")
    f_train_minibatch, f_predict = build_training(
        resnet, params, updates.momentum, args.mode,
        learning_rate=args.learning_rate * args.batch_size / 32,  # as the parallel demo
        momentum=0.9)

    train_time, images, steps = 0.0, 0, 0  # time and images of the epochs after the first
    curves = Curves("train_resnet_pytensor")
    for epoch in range(args.epochs):
        epoch_start, train_loss, i = time.perf_counter(), 0.0, 0
        minibatches = iter_mb_idxs(args.batch_size, len(x_train), shuffle=True)
        total = epoch_steps(args.batch_size, len(x_train), args.max_steps)
        for mb_idxs in progress(minibatches, total, args, f"epoch {epoch}/{args.epochs}"):
            step_start = time.perf_counter()
            # float(): wait for the step (JAX returns before computing; see its docs)
            train_loss += float(f_train_minibatch(x_train[mb_idxs], y_train[mb_idxs]))
            if steps == 0:
                print(f"first step done {time.perf_counter() - start:.1f} s after start "
                      "(includes compiling)", flush=True)
            if epoch > 0:  # the first epoch compiles (JAX: again at the second step)
                train_time += time.perf_counter() - step_start
                images += args.batch_size
            i, steps = i + 1, steps + 1
            if args.max_steps is not None and i >= args.max_steps:
                break
        valid_loss, valid_acc = f_predict(x_valid, y_valid)
        print(f"Epoch {epoch}: training loss {train_loss / i:.3f}, validation loss "
              f"{float(valid_loss):.3f}, accuracy {float(valid_acc):.2%} "
              f"({time.perf_counter() - epoch_start:.1f} s)")
        curves.add(train_loss=train_loss / i, valid_loss=valid_loss, valid_acc=valid_acc,
                   seconds=time.perf_counter() - epoch_start)

    if args.plot is not None:
        result = {"script": "train_resnet_pytensor", "n_parallel": 1, "blocks": list(args.blocks),
                  "width": args.width, "epochs": args.epochs, "mode": args.mode,
                  "valid_loss": float(valid_loss), "valid_acc": float(valid_acc),
                  "images_per_second": images / train_time if train_time > 0 else None}
        png, record = curves.write(args.plot, result)
        print(f"wrote {png} and {record}")
    if float(valid_acc) < args.min_accuracy:
        raise SystemExit(f"validation accuracy {float(valid_acc):.2%} is below "
                         f"--min-accuracy {args.min_accuracy:.0%}")
    rate = f"{images / train_time:,.0f} images/s" if train_time > 0 else "n/a (one epoch)"
    print(f"train_resnet_pytensor passed: validation accuracy {float(valid_acc):.2%} after "
          f"{args.epochs} epochs; training after the first epoch {rate}; total "
          f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main(parse_args(__doc__, parallel=False))
