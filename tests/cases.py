"""Cases shared by the integration suite and the several-machines suite.

One module of cases, run by both:

- ``tests/integration/test_cases.py`` forks a session at each size on this machine and
  checks every case against its reference: plain numpy on the full data;
- ``tests/mpi/scripts/suite.py`` runs the same cases under ``mpiexec`` (several
  "machines") and alone; ``tests/mpi/test_machines.py`` compares the two runs (bit
  for bit, except reductions of collectives between machines in fast mode, within
  rounding) and each against the same references.

Each case returns ``Check``\\ s by name: what the session gave and what numpy gives
(None where the reference would only restate the implementation, e.g. the updates of
a sliced call: such a result is compared between runs only), and ``notes``: error
messages and the session's layout. Names starting ``reduce/`` are reductions of
collectives; ``rounded/``, low-precision exchanges, whose reference is numpy's
rank-order float32 fold of the rounded values (``rounded``, ``folded``): those must
equal it exactly, on one machine and on several. Values have large magnitudes so that a
different summation order shows in the last bits. Public modules only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos import steps, testing

__all__ = ["Check", "Suite", "CASES", "run_all", "rows_of"]


@dataclass
class Check:
    """One result of a case: what the session gave, and numpy's reference."""

    got: np.ndarray
    want: np.ndarray | None

    def compare(self, name: str) -> None:
        """Assert that ``got`` is the reference: exactly for copies and a process's own
        values, within rounding for anything summed in another order."""
        if self.want is None:
            return
        got, want = np.asarray(self.got), np.asarray(self.want)
        assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
        if name.startswith(("copy/", "data/", "rounded/")):
            assert got.dtype == want.dtype and np.array_equal(got, want), (
                f"{name} differs from numpy's")
        else:
            tolerance = ({"rtol": 1e-5, "atol": 1e-3} if got.dtype == np.float32
                         else {"rtol": 1e-10, "atol": 1e-8})
            np.testing.assert_allclose(got, want, err_msg=name, **tolerance)


def raise_on(rank: int) -> None:
    if testing.this_rank() == rank:
        raise ValueError(f"rank {rank} refuses on purpose")


def per_rank(n: int, shape: tuple, seed: int, dtype: str = "float64") -> list[np.ndarray]:
    return [(np.random.default_rng(seed + r).standard_normal(shape) * 1e3).astype(dtype)
            for r in range(n)]


def rounded(values: np.ndarray, exchange: str) -> np.ndarray:
    """float32 ``values`` rounded to ``exchange``'s format (to nearest, ties to even), as
    float32: bf16 keeps 8 significant bits (``frexp`` and ``rint``, for normal values),
    fp16 is numpy's float16."""
    values = np.asarray(values, np.float32)
    if exchange == "fp16":
        return values.astype(np.float16).astype(np.float32)
    mantissa, exponent = np.frexp(values.astype(np.float64))
    return np.ldexp(np.rint(mantissa * 256) / 256, exponent).astype(np.float32)


def folded(values: list[np.ndarray], exchange: str, op: str) -> np.ndarray:
    """What a low-precision exchange of every process's ``values`` (by rank) gives: the
    rounded values summed in float32 in rank order (``avg``: divided by their number)."""
    total = rounded(values[0], exchange)
    for value in values[1:]:
        total = total + rounded(value, exchange)
    return total / np.float32(len(values)) if op == "avg" else total


def rows_of(length: int, n: int, rank: int) -> int:
    """Rows of ``length`` that process ``rank`` of ``n`` takes (the first ``length % n``
    one more)."""
    return length // n + (1 if rank < length % n else 0)


