"""synk.function at n_parallel 1, 2, 3, always against the plain function on the full data.

Compiling a new PyTensor graph costs seconds on a cold cache, so each session builds
a handful of functions once (``Model``) and the tests share them; the graphs are the
same for every n, so sessions after the first load them from the cache.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.raise_op import Assert

import synkhronos as synk
from synkhronos.testing import (
    commands_run,
    lane_runs,
    rank_values,
    run_on_ranks,
    set_rank_values,
    split_bounds,
)

from ..conftest import DEVICE, REPLAY, session_fixture

RTOL = 1e-10


class Model:
    """The functions every test in a session shares."""

    def __init__(self):
        x, y = pt.dmatrix("x"), pt.dmatrix("y")
        z = x.dot(y)
        self.reduce = synk.function(
            inputs=[x],
            bcast_inputs=[y],
            outputs=[
                z.mean(axis=0),
                (z.sum(axis=0), "sum"),
                (z.max(axis=0), "max"),
                (z.min(axis=0), "min"),
                ((1 + 0.01 * z).prod(axis=0), "prod"),
                (z.sum(axis=1), "gather"),
            ],
            name="reduce",
        )
        self.single = synk.function([x], (z.sum(), "sum"), bcast_inputs=[y])
        self.W = pytensor.shared(np.linspace(-1, 1, 12).reshape(4, 3), name="W")
        self.G = pytensor.shared(np.zeros((4, 3)), name="G")
        t = pt.dmatrix("t")
        loss = ((pt.tanh(x.dot(self.W)) - t) ** 2).mean()
        grad = pytensor.grad(loss, self.W)
        self.train = synk.function(
            [x, t], loss, updates=[(self.G, grad), (self.W, self.W - 0.1 * grad, "avg")]
        )
        self.grad_plain = pytensor.function([x, t], grad)
        self.data = pytensor.shared(np.zeros((0, 4)), name="data")
        self.sliced_sum = synk.function(
            [], [(self.data.sum(axis=0), "sum"), (self.data.sum(axis=1), "gather")],
            sliceable_shareds=[self.data],
        )
        v = pt.dvector("v")  # outputs whose shapes follow the values; a check that raises
        self.kept = synk.function(
            [v], [(v[v > 0], "gather"),
                  (Assert("a value below -100")(v.sum(), pt.all(v > -100)), "sum")],
            name="kept")
        b = pt.dvector("b")
        self.count = pytensor.shared(np.float64(0.0), name="count")
        self.bcast_only = synk.function(
            [], [(b.sum(), "sum"), (b * 2, "gather")], bcast_inputs=[b],
            updates=[(self.count, self.count + 1, "sum")],
        )
        synk.distribute()


model = session_fixture(Model)


rng = np.random.default_rng(0)
X = rng.normal(size=(1000, 4))
Y = rng.normal(size=(4, 3))
T = rng.normal(size=(1000, 3))


def assert_all_close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=1e-12)


@pytest.mark.parametrize("length", [1000, 7, 2, 1])
def test_every_reduce_op_matches_serial(model, length):
    got = model.reduce(X[:length], Y)
    assert_all_close(got, model.reduce.as_pytensor(X[:length], Y))


def test_data_inputs_and_numpy_inputs_agree(model):
    xd = synk.data(X)
    assert_all_close(model.reduce(xd, Y), model.reduce.as_pytensor(X, Y))
    assert_all_close(model.reduce(x=xd, y=Y), model.reduce.as_pytensor(X, Y))


@pytest.mark.parametrize(
    "batch",
    [10, slice(3, 250), slice(-20, None), slice(None, None, 1), [5, 1, 999, 5, 0]],
    ids=["int", "slice", "negative-slice", "step-1", "index-list"],
)
def test_batch_selects_rows_before_scatter(model, batch):
    xd = synk.data(X)
    rows = np.arange(1000)[:batch] if isinstance(batch, int) else np.arange(1000)[batch]
    assert_all_close(model.reduce(xd, Y, batch=batch), model.reduce.as_pytensor(X[rows], Y))


def test_shuffled_batch_gathers_in_batch_order(model):
    xd = synk.data(X)
    order = rng.permutation(1000)[:333]
    got = model.reduce(xd, Y, batch=order)
    assert_all_close(got, model.reduce.as_pytensor(X[order], Y))


@pytest.mark.parametrize("num_slices", range(1, 8))
def test_slices_equal_unsliced(model, num_slices):
    got = model.reduce(X[:101], Y, num_slices=num_slices)
    assert_all_close(got, model.reduce.as_pytensor(X[:101], Y))


def test_output_subset_and_single_output(model):
    got = model.reduce(X, Y, output_subset=[5, 0])
    want = model.reduce.as_pytensor(X, Y)
    assert_all_close(got, [want[5], want[0]])
    single = model.single(X, Y)
    assert isinstance(single, np.ndarray) and single.shape == ()
    np.testing.assert_allclose(single, model.single.as_pytensor(X, Y), rtol=RTOL)


@pytest.mark.parametrize("num_slices", [1, 3])
def test_sliced_updates_equal_unsliced_gradient(model, num_slices):
    n = synk.n_parallel()
    start = np.linspace(-1, 1, 12).reshape(4, 3)
    set_rank_values(model.W, [start] * n)
    xs, ts = X[:101], T[:101]
    wants = [model.grad_plain(xs[lo:hi], ts[lo:hi]) for lo, hi in split_bounds(101, n)]
    model.train(xs, ts, num_slices=num_slices)
    grads = rank_values(model.G)
    weights = rank_values(model.W)
    for rank, want in enumerate(wants):
        np.testing.assert_allclose(grads[rank], want, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(weights[rank], start - 0.1 * want, rtol=1e-9, atol=1e-12)


def test_rank_without_rows_applies_no_update(model):
    n = synk.n_parallel()
    marker = np.full((4, 3), 7.0)
    set_rank_values(model.G, [marker] * n)
    model.train(X[:1], T[:1])
    grads = rank_values(model.G)
    assert not np.array_equal(grads[0], marker)
    for rank in range(1, n):
        np.testing.assert_array_equal(grads[rank], marker)


def test_sliceable_shareds_with_batch_s(model):
    n = synk.n_parallel()
    blocks = [X[lo:hi] for lo, hi in split_bounds(10, n)]
    set_rank_values(model.data, blocks)
    whole = np.concatenate(blocks)
    got = model.sliced_sum()
    np.testing.assert_allclose(got[0], whole.sum(axis=0), rtol=RTOL)
    np.testing.assert_allclose(got[1], whole.sum(axis=1), rtol=RTOL)
    got = model.sliced_sum(batch_s=slice(0, 2), num_slices=2)
    picked = np.concatenate([b[0:2] for b in blocks])
    np.testing.assert_allclose(got[1], picked.sum(axis=1), rtol=RTOL)
    per_rank = [np.array([len(b) - 1]) if len(b) else np.array([], dtype=int) for b in blocks]
    got = model.sliced_sum(batch_s=per_rank)
    picked = np.concatenate([b[p] for b, p in zip(blocks, per_rank, strict=True)])
    np.testing.assert_allclose(got[1], picked.sum(axis=1), rtol=RTOL)


def test_a_call_is_one_command_even_with_batch_s(model):
    """batch_s is checked by each process inside the call itself (no shape query)."""
    blocks = [X[lo:hi] for lo, hi in split_bounds(10, synk.n_parallel())]
    set_rank_values(model.data, blocks)
    for kwargs in ({}, {"batch_s": slice(0, 2)}, {"batch_s": [0], "num_slices": 2}):
        model.sliced_sum(**kwargs)  # a variant's first call also distributes it
        before = commands_run()
        model.sliced_sum(**kwargs)
        assert commands_run() == before + 1, kwargs


def test_batch_s_refused_by_one_process_changes_nothing(model):
    """A selection out of range for some process's rows: a ValueError, nobody ran."""
    n = synk.n_parallel()
    blocks = [X[lo:hi] for lo, hi in split_bounds(10, n)]
    set_rank_values(model.data, blocks)
    count = model.count.get_value()
    shortest = min(len(b) for b in blocks)
    with pytest.raises(ValueError, match=r"batch_s for rank \d+: index .* out of range"):
        model.sliced_sum(batch_s=[shortest])
    np.testing.assert_array_equal(rank_values(model.data)[n - 1], blocks[n - 1])
    assert model.count.get_value() == count
    got = model.sliced_sum(batch_s=[0])  # the next call works
    np.testing.assert_allclose(got[0], np.sum([b[0] for b in blocks], axis=0), rtol=RTOL)


