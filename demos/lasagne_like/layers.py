"""Layers, as ``lasagne.layers``: a network is a graph of layer objects, read by ``get_output``.

A layer knows its incoming layer(s), its ``output_shape`` (computed in Python when
it is built; ``None`` for the number of rows) and its parameters (``params``: shared
variable -> set of tags such as ``"trainable"``, ``"regularizable"``). Nothing is
computed until :func:`get_output` walks the graph from the input layers and calls
each layer's ``get_output_for``; keyword arguments such as ``deterministic=True``
reach every layer (dropout off, batch normalization on its running averages).

Shapes follow Lasagne: images are ``(rows, channels, height, width)`` and a
convolution weight is ``(filters, channels, filter_height, filter_width)``. As in
Lasagne, the convolution and pooling layers call Theano's ``conv2d`` and
``pool_2d``, here :func:`synkhronos.extensions.conv2d` and
:func:`synkhronos.extensions.pool_2d` (im2col and one matrix product; a reshape or
strided slices), which compile with Numba and with JAX and have cheap gradients.
``get_output`` passes the input variable's number of rows to the layers
(``input_rows``), and the convolution hands it on as ``input_shape[0]``: every
padding block and reshape is then sized by that one variable, which keeps the graph
of a ResNet-50 small enough for PyTensor to build and rewrite in seconds.

Dropout and batch normalization keep Lasagne's behaviour: their state moves by
PyTensor's default updates, so a training function needs no extra ``updates``.
Dropout draws its masks from a ``RandomStream``, whose generator advances by itself
at every call. PyTensor 3 deprecates default updates (and ``RandomStream``); this
module silences those two warnings so the scripts can stay as Lasagne wrote them.

In a training pass (``deterministic=False``) batch normalization normalizes with the
statistics of the rows at hand and updates its running averages ``mean`` and
``inv_std`` through ``default_update`` on a clone of them that only the training
graph holds, so a training function updates them without being told and a
validation function (``deterministic=True``) reads them. In a data-parallel program
each process normalizes its own rows and updates its own copy of the averages;
average them with ``synk.all_reduce`` before validating (see
``demos/resnet/train_resnet.py``).
"""

from __future__ import annotations

import warnings
from collections import OrderedDict, deque

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.tensor.random.utils import RandomStream

from synkhronos.extensions import conv2d, pool_2d

from . import init, nonlinearities
from .random import get_rng

__all__ = [
    "Layer", "MergeLayer", "InputLayer", "DenseLayer", "DropoutLayer", "dropout",
    "Conv2DLayer", "Pool2DLayer", "MaxPool2DLayer", "GlobalPoolLayer", "BatchNormLayer",
    "NonlinearityLayer", "ElemwiseSumLayer", "FlattenLayer", "get_output",
    "get_output_shape", "get_all_layers", "get_all_params", "count_params",
    "get_all_param_values", "set_all_param_values",
]


class Layer:
    """A layer with one incoming layer (or an input shape)."""

    def __init__(self, incoming, name=None):
        if isinstance(incoming, tuple):
            self.input_shape, self.input_layer = incoming, None
        else:
            self.input_shape, self.input_layer = incoming.output_shape, incoming
        self.name = name
        self.params = OrderedDict()

    @property
    def output_shape(self):
        return self.get_output_shape_for(self.input_shape)

    def get_output_shape_for(self, input_shape):
        return input_shape

    def get_output_for(self, input, **kwargs):  # noqa: A002 (Lasagne's name)
        raise NotImplementedError

    def add_param(self, spec, shape, name=None, **tags):
        """A shared variable of ``shape`` from ``spec`` (an initializer, array or shared).

        Tags ``trainable`` and ``regularizable`` default to True. ``spec=None``
        returns None (a layer without that parameter, such as a bias-free convolution).
        """
        if spec is None:
            return None
        if name is not None and self.name is not None:
            name = f"{self.name}.{name}"
        if isinstance(spec, pytensor.compile.SharedVariable):
            param = spec
        else:
            value = spec(shape) if callable(spec) else np.asarray(spec, pytensor.config.floatX)
            if value.shape != tuple(shape):
                raise ValueError(f"parameter {name!r} needs shape {tuple(shape)}; the "
                                 f"initial value has {value.shape}")
            param = pytensor.shared(value, name=name, shape=value.shape)
        tags.setdefault("trainable", True)
        tags.setdefault("regularizable", True)
        self.params[param] = {tag for tag, on in tags.items() if on}
        return param

    def get_params(self, unwrap_shared=True, **tags):
        """This layer's parameters having every tag set True and none set False."""
        return [param for param, have in self.params.items()
                if all((tag in have) == wanted for tag, wanted in tags.items())]


