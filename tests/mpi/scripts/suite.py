"""Key cases of the function, data and collective suites, the same on one or several machines.

``python suite.py --out DIR --processes 4`` runs alone (4 processes);
``mpiexec -n 2 python suite.py --out DIR --processes 2 [--reduction exact]`` runs on 2
"machines" of 2 processes each (``--processes`` is per machine, as ``synk.fork``'s
``n_parallel``). The master writes every result into ``DIR/suite.npz`` (arrays by case)
and ``DIR/suite.json`` (errors' messages, the session's layout). The test compares a run
over machines with the run alone at the same total number of processes: equal, except
the reductions of collectives in fast mode (names starting ``reduce/``), equal within
rounding.

Values have large magnitudes and many processes' values are summed, so a different
summation order shows in the last bits.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos import steps, testing


def raise_on(rank: int) -> None:
    if testing.this_rank() == rank:
        raise ValueError(f"rank {rank} refuses on purpose")


def per_rank(n: int, shape: tuple, seed: int, dtype: str = "float64") -> list[np.ndarray]:
    return [(np.random.default_rng(seed + r).standard_normal(shape) * 1e3).astype(dtype)
            for r in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--reduction", default="fast", choices=["fast", "exact"])
    args = parser.parse_args()
    n = synk.fork(args.processes, reduction=args.reduction)
    saved: dict[str, np.ndarray] = {}
    notes: dict[str, object] = {"n": n, "hosts": testing.rank_hosts(),
                                "machines": testing.rank_machines(),
                                "pids": testing.process_pids()}

    # -- functions ---------------------------------------------------------------------
    x, y = pt.dmatrix("x"), pt.dvector("y")
    w = pytensor.shared(np.zeros(3), name="w")
    s = pytensor.shared(np.zeros((1, 3)), name="s")
    z = x * y
    f = synk.function([x], [z.mean(axis=0), (z.sum(axis=0), "sum"), (z.max(axis=0), "max"),
                            (z.min(axis=0), "min"), ((x[:, :1] / 50 + 1).prod(), "prod"),
                            (z, "gather"), (z.shape[0], None)], bcast_inputs=[y],
                      name="f")
    g = synk.function([x], (x.sum(axis=0), "sum"), updates=[(w, w + x.sum(axis=0), "sum")],
                      name="g")
    h = synk.function([], (s.sum(axis=0), "gather"), sliceable_shareds=[s], name="h")
    rows = synk.function([x], (x, "gather"), name="rows")
    # collectives' variables
    v = pytensor.shared(np.zeros((2, 3)), name="v")
    big = pytensor.shared(np.zeros(30_000), name="big")  # 240 kB: the large paths
    mixed = [pytensor.shared(np.zeros(5, "float32"), name="m32"),
             pytensor.shared(np.zeros(9000), name="m64")]
    use = synk.function([], [(v.sum() + big.sum() + mixed[0].sum() + mixed[1].sum(), "sum")],
                        name="use")
    synk.distribute()

    rng = np.random.default_rng(0)
    X = rng.standard_normal((53, 3)) * 1e3
    Y = rng.standard_normal(3)
    for i, out in enumerate(f(X, Y)):
        saved[f"f/numpy/{i}"] = np.asarray(out)
    xd = synk.data(X)
    idx = rng.permutation(53)[:31]
    for key, batch in (("indices", idx), ("slice", slice(3, 40)), ("count", 17)):
        for i, out in enumerate(f(xd, Y, batch=batch)):
            saved[f"f/{key}/{i}"] = np.asarray(out)
    minibatch = synk.data(X[:20], minibatch=True)
    saved["f/minibatch"] = rows(minibatch, batch=np.arange(13))
    saved["f/subset"] = np.asarray(f(xd, Y, output_subset=[1]))
    X2 = rng.standard_normal((53, 3))
    first = f(X2, Y)[1]
    X2 += 1.0  # the same shape: a repeated call, its arrays copied where the first went
    saved["f/repeat"] = np.stack([first, f(X2, Y)[1]])
    saved["f/sliced"] = g(xd, num_slices=3)
    saved["f/updates"] = np.stack(testing.rank_values(w))
    synk.scatter(s, rng.standard_normal((4 * n, 3)))
    saved["f/batch_s"] = h(batch_s=[slice(0, 1 + r % 3) for r in range(n)])
    try:
        h(batch_s=[slice(0, 2)] * (n - 1) + [[7]])
    except ValueError as exc:
        notes["f/batch_s_refused"] = str(exc)
    # a command larger than the control block's mailbox (1 MiB), and replies larger
    # than their slots and than the record that ends a command between machines
    large = np.arange(300_000, dtype=np.float64)
    saved["f/large_message"] = np.array(testing.run_on_ranks(np.sum, large))
    saved["f/large_replies"] = np.stack(testing.run_on_ranks(np.ones, 200_000))
    try:
        testing.run_on_ranks(raise_on, n - 1)
    except synk.WorkerError as exc:
        notes["f/worker_error"] = [exc.rank, str(exc)]

    # -- data ----------------------------------------------------------------------------
    data = synk.data(np.arange(12.0).reshape(4, 3), oversize=1.5)
    data.set_value(np.arange(15.0).reshape(5, 3) + 100)
    saved["data/set_value"] = rows(data)
    data[1:3] = -7.0
    data[[0, 4], 2] = np.array([5.5, 6.5])
    saved["data/setitem"] = rows(data)
    data.set_length(11)  # beyond the allocation: values carried over to new memory
    data[5:] = np.arange(18.0).reshape(6, 3)
    saved["data/set_length"] = rows(data)
    data.data[2:4] = 42.0  # through the view: sync() takes it to every machine
    data.sync()
    saved["data/sync"] = rows(data)
    data.set_shape((8, 3))
    saved["data/set_shape"] = rows(data)
    data.free_memory()
    data.set_value(np.full((6, 3), 3.25))
    saved["data/after_free"] = rows(data)

    # -- collectives -----------------------------------------------------------------------
    synk.broadcast(v, np.arange(6.0).reshape(2, 3))
    saved["copy/broadcast"] = np.stack(testing.rank_values(v))
    values = rng.standard_normal((2 * n + 3, 3))
    synk.scatter(v, values)
    parts = testing.rank_values(v)
    saved["copy/scatter"] = np.concatenate(parts)
    saved["copy/lengths"] = np.array(synk.get_lengths(v))
    saved["copy/gather0"] = synk.gather(v, nd_up=0)
    try:
        synk.all_reduce(v)
    except ValueError as exc:
        notes["reduce/mismatch"] = str(exc)
    synk.all_gather(v)
    saved["copy/all_gather"] = np.stack(testing.rank_values(v))
    testing.set_rank_values(v, per_rank(n, (2, 3), 10))
    saved["copy/gather1"] = synk.gather(v)
    synk.set_value(n - 1, v, np.full((2, 3), 9.0))
    saved["copy/get_value"] = np.stack([synk.get_value(r, v) for r in range(n)])
    saved["copy/shapes"] = np.array(synk.get_shapes(v))
    for op in ("sum", "avg", "max", "min", "prod"):
        small = [a / 1e3 + 1 if op == "prod" else a for a in per_rank(n, (2, 3), 20)]
        testing.set_rank_values(v, small)
        synk.all_reduce(v, op)
        saved[f"reduce/all_reduce/small/{op}"] = np.stack(testing.rank_values(v))
        large = per_rank(n, (30_000,), 30)
        if op == "prod":
            large = [a / 1e6 + 1 for a in large]
        testing.set_rank_values(big, large)
        synk.all_reduce(big, op)
        saved[f"reduce/all_reduce/large/{op}"] = np.stack(testing.rank_values(big))
        testing.set_rank_values(big, large)
        saved[f"reduce/reduce/large/{op}"] = synk.reduce(big, op, in_place=False)
        testing.set_rank_values(v, small)
        synk.reduce(v, op)
        saved[f"reduce/reduce/small/{op}"] = np.stack(testing.rank_values(v))
    for name, count in (("small", 500), ("large", 9000)):  # under and over 64 kB
        testing.set_rank_values(mixed[0], per_rank(n, (5,), 40, "float32"))
        testing.set_rank_values(mixed[1], per_rank(n, (count,), 50))
        synk.all_reduce(mixed, "sum")
        for i, var in enumerate(mixed):
            saved[f"reduce/mixed/{name}/{i}"] = np.stack(testing.rank_values(var))
    testing.set_rank_values(big, per_rank(n, (30_000,), 60))
    steps.run([steps.reduce_scatter(big, "sum")])
    pieces = steps.pieces(big)
    own = testing.rank_values(big)
    saved["reduce/reduce_scatter"] = np.concatenate(
        [own[r][lo:hi] for r, (lo, hi) in enumerate(pieces)])
    steps.run([steps.all_gather_pieces(big)])
    saved["reduce/all_gather_pieces"] = np.stack(testing.rank_values(big))
    saved["reduce/use"] = np.asarray(use())  # inputs from the reductions above
    np.savez(args.out / "suite.npz", **saved)
    (args.out / "suite.json").write_text(json.dumps(notes))
    synk.close()


if __name__ == "__main__":
    main()