class Suite:
    """Every case's shared variables and functions, built before ``synk.distribute()``."""

    def __init__(self) -> None:
        x, y = pt.dmatrix("x"), pt.dvector("y")
        self.w = pytensor.shared(np.zeros(3), name="w")
        self.s = pytensor.shared(np.zeros((1, 3)), name="s")
        z = x * y
        self.f = synk.function(
            [x], [z.mean(axis=0), (z.sum(axis=0), "sum"), (z.max(axis=0), "max"),
                  (z.min(axis=0), "min"), ((x[:, :1] / 50 + 1).prod(), "prod"),
                  (z, "gather"), (z.shape[0], None)], bcast_inputs=[y], name="f")
        self.g = synk.function([x], (x.sum(axis=0), "sum"),
                               updates=[(self.w, self.w + x.sum(axis=0), "sum")], name="g")
        self.h = synk.function([], (self.s.sum(axis=0), "gather"),
                               sliceable_shareds=[self.s], name="h")
        self.rows = synk.function([x], (x, "gather"), name="rows")
        # the collectives' variables
        self.v = pytensor.shared(np.zeros((2, 3)), name="v")
        self.big = pytensor.shared(np.zeros(30_000), name="big")  # 240 kB: the large paths
        self.mixed = [pytensor.shared(np.zeros(5, "float32"), name="m32"),
                      pytensor.shared(np.zeros(9000), name="m64")]
        # float32, for the low-precision exchange: small, and over 64 kB with it
        self.r32 = pytensor.shared(np.zeros((3, 4), "float32"), name="r32")
        self.r32big = pytensor.shared(np.zeros(20_000, "float32"), name="r32big")
        total = (self.v.sum() + self.big.sum() + self.mixed[0].sum() + self.mixed[1].sum()
                 + self.r32.sum() + self.r32big.sum())
        self.use = synk.function([], [(total, "sum")], name="use")


def _f_reference(X: np.ndarray, Y: np.ndarray, n: int) -> list[np.ndarray]:
    z = X * Y
    return [z.mean(axis=0), z.sum(axis=0), z.max(axis=0), z.min(axis=0),
            (X[:, :1] / 50 + 1).prod(), z, np.asarray(rows_of(len(X), n, 0))]


def functions(suite: Suite, n: int, notes: dict) -> dict[str, Check]:
    checks: dict[str, Check] = {}
    f = suite.f
    rng = np.random.default_rng(0)
    X = rng.standard_normal((53, 3)) * 1e3
    Y = rng.standard_normal(3)
    for i, (out, want) in enumerate(zip(f(X, Y), _f_reference(X, Y, n), strict=True)):
        checks[f"f/numpy/{i}"] = Check(np.asarray(out), want)
    xd = synk.data(X)
    idx = rng.permutation(53)[:31]
    for key, batch, rows in (("indices", idx, X[idx]), ("slice", slice(3, 40), X[3:40]),
                             ("count", 17, X[:17])):
        for i, (out, want) in enumerate(zip(f(xd, Y, batch=batch), _f_reference(rows, Y, n),
                                            strict=True)):
            checks[f"f/{key}/{i}"] = Check(np.asarray(out), want)
    minibatch = synk.data(X[:20], minibatch=True)
    checks["f/minibatch"] = Check(suite.rows(minibatch, batch=np.arange(13)), X[:13])
    checks["f/subset"] = Check(np.asarray(f(xd, Y, output_subset=[1])),
                               np.asarray([(X * Y).sum(axis=0)]))
    X2 = rng.standard_normal((53, 3))
    first = f(X2, Y)[1]
    want_first = (X2 * Y).sum(axis=0)
    X2 += 1.0  # the same shape: a repeated call, its arrays copied where the first went
    checks["f/repeat"] = Check(np.stack([first, f(X2, Y)[1]]),
                               np.stack([want_first, (X2 * Y).sum(axis=0)]))
    # fewer rows in the same staging buffer (viewed smaller, nothing moved), then each
    # size repeated: each replays its own call, which sends every machine its own rows
    X3 = X2[:20] * 2
    fewer = f(X3, Y)[1]
    X2 += 1.0
    X3 += 1.0
    checks["f/two_sizes"] = Check(
        np.stack([fewer, f(X2, Y)[1], f(X3, Y)[1]]),
        np.stack([((X3 - 1.0) * Y).sum(axis=0), (X2 * Y).sum(axis=0), (X3 * Y).sum(axis=0)]))
    checks["f/sliced"] = Check(suite.g(xd, num_slices=3), X.sum(axis=0))
    checks["f/updates"] = Check(np.stack(testing.rank_values(suite.w)), None)
    values = rng.standard_normal((4 * n, 3))
    synk.scatter(suite.s, values)
    checks["f/batch_s"] = Check(
        suite.h(batch_s=[slice(0, 1 + r % 3) for r in range(n)]),
        np.concatenate([values[4 * r:4 * r + 1 + r % 3].sum(axis=0) for r in range(n)]))
    try:
        suite.h(batch_s=[slice(0, 2)] * (n - 1) + [[7]])
    except ValueError as exc:
        notes["f/batch_s_refused"] = str(exc)
    # a command larger than the control block's mailbox (1 MiB), and replies larger
    # than their slots and than the record that ends a command between machines
    large = np.arange(300_000, dtype=np.float64)
    checks["f/large_message"] = Check(np.array(testing.run_on_ranks(np.sum, large)),
                                      np.full(n, large.sum()))
    checks["f/large_replies"] = Check(np.stack(testing.run_on_ranks(np.ones, 200_000)),
                                      np.ones((n, 200_000)))
    try:
        testing.run_on_ranks(raise_on, n - 1)
    except synk.WorkerError as exc:
        notes["f/worker_error"] = [exc.rank, str(exc)]
    return checks


