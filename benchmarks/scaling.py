"""Scaling of a data-parallel training step: the paper's Figures 2 and 3 and Table 1.

Usage::

    python benchmarks/scaling.py [--model mlp|cnn] [--max-n N] [--rows 256]
        [--rounds 5] [--seconds 1.0] [--profile] [--wait-quiet 600] [--out DIR]
        [--sizes 1,2,4,8,16] [--lean] [--no-state] [--balance] [--chunks K]
        [--chunks-per-process P] [--busy B] [--busy-pinned]

The workload is one SGD step on synthetic float32 data held in memory: an MLP
784-1024-1024-10 (ReLU, softmax cross-entropy; 1.86 M parameters), or with
``--model cnn`` a small CNN written with im2col (two 5x5 convolutions with 2x2
max-pooling, then 512-128-10). The CNN's gradient graphs take Numba minutes to compile
the first time (about 4 on a 2-core machine; the plain program's and synkhronos's
graphs differ), then load from the cache in seconds.

Every configuration lives in its own process (a *server*: this script run with
``--serve``), started once, compiled and warmed up before any timing. The driver then
measures in rounds: in each round every configuration takes one turn of about
``--seconds`` while all the others wait blocked on a pipe (no CPU), in a new random
order every round. A speed-up is a ratio of samples/s *within a round* against the
round's baseline, and the figure reported is the median over rounds, so a change of
the machine's load hits every configuration alike. The JSON records the load average
(``--wait-quiet`` first waits for a 1-minute load below ``--quiet-load``) and, per
round, the cores that processes outside the benchmark used ("foreign cores", from
``/proc``); a round with more than ``--max-foreign`` is recorded, not counted, and run
again. The load average itself is no guide during the run: it counts the benchmark's
own processes.

Configurations (``R`` = ``--rows``, rows per process):

- ``pytensor-1thread``: the plain PyTensor program (``pytensor.grad`` and SGD updates
  in one ``pytensor.function``), one process, one BLAS thread (threadpoolctl), batch
  ``R``: the baseline of every speed-up.
- ``pytensor-threads``: the same with every BLAS thread, batch ``R`` and ``R * max_n``.
- ``pytensor-1thread x n independent``: ``max_n`` copies of the baseline running at
  once, each on its own rows, exchanging nothing: what the cores give this program
  (memory bandwidth, caches and clocks are shared), the ceiling for any data-parallel
  library.
- ``synk-n``: ``make_train_function`` after ``synk.fork(n)``, n = 1 ... ``--max-n``,
  with the paper's ablations: the batch *fixed* (``R`` rows split over the processes)
  or *scaled* (``R`` rows per process); *shuffled* (``batch=`` an index array into a
  ``synk.data`` set: every process gathers its rows) or *contiguous*
  (``batch=slice(...)``: views, no copy); gradient all-reduce *on* (``train(...)``) or
  *off* (``train.grad_function`` then ``train.apply_function``: the processes never
  exchange gradients, which bounds what the all-reduce costs).
- ``torch-1thread``, ``torch-threads``: the same model and step in torch, one process.
- ``torch-ddp-n``: ``DistributedDataParallel``, gloo backend, rendezvous through a
  file store in a private temporary directory, n processes of one thread, ``R`` rows
  per process (only if torch imports; the JSON says so otherwise).

``--sizes`` runs synkhronos at the listed n only (default: every n up to ``--max-n``,
which it then sets to the largest), with the ceiling of n independent plain programs at
each listed n > 1; ``"vs_ceiling_per_n"`` in the headline gives the ratio at each.
``--lean`` leaves out the fixed-batch and unsharded ablations, ``--no-state`` the
optimizer-state measurement (``benchmarks/device_check.py`` uses all three to fit its
time).

``--balance`` adds, at each n > 1, ``synk-n balanced``: the default (sharded) step
built with ``make_train_function(..., balance=True)`` in its own session, so each
process takes rows in proportion to its measured speed; it is measured in the same
rounds as the even split. The headline gives both against the ceiling
(``"vs_ceiling_per_n"`` and ``"vs_ceiling_per_n_balanced"``, shuffled rows) and the
balanced over the even step per round; ``"balance"`` records the shares each balanced
session ended with (``in_use``), the shares its last timings gave (``measured``), and
how often the split changed.

Each turn (and each ``--profile`` or ``--phases`` run) first reads one element of every
page of its configuration's dataset, then
runs ``--untimed-steps`` steps (default 1), neither timed: a process's first steps after
the seconds its configuration sat idle measured the idle, not the step. On the 2-core
machine memory left idle for a few seconds is taken back by the virtual machine's host
(the guest's own reclaim switched off changed nothing) and each 4 KiB page refaults at
tens of microseconds: a gather of 256 rows from the dataset in shared memory took 16-22
ms after 5 s idle against 0.12 ms warm, from the plain program's private copy (huge
pages) 0.7 against 0.1; synkhronos's first step of a turn took 43-100 ms against 31,
the plain program's 32-68 against 28.5. A turn's steps walk the whole dataset, so the
read covers all of it.

Shuffled steps take the next block of a fixed random permutation of the rows (the
gather ``X[idx]`` is part of the timed step, in every framework); contiguous steps the
next block of rows. Each speed-up is against the baseline with the same access, as in
the paper ("compared against their own respective base cases").

``--chunks K`` (or ``--chunks-per-process P``: ``K = P * n`` at each n) adds, at
each n > 1, ``synk-n chunksK``: the default (sharded) step
built with ``make_train_function(..., chunks=K)`` in its own session: each step's rows
in K chunks that the processes take as they come free, each chunk's gradient added
into the process's exchange slot. The headline gives it over the even split, over
``torch-ddp-n`` and over the ceiling, per round; the even split over ``torch-ddp-n``
too. With ``K >= 2n`` also ``synk-n slicedS``: the even split with ``num_slices=K //
n``, each run of the function on as many rows as a chunk has (a model whose
function runs faster on fewer rows at once, such as the CNN, whose im2col buffers
then stay in cache, gains that from chunks too: this tells the two gains apart).
``--busy B`` keeps B cores busy beside the whole run with pure-Python spinning
programs (another user's job on the machine: the 2-core case of one busy core is
``--busy 1``); their processes count as the benchmark's own, not as foreign load.
``--busy-pinned`` holds each of them to one core (the last usable ones): a program
that stays on its core, so that the process the scheduler puts beside it runs at
half speed until it moves, where an unpinned one is shared out among all.

``--profile`` adds the paper's Table 1: the shuffled, batch-scaled, all-reduce
configuration run inside ``synk.profile()`` at n=1 and n=max, beside the plain program
(its gather and function timed apart), all over the same number of samples; printed
as a table on stderr and stored under ``"table1"`` in the JSON.

``--phases`` adds the per-phase account of the step (SPEC 11), at every synkhronos n
of ``--sizes``: the shuffled, batch-scaled, all-reduce step run ``--profile-steps``
times inside ``synk.profile()``, whose ``per_rank()`` gives, for every rank, its
compute, row gather, update, exchange, waiting for the slowest and the rest, in ms per
step, with its CPU time per step and in the exchange (``"phases"`` in the JSON; with
more processes than cores, compare CPU times, not wall times). Beside them, each
rank's CPU time per command of an empty command and of a 4-byte all-reduce, over
``--fixed-commands`` of each, and of the step's exchange run alone (a thirtieth as
many; ``"fixed_costs"``; ``"exchange_copied"``: the same with the all-gather that
copies every piece into every process, as the sharded step did before it read one
buffer in place): what grows with n shows there before
any machine has n cores. ``--out`` draws ``scaling_phases.png``: per n, a stacked bar
per rank.

Prints one JSON document; ``--out DIR`` also writes ``scaling.json``,
``scaling_speedup.png`` (Figure 2: speed-up per configuration at n=1 and n=max) and
``scaling_vs_n.png`` (Figure 3: speed-up against n) there (``scaling_cnn*`` for the
CNN).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

LEARNING_RATE = 0.01
MLP_SIZES = (784, 1024, 1024, 10)
CNN_CHANNELS = (16, 32)  # two 5x5 convolutions, each followed by 2x2 max-pooling
CNN_HIDDEN = 128
SEED = 1234


# -- the models ------------------------------------------------------------------------------
def parameter_shapes(model: str) -> list[tuple[int, ...]]:
    """Weight and bias shapes, in order, shared by the PyTensor and torch models."""
    if model == "mlp":
        shapes: list[tuple[int, ...]] = []
        for a, b in zip(MLP_SIZES[:-1], MLP_SIZES[1:], strict=True):
            shapes += [(a, b), (b,)]
        return shapes
    c1, c2 = CNN_CHANNELS
    flat = 4 * 4 * c2
    return [(25 * 1, c1), (c1,), (25 * c1, c2), (c2,), (flat, CNN_HIDDEN), (CNN_HIDDEN,),
            (CNN_HIDDEN, 10), (10,)]


def initial_parameters(model: str) -> list[np.ndarray]:
    rng = np.random.default_rng(SEED)
    values = []
    for shape in parameter_shapes(model):
        if len(shape) == 1:
            values.append(np.zeros(shape, "float32"))
        else:
            values.append((rng.standard_normal(shape) * np.sqrt(2.0 / shape[0])).astype("float32"))
    return values


def pytensor_model(model: str):
    """``(x, y, loss, params)``: float32 rows of 784 pixels, int32 labels, mean loss."""
    import pytensor
    import pytensor.tensor as pt

    x = pt.matrix("x", dtype="float32")
    y = pt.vector("y", dtype="int32")
    params = [pytensor.shared(v, name=f"p{i}") for i, v in enumerate(initial_parameters(model))]
    if model == "mlp":
        h = x
        for layer in range(len(MLP_SIZES) - 1):
            h = h @ params[2 * layer] + params[2 * layer + 1]
            if layer < len(MLP_SIZES) - 2:
                h = pt.maximum(h, 0)
    else:
        rows = x.shape[0]

        def conv_pool(image, size: int, channels: int, weight, bias):
            # im2col: the 25 shifted views side by side, then one matrix product
            out = size - 4
            patches = pt.concatenate(
                [image[:, i:i + out, j:j + out, :] for i in range(5) for j in range(5)], axis=3)
            h = patches.reshape((rows * out * out, 25 * channels)) @ weight + bias
            h = pt.maximum(h, 0).reshape((rows, out // 2, 2, out // 2, 2, weight.shape[1]))
            return h.max(axis=(2, 4))

        h = conv_pool(x.reshape((rows, 28, 28, 1)), 28, 1, params[0], params[1])
        h = conv_pool(h, 12, CNN_CHANNELS[0], params[2], params[3])
        h = h.reshape((rows, 16 * CNN_CHANNELS[1]))
        h = pt.maximum(h @ params[4] + params[5], 0)
        h = h @ params[6] + params[7]
    log_p = h - pt.logsumexp(h, axis=1, keepdims=True)
    loss = -log_p[pt.arange(y.shape[0]), y].mean()
    return x, y, loss, params


def torch_model(model: str):
    import torch
    from torch import nn

    values = initial_parameters(model)
    if model == "mlp":
        layers: list = []
        for i in range(len(MLP_SIZES) - 1):
            layers.append(nn.Linear(MLP_SIZES[i], MLP_SIZES[i + 1]))
            if i < len(MLP_SIZES) - 2:
                layers.append(nn.ReLU())
        net = nn.Sequential(*layers)
        linears = [m for m in net if isinstance(m, nn.Linear)]
        with torch.no_grad():
            for i, linear in enumerate(linears):
                linear.weight.copy_(torch.from_numpy(values[2 * i].T.copy()))
                linear.bias.copy_(torch.from_numpy(values[2 * i + 1]))
        return net
    c1, c2 = CNN_CHANNELS
    # same shapes and work as the im2col model; the initial values need not match
    return nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)),
        nn.Conv2d(1, c1, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * c2, CNN_HIDDEN), nn.ReLU(), nn.Linear(CNN_HIDDEN, 10),
    )


def dataset(rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(X, Y, permutation)``: the same synthetic data in every server."""
    rng = np.random.default_rng(SEED + 1)
    x = rng.standard_normal((rows, 784), dtype=np.float32)
    y = rng.integers(0, 10, rows).astype("int32")
    return x, y, rng.permutation(rows).astype("int64")


