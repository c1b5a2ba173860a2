"""What the two ResNet programs share: the network, the data, minibatches and flags.

The network is the bottleneck ResNet of the original demos (He et al. 2015, the
ResNet-50 layout that MILA's Platoon examples built with Lasagne), written with the
Lasagne-style module ``demos/lasagne_like``:

- a stem: 7x7 convolution with stride 2, batch normalization, rectifier, and 3x3
  max pooling with stride 2;
- four stages of residual blocks; each block is 1x1, 3x3 and 1x1 convolutions (each
  followed by batch normalization; the first two by a rectifier) whose output has
  four times the block's width, added to the block's input (or, in a stage's first
  block, to a 1x1 projection of it, with stride 2 from the second stage on), then a
  rectifier;
- global average pooling and a dense softmax layer.

``--resnet50`` builds the full ResNet-50 (3, 4, 6, 3 blocks, widths 64 to 512,
224x224 images); by default the network is small enough to train on two cores in
a minute: one block per stage, widths 8 to 64, 32x32 images (the digits, upscaled).
Convolutions have no bias (batch normalization follows) and do not flip their
filters, as in the original.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytensor.tensor as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # demos/
import lasagne_like as lasagne  # noqa: E402
from data import add_data_arguments, describe, load_dataset  # noqa: E402
from lasagne_like.layers import (  # noqa: E402
    BatchNormLayer,
    Conv2DLayer,
    DenseLayer,
    ElemwiseSumLayer,
    GlobalPoolLayer,
    InputLayer,
    NonlinearityLayer,
    Pool2DLayer,
)
from lasagne_like.nonlinearities import rectify, softmax  # noqa: E402
from progress import Curves, add_progress_arguments, progress  # noqa: E402

__all__ = ["build_resnet", "objectives", "require_backend", "iter_mb_idxs", "parse_args",
           "load_images", "lasagne", "Curves", "progress", "epoch_steps"]

RESNET50 = {"blocks": (3, 4, 6, 3), "width": 64, "image_size": 224}
SMALL = {"blocks": (1, 1, 1, 1), "width": 8, "image_size": 32}


def conv_bn(incoming, num_filters, filter_size, stride=1, pad=0, nonlinearity=rectify):
    """Convolution (no bias) -> batch normalization -> optional nonlinearity."""
    layer = Conv2DLayer(incoming, num_filters, filter_size, stride, pad, b=None,
                        nonlinearity=None, flip_filters=False)
    layer = BatchNormLayer(layer)
    return layer if nonlinearity is None else NonlinearityLayer(layer, nonlinearity)


def residual_block(incoming, width, stride=1, project=False):
    """Bottleneck: 1x1 (stride), 3x3, 1x1 to ``4 * width``; plus the input or its projection."""
    branch = conv_bn(incoming, width, 1, stride)
    branch = conv_bn(branch, width, 3, 1, 1)
    branch = conv_bn(branch, 4 * width, 1, nonlinearity=None)
    shortcut = conv_bn(incoming, 4 * width, 1, stride, nonlinearity=None) if project else incoming
    return NonlinearityLayer(ElemwiseSumLayer([shortcut, branch]), rectify)


def build_resnet(input_shape, n_classes, blocks=(3, 4, 6, 3), width=64):
    """The output layer (softmax) of a bottleneck ResNet on ``(channels, h, w)`` images."""
    network = InputLayer((None, *input_shape))
    network = conv_bn(network, width, 7, 2, 3)
    network = Pool2DLayer(network, pool_size=3, stride=2, ignore_border=False, mode="max")
    for stage, n_blocks in enumerate(blocks):
        stage_width = width * 2 ** stage
        for block in range(n_blocks):
            first = block == 0
            stride = 2 if first and stage > 0 else 1
            network = residual_block(network, stage_width, stride, project=first)
    network = GlobalPoolLayer(network)
    return DenseLayer(network, num_units=n_classes, nonlinearity=softmax)


def objectives(resnet):
    """The inputs ``x``, ``y`` and what the programs train and validate: the training
    loss (batch normalization on the minibatch) and the validation loss and accuracy
    (batch normalization on its running averages)."""
    x = T.tensor4("x")
    y = T.ivector("y")
    prob = lasagne.layers.get_output(resnet, x, deterministic=False)
    loss = lasagne.objectives.categorical_crossentropy(prob, y).mean()
    v_prob = lasagne.layers.get_output(resnet, x, deterministic=True)
    v_loss = lasagne.objectives.categorical_crossentropy(v_prob, y).mean()
    v_acc = T.mean(T.eq(T.argmax(v_prob, axis=1), y), dtype="float32")
    return x, y, loss, v_loss, v_acc


def require_backend(mode):
    """Exit with a hint when ``--mode JAX`` is asked for without jax installed."""
    if mode == "JAX" and importlib.util.find_spec("jax") is None:
        raise SystemExit("--mode JAX needs jax (pip install -e .[demos]); or --mode NUMBA")


def iter_mb_idxs(mb_size, data_length, shuffle=False):
    """Minibatch index arrays (or slices, unshuffled); the remainder is dropped."""
    if shuffle:
        indices = np.random.permutation(data_length)
    for low in range(0, data_length - mb_size + 1, mb_size):
        yield indices[low:low + mb_size] if shuffle else slice(low, low + mb_size)


def epoch_steps(mb_size, data_length, max_steps):
    """Steps in one epoch of ``iter_mb_idxs`` cut at ``max_steps`` (the bar's length)."""
    steps = data_length // mb_size
    return steps if max_steps is None else min(steps, max_steps)


def load_images(args):
    """The six arrays at the network's image size, labels as int32 (the targets' type)."""
    arrays = list(load_dataset(args.mnist, image_size=args.image_size))
    arrays[1::2] = [y.astype("int32") for y in arrays[1::2]]
    print(describe(args.mnist, *arrays[0::2]))
    return arrays


def parse_args(doc, parallel=True):
    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if parallel:
        parser.add_argument("--n-parallel", type=int, default=None,
                            help="processes (default: one per usable core)")
        parser.add_argument("--batch-size", type=int, default=32,
                            help="rows per process per step (default 32)")
        parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                            help="synk.fork(device=...): gpu keeps the parameters on the "
                                 "GPUs (with SYNKHRONOS_GPU_PLATFORM=cpu, on JAX's CPU "
                                 "platform); it needs --mode JAX")
    else:
        parser.add_argument("--batch-size", type=int, default=64,
                            help="rows per step (default 64)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=None,
                        help="stop each epoch after this many steps (for a quick run)")
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--resnet50", action="store_true",
                        help="the full ResNet-50: 3,4,6,3 blocks, width 64, 224x224 images")
    parser.add_argument("--blocks", default=None,
                        help="blocks per stage, e.g. 1,1,1,1 (default) or 3,4,6,3")
    parser.add_argument("--width", type=int, default=None, help="the first stage's width")
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--mode", choices=["JAX", "NUMBA"], default="JAX",
                        help="PyTensor backend (default JAX; Numba takes many minutes to "
                             "compile a ResNet's gradient the first time)")
    parser.add_argument("--min-accuracy", type=float, default=0.0,
                        help="fail unless the final validation accuracy reaches this")
    parser.add_argument("--seed", type=int, default=0)
    add_data_arguments(parser)
    add_progress_arguments(parser)
    args = parser.parse_args()
    if getattr(args, "device", "cpu") == "gpu" and args.mode != "JAX":
        parser.error("--device gpu compiles with JAX: leave --mode out or pass JAX")
    preset = RESNET50 if args.resnet50 else SMALL
    args.blocks = (tuple(int(b) for b in args.blocks.split(",")) if args.blocks
                   else preset["blocks"])
    args.width = args.width or preset["width"]
    args.image_size = args.image_size or preset["image_size"]
    return args
