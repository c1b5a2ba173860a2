"""Theano's ``conv2d`` and ``pool_2d`` for PyTensor 3, written with PyTensor's own ops.

PyTensor 3 has neither ``tensor.nnet.conv2d`` nor ``tensor.signal.pool``, which
Theano-era programs (the Deep Learning Tutorials' LeNet, Lasagne-style scripts) call.
This module owns the two functions, with Theano's names, arguments, defaults and
shape conventions, so that such a program is ported by changing its import.

Both build graphs of slices, joins, reshapes, reductions and one matrix product:
ops that every PyTensor backend compiles natively (C, Numba, JAX) and whose
gradients are cheap. ``pytensor.tensor.signal.convolve2d`` instead runs a SciPy
routine per image in Numba's object mode: 12 to 95 times slower per row on LeNet's
layers, forward and backward (``benchmarks/conv_layers.py``).

``conv2d`` (im2col), for ``(rows, channels, height, width)`` images and
``(filters, channels, kh, kw)`` filters:

1. the filters are flipped (``filter_flip=True``, a true convolution) and laid out
   as a ``(kh * kw * channels, filters)`` matrix;
2. the images are moved channels last and padded by blocks of zeros joined to them;
3. the ``kh`` strided slices that start at each row offset of the filter are joined
   along the channel axis, then the ``kw`` slices of each column offset of that
   (``kh + kw`` slices, not ``kh * kw``: a small graph, fast to rewrite and
   differentiate), giving ``(rows, out_h, out_w, kh * kw * channels)``;
4. one matrix product with the filter matrix, and back to channels first.

``pool_2d`` reshapes and reduces when the windows tile the image (stride equal to
the window, no padding, no partial window). Otherwise it pads (``-inf`` for
``"max"``, zeros for the rest, so the padding never wins a maximum nor adds to a
sum), reduces over the strided slices of every row offset, then of every column
offset, and for the averages divides by the window's size or by its count of real
positions.

The number of rows is never a constant: each synkhronos process runs the same graph
on its own number of rows. It is read from the input (``input.shape[0]``), or, for
``conv2d``, from ``input_shape[0]`` when that is a symbolic scalar: a deep network
passes its input variable's row count there so that PyTensor does not trace every
layer's shape back through the layers below (``demos/lasagne_like/layers.py``).
Every other size is read from the variables' static shapes, or from the
``input_shape`` and ``filter_shape`` hints (checked when the function runs, with
``specify_shape``), or else computed in the graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.tensor.variable import TensorVariable

__all__ = ["conv2d", "pool_2d"]

Size = Any  # an int, or a symbolic integer scalar when the size is not static
BorderMode = str | int | Sequence[Any]
PoolMode = Literal["max", "sum", "average_inc_pad", "average_exc_pad"]
POOL_MODES = ("max", "sum", "average_inc_pad", "average_exc_pad")


def conv2d(input: Any, filters: Any, input_shape: Sequence[Any] | None = None,  # noqa: A002
           filter_shape: Sequence[int | None] | None = None,
           border_mode: BorderMode = "valid", subsample: Sequence[int] = (1, 1),
           filter_flip: bool = True, image_shape: Sequence[Any] | None = None,
           filter_dilation: Sequence[int] = (1, 1)) -> TensorVariable:
    """2-d convolution of a minibatch of images, as ``theano.tensor.nnet.conv2d``.

    Parameters
    ----------
    input : 4-d tensor
        ``(rows, channels, height, width)``.
    filters : 4-d tensor
        ``(filters, channels, kh, kw)``. ``kh`` and ``kw`` must be known when the graph
        is built: from ``filter_shape``, from the static shape of ``filters``, or
        from the current value of a shared ``filters``.
    input_shape : tuple of 4, optional
        Known sizes of ``input`` (``None`` where unknown), checked when the function
        runs. The first (the rows) is never taken as a constant; it may be a symbolic
        scalar equal to the number of rows, which is then used instead of
        ``input.shape[0]``.
    filter_shape : tuple of 4, optional
        Known sizes of ``filters`` (``None`` where unknown), checked when the function
        runs.
    border_mode : {"valid", "full", "half"}, int, or pair
        ``"valid"``: no padding; ``"full"``: ``k - 1`` zeros on each side (every
        overlap); ``"half"``: ``k // 2`` on each side (the output keeps the input's
        size for odd ``k``); an int ``p``: ``p`` on every side; ``(ph, pw)``: per
        axis; ``((top, bottom), (left, right))``: per side. ``k`` is the dilated
        filter size, ``(k - 1) * dilation + 1``.
    subsample : pair of int
        The strides over rows and columns.
    filter_flip : bool
        True (Theano's default): a true convolution, the filters flipped in both
        axes. False: a cross-correlation (what most networks mean by convolution).
    image_shape : tuple of 4, optional
        Theano's older name of ``input_shape``.
    filter_dilation : pair of int
        The spacing between filter taps (1: none).

    Returns
    -------
    4-d tensor
        ``(rows, filters, out_h, out_w)``, ``out = (n + pad - k) // stride + 1`` with
        ``pad`` both sides' padding together.

    Raises
    ------
    TypeError
        An argument of the wrong kind (an input that is not 4-d, strides that are
        not ints).
    ValueError
        A shape hint that contradicts the variable's static shape, channel counts of
        the input and the filters that differ, an unknown ``border_mode``, or
        filters larger than the padded image.

    Examples
    --------
    LeNet's layer, from the Deep Learning Tutorials, with only the import changed::

        # was: from theano.tensor.nnet import conv2d
        from synkhronos.extensions import conv2d
        conv_out = conv2d(input=x, filters=W, filter_shape=(20, 1, 5, 5),
                          input_shape=(None, 1, 28, 28))
    """
    if image_shape is not None:
        if input_shape is not None:
            raise ValueError("conv2d takes input_shape or its older name image_shape, "
                             "not both")
        input_shape = image_shape
    input = _tensor(input, 4, "conv2d", "input", "(rows, channels, height, width)")  # noqa: A001
    filters = _tensor(filters, 4, "conv2d", "filters", "(filters, channels, kh, kw)")
    rows, sizes = _rows_and_sizes(input_shape, input)
    input = _with_hint(input, sizes, "input_shape")  # noqa: A001
    if filter_shape is None and isinstance(filters, SharedVariable) and None in (
            filters.type.shape[2:]):
        # A shared weight of no static shape (pytensor.shared's default): its filter
        # size now, checked at every call.
        filter_shape = (None, None, *np.shape(filters.get_value(borrow=True))[2:])
    filters = _with_hint(filters, filter_shape, "filter_shape")
    kh, kw = filters.type.shape[2:]
    if kh is None or kw is None:
        raise ValueError(f"conv2d needs the filters' height and width when the graph is "
                         f"built; {filters} has shape {filters.type.shape}: pass "
                         f"filter_shape=(filters, channels, kh, kw)")
    (sh, sw) = _pair(subsample, "subsample", low=1)
    (dh, dw) = _pair(filter_dilation, "filter_dilation", low=1)
    span_h, span_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1  # the dilated filter's extent
    (top, bottom), (left, right) = _conv_padding(border_mode, (span_h, span_w))

    in_channels, f_channels = input.type.shape[1], filters.type.shape[1]
    if in_channels is not None and f_channels is not None and in_channels != f_channels:
        raise ValueError(f"conv2d: the input has {in_channels} channels but the filters "
                         f"expect {f_channels} (filters shape {filters.type.shape})")
    channels = _size(input, 1) if in_channels is not None else _size(filters, 1)
    n_filters = _size(filters, 0)
    height, width = _size(input, 2), _size(input, 3)
    out_h = (height + top + bottom - span_h) // sh + 1
    out_w = (width + left + right - span_w) // sw + 1
    if isinstance(out_h, int) and isinstance(out_w, int) and min(out_h, out_w) < 1:
        raise ValueError(f"conv2d: filters of {kh}x{kw} (dilation {dh}x{dw}) do not fit "
                         f"images of {height}x{width} padded by "
                         f"{((top, bottom), (left, right))}")

    if filter_flip:
        filters = filters[:, :, ::-1, ::-1]
    depth = kh * kw * channels
    # (kw, kh, channels, filters): the order in which step 3 joins the slices.
    matrix = filters.dimshuffle(3, 2, 1, 0).reshape((depth, n_filters))
    x, shape = input.dimshuffle(0, 2, 3, 1), [height, width, channels]
    x = _pad_axis(x, rows, shape, 1, top, bottom, 0)
    x = _pad_axis(x, rows, shape, 2, left, right, 0)
    by_rows = _offsets(x, shape[0], 1, kh, dh, sh, out_h)
    x = by_rows[0] if kh == 1 else pt.concatenate(by_rows, axis=3)
    by_cols = _offsets(x, shape[1], 2, kw, dw, sw, out_w)
    x = by_cols[0] if kw == 1 else pt.concatenate(by_cols, axis=3)
    columns = x.reshape((rows, out_h * out_w, depth))
    out = pt.matmul(columns, matrix).reshape((rows, out_h, out_w, n_filters))
    return out.dimshuffle(0, 3, 1, 2)


def pool_2d(input: Any, ws: Sequence[int], ignore_border: bool = True,  # noqa: A002
            stride: Sequence[int] | None = None, pad: Sequence[int] = (0, 0),
            mode: PoolMode = "max") -> TensorVariable:
    """Pooling over windows of the last two axes, as ``theano.tensor.signal.pool.pool_2d``.

    Parameters
    ----------
    input : tensor of 2 or more dimensions
        Images in its last two axes (``(rows, channels, height, width)`` usually).
    ws : pair of int
        The window's height and width.
    ignore_border : bool
        True: only whole windows (a 5x5 image in 2x2 windows gives 2x2). False: the
        windows that start inside the image and run past its border count too,
        over the positions they cover (5x5 gives 3x3). Theano's ``pool_2d`` warned
        and took False when this was not given; the default here is the value
        Theano recommended passing, True.
    stride : pair of int, optional
        The step between windows; the window's size by default (no overlap).
    pad : pair of int
        Zeros added above and below (``pad[0]``), left and right (``pad[1]``); each
        smaller than the window, and only with ``ignore_border=True``.
    mode : {"max", "sum", "average_inc_pad", "average_exc_pad"}
        What each window gives: its maximum or its sum over the real positions (the
        padding excluded), or its mean, dividing by the window's size with the
        padding counted as zeros (``"average_inc_pad"``) or by the number of real
        positions (``"average_exc_pad"``). A partial window (``ignore_border=False``)
        averages over the positions it covers in both.

    Returns
    -------
    tensor
        The input's leading axes and ``(out_h, out_w)``: with ``n`` the padded size,
        ``(n - ws) // stride + 1`` (at least 0) when ``ignore_border``, else
        ``(n - 1) // stride + 1`` if ``stride >= ws`` and
        ``max(0, (n - 1 - ws + stride) // stride) + 1`` if not (Theano's rule).

    Raises
    ------
    TypeError
        An input of fewer than 2 dimensions, or a window, stride or pad that is not
        a pair of ints.
    ValueError
        An unknown ``mode``, a window or stride below 1, a pad not smaller than the
        window, or a pad with ``ignore_border=False``.

    Examples
    --------
    LeNet's pooling, from the Deep Learning Tutorials, with only the import changed::

        # was: from theano.tensor.signal.pool import pool_2d
        from synkhronos.extensions import pool_2d
        pooled_out = pool_2d(input=conv_out, ws=(2, 2), ignore_border=True)
    """
    input = pt.as_tensor_variable(input)  # noqa: A001
    if input.ndim < 2:
        raise TypeError(f"pool_2d needs a tensor of 2 or more dimensions (images in the "
                        f"last two); got {input.ndim} for {input}")
    if mode not in POOL_MODES:
        raise ValueError(f"pool_2d: unknown mode {mode!r}; expected one of {POOL_MODES}")
    (kh, kw) = _pair(ws, "ws", low=1)
    (sh, sw) = (kh, kw) if stride is None else _pair(stride, "stride", low=1)
    (ph, pw) = _pair(pad, "pad", low=0)
    if (ph or pw) and not ignore_border:
        raise ValueError(f"pool_2d: pad={pad} needs ignore_border=True (as in Theano)")
    if ph >= kh or pw >= kw:
        raise ValueError(f"pool_2d: pad={pad} must be smaller than the window ws={ws}")

    # The rows (the first axis) stay symbolic whatever the type says.
    lead = [input.shape[0], *(_size(input, axis) for axis in range(1, input.ndim - 2))][
        :input.ndim - 2]
    height, width = _size(input, -2), _size(input, -1)
    out_h = _pool_length(height, kh, sh, ph, ignore_border)
    out_w = _pool_length(width, kw, sw, pw, ignore_border)
    # What partial windows need beyond the given padding, at the bottom and the right.
    extra_h = _at_least_zero((out_h - 1) * sh + kh - (height + 2 * ph))
    extra_w = _at_least_zero((out_w - 1) * sw + kw - (width + 2 * pw))

    if (kh, kw) == (sh, sw) and (ph, pw) == (0, 0) and _is_zero(extra_h) and _is_zero(
            extra_w):
        # The windows tile the image (once the rows and columns no window reaches are
        # cut off): one reshape and one reduction.
        x = input
        if not (_equal(height, out_h * kh) and _equal(width, out_w * kw)):
            x = x[..., :out_h * kh, :out_w * kw]
        blocks = x.reshape((*lead, out_h, kh, out_w, kw))
        axes = (-3, -1)
        if mode == "max":
            return blocks.max(axis=axes)
        if mode == "sum":
            return blocks.sum(axis=axes)
        return _as_dtype(blocks.sum(axis=axes) / np.asarray(kh * kw, input.dtype), input)

    fill = _lowest(input.dtype) if mode == "max" else 0
    rows = lead[0] if lead else None
    shape = [*lead[1:], height, width]
    x = _pad_axis(input, rows, shape, input.ndim - 2, ph, ph + extra_h, fill)
    x = _pad_axis(x, rows, shape, input.ndim - 1, pw, pw + extra_w, fill)
    combine = pt.maximum if mode == "max" else pt.add
    for axis, size, step, n_out in ((input.ndim - 2, kh, sh, out_h),
                                    (input.ndim - 1, kw, sw, out_w)):
        views = _offsets(x, shape[axis - 1] if lead else shape[axis], axis, size, 1,
                         step, n_out)
        x = views[0]
        for view in views[1:]:
            x = combine(x, view)
    if mode in ("max", "sum"):
        return x
    if mode == "average_inc_pad" and ignore_border:
        return _as_dtype(x / np.asarray(kh * kw, input.dtype), input)
    counts = pt.outer(_window_counts(height, kh, sh, ph, out_h),
                      _window_counts(width, kw, sw, pw, out_w))
    return _as_dtype(x / pt.cast(counts, x.dtype), input)


def _tensor(value: Any, ndim: int, caller: str, what: str, layout: str) -> Any:
    variable = pt.as_tensor_variable(value)
    if variable.ndim != ndim:
        raise TypeError(f"{caller} needs a {ndim}-d {what} {layout}; got {variable.ndim} "
                        f"dimensions for {variable}")
    return variable


def _with_hint(variable: Any, hint: Sequence[Any] | None, what: str) -> Any:
    """The variable with the hinted sizes made static.

    A hinted size the variable's type already fixes must agree with it; the others
    are checked when the function runs (``specify_shape``).
    """
    if hint is None:
        return variable
    if len(hint) != variable.ndim:
        raise ValueError(f"{what} has {len(hint)} sizes for a {variable.ndim}-d variable: "
                         f"{tuple(hint)}")
    wanted: list[int | None] = []
    for axis, (size, static) in enumerate(zip(hint, variable.type.shape, strict=True)):
        if size is not None and not isinstance(size, (int, np.integer)):
            raise TypeError(f"{what}[{axis}] must be an int or None; got {size!r}")
        if size is not None and static is not None and int(size) != static:
            raise ValueError(f"{what} says axis {axis} of {variable} has {size} entries, "
                             f"but its type says {static} (shape {variable.type.shape})")
        wanted.append(None if size is None else int(size))
    if all(size is None or size == static for size, static in
           zip(wanted, variable.type.shape, strict=True)):
        return variable
    return pt.specify_shape(variable, tuple(wanted))


def _rows_and_sizes(input_shape: Sequence[Any] | None, input: Any) -> tuple[Any, Any]:  # noqa: A002
    """The number of rows, and ``input_shape`` with its rows left out (``None``).

    The rows are never a constant: a symbolic integer scalar in ``input_shape[0]`` is
    the count to use, anything else there (an int, as Theano allowed) is ignored.
    """
    if input_shape is None:
        return input.shape[0], None
    if len(input_shape) != 4:
        raise ValueError(f"input_shape has {len(input_shape)} sizes for a 4-d input: "
                         f"{tuple(input_shape)}")
    first = input_shape[0]
    if isinstance(first, TensorVariable):
        if first.ndim != 0 or "int" not in first.dtype:
            raise TypeError(f"input_shape[0] must be an int, None or a symbolic integer "
                            f"scalar (the number of rows); got {first} of type "
                            f"{first.type}")
        return first, (None, *input_shape[1:])
    if first is not None and not isinstance(first, (int, np.integer)):
        raise TypeError(f"input_shape[0] must be an int, None or a symbolic integer scalar "
                        f"(the number of rows); got {first!r}")
    return input.shape[0], (None, *input_shape[1:])


def _pair(value: Any, what: str, low: int) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)):
        value = (value, value)
    if not isinstance(value, (tuple, list)) or len(value) != 2 or not all(
            isinstance(v, (int, np.integer)) for v in value):
        raise TypeError(f"{what} must be a pair of ints; got {value!r}")
    if min(value) < low:
        raise ValueError(f"{what} must be at least {low} in each axis; got {tuple(value)}")
    return int(value[0]), int(value[1])


def _conv_padding(border_mode: BorderMode, spans: tuple[int, int]) -> list[tuple[int, int]]:
    """``((top, bottom), (left, right))`` for Theano's ``border_mode``."""
    if isinstance(border_mode, str):
        if border_mode == "valid":
            return [(0, 0), (0, 0)]
        if border_mode == "full":
            return [(span - 1, span - 1) for span in spans]
        if border_mode == "half":
            return [(span // 2, span // 2) for span in spans]
        raise ValueError(f"conv2d: unknown border_mode {border_mode!r}; expected 'valid', "
                         f"'full', 'half', an int or a pair")
    if isinstance(border_mode, (int, np.integer)):
        border_mode = (border_mode, border_mode)
    if not isinstance(border_mode, (tuple, list)) or len(border_mode) != 2:
        raise TypeError(f"conv2d: border_mode must be 'valid', 'full', 'half', an int or "
                        f"a pair; got {border_mode!r}")
    sides = []
    for axis in border_mode:
        pair = (axis, axis) if isinstance(axis, (int, np.integer)) else axis
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(
                isinstance(p, (int, np.integer)) for p in pair):
            raise TypeError(f"conv2d: border_mode {border_mode!r} must hold an int or a "
                            f"pair of ints per axis")
        if min(pair) < 0:
            raise ValueError(f"conv2d: border_mode {border_mode!r} pads by a negative "
                             f"amount")
        sides.append((int(pair[0]), int(pair[1])))
    return sides


def _size(variable: Any, axis: int) -> Size:
    """The static size of ``axis`` if the type has it, else the symbolic one."""
    static = variable.type.shape[axis]
    return variable.shape[axis] if static is None else static


def _pool_length(n: Size, size: int, stride: int, pad: int, ignore_border: bool) -> Size:
    """Theano's number of windows over ``n`` positions (``Pool.out_shape``)."""
    n = n + 2 * pad
    if ignore_border:
        return _at_least_zero((n - size) // stride + 1)
    if stride >= size:
        return (n - 1) // stride + 1
    return _at_least_zero((n - 1 - size + stride) // stride) + 1


def _at_least_zero(value: Size) -> Size:
    return max(0, value) if isinstance(value, int) else pt.maximum(0, value)


def _is_zero(value: Size) -> bool:
    return isinstance(value, int) and value == 0


def _equal(a: Size, b: Size) -> bool:
    return isinstance(a, int) and isinstance(b, int) and a == b


def _lowest(dtype: str) -> float | int:
    """What a maximum ignores: ``-inf``, or the smallest integer."""
    return -np.inf if np.issubdtype(dtype, np.floating) else int(np.iinfo(dtype).min)


def _as_dtype(value: Any, like: Any) -> Any:
    """Integer images average to integers, as in Theano (truncated)."""
    return value if value.dtype == like.dtype else pt.cast(value, like.dtype)


def _window_counts(n: Size, size: int, stride: int, pad: int, n_out: Size) -> Any:
    """How many real positions (not padding, not past the border) each window covers."""
    starts = pt.arange(n_out) * stride
    return pt.minimum(starts + size, n + pad) - pt.maximum(starts, pad)


def _pad_axis(x: Any, rows: Size | None, shape: list[Size], axis: int, before: Size,
              after: Size, value: float | int) -> Any:
    """``x`` with blocks of ``value`` joined before and after it along ``axis``.

    ``shape`` holds the sizes of every axis of ``x`` but the rows (when ``rows`` is
    given; every axis when it is None) and is updated. The blocks are sized by
    ``rows`` rather than by ``x.shape``: a shape read from ``x`` itself (as
    ``pt.pad`` does) makes PyTensor trace it back through everything above ``x``.
    """
    index = axis - 1 if rows is not None else axis
    if _is_zero(before) and _is_zero(after):
        return x

    def block(size: Size) -> Any:
        sizes = list(shape)
        sizes[index] = size
        leading = [] if rows is None else [rows]
        return pt.alloc(np.asarray(value, dtype=x.dtype), *leading, *sizes)

    parts = [block(before)] * (not _is_zero(before)) + [x] + (
        [block(after)] * (not _is_zero(after)))
    shape[index] = shape[index] + before + after
    return pt.concatenate(parts, axis=axis)


def _offsets(x: Any, length: Size, axis: int, size: int, dilation: int, stride: int,
             n_out: Size) -> list[Any]:
    """The ``size`` strided slices along ``axis`` (of ``length``), one per filter or
    window offset: slice ``i`` starts at ``i * dilation`` and holds ``n_out`` entries."""
    views = []
    extent = _at_least_zero((n_out - 1) * stride + 1)  # no window: empty slices
    for i in range(size):
        start = i * dilation
        stop = start + extent
        if start == 0 and stride == 1 and _equal(stop, length):
            views.append(x)  # the whole axis: no slice
            continue
        index: list[Any] = [slice(None)] * x.ndim
        index[axis] = slice(start, stop, stride)
        views.append(x[tuple(index)])
    return views