def data(suite: Suite, n: int, notes: dict) -> dict[str, Check]:
    checks: dict[str, Check] = {}
    rows = suite.rows
    shared = synk.data(np.arange(12.0).reshape(4, 3), oversize=1.5)
    ref = np.arange(15.0).reshape(5, 3) + 100
    shared.set_value(ref)
    checks["data/set_value"] = Check(rows(shared), ref.copy())
    shared[1:3] = -7.0
    ref[1:3] = -7.0
    shared[[0, 4], 2] = np.array([5.5, 6.5])
    ref[[0, 4], 2] = [5.5, 6.5]
    checks["data/setitem"] = Check(rows(shared), ref.copy())
    shared.set_length(11)  # beyond the allocation: values carried over to new memory
    shared[5:] = np.arange(18.0).reshape(6, 3)
    ref = np.concatenate([ref, np.arange(18.0).reshape(6, 3)])
    checks["data/set_length"] = Check(rows(shared), ref.copy())
    shared.data[2:4] = 42.0  # through the view: sync() takes it to every machine
    ref[2:4] = 42.0
    shared.sync()
    checks["data/sync"] = Check(rows(shared), ref.copy())
    shared.set_shape((8, 3))
    checks["data/set_shape"] = Check(rows(shared), ref[:8].copy())
    shared.free_memory()
    shared.set_value(np.full((6, 3), 3.25))
    checks["data/after_free"] = Check(rows(shared), np.full((6, 3), 3.25))
    return checks


_OPS: dict[str, Callable[..., Any]] = {"sum": np.sum, "avg": np.mean, "max": np.max,
                                       "min": np.min, "prod": np.prod}


def collectives(suite: Suite, n: int, notes: dict) -> dict[str, Check]:
    checks: dict[str, Check] = {}
    v, big, mixed = suite.v, suite.big, suite.mixed
    rng = np.random.default_rng(1)
    value = np.arange(6.0).reshape(2, 3)
    synk.broadcast(v, value)
    checks["copy/broadcast"] = Check(np.stack(testing.rank_values(v)),
                                     np.stack([value] * n))
    values = rng.standard_normal((2 * n + 1, 3))  # uneven: all_reduce refuses below
    synk.scatter(v, values)
    checks["copy/scatter"] = Check(np.concatenate(testing.rank_values(v)), values)
    checks["copy/lengths"] = Check(np.array(synk.get_lengths(v)),
                                   np.array([rows_of(len(values), n, r) for r in range(n)]))
    checks["copy/gather0"] = Check(synk.gather(v, nd_up=0), values)
    try:
        synk.all_reduce(v)
    except ValueError as exc:
        notes["reduce/mismatch"] = str(exc)
    synk.all_gather(v)
    checks["copy/all_gather"] = Check(np.stack(testing.rank_values(v)), np.stack([values] * n))
    own = per_rank(n, (2, 3), 10)
    testing.set_rank_values(v, own)
    checks["copy/gather1"] = Check(synk.gather(v), np.stack(own))
    synk.set_value(n - 1, v, np.full((2, 3), 9.0))
    own[n - 1] = np.full((2, 3), 9.0)
    checks["copy/get_value"] = Check(np.stack([synk.get_value(r, v) for r in range(n)]),
                                     np.stack(own))
    checks["copy/shapes"] = Check(np.array(synk.get_shapes(v)), np.array([(2, 3)] * n))
    for op, combine in _OPS.items():
        small = [a / 1e3 + 1 if op == "prod" else a for a in per_rank(n, (2, 3), 20)]
        testing.set_rank_values(v, small)
        synk.all_reduce(v, op)
        result = combine(np.stack(small), axis=0)
        checks[f"reduce/all_reduce/small/{op}"] = Check(np.stack(testing.rank_values(v)),
                                                       np.stack([result] * n))
        large = per_rank(n, (30_000,), 30)
        if op == "prod":
            large = [a / 1e6 + 1 for a in large]
        testing.set_rank_values(big, large)
        synk.all_reduce(big, op)
        result_large = combine(np.stack(large), axis=0)
        checks[f"reduce/all_reduce/large/{op}"] = Check(np.stack(testing.rank_values(big)),
                                                       np.stack([result_large] * n))
        testing.set_rank_values(big, large)
        checks[f"reduce/reduce/large/{op}"] = Check(synk.reduce(big, op, in_place=False),
                                                   result_large)
        testing.set_rank_values(v, small)
        synk.reduce(v, op)
        after = list(small)
        after[synk.master_rank()] = result  # in place: the master's only
        checks[f"reduce/reduce/small/{op}"] = Check(np.stack(testing.rank_values(v)),
                                                   np.stack(after))
    for name, count in (("small", 500), ("large", 9000)):  # under and over 64 kB
        parts = [per_rank(n, (5,), 40, "float32"), per_rank(n, (count,), 50)]
        for var, values_of in zip(mixed, parts, strict=True):
            testing.set_rank_values(var, values_of)
        synk.all_reduce(mixed, "sum")
        for i, (var, values_of) in enumerate(zip(mixed, parts, strict=True)):
            checks[f"reduce/mixed/{name}/{i}"] = Check(
                np.stack(testing.rank_values(var)), np.stack([np.sum(values_of, axis=0)] * n))
    large = per_rank(n, (30_000,), 60)
    total = np.sum(large, axis=0)
    testing.set_rank_values(big, large)
    steps.run([steps.reduce_scatter(big, "sum")])
    pieces = steps.pieces(big)
    own = testing.rank_values(big)
    checks["reduce/reduce_scatter"] = Check(
        np.concatenate([own[r][lo:hi] for r, (lo, hi) in enumerate(pieces)]), total)
    steps.run([steps.all_gather_pieces(big)])
    checks["reduce/all_gather_pieces"] = Check(np.stack(testing.rank_values(big)),
                                               np.stack([total] * n))
    checks["reduce/use"] = Check(np.asarray(suite.use()), None)  # values left by the above
    return checks


