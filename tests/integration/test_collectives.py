"""Integration tests of the collectives at n_parallel 1, 2 and 3.

Most tests share one forked session per ``n`` (class-scoped ``env``): forking and
compiling a function costs seconds, so one function using a bank of shared variables
is built and distributed once. Every test first writes known per-rank values through
a CALLABLE command (independent of the collectives under test), runs the collective,
and compares every rank's values, read back the same way, with numpy.

Misuse tests that need their own session (before ``distribute``) come first, outside
the class, so no shared session is alive while they run.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytensor
import pytest

import synkhronos as synk
from synkhronos.errors import WorkerError
from synkhronos.testing import fault_at, lane_runs, on_variable, program_prefix
from tests.cases import folded

from ..conftest import DEVICE, REPLAY, sizes_to_run

pytestmark = pytest.mark.timeout(120)

OPS = ["avg", "sum", "prod", "max", "min"]
NUMPY = {"avg": np.mean, "sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}
BIG = 6_000_000  # float32 elements: 24 MB, well over SMALL_BYTES
FIRST_SHAPES = {"f32m": (4, 3), "f64v": (5,), "i32v": (7,), "f64s": (), "i64s": (),
                "c64v": (3,), "rows": (10, 2), "big": (BIG,), "f16m": (2, 2)}


# -- functions run in every process (synkhronos.testing.on_variable) -----------------------
def _fill(var, rank: int, shape: tuple, dtype: str, seed: int, order: str = "C") -> None:
    """Give this rank's copy of ``var`` the value ``_expected(shape, dtype, seed, rank)``."""
    value = _expected(shape, dtype, seed, rank)
    if order == "strided":  # every other row of a larger array
        rows = np.empty((2 * shape[0], *shape[1:]), dtype)
        rows[::2] = value
        value = rows[::2]
    var.set_value(np.asarray(value, order="K" if order == "strided" else order), borrow=True)


def _expected(shape: tuple, dtype: str, seed: int, rank: int) -> np.ndarray:
    rng = np.random.default_rng(seed * 101 + rank)
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return rng.integers(1, 5, size=shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.uniform(0.5, 2, shape) + 1j * rng.uniform(0.5, 2, shape)).astype(dtype)
    return rng.uniform(0.5, 2.0, size=shape).astype(dtype)


def _read(var, rank: int) -> np.ndarray:
    return var.get_value()


def _set(var, rank: int, value: np.ndarray) -> None:
    var.set_value(value)


# -- helpers in the master ------------------------------------------------------------------
def fill(var, seed: int, shape=None, order: str = "C") -> list[np.ndarray]:
    """Set per-rank values of ``var`` (default: its first shape); return them by rank."""
    shape = FIRST_SHAPES[var.name] if shape is None else shape
    dtype = var.type.dtype
    on_variable(var, _fill, shape, dtype, seed, order)
    return [_expected(shape, dtype, seed, r) for r in range(synk.n_parallel())]


def per_rank(var) -> list[np.ndarray]:
    """``var``'s value in every process, read without the collectives."""
    return on_variable(var, _read)


def expected_reduce(op: str, values: list[np.ndarray]) -> np.ndarray:
    return NUMPY[op](np.stack(values), axis=0)


def assert_close(actual, expected) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape
    if expected.dtype.kind in "fc":
        tol = 10 * np.finfo(expected.dtype).eps  # summation order differs from numpy's
        np.testing.assert_allclose(actual, expected, rtol=tol)
    else:
        np.testing.assert_array_equal(actual, expected)