def test_late_function_keeps_shared_identity(model):
    n = synk.n_parallel()
    start = np.ones((4, 3))
    set_rank_values(model.W, [start] * n)
    read_w = synk.function([], model.W.sum() * 1.0, name="late")  # built after distribute
    model.train(X[:30], T[:30])  # changes W in every process that had rows
    after = rank_values(model.W)
    sums = read_w()
    np.testing.assert_allclose(sums, np.mean([w.sum() for w in after]), rtol=RTOL)


def test_givens_turn_shared_data_into_a_scattered_input(model):
    observed = pytensor.shared(np.zeros(5), name="observed")
    mu = pt.dscalar("mu")
    obs_in = pt.dvector("obs_in")
    logp = -0.5 * ((observed - mu) ** 2).sum()
    f = synk.function([obs_in], (logp, "sum"), bcast_inputs=[mu], givens={observed: obs_in})
    values = rng.normal(size=1001)
    np.testing.assert_allclose(f(values, 0.3), f.as_pytensor(values, 0.3), rtol=RTOL)


@pytest.mark.filterwarnings("ignore:input 0 .* is a synk.Data of another dtype:UserWarning")
def test_integer_data_is_cast_where_pytensor_casts(model):
    ints = synk.data(np.arange(40, dtype=np.int32).reshape(10, 4))
    got = model.reduce(ints, Y)
    assert_all_close(got, model.reduce.as_pytensor(np.arange(40).reshape(10, 4).astype(float), Y))