def low_precision(suite: Suite, n: int, notes: dict) -> dict[str, Check]:
    """``all_reduce`` and ``reduce_scatter`` with ``exchange="bf16"``/``"fp16"``."""
    checks: dict[str, Check] = {}
    r32, r32big = suite.r32, suite.r32big
    for exchange in ("bf16", "fp16"):
        for op in ("sum", "avg"):
            for name, variables in (("small", [r32]), ("large", [r32, r32big])):
                values = [per_rank(n, var.get_value().shape, 70 + i, "float32")
                          for i, var in enumerate(variables)]
                for var, values_of in zip(variables, values, strict=True):
                    testing.set_rank_values(var, values_of)
                synk.all_reduce(variables, op, exchange=exchange)
                for i, (var, values_of) in enumerate(zip(variables, values, strict=True)):
                    checks[f"rounded/all_reduce/{exchange}/{op}/{name}/{i}"] = Check(
                        np.stack(testing.rank_values(var)),
                        np.stack([folded(values_of, exchange, op)] * n))
        large = per_rank(n, (20_000,), 80, "float32")
        testing.set_rank_values(r32big, large)
        steps.run([steps.reduce_scatter(r32big, "sum", exchange=exchange)])
        own = testing.rank_values(r32big)
        checks[f"rounded/reduce_scatter/{exchange}"] = Check(
            np.concatenate([own[r][lo:hi] for r, (lo, hi) in enumerate(steps.pieces(r32big))]),
            folded(large, exchange, "sum"))
    try:
        synk.all_reduce(r32, "max", exchange="bf16")
    except ValueError as exc:
        notes["rounded/refused"] = str(exc)
    return checks


CASES: dict[str, Callable[[Suite, int, dict], dict[str, Check]]] = {
    "functions": functions,
    "data": data,
    "collectives": collectives,
    "low_precision": low_precision,
}


def run_all(n: int) -> tuple[dict[str, Check], dict[str, Any]]:
    """Build the suite, distribute, run every case in order; the checks and notes."""
    suite = Suite()
    synk.distribute()
    notes: dict[str, Any] = {"n": n, "hosts": testing.rank_hosts(),
                             "machines": testing.rank_machines(),
                             "pids": testing.process_pids()}
    checks: dict[str, Check] = {}
    for case in CASES.values():
        checks.update(case(suite, n, notes))
    return checks, notes