class Bank:
    """The shared variables of one session, all used by one distributed function."""

    def __init__(self) -> None:
        def shared(value, name):
            return pytensor.shared(np.asarray(value), name=name)

        def zeros(name, dtype):
            return shared(np.zeros(FIRST_SHAPES[name], dtype), name)

        self.f32m = zeros("f32m", "float32")
        self.f64v = zeros("f64v", "float64")
        self.i32v = zeros("i32v", "int32")
        self.f64s = zeros("f64s", "float64")
        self.i64s = zeros("i64s", "int64")
        self.c64v = zeros("c64v", "complex64")
        self.rows = zeros("rows", "float32")
        self.big = zeros("big", "float32")
        self.f16m = zeros("f16m", "float16")
        self.unused = shared(np.zeros(3, "float32"), "unused")
        used = [self.f32m, self.f64v, self.i32v, self.f64s, self.i64s, self.c64v,
                self.rows, self.big, self.f16m]
        self.sums = synk.function([], [abs(v).sum() for v in used], name="sums")
        self.double = synk.function([], [], updates=[(self.f32m, self.f32m * 2)], name="double")
        synk.distribute()

    @property
    def mixed(self) -> list:
        return [self.f32m, self.f64v, self.i32v, self.f64s, self.i64s, self.f16m]

    @property
    def floats(self) -> list:
        return [self.f32m, self.f64v, self.f64s, self.c64v, self.f16m]


# -- misuse with a session of its own ---------------------------------------------------------
def test_collective_before_distribute_says_to_distribute(forked):
    var = pytensor.shared(np.zeros(3), name="early")
    for call in (lambda: synk.all_reduce(var), lambda: synk.broadcast(var),
                 lambda: synk.gather(var), lambda: synk.get_shapes(var)):
        with pytest.raises(RuntimeError, match=r"call synk.distribute\(\) before"):
            call()


def test_collective_after_close_says_to_fork():
    synk.fork(1)
    synk.close()
    var = pytensor.shared(np.zeros(3), name="late")
    with pytest.raises(RuntimeError, match=r"synk.fork\(\) must be called before synk.all_reduce"):
        synk.all_reduce(var)


# -- the shared session -----------------------------------------------------------------------
@pytest.fixture(scope="class", params=sizes_to_run([1, 2, 3]), ids=lambda n: f"n{n}")
def env(request):
    synk.fork(request.param, device=DEVICE)
    try:
        yield Bank()
    finally:
        synk.close()