class MergeLayer(Layer):
    """A layer with several incoming layers."""

    def __init__(self, incomings, name=None):
        self.input_shapes = [layer.output_shape for layer in incomings]
        self.input_layers = list(incomings)
        self.name = name
        self.params = OrderedDict()

    @property
    def output_shape(self):
        return self.get_output_shape_for(self.input_shapes)


class InputLayer(Layer):
    """The network's input: ``shape`` with ``None`` for the rows, and its variable.

    Without ``input_var``, a floatX tensor of ``len(shape)`` dimensions is made.
    """

    def __init__(self, shape, input_var=None, name=None):
        self.shape = tuple(shape)
        if any(size is None for size in self.shape[1:]):
            raise ValueError(f"InputLayer needs every axis but the rows known; got {shape}")
        if input_var is None:
            input_var = pt.tensor(dtype=pytensor.config.floatX, shape=(None,) * len(shape),
                                  name=name or "input")
        if input_var.ndim != len(self.shape):
            raise ValueError(f"InputLayer shape {shape} has {len(shape)} axes but its "
                             f"input_var {input_var} has {input_var.ndim}")
        self.input_var, self.input_layer, self.input_shape = input_var, None, self.shape
        self.name = name
        self.params = OrderedDict()

    @property
    def output_shape(self):
        return self.shape


class DenseLayer(Layer):
    """``nonlinearity(x @ W + b)``; an input of more than 2 axes is flattened first."""

    def __init__(self, incoming, num_units, W=init.GlorotUniform(),  # noqa: B008, N803
                 b=init.Constant(0.0), nonlinearity=nonlinearities.rectify,  # noqa: B008
                 name=None):
        super().__init__(incoming, name)
        self.num_units = num_units
        self.num_inputs = int(np.prod(self.input_shape[1:]))
        self.nonlinearity = nonlinearity or nonlinearities.identity
        self.W = self.add_param(W, (self.num_inputs, num_units), name="W")
        self.b = self.add_param(b, (num_units,), name="b", regularizable=False)

    def get_output_shape_for(self, input_shape):
        return (input_shape[0], self.num_units)

    def get_output_for(self, input, **kwargs):  # noqa: A002
        if input.ndim > 2:
            input = input.reshape((input.shape[0], self.num_inputs))
        activation = pt.dot(input, self.W)
        if self.b is not None:
            activation = activation + self.b
        return self.nonlinearity(activation)


class DropoutLayer(Layer):
    """Zero each input with probability ``p`` in training (scaled by ``1/(1-p)``).

    With ``deterministic=True`` (validation) it passes the input through. The mask
    comes from this layer's own ``RandomStream``, seeded from
    :func:`lasagne_like.random.get_rng` when the layer is built.
    """

    def __init__(self, incoming, p=0.5, rescale=True, name=None):
        super().__init__(incoming, name)
        self.p, self.rescale = p, rescale
        with warnings.catch_warnings():  # see the module docstring on default updates
            warnings.filterwarnings("ignore", "RandomStream is deprecated", FutureWarning)
            self._srng = RandomStream(int(get_rng().randint(1, 2147462579)))

    def get_output_for(self, input, deterministic=False, **kwargs):  # noqa: A002
        if deterministic or self.p == 0:
            return input
        retain = 1.0 - self.p
        mask = pt.lt(self._srng.uniform(size=input.shape), retain)
        kept = pt.switch(mask, input, 0)
        return kept / np.asarray(retain, dtype=input.dtype) if self.rescale else kept


