"""``conv2d`` and ``pool_2d`` in one process, against SciPy and numpy references.

Never forks. Graphs compile with PyTensor's Python linker and no rewrites, so every
case costs milliseconds; ``tests/integration/test_conv.py`` runs them compiled by the
default (Numba) backend, in a session. The convolution's reference is SciPy's
``convolve2d`` (``filter_flip=True``) or ``correlate2d`` (False) summed over the
channels, on explicitly padded images, with the dilated filter written out and the
output subsampled; the pooling's reference is a loop over windows written from
Theano's definition (each window clipped to the image, the padding excluded except
from ``"average_inc_pad"``'s divisor).
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.gradient import verify_grad
from scipy import signal

from synkhronos.extensions import conv2d, pool_2d

PY_MODE = pytensor.compile.mode.Mode(linker="py", optimizer=None)
RTOL, ATOL = 1e-12, 1e-12


def padding_of(border_mode, spans):
    """``((top, bottom), (left, right))``, from Theano's documentation of border_mode."""
    if border_mode == "valid":
        return ((0, 0), (0, 0))
    if border_mode == "full":
        return tuple((k - 1, k - 1) for k in spans)
    if border_mode == "half":
        return tuple((k // 2, k // 2) for k in spans)
    if isinstance(border_mode, int):
        return ((border_mode,) * 2,) * 2
    return tuple((p, p) if isinstance(p, int) else tuple(p) for p in border_mode)


def reference_conv(x, w, border_mode="valid", subsample=(1, 1), flip=True, dilation=(1, 1)):
    n_filters, channels, kh, kw = w.shape
    dilated = np.zeros((n_filters, channels, (kh - 1) * dilation[0] + 1,
                        (kw - 1) * dilation[1] + 1))
    dilated[:, :, ::dilation[0], ::dilation[1]] = w
    pads = padding_of(border_mode, dilated.shape[2:])
    x = np.pad(x, ((0, 0), (0, 0), *pads))
    scipy_op = signal.convolve2d if flip else signal.correlate2d
    out = np.stack([np.stack([sum(scipy_op(image[c], dilated[f, c], mode="valid")
                                  for c in range(channels)) for f in range(n_filters)])
                    for image in x])
    return out[:, :, ::subsample[0], ::subsample[1]]


def pool_length(n, ws, stride, pad, ignore_border):
    """Theano's output length, as its documentation gives it."""
    n += 2 * pad
    if ignore_border:
        return max(0, (n - ws) // stride + 1)
    if stride >= ws:
        return (n - 1) // stride + 1
    return max(0, (n - 1 - ws + stride) // stride) + 1


def reference_pool(x, ws, ignore_border=True, stride=None, pad=(0, 0), mode="max"):
    stride = ws if stride is None else stride
    height, width = x.shape[-2:]
    out_h = pool_length(height, ws[0], stride[0], pad[0], ignore_border)
    out_w = pool_length(width, ws[1], stride[1], pad[1], ignore_border)
    out = np.zeros((*x.shape[:-2], out_h, out_w), dtype=np.float64)
    for i in range(out_h):
        for j in range(out_w):
            # The window in padded coordinates, then its real positions.
            r0, c0 = i * stride[0], j * stride[1]
            r1, c1 = min(r0 + ws[0], height + 2 * pad[0]), min(c0 + ws[1], width + 2 * pad[1])
            rows = slice(max(r0, pad[0]) - pad[0], min(r1, height + pad[0]) - pad[0])
            cols = slice(max(c0, pad[1]) - pad[1], min(c1, width + pad[1]) - pad[1])
            window = x[..., rows, cols].astype(np.float64)
            if mode == "max":
                out[..., i, j] = window.max(axis=(-2, -1))
            elif mode == "sum":
                out[..., i, j] = window.sum(axis=(-2, -1))
            elif mode == "average_inc_pad" and ignore_border:
                out[..., i, j] = window.sum(axis=(-2, -1)) / (ws[0] * ws[1])
            else:  # the window's real positions (a partial window: those it covers)
                out[..., i, j] = window.mean(axis=(-2, -1))
    return out


def run(inputs, output, *values):
    return pytensor.function(inputs, output, mode=PY_MODE)(*values)


rng = np.random.default_rng(47)


# -- conv2d ------------------------------------------------------------------------------------
BORDER_MODES = ["valid", "full", "half", 2, (1, 2), ((0, 2), (3, 1))]


@pytest.mark.parametrize("border_mode", BORDER_MODES, ids=str)
@pytest.mark.parametrize("subsample", [(1, 1), (2, 3)], ids=str)
@pytest.mark.parametrize("filter_flip", [True, False], ids=["convolution", "correlation"])
@pytest.mark.parametrize("channels", [1, 3])
def test_conv2d_matches_scipy(border_mode, subsample, filter_flip, channels):
    n_filters, kh, kw = 2 + channels, 3, 2  # an even width: "half" is not "same" there
    x_val = rng.normal(size=(4, channels, 9, 8))
    w_val = rng.normal(size=(n_filters, channels, kh, kw))
    x, w = pt.tensor4("x", dtype="float64"), pt.tensor4("w", dtype="float64")
    out = conv2d(x, w, filter_shape=(n_filters, channels, kh, kw), border_mode=border_mode,
                 subsample=subsample, filter_flip=filter_flip)
    got = run([x, w], out, x_val, w_val)
    want = reference_conv(x_val, w_val, border_mode, subsample, filter_flip)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dilation, border_mode", [((2, 1), "valid"), ((1, 3), "full"),
                                                   ((2, 2), "half")], ids=str)
def test_conv2d_filter_dilation(dilation, border_mode):
    x_val, w_val = rng.normal(size=(2, 2, 11, 10)), rng.normal(size=(3, 2, 3, 3))
    x, w = pt.tensor4("x", dtype="float64"), pt.tensor4("w", dtype="float64")
    out = conv2d(x, w, filter_shape=w_val.shape, border_mode=border_mode,
                 filter_dilation=dilation)
    np.testing.assert_allclose(run([x, w], out, x_val, w_val),
                               reference_conv(x_val, w_val, border_mode, (1, 1), True, dilation),
                               rtol=RTOL, atol=ATOL)


def test_conv2d_shape_hints_static_and_symbolic_sizes_agree():
    """The same convolution from static sizes (hints), from the variables' types, and
    from sizes computed in the graph; one compiled function serves any number of rows."""
    w_val = rng.normal(size=(5, 3, 3, 3))
    x = pt.tensor4("x", dtype="float64")
    typed = pt.tensor("t", dtype="float64", shape=(None, 3, 10, 7))
    w = pytensor.shared(w_val, name="w")  # no static shape: the filter size from its value
    n_rows = pt.lscalar("n_rows")
    outs = [
        conv2d(x, w, border_mode="half", subsample=(2, 1)),  # sizes computed in the graph
        conv2d(x, w, input_shape=(None, 3, 10, 7), filter_shape=(5, 3, 3, 3),
               border_mode="half", subsample=(2, 1)),
        conv2d(typed, w, border_mode="half", subsample=(2, 1)),
        conv2d(x, w, image_shape=(n_rows, 3, 10, 7), border_mode="half", subsample=(2, 1)),
    ]
    assert outs[1].type.shape == (None, 5, 5, 7)  # the rows never static
    assert outs[2].type.shape == (None, None, 5, 7)  # w's filter count is not in its type
    f = pytensor.function([x, typed, n_rows], outs, mode=PY_MODE, on_unused_input="ignore")
    for rows in (3, 1, 6):
        x_val = rng.normal(size=(rows, 3, 10, 7))
        want = reference_conv(x_val, w_val, "half", (2, 1))
        for got in f(x_val, x_val, rows):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_conv2d_hints_are_checked_when_the_function_runs():
    x = pt.tensor4("x", dtype="float64")
    w = pytensor.shared(rng.normal(size=(2, 1, 3, 3)), name="w")
    f = pytensor.function([x], conv2d(x, w, input_shape=(None, 1, 6, 6)), mode=PY_MODE)
    assert f(np.zeros((2, 1, 6, 6))).shape == (2, 2, 4, 4)
    with pytest.raises(AssertionError):  # PyTensor's SpecifyShape check
        f(np.zeros((2, 1, 7, 6)))
    w.set_value(np.zeros((2, 1, 5, 5)))  # the filter size read when the graph was built
    with pytest.raises(AssertionError):
        f(np.zeros((2, 1, 6, 6)))


def test_conv2d_refuses_bad_arguments():
    x = pt.tensor4("x", dtype="float64")
    w = pt.tensor("w", dtype="float64", shape=(2, 3, 3, 3))
    with pytest.raises(TypeError, match="4-d input"):
        conv2d(pt.matrix("m"), w)
    with pytest.raises(ValueError, match="filters' height and width"):
        conv2d(x, pt.tensor4("free"))
    with pytest.raises(ValueError, match="input has 2 channels but the filters expect 3"):
        conv2d(x, w, input_shape=(None, 2, 8, 8))
    with pytest.raises(ValueError, match="filter_shape says axis 3 .* has 4 entries"):
        conv2d(x, w, filter_shape=(2, 3, 3, 4))
    with pytest.raises(ValueError, match="unknown border_mode 'same'"):
        conv2d(x, w, border_mode="same")
    with pytest.raises(ValueError, match="negative"):
        conv2d(x, w, border_mode=(1, -1))
    with pytest.raises(ValueError, match="do not fit"):
        conv2d(x, w, input_shape=(None, 3, 2, 8))
    with pytest.raises(ValueError, match="subsample must be at least 1"):
        conv2d(x, w, subsample=(0, 1))
    with pytest.raises(TypeError, match="subsample must be a pair of ints"):
        conv2d(x, w, subsample=(1.5, 1))
    with pytest.raises(ValueError, match="not both"):
        conv2d(x, w, input_shape=(None, 3, 8, 8), image_shape=(None, 3, 8, 8))
    with pytest.raises(TypeError, match="input_shape\\[0\\] must be"):
        conv2d(x, w, input_shape=(pt.vector("v"), 3, 8, 8))


# -- pool_2d -----------------------------------------------------------------------------------
MODES = ["max", "sum", "average_inc_pad", "average_exc_pad"]
WINDOWS = [  # (ws, stride, pad, ignore_border) on 7x9 images
    ((2, 2), None, (0, 0), True),      # tiles once the last row and column are cut
    ((2, 2), None, (0, 0), False),     # partial windows at the bottom and right
    ((3, 2), (2, 1), (0, 0), False),   # overlapping, partial
    ((3, 3), (2, 2), (1, 1), True),    # padded
    ((2, 3), (3, 1), (1, 2), True),    # stride above the window, padded
    ((2, 2), (3, 3), (0, 0), False),   # gaps between windows, partial
    ((1, 9), None, (0, 0), True),      # whole rows
    ((8, 2), (1, 2), (0, 0), True),    # taller than the image: no window
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ws, stride, pad, ignore_border", WINDOWS, ids=str)
@pytest.mark.parametrize("static", [True, False], ids=["static", "symbolic"])
def test_pool_2d_matches_numpy(mode, ws, stride, pad, ignore_border, static):
    x_val = rng.normal(size=(3, 2, 7, 9))
    x = pt.tensor("x", dtype="float64", shape=(None, 2, 7, 9) if static else (None,) * 4)
    got = run([x], pool_2d(x, ws, ignore_border, stride, pad, mode), x_val)
    want = reference_pool(x_val, ws, ignore_border, stride, pad, mode)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("ndim", [2, 3, 5])
def test_pool_2d_pools_the_last_two_axes_of_any_tensor(ndim):
    x_val = rng.normal(size=(2, 3, 4)[:ndim - 2] + (2,) * max(0, ndim - 5) + (5, 6))
    x = pt.tensor("x", dtype="float64", shape=(None,) * ndim)
    for args in [((2, 2), True, None, (0, 0), "max"), ((2, 3), False, (1, 2), (0, 0), "sum"),
                 ((3, 2), True, (2, 2), (1, 1), "average_exc_pad")]:
        np.testing.assert_allclose(run([x], pool_2d(x, *args), x_val),
                                   reference_pool(x_val, *args), rtol=RTOL, atol=ATOL)


def test_pool_2d_integer_images_keep_their_dtype():
    x_val = rng.integers(-50, 50, size=(2, 1, 5, 5)).astype(np.int32)
    x = pt.tensor4("x", dtype="int32")
    for mode in MODES:
        out = pool_2d(x, (2, 2), ignore_border=False, mode=mode)
        assert out.dtype == "int32"
        want = np.trunc(reference_pool(x_val, (2, 2), False, mode=mode))  # C's division
        np.testing.assert_array_equal(run([x], out, x_val), want)


def test_pool_2d_refuses_bad_arguments():
    x = pt.tensor4("x")
    with pytest.raises(ValueError, match="unknown mode 'mean'"):
        pool_2d(x, (2, 2), mode="mean")
    with pytest.raises(ValueError, match="needs ignore_border=True"):
        pool_2d(x, (2, 2), ignore_border=False, pad=(1, 0))
    with pytest.raises(ValueError, match="smaller than the window"):
        pool_2d(x, (2, 2), pad=(2, 0))
    with pytest.raises(ValueError, match="ws must be at least 1"):
        pool_2d(x, (0, 2))
    with pytest.raises(TypeError, match="stride must be a pair of ints"):
        pool_2d(x, (2, 2), stride=(1, 2, 3))
    with pytest.raises(TypeError, match="2 or more dimensions"):
        pool_2d(pt.vector("v"), (2, 2))


# -- gradients ---------------------------------------------------------------------------------
@pytest.mark.parametrize("border_mode, subsample, flip, dilation", [
    ("valid", (1, 1), True, (1, 1)), ("full", (2, 1), False, (1, 1)),
    ((1, 2), (1, 2), True, (2, 1)), ("half", (2, 2), False, (1, 1))], ids=str)
def test_conv2d_gradient_against_finite_differences(border_mode, subsample, flip, dilation):
    x_val, w_val = rng.normal(size=(2, 2, 6, 5)), rng.normal(size=(3, 2, 3, 2))

    def conv(x, w):
        return conv2d(x, w, filter_shape=w_val.shape, border_mode=border_mode,
                      subsample=subsample, filter_flip=flip, filter_dilation=dilation)

    verify_grad(conv, [x_val, w_val], rng=np.random.default_rng(1), mode=PY_MODE)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ws, stride, pad, ignore_border", [
    ((2, 2), None, (0, 0), True), ((3, 2), (2, 1), (0, 0), False),
    ((3, 3), (2, 2), (1, 2), True)], ids=str)
def test_pool_2d_gradient_against_finite_differences(mode, ws, stride, pad, ignore_border):
    x_val = rng.normal(size=(2, 2, 7, 8))  # no ties: the maximum is differentiable
    verify_grad(lambda x: pool_2d(x, ws, ignore_border, stride, pad, mode), [x_val],
                rng=np.random.default_rng(2), mode=PY_MODE)
