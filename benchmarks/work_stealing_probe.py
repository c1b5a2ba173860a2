"""What taking rows dynamically (work stealing) could gain beside a busy core: a probe.

A question for synkhronos.pymc's design, measured outside it: with another program
spinning on one of two cores, is a log-likelihood evaluation divided over two processes
faster when the rows are cut into chunks that whichever process is free takes, rather
than in two fixed halves? Two processes (this one and one forked worker) evaluate a
logistic regression's log-likelihood and gradient (PyTensor, the default backend) on
``--rows`` rows in ``--chunks`` chunks, three ways, in alternating rounds:

- ``own``: one process, all the rows in one call, in a process of its own, never
  pinned (PyMC's own function in ``pm.sample``'s situation), timed there while the two
  others wait;
- ``static``: each process its fixed half of the chunks;
- ``dynamic``: the master takes chunks from the front, the worker from the back, each
  skipping a chunk the other has marked taken (a race on the marks only costs a chunk
  computed twice, with the same result); results are kept per chunk and added in chunk
  order, as synkhronos's exact mode adds them.

``--busy`` runs a pure-Python spinner beside them; ``--pin`` pins the master to the
first usable core and the worker to the second (the spinner stays free, as another
program would). Prints JSON: each way's median microseconds per evaluation over
``--rounds`` rounds of about a second, and ``static`` and ``dynamic`` over ``own``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing as mp
import os
import time

import numpy as np
import pytensor
import pytensor.tensor as pt


def spin(stop) -> None:
    while not stop.is_set():
        for _ in range(10_000):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--chunks", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--busy", action="store_true")
    parser.add_argument("--pin", action="store_true")
    args = parser.parse_args()
    rows, chunks = args.rows, args.chunks

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 10))
    y = (rng.random(rows) < 0.5).astype("float64")
    xs, ys, theta = pt.matrix("x"), pt.vector("y"), pt.vector("theta")
    z = xs @ theta[:10] + theta[10]
    loglik = (-ys * pt.softplus(-z) - (1 - ys) * pt.softplus(z)).sum()
    both = pt.concatenate([loglik[None], pytensor.grad(loglik, theta)])
    fn = pytensor.function([xs, ys, theta], both)
    width = 12
    bounds = [(c * rows // chunks, (c + 1) * rows // chunks) for c in range(chunks)]

    shared = mmap.mmap(-1, 4096 + chunks * width * 8 + 4096)
    taken = np.frombuffer(shared, dtype=np.int8, count=chunks)
    results = np.frombuffer(shared, dtype=np.float64, count=chunks * width,
                            offset=4096).reshape(chunks, width)
    values = np.frombuffer(shared, dtype=np.float64, count=11,
                           offset=4096 + chunks * width * 8)
    go, done = mp.Semaphore(0), mp.Semaphore(0)
    order = mp.Value("i", 0)
    cores = sorted(os.sched_getaffinity(0))

    def work(sequence) -> None:
        point = values.copy()
        for c in sequence:
            if taken[c]:
                continue
            taken[c] = 1
            start, stop = bounds[c]
            results[c] = fn(x[start:stop], y[start:stop], point)

    def worker() -> None:
        if args.pin:
            os.sched_setaffinity(0, {cores[1]})
        while True:
            go.acquire()
            if order.value == 0:
                work(range(chunks // 2, chunks))
            elif order.value == 1:
                work(range(chunks - 1, -1, -1))
            else:
                return
            done.release()

    context = mp.get_context("fork")
    helper = context.Process(target=worker)
    helper.start()
    if args.pin:
        os.sched_setaffinity(0, {cores[0]})
    stop = context.Event()
    spinner = context.Process(target=spin, args=(stop,)) if args.busy else None
    if spinner is not None:
        spinner.start()
    point = np.full(11, 0.01)

    def divided(way: int) -> np.ndarray:
        taken[:] = 0
        values[:] = point
        order.value = way
        go.release()
        work(range(chunks // 2) if way == 0 else range(chunks))
        done.acquire()
        total = results[0].copy()
        for row in results[1:]:
            total += row
        return total

    def timed(call) -> float:
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < 1.0:
            call()
            calls += 1
        return (time.perf_counter() - start) / calls

    def own_round(send) -> None:
        os.sched_setaffinity(0, cores)  # (forked from a pinned master: unpinned again)
        send.send(timed(lambda: fn(x, y, point)))

    def own() -> float:
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=own_round, args=(send,))
        process.start()
        took = receive.recv()
        process.join()
        return took

    ways = {"static": lambda: divided(0), "dynamic": lambda: divided(1)}
    want = fn(x, y, point)
    for call in ways.values():
        np.testing.assert_allclose(call(), want, rtol=1e-9)
    seconds: dict[str, list[float]] = {"own": [], **{name: [] for name in ways}}
    try:
        for _ in range(args.rounds):
            seconds["own"].append(own())
            for name, call in ways.items():
                seconds[name].append(timed(call))
    finally:
        order.value = 2
        go.release()
        helper.join()
        if spinner is not None:
            stop.set()
            spinner.join()
    medians = {name: float(np.median(s)) * 1e6 for name, s in seconds.items()}
    print(json.dumps({
        "benchmark": "work_stealing_probe", "rows": rows, "chunks": chunks,
        "busy": args.busy, "pinned": args.pin, "rounds": args.rounds,
        "us_per_evaluation": {k: round(v, 1) for k, v in medians.items()},
        "speedup_over_own": {k: round(medians["own"] / medians[k], 3)
                             for k in ("static", "dynamic")},
        "load": list(os.getloadavg()),
    }, indent=1))


if __name__ == "__main__":
    main()