def touch(array: np.ndarray) -> None:
    """Read one element of every 4 KiB page of ``array`` (see ``--untimed-steps``)."""
    flat = array.reshape(-1)
    flat[::max(1, 4096 // flat.itemsize)].sum()


class Rows:
    """The rows of successive steps: blocks of a fixed permutation, or of the rows."""

    def __init__(self, permutation: np.ndarray):
        self.permutation = permutation
        self.cursor = 0

    def next(self, count: int, shuffled: bool, skip: int = 0, stride: int | None = None):
        """The next ``count`` rows (after ``skip``); the cursor moves ``stride`` rows."""
        stride = count if stride is None else stride
        if self.cursor + stride > len(self.permutation):
            self.cursor = 0
        start = self.cursor + skip
        self.cursor += stride
        if shuffled:
            return self.permutation[start:start + count]
        return slice(start, start + count)


# -- the servers -------------------------------------------------------------------------------
class PlainServer:
    """The plain PyTensor program in one process, with one or every BLAS thread."""

    def __init__(self, spec: dict):
        import pytensor
        from threadpoolctl import threadpool_info, threadpool_limits

        x, y, loss, params = pytensor_model(spec["model"])
        lr = np.float32(LEARNING_RATE)
        grads = pytensor.grad(loss, params)
        start = time.perf_counter()
        self.fn = pytensor.function([x, y], loss, updates=[
            (p, p - lr * g) for p, g in zip(params, grads, strict=True)])
        self.compile_s = time.perf_counter() - start
        # limited after compiling: only the BLAS libraries loaded by then are limited
        self.limiter = threadpool_limits(limits=1) if spec["threads"] == 1 else None
        self.x, self.y, perm = dataset(spec["dataset_rows"])
        self.rows = Rows(perm)
        self.blas_threads = [d["num_threads"] for d in threadpool_info()]

    def info(self) -> dict:
        return {"compile_s": self.compile_s, "blas_threads": self.blas_threads}

    def step(self, variant: dict) -> None:
        rows = self.rows.next(variant["batch"], variant["access"] == "shuffled")
        self.fn(self.x[rows], self.y[rows])

    def touch(self) -> None:
        touch(self.x)

    def profile(self, variant: dict, steps: int) -> dict:
        gather = function = 0.0
        start = time.perf_counter()
        for _ in range(steps):
            t0 = time.perf_counter()
            rows = self.rows.next(variant["batch"], variant["access"] == "shuffled")
            xb, yb = self.x[rows], self.y[rows]
            t1 = time.perf_counter()
            self.fn(xb, yb)
            t2 = time.perf_counter()
            gather += t1 - t0
            function += t2 - t1
        return {"total": time.perf_counter() - start, "gather": gather, "function": function}


def _rank_blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [d["num_threads"] for d in threadpool_info()]


class SynkServer:
    """``make_train_function`` after ``synk.fork(n)``: every ablation of one n."""

    def __init__(self, spec: dict):
        import synkhronos as synk
        from synkhronos import testing
        from synkhronos.extensions.train import make_train_function

        self.synk = synk
        self.n = spec["n"]
        load = os.getloadavg()[0]
        synk.fork(self.n, spin=spec.get("spin"))
        self.spin = testing.spin_seconds()
        x, y, loss, params = pytensor_model(spec["model"])
        start = time.perf_counter()
        self.train = make_train_function(loss, params, [x, y], "sgd",
                                         learning_rate=np.float32(LEARNING_RATE),
                                         sharded=spec.get("sharded", False),
                                         balance=spec.get("balance", False),
                                         chunks=spec.get("chunks"))
        import pytensor

        # a 4-byte variable for the fixed costs' all-reduce (distributed with the step)
        self.tiny = pytensor.shared(np.zeros(1, "float32"), name="tiny")
        synk.function([x], (x.sum() * self.tiny[0], "sum"))
        synk.distribute()
        self.compile_s = time.perf_counter() - start
        xs, ys, perm = dataset(spec["dataset_rows"])
        self.x, self.y = synk.data(xs), synk.data(ys)
        del xs, ys
        self.rows = Rows(perm)
        self.dtype = self.train.grad_shared.dtype
        self.blas_threads = testing.run_on_ranks(_rank_blas_threads)
        self.load_at_fork = load

    def info(self) -> dict:
        return {"compile_s": self.compile_s, "spin_s": self.spin, "sharded": self.train.sharded,
                "load_at_fork": self.load_at_fork, "blas_threads_per_rank": self.blas_threads}

    def step(self, variant: dict) -> None:
        total = variant["batch"]
        batch = self.rows.next(total, variant["access"] == "shuffled")
        if variant["allreduce"]:
            self.train(self.x, self.y, batch=batch, num_slices=variant.get("num_slices", 1))
        else:
            self.train.grad_function(self.x, self.y, np.asarray(total, dtype=self.dtype),
                                     batch=batch)
            self.train.apply_function()

    def touch(self) -> None:
        touch(self.x.data)  # (the master's read maps the pages back for every process)

    def profile(self, variant: dict, steps: int) -> dict:
        with self.synk.profile() as prof:
            start = time.perf_counter()
            for _ in range(steps):
                self.step(variant)
            wall = time.perf_counter() - start
        summary = prof.summary()
        summary["wall"] = wall
        if self.n > 1:  # the step's exchange alone, again and again: values stay resident
            steps_of, exchange = self.synk.steps, self._exchange()
            times = []
            for _ in range(steps + 2):
                start = time.perf_counter()
                steps_of.run(exchange)
                times.append(time.perf_counter() - start)
            summary["allreduce_resident_total"] = sum(sorted(times)[:steps])
        for record in prof.records:
            if record.kind == "call":
                key = f"function[{record.name}]"
                ran = record.function
                summary[key] = summary.get(key, 0.0) + (sum(ran) / len(ran) if ran else 0.0)
                for rank, seconds in enumerate(ran):  # ranks that ran, in rank order
                    key = f"function[{record.name}] rank {rank}"
                    summary[key] = summary.get(key, 0.0) + seconds
        return summary

    def _exchange(self, common: bool = True) -> list:
        """The step's exchange as steps of its own (values stay resident); ``common``
        False: the all-gather that copies every piece into every process (the sharded
        step's before it read one buffer in place)."""
        train, steps_of = self.train, self.synk.steps
        if train.sharded:
            in_place = common and self.synk.device() == "cpu"
            return [steps_of.reduce_scatter(train.grad_shared, op="sum"),
                    steps_of.all_gather_pieces(train.params_flat, common=in_place)]
        return [steps_of.all_reduce(train.grad_shared, op="sum")]

    def phases(self, variant: dict, steps: int, commands: int) -> dict:
        """Every rank's phases of the step, ms per step (``synk.profile``), and its
        CPU time per command of an empty command, a 4-byte all-reduce and the step's
        exchange alone, us (a checkout whose profile has no ``per_rank`` gives the
        CPU times alone)."""
        from synkhronos import testing

        self.step(variant)
        with self.synk.profile() as prof:
            for _ in range(steps):
                self.step(variant)
        per_rank = [{k: (round(1e3 * v / entry["steps"], 4) if k not in ("rank", "steps")
                         else v) for k, v in entry.items()}
                    for entry in getattr(prof, "per_rank", list)()]
        fixed = {}
        exchange = self._exchange() if self.n > 1 else None
        copied = self._exchange(common=False) if self.n > 1 and self.train.sharded else None
        for name, command, count in (
                ("empty", testing.ping, commands),
                ("all_reduce_4B", lambda: self.synk.all_reduce(self.tiny), commands),
                ("exchange", lambda: self.synk.steps.run(exchange), max(3, commands // 30)),
                ("exchange_copied", lambda: self.synk.steps.run(copied),
                 max(3, commands // 30))):
            if (name == "exchange" and exchange is None) or (
                    name == "exchange_copied" and copied is None):
                continue
            command()
            before = testing.run_on_ranks(time.process_time)
            start = time.perf_counter()
            for _ in range(count):
                command()
            wall = time.perf_counter() - start
            after = testing.run_on_ranks(time.process_time)
            fixed[name] = {"cpu_us_per_rank": [round(1e6 * (b - a) / count, 2)
                                               for a, b in zip(before, after, strict=True)],
                           "wall_us": round(1e6 * wall / count, 2), "commands": count}
        return {"n": self.n, "steps": steps, "spin_s": self.spin,
                "ms_per_step": per_rank, "fixed_costs": fixed}

    def balance(self) -> dict:
        balancer = self.train.balancer
        if balancer is None:
            return {"in_use": None}
        shares, measured = balancer.in_use, balancer.proposed()
        return {"in_use": None if shares is None else [round(v, 4) for v in shares],
                "measured": None if measured is None else [round(v, 4) for v in measured],
                "changes": balancer.changes}

    def close(self) -> None:
        self.synk.close()


class StateServer:
    """Adam's state per process: ``make_train_function(..., "adam")`` after one step."""

    def __init__(self, spec: dict):
        import synkhronos as synk
        from synkhronos import testing
        from synkhronos.extensions.train import make_train_function

        self.synk = synk
        synk.fork(spec["n"])
        x, y, loss, params = pytensor_model(spec["model"])
        train = make_train_function(loss, params, [x, y], "adam", sharded=spec["sharded"])
        xs, ys, _ = dataset(spec["dataset_rows"])
        train(synk.data(xs), synk.data(ys), batch=slice(0, 64 * spec["n"]))
        per_rank = [0] * spec["n"]
        for var in train.state:
            for rank, value in enumerate(testing.rank_values(var)):
                per_rank[rank] += int(value.nbytes)
        self.result = {"n": spec["n"], "sharded": train.sharded,
                       "state_bytes_per_rank": per_rank,
                       "parameter_bytes": int(sum(p.get_value().nbytes for p in params))}

    def info(self) -> dict:
        return self.result

    def close(self) -> None:
        self.synk.close()


class TorchServer:
    """The same step in torch: one process, or one rank of DistributedDataParallel."""

    def __init__(self, spec: dict):
        import torch

        self.torch = torch
        torch.manual_seed(SEED)
        threads = spec["threads"]
        torch.set_num_threads(len(os.sched_getaffinity(0)) if threads == "all" else threads)
        self.world = spec.get("world", 1)
        self.rank = spec.get("rank", 0)
        net = torch_model(spec["model"])
        if self.world > 1:
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel

            self.dist = dist
            dist.init_process_group("gloo", init_method=f"file://{spec['store']}",
                                    rank=self.rank, world_size=self.world)
            net = DistributedDataParallel(net)
        self.net = net
        self.optimizer = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE)
        xs, ys, perm = dataset(spec["dataset_rows"])
        self.x = torch.from_numpy(xs)
        self.y = torch.from_numpy(ys.astype("int64"))
        self.rows = Rows(torch.from_numpy(perm))
        self.threads = torch.get_num_threads()

    def info(self) -> dict:
        return {"torch": self.torch.__version__, "threads": self.threads,
                "backend": "gloo" if self.world > 1 else None}

    def step(self, variant: dict) -> None:
        torch = self.torch
        count = variant["batch"]
        rows = self.rows.next(count, variant["access"] == "shuffled",
                              skip=self.rank * count, stride=count * self.world)
        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(self.net(self.x[rows]), self.y[rows])
        loss.backward()
        self.optimizer.step()

    def touch(self) -> None:
        touch(self.x.numpy())

    def barrier(self) -> None:
        if self.world > 1:
            self.dist.barrier()

    def close(self) -> None:
        if self.world > 1:
            self.dist.destroy_process_group()


def serve(spec: dict) -> None:
    """Answer the driver's commands, one JSON line each, until ``quit``."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed by the libraries goes to stderr, not the channel
    sys.stdout = sys.stderr
    kind = spec["kind"]
    server = {"pytensor": PlainServer, "synk": SynkServer, "state": StateServer,
              "torch": TorchServer}[kind](spec)
    channel.write(json.dumps({"ready": True, "info": server.info()}) + "\n")
    barrier = getattr(server, "barrier", lambda: None)
    touch_data = getattr(server, "touch", lambda: None)
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "quit":
            break
        variant = command.get("variant")
        if op in ("warmup", "run"):
            if op == "run":
                touch_data()
            for _ in range(command.get("untimed", 0)):
                server.step(variant)
            barrier()
            start = time.perf_counter()
            for _ in range(command["steps"]):
                server.step(variant)
            reply = {"seconds": time.perf_counter() - start}
        elif op == "profile":
            touch_data()
            reply = server.profile(variant, command["steps"])
        elif op == "balance":
            reply = server.balance()
        elif op == "phases":
            touch_data()
            reply = server.phases(variant, command["steps"], command["commands"])
        else:
            reply = {"error": f"unknown op {op!r}"}
        channel.write(json.dumps(reply) + "\n")
    getattr(server, "close", lambda: None)()


# -- the driver --------------------------------------------------------------------------------
class Remote:
    """One server process and its pipe."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.proc: subprocess.Popen | None = None
        self.info: dict | None = None

    def launch(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve", json.dumps(self.spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            env=dict(os.environ, GLOO_SOCKET_IFNAME="lo"),
        )

    def send(self, command: dict) -> None:
        self.proc.stdin.write(json.dumps(command) + "\n")

    def receive(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"server {self.spec} exited with code {self.proc.wait()}")
        return json.loads(line)

    def wait_ready(self) -> None:
        self.info = self.receive()["info"]

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            self.send({"op": "quit"})
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()
            self.proc.wait()


class Config:
    """One measured configuration: a group of servers (several for DDP) and a variant."""

    def __init__(self, name: str, remotes: list[Remote], variant: dict, **labels):
        self.name = name
        self.remotes = remotes
        self.variant = variant
        self.labels = labels  # framework, n, batch, access, allreduce, threads
        self.steps = 1
        self.samples_per_s: list[float] = []

    @property
    def samples_per_step(self) -> int:
        return self.variant["batch"] * len(self.remotes)

    def execute(self, op: str, steps: int, untimed: int = 0) -> float:
        for remote in self.remotes:
            remote.send({"op": op, "variant": self.variant, "steps": steps,
                         "untimed": untimed})
        return max(remote.receive()["seconds"] for remote in self.remotes)


def cpu_ticks(pids: set[int]) -> tuple[int, int]:
    """(busy ticks of the whole machine, ticks used by ``pids`` and their threads)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]
    ours = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            ours += int(parts[11]) + int(parts[12])  # utime, stime
        except (OSError, IndexError):
            pass
    return busy, ours


def descendants(root: int) -> set[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def wait_for_quiet(limit_s: float, threshold: float) -> dict:
    start = time.monotonic()
    first = os.getloadavg()
    while os.getloadavg()[0] >= threshold and time.monotonic() - start < limit_s:
        time.sleep(5.0)
    return {"load_at_start": [round(v, 2) for v in first],
            "waited_s": round(time.monotonic() - start, 1),
            "load_after_wait": [round(v, 2) for v in os.getloadavg()],
            "quiet_threshold": threshold}


# another program keeping one core busy (pure Python: no BLAS threads, no memory traffic)
SPINNER = "import os\nos.sched_setaffinity(0, {cores})\nwhile True:\n    pass\n"


def chunks_at(args, n: int) -> int:
    """The chunks of the chunked step at ``n`` processes (0: none)."""
    return args.chunks or args.chunks_per_process * n


def build_configs(args, torch_ok: bool) -> tuple[list[Config], list[Remote]]:
    spec = {"model": args.model, "dataset_rows": args.dataset_rows}
    rows = args.rows
    accesses = ("shuffled", "contiguous")
    remotes: list[Remote] = []
    configs: list[Config] = []

    def start(**extra) -> Remote:
        remote = Remote(dict(spec, **extra))
        remotes.append(remote)
        return remote

    def variant(batch: int, access: str, allreduce: bool | None = None) -> dict:
        out = {"batch": batch, "access": access}
        if allreduce is not None:
            out["allreduce"] = allreduce
        return out

    def sharded_step(n: int, remote: Remote, label: str, num_slices: int = 1,
                     **labels) -> None:
        """The default (sharded) step of ``remote`` at ``n``, batch scaled, with the
        exchange, at both accesses: ``synk-n <label>``."""
        for access in accesses:
            step = variant(rows * n, access, True)
            if num_slices > 1:
                step["num_slices"] = labels["num_slices"] = num_slices
            configs.append(Config(
                f"synk-{n} {label} scaled {access} allreduce-on", [remote], step,
                framework="synkhronos", n=n, batch=rows * n, scaling="scaled",
                access=access, allreduce=True, sharded=True, **labels))

    for threads, name in ((1, "pytensor-1thread"), ("all", "pytensor-threads")):
        remote = start(kind="pytensor", threads=threads)
        batches = [rows] if threads == 1 or args.max_n == 1 else [rows, rows * args.max_n]
        for batch in batches:
            for access in accesses if batch == rows else ("shuffled",):
                configs.append(Config(f"{name} b{batch} {access}", [remote],
                                      variant(batch, access), framework="pytensor",
                                      threads=threads, n=1, batch=batch, access=access))
    # the hardware's ceiling: n plain programs at once, no exchange (at --max-n; with
    # --sizes, at each listed n)
    for n in [m for m in args.sizes if m > 1] if args.sizes_given else (
            [args.max_n] if args.max_n > 1 else []):
        group = [start(kind="pytensor", threads=1) for _ in range(n)]
        for access in accesses:
            configs.append(Config(f"pytensor-1thread x{n} independent b{rows}x{n} {access}",
                                  group, variant(rows, access), framework="independent",
                                  threads=1, n=n, batch=rows * n, access=access))
    for n in args.sizes:
        # the default form: sharded update with several processes, whole with one
        remote = start(kind="synk", n=n, spin=args.spin, sharded=n > 1)
        for scaling in ("scaled", "fixed") if n > 1 and not args.lean else ("scaled",):
            batch = rows * n if scaling == "scaled" else rows
            for access in accesses:
                configs.append(Config(
                    f"synk-{n} {scaling} {access} allreduce-on", [remote],
                    variant(batch, access, True), framework="synkhronos", n=n,
                    batch=batch, scaling=scaling, access=access, allreduce=True,
                    sharded=n > 1, balance=False))
        chunks = chunks_at(args, n)
        if n > 1 and chunks >= 2 * n:  # the even split in slices of a chunk's rows
            sharded_step(n, remote, f"sliced{chunks // n}", num_slices=chunks // n)
        if n > 1 and args.balance:  # rows in proportion to each process's measured speed
            sharded_step(n, start(kind="synk", n=n, spin=args.spin, sharded=True,
                                  balance=True),
                         "balanced", balance=True)
        if n > 1 and chunks:  # rows taken in chunks as the processes come free
            sharded_step(n, start(kind="synk", n=n, spin=args.spin, sharded=True,
                                  chunks=chunks),
                         f"chunks{chunks}", chunks=chunks)
        if n > 1 and not args.lean:  # the unsharded form, and no exchange at all
            remote = start(kind="synk", n=n, spin=args.spin, sharded=False)
            for access in accesses:
                for allreduce in (True, False):
                    label = "on" if allreduce else "off"
                    configs.append(Config(
                        f"synk-{n} unsharded scaled {access} allreduce-{label}", [remote],
                        variant(rows * n, access, allreduce), framework="synkhronos", n=n,
                        batch=rows * n, scaling="scaled", access=access, allreduce=allreduce,
                        sharded=False))
    if torch_ok:
        for threads, name in ((1, "torch-1thread"), ("all", "torch-threads")):
            remote = start(kind="torch", threads=threads)
            for access in accesses if threads == 1 else ("shuffled",):
                configs.append(Config(f"{name} b{rows} {access}", [remote],
                                      variant(rows, access), framework="torch",
                                      threads=threads, n=1, batch=rows, access=access))
        for n in [m for m in args.sizes if m > 1]:
            store = os.path.join(args.tmp, f"ddp-store-{n}")
            group = [start(kind="torch", threads=1, world=n, rank=r, store=store)
                     for r in range(n)]
            for access in accesses:
                configs.append(Config(f"torch-ddp-{n} b{rows}x{n} {access}", group,
                                      variant(rows, access), framework="torch-ddp", n=n,
                                      batch=rows * n, access=access))
    return configs, remotes


def median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")


def ratio(a: Config, b: Config) -> dict:
    """Per-round ratios of samples/s (a over b): median, min, max."""
    values = [x / y for x, y in zip(a.samples_per_s, b.samples_per_s, strict=True)]
    return {"median": round(median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def measure(configs: list[Config], args, pids: set[int]) -> list[dict]:
    """Rounds of one turn per configuration, each in a new random order.

    A round in which processes outside the benchmark used more than ``--max-foreign``
    cores is recorded but not counted, and another is run in its place (at most
    ``--attempts`` rounds in all; if none was quiet, every round counts and the
    record says so).
    """
    for config in configs:  # warm up: compile caches, allocator, first-call costs
        config.execute("warmup", 2)
        per_step = config.execute("warmup", 3) / 3
        config.steps = max(3, int(round(args.seconds / per_step)))
    rng = np.random.default_rng(SEED + 2)
    rounds: list[dict] = []
    measured: list[list[float]] = []
    hz = os.sysconf("SC_CLK_TCK")
    while (sum(r["counted"] is True for r in rounds) < args.rounds
           and len(rounds) < max(args.attempts, args.rounds)):
        values = [0.0] * len(configs)
        busy0, ours0 = cpu_ticks(pids)
        start = time.monotonic()
        for i in rng.permutation(len(configs)):
            config = configs[i]
            values[i] = config.steps * config.samples_per_step / config.execute(
                "run", config.steps, args.untimed_steps)
        elapsed = time.monotonic() - start
        busy1, ours1 = cpu_ticks(pids)
        foreign = max(0, (busy1 - busy0) - (ours1 - ours0)) / hz / elapsed
        measured.append(values)
        rounds.append({"round": len(rounds), "seconds": round(elapsed, 1),
                       "foreign_cores": round(foreign, 3),
                       "counted": bool(foreign <= args.max_foreign),
                       "load_1min": round(os.getloadavg()[0], 2)})
    if not any(r["counted"] for r in rounds):
        for r in rounds:
            r["counted"] = "counted anyway: no round was quiet"
    for r, values in zip(rounds, measured, strict=True):
        if r["counted"]:
            for config, value in zip(configs, values, strict=True):
                config.samples_per_s.append(value)
    return rounds


def find(configs: list[Config], **labels) -> Config | None:
    for config in configs:
        if all(config.labels.get(k) == v for k, v in labels.items()):
            return config
    return None


def summarize(configs: list[Config], args) -> tuple[list[dict], dict]:
    rows = args.rows
    base = {access: find(configs, framework="pytensor", threads=1, access=access)
            for access in ("shuffled", "contiguous")}
    table = []
    for config in configs:
        reference = base[config.labels["access"]]
        entry = dict(name=config.name, **config.labels, steps_per_turn=config.steps,
                     samples_per_s=round(median(config.samples_per_s), 1),
                     ms_per_step=round(1e3 * config.samples_per_step
                                       / median(config.samples_per_s), 3),
                     speedup=ratio(config, reference), speedup_vs=reference.name,
                     samples_per_s_per_round=[round(v, 1) for v in config.samples_per_s])
        table.append(entry)
    n = args.max_n
    headline: dict = {}
    for access in ("shuffled", "contiguous"):
        main = find(configs, framework="synkhronos", n=n, scaling="scaled", access=access,
                    allreduce=True, balance=False)
        if main is None:
            continue
        key = f"synk-{n} scaled {access} allreduce-on"
        headline[f"{key} / pytensor-1thread"] = ratio(main, base[access])
        synk1 = find(configs, framework="synkhronos", n=1, access=access)
        if synk1 is not None:  # --sizes may leave n=1 out
            headline[f"{key} / synk-1"] = ratio(main, synk1)
        threads = find(configs, framework="pytensor", threads="all", batch=rows,
                       access=access)
        if threads is not None:
            headline[f"pytensor-threads b{rows} {access} / pytensor-1thread"] = ratio(
                threads, base[access])
        independent = find(configs, framework="independent", n=n, access=access)
        unsharded = find(configs, framework="synkhronos", n=n, scaling="scaled", access=access,
                         allreduce=True, sharded=False) if n > 1 else None
        if independent is not None:
            headline[f"{key} / pytensor-1thread x{n} independent"] = ratio(main, independent)
            if unsharded is not None:
                headline[f"synk-{n} unsharded scaled {access} allreduce-on / pytensor-1thread "
                         f"x{n} independent"] = ratio(unsharded, independent)
        if unsharded is not None:
            headline[f"{key} (sharded) / unsharded"] = ratio(main, unsharded)
            headline[f"pytensor-1thread x{n} independent {access} / pytensor-1thread"] = ratio(
                independent, base[access])
        ddp = find(configs, framework="torch-ddp", n=n, access=access)
        torch1 = find(configs, framework="torch", threads=1, access=access)
        if ddp is not None:
            headline[f"{key} / torch-ddp-{n}"] = ratio(main, ddp)
            headline[f"torch-ddp-{n} {access} / torch-1thread"] = ratio(ddp, torch1)
        if torch1 is not None:
            headline[f"torch-1thread {access} / pytensor-1thread"] = ratio(torch1, base[access])
    per_n, per_n_balanced = {}, {}
    for m in args.sizes:
        synk_m = find(configs, framework="synkhronos", n=m, scaling="scaled",
                      access="shuffled", allreduce=True, balance=False)
        ceiling = find(configs, framework="independent", n=m, access="shuffled")
        if synk_m is not None and ceiling is not None:
            per_n[str(m)] = ratio(synk_m, ceiling)
        balanced = find(configs, framework="synkhronos", n=m, access="shuffled",
                        balance=True)
        if balanced is not None and ceiling is not None:
            per_n_balanced[str(m)] = ratio(balanced, ceiling)
    if per_n:  # synk-n scaled shuffled allreduce-on over n independent plain programs
        headline["vs_ceiling_per_n"] = per_n
    if per_n_balanced:  # the same, rows in proportion to measured speed
        headline["vs_ceiling_per_n_balanced"] = per_n_balanced
    for m in args.sizes:
        for access in ("shuffled", "contiguous"):
            even = find(configs, framework="synkhronos", n=m, scaling="scaled",
                        access=access, allreduce=True, balance=False)
            balanced = find(configs, framework="synkhronos", n=m, access=access,
                            balance=True)
            ceiling = find(configs, framework="independent", n=m, access=access)
            if even is None or balanced is None:
                continue
            key = f"synk-{m} balanced scaled {access} allreduce-on"
            headline[f"{key} / even split"] = ratio(balanced, even)
            if ceiling is not None:
                headline[f"{key} / pytensor-1thread x{m} independent"] = ratio(
                    balanced, ceiling)
    for m in args.sizes:  # rows in chunks: against the even split, DDP and the ceiling
        for access in ("shuffled", "contiguous"):
            even = find(configs, framework="synkhronos", n=m, scaling="scaled",
                        access=access, allreduce=True, balance=False)
            chunked = find(configs, framework="synkhronos", n=m, access=access,
                           chunks=chunks_at(args, m)) if chunks_at(args, m) else None
            ddp = find(configs, framework="torch-ddp", n=m, access=access)
            ceiling = find(configs, framework="independent", n=m, access=access)
            if even is not None and ddp is not None:
                headline[f"synk-{m} scaled {access} allreduce-on / torch-ddp-{m}"] = ratio(
                    even, ddp)
            if chunked is None:
                continue
            key = f"synk-{m} chunks{chunks_at(args, m)} scaled {access} allreduce-on"
            if even is not None:
                headline[f"{key} / even split"] = ratio(chunked, even)
            sliced = find(configs, framework="synkhronos", n=m, access=access,
                          num_slices=chunks_at(args, m) // m)
            if sliced is not None:  # the same rows per run of the function, fixed
                headline[f"{key} / even split in slices of a chunk"] = ratio(chunked, sliced)
            if ddp is not None:
                headline[f"{key} / torch-ddp-{m}"] = ratio(chunked, ddp)
            if ceiling is not None:
                headline[f"{key} / pytensor-1thread x{m} independent"] = ratio(chunked, ceiling)
    if n > 1:
        goal = 0.95 if args.model == "mlp" else 0.97
        targets = {}
        for access in ("shuffled", "contiguous"):
            key = (f"synk-{n} scaled {access} allreduce-on / pytensor-1thread x{n} "
                   "independent")
            if key in headline:
                targets[f"synk-{n} {access} >= {goal} of the ceiling"] = (
                    headline[key]["median"] >= goal)
        headline["targets_met (medians)"] = targets
    return table, headline


# -- Table 1 -------------------------------------------------------------------------------------
def profile_table(configs: list[Config], args, pids: set[int]) -> dict:
    """Plain program, synk-1 and synk-max over the same samples, interleaved in rounds
    (a round with more than ``--max-foreign`` foreign cores is redone, as in
    :func:`measure`)."""
    rows, n = args.rows, args.max_n
    plain = find(configs, framework="pytensor", threads=1, access="shuffled")
    synk1 = find(configs, framework="synkhronos", n=1, access="shuffled")
    synkn = find(configs, framework="synkhronos", n=n, scaling="scaled", access="shuffled",
                 allreduce=True, balance=False)
    steps = max(1, args.profile_steps)
    hz = os.sysconf("SC_CLK_TCK")
    columns: dict[str, dict] = {}
    rounds: list[dict] = []
    measured: list[dict] = []
    while (sum(r["counted"] for r in rounds) < args.profile_rounds
           and len(rounds) < max(args.attempts, args.profile_rounds)):
        busy0, ours0 = cpu_ticks(pids)
        start = time.monotonic()
        results = {}
        for name, config, count in (("pytensor", plain, steps * n), ("synk-1", synk1, steps * n),
                                    (f"synk-{n}", synkn, steps)):
            remote = config.remotes[0]
            remote.send({"op": "profile", "variant": config.variant, "steps": count})
            results[name] = remote.receive()
        elapsed = time.monotonic() - start
        busy1, ours1 = cpu_ticks(pids)
        foreign = max(0, (busy1 - busy0) - (ours1 - ours0)) / hz / elapsed
        counted = bool(foreign <= args.max_foreign)
        rounds.append({"seconds": round(elapsed, 1), "foreign_cores": round(foreign, 3),
                       "counted": counted})
        measured.append(results)
    if not any(r["counted"] for r in rounds):
        for r in rounds:
            r["counted"] = "counted anyway: no round was quiet"
    for r, results in zip(rounds, measured, strict=True):
        if r["counted"]:
            for name, result in results.items():
                column = columns.setdefault(name, {})
                for key, value in result.items():
                    column[key] = column.get(key, 0.0) + value
    samples = sum(bool(r["counted"]) for r in rounds) * steps * n * rows
    items = [("Total", "total"), ("PyTensor function", "function"),
             ("  slowest rank", "function_max"), ("Shuffle (gather)", "gather"),
             ("Stage (master)", "stage"), ("Straggler effect", "straggler"),
             ("Reduce outputs", "reduce"), ("Exchange (measured alone)", "exchange"),
             ("Other (posting, Python)", "unaccounted")]
    for column in columns.values():
        # the exchange runs inside the step's one command: timed alone, values resident
        column["exchange"] = column.get("collective", 0.0) + column.get(
            "allreduce_resident_total", 0.0)
        parts = sum(column.get(k, 0.0) for k in ("stage", "gather", "function", "straggler",
                                                  "reduce", "exchange"))
        column["unaccounted"] = column["total"] - parts
    lines = []
    for label, key in items:
        values = {name: columns[name].get(key) for name in columns}
        if key in ("function_max", "stage", "straggler", "reduce", "exchange"):
            values["pytensor"] = None
        plain_v, last = values["pytensor"], values[f"synk-{n}"]
        scaling = plain_v / last if plain_v and last else None
        lines.append({"item": label, **{k: (round(v, 4) if v is not None else None)
                                        for k, v in values.items()},
                      "scaling": round(scaling, 2) if scaling else None})
    synk_n = columns.get(f"synk-{n}", {})
    if synk_n.get("steps") and "allreduce_resident_total" in synk_n:
        per_step = synk_n["allreduce_resident_total"] / synk_n["steps"]
        lines.append({"item": "  exchange per step, ms", "pytensor": None, "synk-1": None,
                      f"synk-{n}": round(1e3 * per_step, 3), "scaling": None})
    return {"samples": samples, "rows_per_process": rows, "columns_seconds": columns,
            "table": lines, "rounds": rounds,
            "note": "seconds over the same samples; per-rank phases (function, gather) are "
                    "means over ranks; 'unaccounted' = total less the listed phases (command "
                    "posting, waking, Python). The pytensor column times the plain program's "
                    "numpy gather X[idx] and its function apart."}


def phase_account(configs: list[Config], args) -> dict:
    """``--phases``: the phase account at every synkhronos n (``SynkServer.phases``),
    one server after the other while the others wait."""
    account = {}
    for n in args.sizes:
        config = find(configs, framework="synkhronos", n=n, scaling="scaled",
                      access="shuffled", allreduce=True, balance=False)
        if config is None:
            continue
        remote = config.remotes[0]
        remote.send({"op": "phases", "variant": config.variant,
                     "steps": args.profile_steps, "commands": args.fixed_commands})
        account[str(n)] = remote.receive()
    return {"note": "ms per step per rank from synk.profile().per_rank() (wait: at meeting "
                    "points for the slowest rank, and the master's wait for the slowest "
                    "worker; other: the calls' Python path); cpu, cpu_exchange: the "
                    "process's CPU time in the step and in its collectives (a spinning "
                    "wait counts, a blocked one does not: spin_s says which). fixed_costs: "
                    "each rank's CPU us per command.", "per_n": account}


def draw_phases(phases: dict, out: Path, machine: dict) -> str:
    """``scaling_phases.png``: per n, one stacked bar of phases per rank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_n = phases["per_n"]
    names = ("compute", "gather", "update", "exchange", "wait", "other")
    colors = ("tab:blue", "tab:cyan", "tab:green", "tab:orange", "tab:red", "tab:gray")
    fig, axes = plt.subplots(1, len(per_n), figsize=(2.2 + 1.1 * len(per_n) + 0.25 * sum(
        len(v["ms_per_step"]) for v in per_n.values()), 4.2), squeeze=False)
    for ax, (n, entry) in zip(axes[0], per_n.items(), strict=True):
        ranks = entry["ms_per_step"]
        x = np.arange(len(ranks))
        bottom = np.zeros(len(ranks))
        for name, color in zip(names, colors, strict=True):
            values = np.array([r[name] for r in ranks])
            ax.bar(x, values, bottom=bottom, color=color, label=name, width=0.8)
            bottom += values
        ax.plot(x, [r["cpu"] for r in ranks], "k.", label="CPU time")
        ax.set_xticks(x, [str(r["rank"]) for r in ranks], fontsize=6)
        ax.set_title(f"n={n}", fontsize=9)
        ax.set_xlabel("rank", fontsize=8)
    axes[0][0].set_ylabel("ms per step")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"Phases of one training step per rank ({machine['usable_cores']} cores)",
                 fontsize=10)
    fig.tight_layout()
    path = out / "scaling_phases.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def format_table(table1: dict, n: int) -> str:
    header = f"{'Item':24s} {'PyTensor':>10s} {'Synk-1':>10s} {f'Synk-{n}':>10s} {'Scaling':>8s}"
    out = [f"Table 1: {table1['samples']} samples, seconds", header]

    def cell(value):
        return f"{value:10.3f}" if value is not None else f"{'-':>10s}"

    for line in table1["table"]:
        scaling = f"{line['scaling']:8.2f}" if line["scaling"] else f"{'-':>8s}"
        out.append(f"{line['item']:24s} {cell(line['pytensor'])} {cell(line['synk-1'])} "
                   f"{cell(line[f'synk-{n}'])} {scaling}")
    return "\n".join(out)


# -- figures -------------------------------------------------------------------------------------
def draw(result: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = result["max_n"]
    rows = result["rows_per_process"]
    entries = result["configurations"]
    written = []
    bars = [e for e in entries if e["framework"] in ("synkhronos", "torch-ddp", "torch",
                                                     "independent")
            and e["n"] in (1, n) or (e["framework"] == "pytensor" and e["threads"] == "all")]
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(bars) + 1.6))
    colors = {"synkhronos": "tab:blue", "pytensor": "tab:gray", "torch": "tab:orange",
              "torch-ddp": "tab:red", "independent": "silver"}
    labels, values, errors, cols = [], [], [], []
    for e in bars:
        s = e["speedup"]
        labels.append(e["name"])
        values.append(s["median"])
        errors.append([s["median"] - s["min"], s["max"] - s["median"]])
        cols.append(colors[e["framework"]])
    y = np.arange(len(bars))[::-1]
    ax.barh(y, values, xerr=np.array(errors).T, color=cols, capsize=2)
    ax.set_yticks(y, labels, fontsize=8)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvline(n, color="k", lw=0.8, ls="--")
    for yi, v, (_, up) in zip(y, values, errors, strict=True):
        ax.text(v + up + 0.03, yi, f"{v:.2f}x", va="center", fontsize=7)
    ax.set_xlabel(f"speed-up (samples/s) over the plain PyTensor program, 1 process, "
                  f"1 BLAS thread, {rows} rows,\nsame access (shuffled / contiguous); "
                  f"median and range over rounds", fontsize=9)
    ax.set_title(f"{result['model'].upper()} training step, n={n} "
                 f"({result['machine']['usable_cores']} cores): ablations and peers")
    fig.tight_layout()
    stem = "scaling" if result["model"] == "mlp" else f"scaling_{result['model']}"
    path = out / f"{stem}_speedup.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(str(path))

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ns = list(range(1, n + 1))
    ax.plot(ns, ns, "k--", lw=0.8, label="linear")
    for scaling, access, allreduce, style, color in (
            ("scaled", "shuffled", True, "o-", "tab:blue"),
            ("scaled", "contiguous", True, "s-", "tab:cyan"),
            ("scaled", "shuffled", False, "o:", "tab:purple"),
            ("fixed", "shuffled", True, "^-", "tab:green")):
        points = []
        for e in entries:
            if (e["framework"] != "synkhronos" or e["access"] != access or e.get("balance")
                    or e.get("chunks") or e.get("num_slices")):
                continue
            if e["n"] == 1 or (e["scaling"] == scaling and e["allreduce"] == allreduce):
                points.append((e["n"], e["speedup"]["median"]))
        if points:
            points.sort()
            label = (f"synk, batch {'x n' if scaling == 'scaled' else 'fixed'}, {access}, "
                     f"all-reduce {'on' if allreduce else 'off'}")
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, style, color=color, label=label)
    ceiling = sorted((e["n"], e["speedup"]["median"]) for e in entries
                     if e["framework"] == "independent" and e["access"] == "shuffled")
    if ceiling:
        ax.plot([1] + [c[0] for c in ceiling], [1.0] + [c[1] for c in ceiling], "d:",
                color="gray", label="n plain programs at once (no exchange): the ceiling")
    ddp = sorted((e["n"], e["speedup"]["median"]) for e in entries
                 if e["framework"] == "torch-ddp" and e["access"] == "shuffled")
    torch1 = [e for e in entries if e["framework"] == "torch" and e["threads"] == 1
              and e["access"] == "shuffled"]
    if ddp and torch1:
        ax.plot([1] + [p[0] for p in ddp], [torch1[0]["speedup"]["median"]] +
                [p[1] for p in ddp], "x-", color="tab:red", label="torch DDP (gloo), shuffled")
    ax.set_xticks(ns)
    ax.set_xlabel("processes n")
    ax.set_ylabel("speed-up over plain PyTensor, 1 thread")
    ax.set_title(f"{result['model'].upper()}: speed-up against n ({rows} rows per process)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / f"{stem}_vs_n.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(str(path))
    return written


def optimizer_state(args) -> list[dict]:
    """Adam's state per process at n=1 and n=max, sharded and not (one server each)."""
    spec = {"kind": "state", "model": args.model, "dataset_rows": args.dataset_rows}
    found = []
    for n, sharded in ((1, False), (args.max_n, True), (args.max_n, False)):
        if n == 1 and found:
            continue
        remote = Remote(dict(spec, n=n, sharded=sharded))
        remote.launch()
        try:
            remote.wait_ready()
            found.append(remote.info)
        finally:
            remote.close()
        if args.max_n == 1:
            break
    if len(found) >= 2:
        whole = max(found[0]["state_bytes_per_rank"])
        found[1]["fraction_of_n1_per_rank"] = round(
            max(found[1]["state_bytes_per_rank"]) / whole, 3)
    return found


# -- main ----------------------------------------------------------------------------------------
def torch_available() -> str | None:
    """None if torch imports (checked in a child, so the driver stays torch-free)."""
    probe = subprocess.run([sys.executable, "-c", "import torch, torch.distributed"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else probe.stderr.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--max-n", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--rows", type=int, default=256, help="rows per process")
    parser.add_argument("--rounds", type=int, default=5,
                        help="measurement rounds (0: only --profile)")
    parser.add_argument("--max-foreign", type=float, default=0.25,
                        help="a round in which other processes used more cores is redone")
    parser.add_argument("--attempts", type=int, default=15, help="rounds at most, redone ones "
                        "included")
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="approximate length of one configuration's turn")
    parser.add_argument("--untimed-steps", type=int, default=1,
                        help="steps each configuration runs untimed at the start of its "
                             "turn, after the seconds it sat idle")
    parser.add_argument("--dataset-rows", type=int, default=16384)
    parser.add_argument("--profile", action="store_true", help="also the Table-1 profile")
    parser.add_argument("--profile-steps", type=int, default=20,
                        help="synk-max steps per profile round")
    parser.add_argument("--profile-rounds", type=int, default=3)
    parser.add_argument("--phases", action="store_true",
                        help="also the per-phase account of the step at every n")
    parser.add_argument("--fixed-commands", type=int, default=300,
                        help="empty commands and 4-byte all-reduces timed per n (--phases)")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--spin", type=float, default=None,
                        help="synk.fork(spin=...); default: the library's choice")
    parser.add_argument("--wait-quiet", type=float, default=0.0,
                        help="seconds to wait at most for a 1-minute load average below "
                             "--quiet-load before starting")
    parser.add_argument("--quiet-load", type=float, default=1.0)
    parser.add_argument("--out", type=Path, help="write scaling.json and PNGs here")
    parser.add_argument("--sizes", default=None,
                        help="comma-separated n to run (default: 1 .. --max-n)")
    parser.add_argument("--lean", action="store_true",
                        help="no fixed-batch and no unsharded ablations")
    parser.add_argument("--no-state", action="store_true",
                        help="skip the optimizer-state measurement")
    parser.add_argument("--balance", action="store_true",
                        help="also the step with rows balanced by measured speed")
    parser.add_argument("--chunks", type=int, default=0,
                        help="also the step whose rows are taken in this many chunks as "
                             "the processes come free (make_train_function(chunks=...))")
    parser.add_argument("--busy-pinned", action="store_true",
                        help="each --busy program held to one core (the last usable ones), "
                             "as a program that stays on its core does")
    parser.add_argument("--chunks-per-process", type=int, default=0,
                        help="the same with this many chunks per process at each n")
    parser.add_argument("--busy", type=int, default=0,
                        help="programs that keep a core busy beside the benchmark, from "
                             "before the servers start to the end of the measurement "
                             "(another user's job on the machine; not counted as foreign)")
    args = parser.parse_args()
    if args.serve:
        serve(json.loads(args.serve))
        return
    args.sizes_given = args.sizes is not None
    if args.sizes_given:
        args.sizes = sorted({int(v) for v in args.sizes.split(",")})
        if not args.sizes or args.sizes[0] < 1:
            parser.error(f"--sizes must list positive integers; got {args.sizes}")
        args.max_n = args.sizes[-1]
    else:
        args.sizes = list(range(1, args.max_n + 1))
    args.dataset_rows = max(args.dataset_rows, 4 * args.rows * args.max_n)
    quiet = wait_for_quiet(args.wait_quiet, args.quiet_load)
    torch_problem = None if not args.no_torch else "--no-torch"
    if torch_problem is None:
        torch_problem = torch_available()
    with tempfile.TemporaryDirectory(prefix="synk-scaling-") as tmp:
        args.tmp = tmp
        started = time.monotonic()
        configs, remotes = build_configs(args, torch_problem is None)
        usable = sorted(os.sched_getaffinity(0))
        spinners = [subprocess.Popen([sys.executable, "-c", SPINNER.format(
            cores={usable[-1 - i]} if args.busy_pinned else set(usable))])
            for i in range(args.busy)]
        try:
            # synk first, alone: fork() picks its spin from the load average, which the
            # other servers' compiling would raise
            first = [r for r in remotes if r.spec["kind"] == "synk"]
            for batch in (first, [r for r in remotes if r not in first]):
                for remote in batch:
                    remote.launch()
                for remote in batch:
                    remote.wait_ready()
            startup_s = time.monotonic() - started
            pids = descendants(os.getpid())
            load_before = os.getloadavg()
            rounds = measure(configs, args, pids) if args.rounds > 0 else []
            load_after = os.getloadavg()
            balance = {}
            for remote in remotes:
                if remote.spec.get("balance"):
                    remote.send({"op": "balance"})
                    balance[f"synk-{remote.spec['n']}"] = remote.receive()
            table1 = profile_table(configs, args, pids) if args.profile else None
            phases = phase_account(configs, args) if args.phases else None
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
            for remote in remotes:
                remote.close()
        state = optimizer_state(args) if not args.no_state else "omitted: --no-state"
    result: dict = {
        "benchmark": "scaling",
        "model": args.model,
        "layers": list(MLP_SIZES) if args.model == "mlp" else
        f"im2col CNN: conv5x5x{CNN_CHANNELS[0]}+pool2, conv5x5x{CNN_CHANNELS[1]}+pool2, "
        f"{16 * CNN_CHANNELS[1]}-{CNN_HIDDEN}-10",
        "parameters": int(sum(np.prod(s) for s in parameter_shapes(args.model))),
        "dtype": "float32",
        "update": f"sgd, learning_rate {LEARNING_RATE}",
        "rows_per_process": args.rows,
        "max_n": args.max_n,
        "rounds": args.rounds,
        "seconds_per_turn": args.seconds,
        "untimed_steps_per_turn": args.untimed_steps,
        "dataset_rows": args.dataset_rows,
        "machine": _harness.machine(),
        "sizes": args.sizes,
        "lean": args.lean,
        "balance": balance if args.balance else "omitted: no --balance",
        "chunks": ({str(m): chunks_at(args, m) for m in args.sizes if m > 1}
                   if args.chunks or args.chunks_per_process
                   else "omitted: no --chunks or --chunks-per-process"),
        "busy_programs": args.busy, "busy_pinned": args.busy_pinned,
        "load": dict(quiet, startup_s=round(startup_s, 1),
                     load_at_measurement=[round(v, 2) for v in load_before],
                     load_after_measurement=[round(v, 2) for v in load_after],
                     rounds=rounds),
        "torch": "used" if torch_problem is None else f"omitted: {torch_problem}",
        "servers": [{"spec": {k: v for k, v in r.spec.items() if k != "store"},
                     "info": r.info} for r in remotes],
    }
    result["optimizer_state"] = state
    if args.rounds > 0:
        table, headline = summarize(configs, args)
        result["headline"] = headline
        result["configurations"] = table
    if phases is not None:
        result["phases"] = phases
    if table1 is not None:
        result["table1"] = table1
        print(format_table(table1, args.max_n), file=sys.stderr)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        if args.rounds > 0:
            try:
                result["figures"] = draw(result, args.out)
            except ImportError as exc:
                result["figures"] = f"omitted: {exc}"
        if phases is not None:
            try:
                phases["figure"] = draw_phases(phases, args.out, result["machine"])
            except ImportError as exc:
                phases["figure"] = f"omitted: {exc}"
        stem = "scaling" if args.model == "mlp" else f"scaling_{args.model}"
        (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