def test_a_data_cast_at_every_call_warns_once(model):
    x = pt.dmatrix("x")
    f = synk.function([x], (x.sum(axis=0), "sum"))
    ints = synk.data(np.arange(40, dtype=np.int32).reshape(10, 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = f(ints), f(ints)
    casts = [w for w in caught if "synk.Data of another dtype, cast to float64" in str(w.message)]
    assert len(casts) == 1 and casts[0].category is UserWarning
    want = f.as_pytensor(np.arange(40).reshape(10, 4).astype(float))
    np.testing.assert_allclose(first, want, rtol=RTOL)
    np.testing.assert_allclose(second, want, rtol=RTOL)


def test_repeated_data_calls_follow_changes_in_place_and_in_size(model):
    """A call repeated with the same Data reuses its plan: every change must show."""
    xd = synk.data(X[:100], oversize=2)
    assert_all_close(model.reduce(xd, Y), model.reduce.as_pytensor(X[:100], Y))
    assert_all_close(model.reduce(xd, Y), model.reduce.as_pytensor(X[:100], Y))
    xd[:] = X[100:200]  # written in place: the same segment and shape
    assert_all_close(model.reduce(xd, Y), model.reduce.as_pytensor(X[100:200], Y))
    xd.set_value(X[:37])  # fewer rows in the same allocation
    assert_all_close(model.reduce(xd, Y), model.reduce.as_pytensor(X[:37], Y))
    xd.set_value(X[:900])  # more rows than allocated: a new segment
    assert_all_close(model.reduce(xd, Y), model.reduce.as_pytensor(X[:900], Y))
    yd = synk.data(Y)
    for rows in (X[:900], X[:900], X[:3]):  # a broadcast Data in the mix
        xd.set_value(rows)
        assert_all_close(model.reduce(xd, yd), model.reduce.as_pytensor(rows, Y))
    xd.free_memory()
    xd.set_value(X[5:10])  # a new allocation after the old one was freed
    assert_all_close(model.reduce(xd, Y), model.reduce.as_pytensor(X[5:10], Y))


def test_repeated_numpy_calls_alternating_shapes_and_dtypes(model):
    """Numpy inputs reuse a plan only while the staging buffers still fit them."""
    cases = [X[:50], X[:900], X[:50], X[:50].astype(np.float32), X[:50], X[:900] + 1.0]
    for rows in cases + cases[::-1]:
        want = model.reduce.as_pytensor(rows.astype(np.float64), Y)
        assert_all_close(model.reduce(rows, Y), want)
        rows_d = synk.data(rows.astype(np.float64))
        assert_all_close(model.reduce(rows_d, Y), want)  # Data calls in between


def test_alternating_numpy_shapes_each_replay_once_the_staging_fits(model, monkeypatch,
                                                                     no_cyclic_gc):
    """A loop that alternates two batch sizes of numpy rows (training, then
    validation) on one function: once the staging buffer fits the bigger, each size
    replays its own record (viewing the buffer with another shape moves nothing), and
    every result is the plain function's."""
    prepared = []
    prepare = model.reduce.prepare
    monkeypatch.setattr(model.reduce, "prepare",
                        lambda *a, **k: prepared.append(1) or prepare(*a, **k))
    sizes = [900, 50] * 4
    for i, size in enumerate(sizes):
        rows = X[:size] + i
        assert_all_close(model.reduce(rows, Y), model.reduce.as_pytensor(rows, Y))
    # one validation per size (the buffer grew for the first only); none without replay
    assert len(prepared) == (2 if REPLAY else len(sizes))


def test_repeated_sliced_calls_follow_slices_and_changes(model, monkeypatch, no_cyclic_gc):
    """Sliced calls repeat too (PyMC's likelihood runs in slices): the second call like
    the first is not validated again, and a change of num_slices, of the rows or of
    their size must show."""
    prepared = []
    prepare = model.reduce.prepare
    monkeypatch.setattr(model.reduce, "prepare",
                        lambda *a, **k: prepared.append(a[-4]) or prepare(*a, **k))
    xd = synk.data(X[:300], oversize=2)
    cases = [(X[:300], 3), (X[:300], 3), (X[:300], 2), (X[:300], 1), (X[:300] + 1, 3),
             (X[:50], 3), (X[:900], 4), (X[:900], 4), (X[:300], 3)]
    for rows, slices in cases:
        want = model.reduce.as_pytensor(rows, Y)
        assert_all_close(model.reduce(rows, Y, num_slices=slices), want)
        xd.set_value(rows)
        assert_all_close(model.reduce(xd, Y, num_slices=slices), want)
    if not REPLAY:  # SYNK_REPLAY=0: every call validated
        assert len(prepared) == 2 * len(cases)
        return
    # validated: the first call of each (slices, shape) pair, numpy and Data each; a
    # Data that moved to a bigger segment (900 rows) once more
    assert 0 < len(prepared) < 2 * len(cases)
    # xd was just resized, which moves the epoch on: the next call is validated once
    # (its record is stale), and the one after it replays
    before = len(prepared)
    for _ in range(2):
        assert_all_close(model.reduce(X[:300], Y, num_slices=3),
                         model.reduce.as_pytensor(X[:300], Y))
    assert len(prepared) == before + 1
    model.reduce(X[:300], Y, num_slices=3)
    assert len(prepared) == before + 1  # repeated: no validation


def test_repeated_numpy_calls_read_the_callers_arrays_as_they_are_now(model):
    """At n_parallel 1 a repeated call reads its numpy inputs where they are (nobody else
    needs a copy in shared memory): a change the caller makes between calls, in place
    or by passing another array of the same shape, must show, and an array the call
    cannot read as it is (another dtype, Fortran order) is copied as before. (Arrays
    of over 32 KiB, even in float32: smaller ones are copied, which costs less.)"""
    x, y = np.tile(X, (4, 1)), Y.copy()
    other = x[::-1].copy()
    calls = [x, x, x, "x += 1", x, other, x, "y *= 2", x, other]
    for step in calls:
        if isinstance(step, str):
            exec(step, {}, {"x": x, "y": y})  # in place: the same arrays, new values
            continue
        assert_all_close(model.reduce(step, y), model.reduce.as_pytensor(step, y))
    for odd in (np.asfortranarray(x), x.astype(np.float32)):  # copied, and cast
        for k in range(3):
            odd[0, 0] = k
            want = model.reduce.as_pytensor(np.asarray(odd, dtype=np.float64), y)
            assert_all_close(model.reduce(odd, y), want)
    assert_all_close(model.reduce(x, y), model.reduce.as_pytensor(x, y))


def test_a_repeated_call_takes_the_lanes(model):
    """A training loop's call (the same command again) runs through the lanes, the
    master's (posted again as it stood) and each worker's, for Data and numpy inputs
    alike, and every change of the values shows."""
    n = synk.n_parallel()
    xd = synk.data(X[:40])
    for kind in ("data", "numpy"):
        before = lane_runs()
        for k in range(5):
            rows = X[:40] + k
            if kind == "data":
                xd[:] = rows  # in place: the same segment, the same command
            got = model.reduce(xd if kind == "data" else rows, Y)
            assert_all_close(got, model.reduce.as_pytensor(rows, Y))
        ran = np.subtract(lane_runs(), before)
        if not REPLAY:  # SYNK_REPLAY=0: no lane
            assert not ran.any(), (kind, ran)
            continue
        # the first calls of a new message go the usual way until it has been posted
        # keyed by itself and the worker has kept its plan (a numpy call's first
        # message is not the one that repeats); at n=1 nothing is posted
        assert all(count >= 2 for count in ran[1:]) and len(ran) == n, (kind, ran)
        assert ran[0] >= 2 if n > 1 else ran[0] == 0, (kind, ran)


@pytest.mark.skipif(DEVICE == "gpu", reason="JAX (the device stand-in) gives every output "
                    "a static shape and drops Assert ops: this function cannot run there")
def test_in_the_lane_outputs_of_other_shapes_and_failures_show(model):
    """The lane writes a reply where the last went only if its outputs have the same
    dtypes and shapes; else, and when the function raises, the result or the error is
    the same as on the usual way, and the session goes on."""
    n = synk.n_parallel()
    rng = np.random.default_rng(3)
    vd = synk.data(rng.normal(size=30))
    steps = ["ok", "ok", "shape", "ok", "shape", "fail", "ok", "ok", "fail", "fail", "ok",
             "ok", "fail_master", "ok", "ok", "fail_master", "fail", "ok"]
    for step in steps:
        values = rng.normal(size=30)  # how many are positive, per process: any
        if step == "ok":
            values = np.abs(values) + 0.1  # every row kept: the same shapes as before
        elif step == "fail":
            values[-1] = -1000.0  # in the last process's rows
        elif step == "fail_master":
            values = np.abs(values) + 0.1
            values[0] = -1000.0  # in the master's rows alone
        vd[:] = values
        if step.startswith("fail"):
            with pytest.raises(synk.WorkerError, match="a value below -100"):
                model.kept(vd)
            continue
        got = model.kept(vd)
        want = model.kept.as_pytensor(values)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=RTOL)
    if n > 1:
        assert min(lane_runs()) > 0 if REPLAY else max(lane_runs()) == 0


def test_as_pytensor_still_checks_its_inputs(model):
    """Parallel calls skip PyTensor's per-call input check; the serial one must not."""
    with pytest.raises(TypeError):
        model.reduce.as_pytensor(X[0], Y)
    assert_all_close(model.reduce(X[:10], Y), model.reduce.as_pytensor(X[:10], Y))


@pytest.mark.parametrize("num_slices", [1, 3])
def test_slices_of_a_function_with_nothing_to_slice(model, num_slices):
    """Only broadcast inputs: every process runs once, whatever num_slices says."""
    n = synk.n_parallel()
    set_rank_values(model.count, [np.float64(0.0)] * n)
    total, gathered = model.bcast_only(Y[0], num_slices=num_slices)
    np.testing.assert_allclose(total, Y[0].sum() * n, rtol=RTOL)
    np.testing.assert_allclose(gathered, np.concatenate([Y[0] * 2] * n), rtol=RTOL)
    assert rank_values(model.count) == [1.0] * n


def test_repeated_numpy_calls_after_other_calls_moved_the_staging(model):
    """Keyword, batch, sliced and profiled calls restage the same buffers in between:
    a repeated plain call must notice its buffer moved or changed shape."""
    small, big = X[:2], X[:800] * 2
    want_small = model.reduce.as_pytensor(small, Y)
    for _ in range(2):  # prepared, then repeated: where it copies to is kept
        assert_all_close(model.reduce(small, Y), want_small)
    assert_all_close(model.reduce(x=big, y=Y), model.reduce.as_pytensor(big, Y))
    assert_all_close(model.reduce(small, Y), want_small)
    assert_all_close(model.reduce(big, Y, batch=5), model.reduce.as_pytensor(big[:5], Y))
    assert_all_close(model.reduce(small + 1, Y), model.reduce.as_pytensor(small + 1, Y))
    assert_all_close(model.reduce(big, Y, num_slices=3), model.reduce.as_pytensor(big, Y))
    with synk.profile():
        assert_all_close(model.reduce(X[:3], Y), model.reduce.as_pytensor(X[:3], Y))
    assert_all_close(model.reduce(small, Y), want_small)


def test_a_bound_call_follows_what_it_relies_on(model, monkeypatch, no_cyclic_gc):
    """Calls bound to the same Data (synkhronos.pymc's likelihood) run their kept
    message once one has repeated, without building a repeat key; values written in
    place show, and a Data moved or reshaped, the staging moved by another call, an
    array of another dtype or shape, synk.profile() or a sliced call take the full
    path. Every result equals the plain function's."""
    function_module = sys.modules["synkhronos.function"]  # (synk.function: the function)
    keys = []
    repeat_key = function_module.repeat_key
    monkeypatch.setattr(function_module, "repeat_key",
                        lambda args: keys.append(1) or repeat_key(args))
    xd = synk.data(X[:100], oversize=2)
    bound = model.reduce.bind((xd,))
    sliced = model.reduce.bind((xd,), num_slices=3)

    def check(call, rows, y, fast):
        before = len(keys)
        assert_all_close(call(y), model.reduce.as_pytensor(rows, y))
        assert (len(keys) == before) == (fast and REPLAY)  # (SYNK_REPLAY=0: never)

    check(bound, X[:100], Y, fast=False)  # prepared: kept from now on
    check(bound, X[:100], Y + 1, fast=True)
    xd[:] = X[100:200]  # written in place: the same memory
    check(bound, X[100:200], Y, fast=True)
    xd.set_value(X[:37])  # fewer rows in the same allocation
    check(bound, X[:37], Y, fast=False)
    check(bound, X[:37], Y * 2, fast=True)
    xd.set_value(X[:900])  # a new segment
    check(bound, X[:900], Y, fast=False)
    check(bound, X[:900], Y, fast=True)
    check(bound, X[:900], Y.astype(np.float32), fast=False)  # cast as a call casts it
    check(bound, X[:900], Y[:, :2], fast=False)  # another shape
    check(bound, X[:900], Y[:, :2] + 1, fast=True)
    check(bound, X[:900], Y, fast=False)  # and back, no Data moved in between
    check(bound, X[:900], Y[:, :2], fast=False)
    wide = np.tile(Y, (1, 40))  # the broadcast input's buffer grows and moves
    assert_all_close(model.reduce(xd, wide), model.reduce.as_pytensor(X[:900], wide))
    check(bound, X[:900], Y[:, :2], fast=False)
    check(bound, X[:900], Y[:, :2], fast=True)
    with synk.profile() as profile:  # the timed message, kept as the other
        for fast in (False, True, True):
            check(bound, X[:900], Y[:, :2] + fast, fast=fast)
    assert [record.kind for record in profile.records] == ["call"] * 3
    assert all(record.stage > 0 and record.reduce > 0 for record in profile.records)
    assert all(len(record.function) == synk.n_parallel() for record in profile.records)
    check(bound, X[:900], Y[:, :2], fast=False)  # the timed call staged anew
    check(bound, X[:900], Y[:, :2], fast=True)
    for fast in (False, True):  # sliced calls repeat apart from unsliced ones
        check(sliced, X[:900], Y, fast=fast)
    # The sliced variant stages in buffers of its own: the unsliced record still holds,
    # unless they were new (a new Data moves the epoch on; an earlier test of the same
    # session may have made them), and replays once more at the latest
    assert_all_close(bound(Y[:, :2] * 3), model.reduce.as_pytensor(X[:900], Y[:, :2] * 3))
    check(bound, X[:900], Y[:, :2] * 4, fast=True)


def _mapped(name):
    with open("/proc/self/maps") as f:
        return sum(name in line for line in f)


def test_freed_data_is_unmapped_everywhere_after_repeated_calls(model):
    """Views kept for repeated calls never hold a freed Data's memory."""
    big = synk.data(X)
    segment = big.ref().segment
    for _ in range(3):
        assert_all_close(model.reduce(big, Y), model.reduce.as_pytensor(X, Y))
    big.free_memory()
    small = synk.data(X[:4])
    for _ in range(2):  # the release reaches the workers with the next command
        model.reduce(small, Y)
    mapped = run_on_ranks(_mapped, segment)
    assert mapped == [0] * synk.n_parallel()