class TestCollectives:
    @pytest.mark.parametrize("op", OPS)
    def test_all_reduce_list_of_mixed_dtypes(self, env, op):
        variables = env.floats if op == "avg" else env.mixed
        before = [fill(var, seed) for seed, var in enumerate(variables)]
        assert synk.all_reduce(variables, op=op) is None
        for var, values in zip(variables, before, strict=True):
            for value in per_rank(var):
                assert_close(value, expected_reduce(op, values))

    @pytest.mark.parametrize("op", OPS)
    def test_all_reduce_single_large(self, env, op):
        before = fill(env.big, 11)
        synk.all_reduce(env.big, op)
        for value in per_rank(env.big):
            assert_close(value, expected_reduce(op, before))

    def test_all_reduce_large_fused_with_small(self, env):
        variables = [env.f64v, env.big, env.f32m, env.f16m]
        for repeat in range(2):  # values copied in from private storage
            before = [fill(var, 20 + repeat + i) for i, var in enumerate(variables)]
            synk.all_reduce(variables, "sum")
            for var, values in zip(variables, before, strict=True):
                for value in per_rank(var):
                    assert_close(value, expected_reduce("sum", values))
        after = [per_rank(var)[0] for var in variables]
        synk.all_reduce(variables, "sum")  # values already resident in the slots
        for var, values in zip(variables, after, strict=True):
            for value in per_rank(var):
                assert_close(value, values * synk.n_parallel())

    def test_all_reduce_large_from_non_contiguous_storage(self, env):
        variables = [env.big, env.f32m]
        before = [fill(env.big, 24, order="strided"), fill(env.f32m, 25, order="F")]
        synk.all_reduce(variables, "max")
        for var, values in zip(variables, before, strict=True):
            for value in per_rank(var):
                assert_close(value, expected_reduce("max", values))

    def test_all_reduce_twice_and_after_function_updates(self, env):
        before = fill(env.f32m, 3)
        synk.all_reduce(env.f32m, "sum")
        total = expected_reduce("sum", before)
        env.double()  # every process replaces (or updates in place) its storage
        synk.all_reduce(env.f32m, "sum")
        for value in per_rank(env.f32m):
            assert_close(value, 2 * total * synk.n_parallel())

    def test_all_reduces_back_to_back_take_the_lanes(self, env):
        """All-reduces of the same variables and op one after the other (between
        training steps) are posted again as they stood by the master, and run in every
        worker through its lane (two processes: the pair's; more: every rank folds):
        every one counts, and every value is the serial result."""
        n = synk.n_parallel()
        before = fill(env.f64v, 40)
        runs = lane_runs()
        for _ in range(4):
            synk.all_reduce(env.f64v, "sum")
        ran = np.subtract(lane_runs(), runs)
        for value in per_rank(env.f64v):  # each sum after the first multiplies by n
            assert_close(value, expected_reduce("sum", before) * n**3)
        if n == 1:  # one process: no command
            assert not ran.any(), ran
            return
        # the usual way: the first after lane_runs (a command), the first of a group (on
        # a device: staged); none with SYNK_REPLAY=0
        assert all(count >= 2 for count in ran) if REPLAY else not ran.any(), ran
        # the kept step, one process's shape changed: refused, nothing changed
        now = per_rank(env.f64v)
        longer = np.append(now[-1], 7.0)
        on_variable(env.f64v, _set, longer, ranks=[n - 1])
        with pytest.raises(ValueError, match=rf"'f64v'.*same shape in every process.*"
                           rf"\({len(longer)},\) in rank {n - 1}"):
            synk.all_reduce(env.f64v, "sum")
        for value, was in zip(per_rank(env.f64v), [*now[:-1], longer], strict=True):
            assert_close(value, was)
        set_values = fill(env.f64v, 41)  # the same shape again: the kept step serves
        synk.all_reduce(env.f64v, "sum")
        for value in per_rank(env.f64v):
            assert_close(value, expected_reduce("sum", set_values))

    def test_a_repeated_all_reduce_follows_what_it_is_given(self, env):
        """A call with the same variables and op as the last skips its checks and runs
        the step it kept (``fused.Repeat``): each change between calls must still
        count: the list changed in place, another op, values set anew, a new shape, a
        variable by name, a one-element variable (its own kernel at two processes)."""
        variables = [env.f64v, env.f32m]
        for seed in (50, 51):  # the second call repeats the first
            before = [fill(var, seed + i) for i, var in enumerate(variables)]
            synk.all_reduce(variables, "sum")
            for var, values in zip(variables, before, strict=True):
                for value in per_rank(var):
                    assert_close(value, expected_reduce("sum", values))
        untouched = per_rank(env.f32m)
        variables[1] = env.f64s  # the same list, changed in place
        before = [fill(var, 52 + i) for i, var in enumerate(variables)]
        synk.all_reduce(variables, "sum")
        for var, values in zip(variables, before, strict=True):
            for value in per_rank(var):
                assert_close(value, expected_reduce("sum", values))
        for value, was in zip(per_rank(env.f32m), untouched, strict=True):
            assert_close(value, was)
        for op in ("max", "max", "avg"):  # another op, then the same again
            before = [fill(var, 53 + i) for i, var in enumerate(variables)]
            synk.all_reduce(variables, op)
            for var, values in zip(variables, before, strict=True):
                for value in per_rank(var):
                    assert_close(value, expected_reduce(op, values))
        for shape in ((5,), (8,), (8,)):  # the master's own value only, then new shapes
            if shape == (5,):
                env.f64v.set_value(np.arange(5.0))
                before = [np.arange(5.0), *per_rank(env.f64v)[1:]]
            else:
                before = fill(env.f64v, 54, shape=shape)
            synk.all_reduce(variables, "avg")
            for value in per_rank(env.f64v):
                assert_close(value, expected_reduce("avg", before))
        fill(env.f64v, 55)  # (the first shape again, for the tests after this one)
        for seed in (56, 57):
            before = fill(env.f64s, seed)
            synk.all_reduce("f64s", "avg")
            for value in per_rank(env.f64s):
                assert_close(value, expected_reduce("avg", before))

    # -- the low-precision exchange (exchange="bf16" / "fp16") -----------------------------
    @pytest.mark.parametrize("exchange", ["bf16", "fp16"])
    @pytest.mark.parametrize("op", ["sum", "avg"])
    def test_low_precision_all_reduce_is_numpys_fold_of_the_rounded_values(self, env, op,
                                                                           exchange):
        """Each process's values rounded, summed in float32 in rank order (and divided,
        avg): numpy's fold of the rounded values, bit for bit, in every process; a small
        variable alone, and a list over 64 kB (the folds by pieces), twice (the second
        time from the slots the first left the values in)."""
        for variables in ([env.f32m], [env.rows, env.big, env.f32m]):
            for seed in (60, 61):
                before = [fill(var, seed + i) for i, var in enumerate(variables)]
                given = variables[0] if len(variables) == 1 else variables
                assert synk.all_reduce(given, op, exchange=exchange) is None
                for var, values in zip(variables, before, strict=True):
                    want = folded(values, exchange, op)
                    assert not np.allclose(want, expected_reduce(op, values), rtol=1e-7,
                                           atol=0)  # (rounded: not the exact result)
                    for value in per_rank(var):
                        value = np.asarray(value)
                        assert value.dtype == np.float32 and np.array_equal(value, want)

    def test_low_precision_reduce_scatter_gives_each_process_its_piece(self, env):
        before = fill(env.big, 62)
        synk.steps.run([synk.steps.reduce_scatter(env.big, "avg", exchange="bf16")])
        want = folded(before, "bf16", "avg")
        for value, (lo, hi) in zip(per_rank(env.big), synk.steps.pieces(env.big),
                                   strict=True):
            assert np.array_equal(np.asarray(value)[lo:hi], want[lo:hi])

    def test_switching_exchange_back_to_back_takes_each_modes_own_step(self, env):
        """All-reduces of one variable one after another, the exchange switching between
        exact, bf16 and fp16 (with a repeat of each, which the master keeps and the
        workers run from their lanes): every result is its own mode's, so neither a kept
        step nor a lane ever serves another mode."""
        n = synk.n_parallel()
        runs = lane_runs()
        for seed, modes in ((63, ["bf16", "bf16", "bf16", None, None, "fp16", "fp16", "bf16",
                                  None]), (64, [None, "fp16", "bf16", "bf16"])):
            values = fill(env.f32m, seed)  # (in [0.5, 2): times 3**9 still fits fp16)
            for exchange in modes:  # back to back: nothing read between them
                synk.all_reduce(env.f32m, "sum", exchange=exchange)
                if exchange is None:
                    values = [expected_reduce("sum", values)] * n
                else:
                    values = [folded(values, exchange, "sum")] * n
            # bit for bit, the exact sums too: a small list is summed in rank order, as
            # numpy sums a stack along its first axis
            for value in per_rank(env.f32m):
                assert np.array_equal(np.asarray(value), values[0])
        ran = np.subtract(lane_runs(), runs)
        if n > 1 and REPLAY:  # the repeats of bf16, fp16 and exact, through the lanes
            assert all(count >= 4 for count in ran), ran

    def test_low_precision_refusals_move_nothing(self, env):
        """Misuse raises in the master before any process moves: every value stays."""
        n = synk.n_parallel()
        variables = [env.f32m, env.f64v, env.f16m]
        before = [fill(var, 64 + i) for i, var in enumerate(variables)]
        with pytest.raises(ValueError, match=r"exchange='bf16' rounds values for a sum or an "
                           r"average; op 'max' takes the exact exchange \(exchange=None\)"):
            synk.all_reduce(env.f32m, "max", exchange="bf16")
        with pytest.raises(TypeError, match=r"exchange='bf16' rounds float32 values; .*'f64v'"
                           r".* has dtype float64"):
            synk.all_reduce([env.f32m, env.f64v], "sum", exchange="bf16")
        with pytest.raises(TypeError, match=r"'f16m'.* has dtype float16"):
            synk.all_reduce(env.f16m, "avg", exchange="fp16")
        with pytest.raises(ValueError, match=r"exchange must be None \(exact\), 'bf16' or "
                           r"'fp16'; got 'int8'"):
            synk.all_reduce(env.f32m, "sum", exchange="int8")
        with pytest.raises(TypeError, match="exchange must be None, 'bf16' or 'fp16'; got int"):
            synk.all_reduce(env.f32m, "sum", exchange=16)
        with pytest.raises(TypeError, match="'f64v'.* has dtype float64"):
            synk.steps.reduce_scatter(env.f64v, "sum", exchange="fp16")
        with pytest.raises(ValueError, match="op 'prod'"):
            synk.steps.all_reduce(env.f32m, "prod", exchange="fp16")
        for var, values in zip(variables, before, strict=True):
            for value, was in zip(per_rank(var), values, strict=True):
                assert np.array_equal(np.asarray(value), was)
        if n == 1:
            return
        # one process's shape differs: the vote refuses it in every process alike
        longer = np.zeros((5, 3), "float32")
        on_variable(env.f32m, _set, longer, ranks=[n - 1])
        for _ in range(2):  # (the second time, the step kept by the first)
            with pytest.raises(ValueError, match=rf"'f32m'.*same shape in every process.*"
                               rf"\(5, 3\) in rank {n - 1}"):
                synk.all_reduce(env.f32m, "sum", exchange="bf16")
        for value, was in zip(per_rank(env.f32m), [*before[0][:-1], longer], strict=True):
            assert np.array_equal(np.asarray(value), was)
        fill(env.f32m, 65)  # (its first shape again, for the tests after this one)

    @pytest.mark.parametrize("op", OPS)
    @pytest.mark.parametrize("in_place", [True, False])
    def test_reduce(self, env, op, in_place):
        variables = [env.f32m, env.f64v, env.f64s] + ([] if op == "avg" else [env.i32v])
        before = [fill(var, 30 + i) for i, var in enumerate(variables)]
        result = synk.reduce(variables, op=op, in_place=in_place)
        master = synk.master_rank()
        for i, (var, values) in enumerate(zip(variables, before, strict=True)):
            expected = expected_reduce(op, values)
            now = per_rank(var)
            if in_place:
                assert result is None
                assert_close(now[master], expected)
            else:
                assert_close(result[i], expected)
                assert_close(now[master], values[master])
            for rank in range(synk.n_parallel()):
                if rank != master:
                    assert_close(now[rank], values[rank])

    @pytest.mark.parametrize("in_place", [True, False])
    def test_reduce_large(self, env, in_place):
        variables = [env.f32m, env.big]
        for resident in (False, True):  # the second call finds the values in the slots
            before = [per_rank(var) for var in variables] if resident else \
                [fill(var, 40 + i) for i, var in enumerate(variables)]
            result = synk.reduce(variables, "avg", in_place=in_place)
            for i, var in enumerate(variables):
                expected = expected_reduce("avg", before[i])
                now = per_rank(var)
                assert_close(now[0] if in_place else result[i], expected)
                for rank in range(1 if in_place else 0, synk.n_parallel()):
                    assert_close(now[rank], before[i][rank])

    @pytest.mark.parametrize("collective, op", [("reduce", "avg"), ("reduce", "sum"),
                                                ("all_reduce", "avg")])
    def test_folds_wait_for_a_slow_rank(self, env, collective, op):
        """In-place results are whole when the last worker folds its piece 0.3 s after
        the others (on the GPU stand-in the master copies its slot to the device: a
        reduce once copied a piece mid-average)."""
        n = synk.n_parallel()
        if n == 1:
            pytest.skip("needs a worker")
        before = fill(env.big, 46)
        with fault_at("exchange", "slow", ranks=[n - 1]):
            getattr(synk, collective)([env.big], op)
        now = per_rank(env.big)
        for rank in range(n if collective == "all_reduce" else 1):
            assert_close(now[rank], expected_reduce(op, before))

    def test_broadcast_master_values(self, env):
        variables = env.mixed + [env.big]
        before = [fill(var, 50 + i) for i, var in enumerate(variables)]
        assert synk.broadcast(variables) is None
        for var, values in zip(variables, before, strict=True):
            for value in per_rank(var):
                assert_close(value, values[0])

    def test_broadcast_given_values_casts_like_pytensor(self, env):
        synk.broadcast([env.f32m, env.i64s], [[[1, 2], [3, 4.5]], 7])
        for value in per_rank(env.f32m):
            assert value.dtype == np.float32
            assert_close(value, np.array([[1, 2], [3, 4.5]], "float32"))
        assert [int(v) for v in per_rank(env.i64s)] == [7] * synk.n_parallel()

    def test_broadcast_new_shape_then_reduce(self, env):
        fill(env.f64v, 1)
        synk.all_reduce(env.f64v, "sum")  # resident at the old shape
        synk.broadcast(env.f64v, np.arange(9.0))
        synk.all_reduce(env.f64v, "sum")
        for value in per_rank(env.f64v):
            assert_close(value, np.arange(9.0) * synk.n_parallel())

    @pytest.mark.parametrize("batch", [None, 7, slice(2, 9), [9, 0, 3, 3, 5, 1, 8]])
    def test_scatter_splits_rows_like_function_inputs(self, env, batch):
        data = np.arange(20, dtype="float32").reshape(10, 2)
        labels = np.arange(10, dtype="int32")
        synk.scatter([env.rows, env.i32v], [data, labels], batch=batch)
        chosen = np.arange(10)[slice(batch) if isinstance(batch, int) or batch is None
                               else batch]
        blocks = np.array_split(chosen, synk.n_parallel())
        for block, value, label in zip(blocks, per_rank(env.rows), per_rank(env.i32v), strict=True):
            np.testing.assert_array_equal(value, data[block])
            np.testing.assert_array_equal(label, labels[block])

    def test_scatter_from_shared_data_in_place(self, env):
        source = synk.data(np.arange(33, dtype="float32").reshape(11, 3))
        synk.scatter(env.f32m, source)
        np.testing.assert_array_equal(np.concatenate(per_rank(env.f32m)), source.data)
        source.free_memory()

    def test_uneven_shapes_gather_all_gather_and_queries(self, env):
        data = np.arange(14, dtype="float32").reshape(7, 2)
        synk.scatter(env.rows, data)
        n = synk.n_parallel()
        lengths = [7 // n + (1 if r < 7 % n else 0) for r in range(n)]
        assert synk.get_lengths(env.rows) == lengths
        assert synk.get_shapes(env.rows) == [(k, 2) for k in lengths]
        f64v_lengths = [len(value) for value in per_rank(env.f64v)]
        assert synk.get_lengths([env.rows, env.f64v]) == [lengths, f64v_lengths]
        np.testing.assert_array_equal(synk.gather(env.rows, nd_up=0), data)
        if n > 1 and len(set(lengths)) > 1:
            with pytest.raises(ValueError, match="'rows'.*needs the same shape.*nd_up=0"):
                synk.gather(env.rows)
            with pytest.raises(ValueError, match="'rows'.*same shape in every process"):
                synk.all_reduce(env.rows)
            with pytest.raises(ValueError, match="'rows'.*same shape in every process"):
                synk.reduce([env.f64v, env.rows], in_place=False)
            for rank, value in enumerate(per_rank(env.rows)):  # nothing changed
                assert len(value) == lengths[rank]
        synk.all_gather(env.rows)
        for value in per_rank(env.rows):
            np.testing.assert_array_equal(value, data)
        assert synk.get_lengths(env.rows) == [7] * n

    def test_gather_stacks_and_concatenates(self, env):
        variables = [env.f32m, env.f64s, env.i32v]
        before = [fill(var, 60 + i) for i, var in enumerate(variables)]
        stacked = synk.gather(variables)
        joined = synk.gather(variables, nd_up=0)
        for var, values, s, j in zip(variables, before, stacked, joined, strict=True):
            assert_close(s, np.stack(values))
            assert_close(j, np.stack(values) if values[0].ndim == 0 else np.concatenate(values))
            for value, original in zip(per_rank(var), values, strict=True):
                assert_close(value, original)
        single = synk.gather(env.f64s)
        assert isinstance(single, np.ndarray) and single.shape == (synk.n_parallel(),)

    def test_gather_and_all_gather_large(self, env):
        before = fill(env.big, 70, shape=(BIG // 4,))
        assert_close(synk.gather(env.big, nd_up=0), np.concatenate(before))
        synk.all_gather(env.big)
        for value in per_rank(env.big):
            assert_close(value, np.concatenate(before))

    def test_set_value_and_get_value_each_rank(self, env):
        n = synk.n_parallel()
        for rank in range(n):
            synk.set_value(rank, [env.f64v, env.i64s], [np.full(rank + 1, rank + 0.5), rank])
        for rank in range(n):
            vector, scalar = synk.get_value(rank, [env.f64v, env.i64s])
            assert_close(vector, np.full(rank + 1, rank + 0.5))
            assert int(scalar) == rank
            assert_close(synk.get_value(rank, env.f64v), np.full(rank + 1, rank + 0.5))
        assert [len(v) for v in per_rank(env.f64v)] == list(range(1, n + 1))

    def test_set_value_with_batch_and_large(self, env):
        data = np.arange(20, dtype="float32").reshape(10, 2)
        last = synk.n_parallel() - 1
        synk.set_value(last, env.rows, data, batch=[3, 1, 4])
        np.testing.assert_array_equal(synk.get_value(last, env.rows), data[[3, 1, 4]])
        big = np.random.default_rng(5).uniform(size=BIG).astype("float32")
        synk.set_value(last, env.big, big)
        np.testing.assert_array_equal(synk.get_value(last, env.big), big)

    def test_segments_do_not_linger_between_calls(self, env):
        fill(env.f32m, 2)
        fill(env.big, 2)
        synk.all_reduce([env.f32m, env.big])
        synk.gather(env.f32m)
        mark = program_prefix()
        before = {e for e in os.listdir("/dev/shm") if e.startswith(mark)}
        synk.all_reduce([env.f32m, env.big], "sum")
        synk.all_gather(env.rows)
        synk.reduce(env.big, in_place=False)
        after = {e for e in os.listdir("/dev/shm") if e.startswith(mark)}
        assert after <= before  # exchange buffers are unlinked once every rank mapped them

    def test_least_recently_used_groups_are_evicted(self, env):
        """More distinct lists than the backend keeps groups for: evicted ones come back."""
        small = [env.f32m, env.f64v, env.i32v, env.f64s, env.i64s, env.c64v, env.rows]
        lists = [list(c) for k in (1, 2, 3) for c in itertools.combinations(small, k)][:70]
        lists.append([env.f32m])
        for round_ in range(2):
            for i, variables in enumerate(lists):
                before = [fill(var, 80 + i + round_) for var in variables]
                synk.all_reduce(variables, "max")
                for var, values in zip(variables, before, strict=True):
                    for value in per_rank(var):
                        assert_close(value, expected_reduce("max", values))

    # -- errors: raised in the master before any process moves -----------------------------
    def test_unknown_and_bad_ops(self, env):
        with pytest.raises(ValueError, match="op must be one of avg, sum, prod, max, min"):
            synk.all_reduce(env.f32m, op="mean")
        with pytest.raises(ValueError, match="gather and None are for function outputs"):
            synk.reduce(env.f32m, op="gather")
        with pytest.raises(TypeError, match="op must be a string"):
            synk.all_reduce(env.f32m, op=3)
        with pytest.raises(TypeError, match="op 'avg' needs floating-point.*'i32v'"):
            synk.all_reduce([env.f32m, env.i32v])

    def test_variable_not_distributed_is_named(self, env):
        with pytest.raises(ValueError, match=r"'unused' \(shared_vars\[1\]\) is not used by any"):
            synk.all_reduce([env.f32m, env.unused])
        with pytest.raises(ValueError, match="'unused' is not used by any distributed"):
            synk.get_value(0, env.unused)
        with pytest.raises(ValueError, match="appears more than once"):
            synk.broadcast([env.f32m, env.f32m])
        with pytest.raises(TypeError, match="must be a PyTensor tensor shared variable"):
            synk.gather([env.f32m, np.zeros(3)])
        with pytest.raises(ValueError, match="shared_vars is empty"):
            synk.all_reduce([])

    def test_rank_out_of_range(self, env):
        n = synk.n_parallel()
        with pytest.raises(ValueError, match=rf"rank must be in 0..{n - 1}"):
            synk.get_value(n, env.f32m)
        with pytest.raises(ValueError, match="rank must be in"):
            synk.set_value(-1, env.f32m, np.zeros((2, 3), "float32"))
        with pytest.raises(TypeError, match="rank must be an integer"):
            synk.get_value(True, env.f32m)

    def test_values_that_do_not_fit(self, env):
        before = fill(env.f32m, 90)
        with pytest.raises(TypeError, match="value for shared variable 'f32m' does not fit"):
            synk.broadcast(env.f32m, np.zeros(3, "float32"))  # wrong ndim
        with pytest.raises(TypeError, match="'f32m' does not fit.*loss of precision"):
            synk.broadcast(env.f32m, np.zeros((2, 2), "float64"))
        with pytest.raises(TypeError, match="'i32v' does not fit"):
            synk.set_value(0, env.i32v, np.zeros(3, "float64"))
        with pytest.raises(ValueError, match="one value per shared variable"):
            synk.broadcast([env.f32m, env.f64v], [np.zeros((1, 1), "float32")])
        with pytest.raises(TypeError, match="values must be a list"):
            synk.scatter([env.f32m], np.zeros((1, 1), "float32"))
        with pytest.raises(ValueError, match="share their length along axis 0"):
            synk.set_value(0, [env.rows, env.i32v],
                           [np.zeros((4, 2), "float32"), np.zeros(5, "int32")], batch=[0])
        with pytest.raises(ValueError, match="scatter of shared variable 'rows'.*out of range"):
            synk.scatter([env.rows, env.i32v], [np.zeros((4, 2), "float32"),
                                                np.zeros(5, "int32")], batch=[4])
        with pytest.raises(ValueError, match="is 0-d"):
            synk.scatter(env.f64s, 1.0)
        with pytest.raises(ValueError, match="out of range"):
            synk.scatter(env.rows, np.zeros((4, 2), "float32"), batch=[5])
        with pytest.raises(ValueError, match="nd_up must be 1"):
            synk.gather(env.f32m, nd_up=2)
        with pytest.raises(ValueError, match="all_gather.*'f64s' is 0-d"):
            synk.all_gather(env.f64s)
        with pytest.raises(ValueError, match="'i64s' is 0-d and has no length"):
            synk.get_lengths(env.i64s)
        for rank, value in enumerate(per_rank(env.f32m)):  # no process moved
            assert_close(value, before[rank])

    def test_worker_error_keeps_processes_in_step(self, env):
        if synk.n_parallel() == 1:
            pytest.skip("needs a worker")
        on_variable(env.f64v, _break_storage, ranks=[1])
        with pytest.raises(WorkerError, match="rank 1"):
            synk.all_reduce([env.f32m, env.f64v], "sum")
        before = fill(env.f64v, 99)
        synk.all_reduce(env.f64v, "sum")
        for value in per_rank(env.f64v):
            assert_close(value, expected_reduce("sum", before))


def _break_storage(var, rank: int) -> None:
    """Put something no collective can copy into a variable's storage (a test fault)."""
    var.container.storage[0] = object()