dropout = DropoutLayer


def _pair(value, what):
    if isinstance(value, int):
        return (value, value)
    if len(value) != 2:
        raise ValueError(f"{what} must be an int or a pair; got {value!r}")
    return tuple(int(v) for v in value)


def _conv_pad(pad, filter_size):
    if pad == "valid":
        return (0, 0)
    if pad == "full":
        return (filter_size[0] - 1, filter_size[1] - 1)
    if pad == "same":
        if filter_size[0] % 2 == 0 or filter_size[1] % 2 == 0:
            raise ValueError(f"pad='same' needs odd filter sizes; got {filter_size}")
        return (filter_size[0] // 2, filter_size[1] // 2)
    return _pair(pad, "pad")


class Conv2DLayer(Layer):
    """2-d convolution of ``(rows, channels, h, w)`` images, by im2col.

    ``pad``: an int or pair, ``"valid"`` (0), ``"same"`` (odd filters) or ``"full"``.
    ``flip_filters=True`` (Lasagne's default) convolves; False cross-correlates (as
    the ResNet's pretrained weights expected). ``b=None``: no bias.
    """

    def __init__(self, incoming, num_filters, filter_size, stride=(1, 1), pad=0,
                 untie_biases=False, W=init.GlorotUniform(), b=init.Constant(0.0),  # noqa: B008, N803
                 nonlinearity=nonlinearities.rectify, flip_filters=True, name=None):
        super().__init__(incoming, name)
        if len(self.input_shape) != 4:
            raise ValueError(f"Conv2DLayer needs a 4-d input (rows, channels, h, w); got "
                             f"shape {self.input_shape}")
        if untie_biases:
            raise NotImplementedError("untie_biases=True is not supported here")
        self.num_filters = num_filters
        self.filter_size = _pair(filter_size, "filter_size")
        self.stride = _pair(stride, "stride")
        self.pad = _conv_pad(pad, self.filter_size)
        self.flip_filters = flip_filters
        self.nonlinearity = nonlinearity or nonlinearities.identity
        channels = self.input_shape[1]
        self.W = self.add_param(W, (num_filters, channels, *self.filter_size), name="W")
        self.b = self.add_param(b, (num_filters,), name="b", regularizable=False)

    def get_output_shape_for(self, input_shape):
        sizes = [(n + 2 * p - k) // s + 1 for n, p, k, s in
                 zip(input_shape[2:], self.pad, self.filter_size, self.stride, strict=True)]
        if min(sizes) < 1:
            raise ValueError(f"{self.filter_size} filters do not fit input {input_shape} "
                             f"with pad {self.pad}")
        return (input_shape[0], self.num_filters, *sizes)

    def get_output_for(self, input, input_rows=None, **kwargs):  # noqa: A002
        # The rows go in as input_shape[0]: the input variable's count (see get_output).
        rows = input.shape[0] if input_rows is None else input_rows
        out = conv2d(input, self.W, input_shape=(rows, *self.input_shape[1:]),
                     filter_shape=(self.num_filters, self.input_shape[1], *self.filter_size),
                     border_mode=self.pad, subsample=self.stride,
                     filter_flip=self.flip_filters)
        if self.b is not None:
            out = out + self.b.dimshuffle("x", 0, "x", "x")
        return self.nonlinearity(out)


def _pool_length(n, size, stride, pad, ignore_border):
    """Lasagne's output length of a pooling window over ``n`` positions."""
    if ignore_border:
        return (n + 2 * pad - size + 1 + stride - 1) // stride
    if stride >= size:
        return (n + stride - 1) // stride
    return max(0, (n - size + stride - 1) // stride) + 1


class Pool2DLayer(Layer):
    """Pooling over ``pool_size`` windows of the last two axes.

    ``mode``: ``"max"``, ``"average_inc_pad"`` (padding counts as zeros) or
    ``"average_exc_pad"`` (the mean over the window's real positions). With
    ``ignore_border=False`` the last windows may run past the border (Lasagne's
    partial windows); they cover only the positions inside.
    """

    def __init__(self, incoming, pool_size, stride=None, pad=(0, 0), ignore_border=True,
                 mode="max", name=None):
        super().__init__(incoming, name)
        if len(self.input_shape) != 4:
            raise ValueError(f"{type(self).__name__} needs a 4-d input; got shape "
                             f"{self.input_shape}")
        if mode not in ("max", "average_inc_pad", "average_exc_pad"):
            raise ValueError(f"unknown pooling mode {mode!r}")
        self.pool_size = _pair(pool_size, "pool_size")
        self.stride = self.pool_size if stride is None else _pair(stride, "stride")
        self.pad = _pair(pad, "pad")
        if not ignore_border and any(self.pad):
            raise ValueError("pad needs ignore_border=True")
        self.ignore_border, self.mode = ignore_border, mode

    def get_output_shape_for(self, input_shape):
        sizes = [_pool_length(n, k, s, p, self.ignore_border) for n, k, s, p in
                 zip(input_shape[2:], self.pool_size, self.stride, self.pad, strict=True)]
        return (*input_shape[:2], *sizes)

    def get_output_for(self, input, **kwargs):  # noqa: A002
        return pool_2d(input, self.pool_size, ignore_border=self.ignore_border,
                       stride=self.stride, pad=self.pad, mode=self.mode)


class MaxPool2DLayer(Pool2DLayer):
    """Max pooling (``Pool2DLayer`` with ``mode="max"``)."""

    def __init__(self, incoming, pool_size, stride=None, pad=(0, 0), ignore_border=True,
                 name=None):
        super().__init__(incoming, pool_size, stride, pad, ignore_border, "max", name)


class GlobalPoolLayer(Layer):
    """``pool_function`` (mean by default) over every axis after the second."""

    def __init__(self, incoming, pool_function=pt.mean, name=None):
        super().__init__(incoming, name)
        self.pool_function = pool_function

    def get_output_shape_for(self, input_shape):
        return input_shape[:2]

    def get_output_for(self, input, **kwargs):  # noqa: A002
        # Over the axes themselves: flattening them would compute a shape from the
        # input's, which JAX cannot trace.
        return self.pool_function(input, axis=tuple(range(2, input.ndim)))


class BatchNormLayer(Layer):
    """Batch normalization: ``(x - mean) * gamma * inv_std + beta`` per channel.

    ``axes="auto"``: every axis but the second (rows and image positions). In
    training, mean and ``inv_std = 1/sqrt(var + epsilon)`` come from the input and
    the running averages move by ``alpha`` toward them; with ``deterministic=True``
    the running averages are used. ``batch_norm_use_averages`` and
    ``batch_norm_update_averages`` override those two choices, as in Lasagne.
    """

    def __init__(self, incoming, axes="auto", epsilon=1e-4, alpha=0.1,
                 beta=init.Constant(0.0), gamma=init.Constant(1.0),  # noqa: B008
                 mean=init.Constant(0.0), inv_std=init.Constant(1.0), name=None):  # noqa: B008
        super().__init__(incoming, name)
        ndim = len(self.input_shape)
        self.axes = (0, *range(2, ndim)) if axes == "auto" else tuple(
            (axes,) if isinstance(axes, int) else axes)
        self.epsilon, self.alpha = epsilon, alpha
        shape = [size for axis, size in enumerate(self.input_shape) if axis not in self.axes]
        if any(size is None for size in shape):
            raise ValueError(f"BatchNormLayer needs the size of every axis it keeps; got "
                             f"input shape {self.input_shape} and axes {self.axes}")
        self.beta = self.add_param(beta, shape, "beta", regularizable=False)
        self.gamma = self.add_param(gamma, shape, "gamma", regularizable=True)
        self.mean = self.add_param(mean, shape, "mean", trainable=False, regularizable=False)
        self.inv_std = self.add_param(inv_std, shape, "inv_std", trainable=False,
                                      regularizable=False)

    def get_output_for(self, input, deterministic=False, batch_norm_use_averages=None,
                       batch_norm_update_averages=None, **kwargs):  # noqa: A002
        use_averages = deterministic if batch_norm_use_averages is None else (
            batch_norm_use_averages)
        update_averages = (not deterministic if batch_norm_update_averages is None
                           else batch_norm_update_averages)
        if not use_averages or update_averages:
            batch_mean = input.mean(self.axes)
            batch_inv_std = 1.0 / pt.sqrt(input.var(self.axes) + self.epsilon)
        if use_averages:
            mean, inv_std = self.mean, self.inv_std
        else:
            mean, inv_std = batch_mean, batch_inv_std
        if update_averages:
            # Lasagne's way: the updates ride on clones of the averages (sharing their
            # storage) that only this graph holds, so only functions built from this
            # output update them, by PyTensor's default_update.
            running_mean = self.mean.clone()
            running_inv_std = self.inv_std.clone()
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Setting default_update",
                                        DeprecationWarning)
                running_mean.default_update = pt.cast(
                    (1 - self.alpha) * running_mean + self.alpha * batch_mean, self.mean.dtype)
                running_inv_std.default_update = pt.cast(
                    (1 - self.alpha) * running_inv_std + self.alpha * batch_inv_std,
                    self.inv_std.dtype)
            mean = mean + 0 * running_mean
            inv_std = inv_std + 0 * running_inv_std
        pattern = []
        kept = iter(range(input.ndim - len(self.axes)))
        for axis in range(input.ndim):
            pattern.append("x" if axis in self.axes else next(kept))

        def spread(param):
            return param.dimshuffle(pattern)

        beta = 0 if self.beta is None else spread(self.beta)
        gamma = 1 if self.gamma is None else spread(self.gamma)
        return (input - spread(mean)) * (gamma * spread(inv_std)) + beta


class NonlinearityLayer(Layer):
    """``nonlinearity(x)``."""

    def __init__(self, incoming, nonlinearity=nonlinearities.rectify, name=None):
        super().__init__(incoming, name)
        self.nonlinearity = nonlinearity or nonlinearities.identity

    def get_output_for(self, input, **kwargs):  # noqa: A002
        return self.nonlinearity(input)


class ElemwiseSumLayer(MergeLayer):
    """``sum(coeff * x)`` over the incoming layers (``coeffs``: a number or one per input)."""

    def __init__(self, incomings, coeffs=1, name=None):
        super().__init__(incomings, name)
        self.coeffs = [coeffs] * len(incomings) if np.isscalar(coeffs) else list(coeffs)
        if any(tuple(s) != tuple(self.input_shapes[0]) for s in self.input_shapes):
            raise ValueError(f"ElemwiseSumLayer needs inputs of one shape; got "
                             f"{self.input_shapes}")

    def get_output_shape_for(self, input_shapes):
        return input_shapes[0]

    def get_output_for(self, inputs, **kwargs):
        total = None
        for coeff, x in zip(self.coeffs, inputs, strict=True):
            term = x if coeff == 1 else coeff * x
            total = term if total is None else total + term
        return total


class FlattenLayer(Layer):
    """``(rows, ...)`` -> ``(rows, product of the rest)`` (``outdim=2``)."""

    def get_output_shape_for(self, input_shape):
        return (input_shape[0], int(np.prod(input_shape[1:])))

    def get_output_for(self, input, **kwargs):  # noqa: A002
        return input.reshape((input.shape[0], self.output_shape[1]))


def _as_list(layer_or_layers):
    if isinstance(layer_or_layers, Layer):
        return [layer_or_layers]
    if isinstance(layer_or_layers, dict):
        return list(layer_or_layers.values())
    return list(layer_or_layers)  # a list, tuple, dict.values() or other iterable


def _incoming(layer):
    if isinstance(layer, MergeLayer):
        return layer.input_layers
    return [] if layer.input_layer is None else [layer.input_layer]


def get_all_layers(layer_or_layers):
    """Every layer the given ones depend on, inputs first (a topological order)."""
    # Depth-first, each layer expanded once: residual networks reach a layer by
    # exponentially many paths, so a walk that re-expands shared layers never ends.
    order, seen = [], set()
    for top in _as_list(layer_or_layers):
        stack = deque([(top, False)])
        while stack:
            layer, finished = stack.pop()
            if finished:
                order.append(layer)
                continue
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            stack.append((layer, True))
            for parent in reversed(_incoming(layer)):
                if id(parent) not in seen:
                    stack.append((parent, False))
    return order


def get_output(layer_or_layers, inputs=None, **kwargs):
    """The symbolic output of one layer (or a list of them).

    Parameters
    ----------
    layer_or_layers : Layer or list of Layer
    inputs : Variable or dict, optional
        A variable for the network's single InputLayer, or ``{InputLayer: variable}``;
        by default each InputLayer's ``input_var``.
    **kwargs
        Passed to every layer's ``get_output_for`` (``deterministic=True``...).
    """
    layers = get_all_layers(layer_or_layers)
    given = {}
    if isinstance(inputs, dict):
        given = {id(layer): var for layer, var in inputs.items()}
    elif inputs is not None:
        input_layers = [layer for layer in layers if isinstance(layer, InputLayer)]
        if len(input_layers) != 1:
            raise ValueError(f"one input variable was given but the network has "
                             f"{len(input_layers)} InputLayers; pass a dict")
        given = {id(input_layers[0]): inputs}
    input_vars = [given.get(id(layer), layer.input_var) for layer in layers
                  if isinstance(layer, InputLayer)]
    if input_vars and "input_rows" not in kwargs:
        # Every layer's rows are the input's rows: padding and reshapes take them from
        # the input variable, a tiny graph, rather than from the layer's own input.
        kwargs["input_rows"] = input_vars[0].shape[0]
    outputs = {}
    for layer in layers:
        if isinstance(layer, InputLayer):
            outputs[id(layer)] = given.get(id(layer), layer.input_var)
        elif isinstance(layer, MergeLayer):
            outputs[id(layer)] = layer.get_output_for(
                [outputs[id(parent)] for parent in layer.input_layers], **kwargs)
        else:
            outputs[id(layer)] = layer.get_output_for(outputs[id(layer.input_layer)], **kwargs)
    if isinstance(layer_or_layers, Layer):
        return outputs[id(layer_or_layers)]
    return [outputs[id(layer)] for layer in _as_list(layer_or_layers)]


def get_output_shape(layer_or_layers, input_shapes=None):
    """The output shape (``None`` for the rows) of one layer or a list of them."""
    if input_shapes is not None:
        raise NotImplementedError("get_output_shape with input_shapes is not supported")
    if isinstance(layer_or_layers, Layer):
        return layer_or_layers.output_shape
    return [layer.output_shape for layer in _as_list(layer_or_layers)]


def get_all_params(layer_or_layers, unwrap_shared=True, **tags):
    """The parameters of every layer below the given ones, each once, in layer order."""
    params = []
    for layer in get_all_layers(layer_or_layers):
        params.extend(p for p in layer.get_params(**tags) if p not in params)
    return params


def count_params(layer, **tags):
    return int(sum(p.get_value(borrow=True).size for p in get_all_params(layer, **tags)))


def get_all_param_values(layer_or_layers, **tags):
    return [p.get_value() for p in get_all_params(layer_or_layers, **tags)]


def set_all_param_values(layer_or_layers, values, **tags):
    params = get_all_params(layer_or_layers, **tags)
    if len(params) != len(values):
        raise ValueError(f"got {len(values)} values for {len(params)} parameters")
    for param, value in zip(params, values, strict=True):
        param.set_value(value)
