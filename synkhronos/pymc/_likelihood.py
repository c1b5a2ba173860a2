"""The divided log-likelihood, built: the model rewritten around the rows on every process.

This module owns the building, once per function (the Op that runs every evaluation
is ``_rowsum``'s). Steps 2-5 of :mod:`synkhronos.pymc` (step 1, the split, is
``_split``):

2. rebuild each divided observed variable on row inputs (data replaced, size resized
   with ``change_dist_size``) and take ``pm.logp`` of it; free variables become the
   model's value variables;
3. join every group's log-likelihood (one group a length of rows, ``_split``) in one
   graph (``_join``: several lengths are each divided on their own rows, through one
   scattered input of positions), compile it and its gradient as ONE ``synk.function``
   in PyMC's mode (parameter checks give ``-inf``, as in PyMC), copy the rows into
   ``synk.data``, and choose the slices: each process runs its rows in blocks of about
   ``grainsize`` rows (``num_slices``), small enough that a block's data and
   temporaries stay in the core's cache between the log-likelihood and its gradient
   (Stan's ``grainsize``; by default only when a process's rows outgrow the shared
   cache); in exact mode the rows are fixed chunks instead, one a slice, whose sums
   the master adds in chunk order (``_exact_chunks``);
4. check once, at a jittered point, that the sum over processes equals the same graph
   on the whole data: a term that mixes rows (a mean over the data inside the model)
   is refused instead of sampled wrongly;
5. wrap that function in the ``Part`` of one Op (``_rowsum.RowSum``) whose gradient is
   the reduced gradient, over the value variables in one flat vector (``Values``), and
   put the Op in a copy of the model in place of the divided terms (``_model``): PyMC's
   own functions then evaluate log-prior + Op, one parallel call an evaluation,
   whatever the number of groups.

Its interface, besides ``logp_dlogp_function``: ``build`` (steps 1-5, for ``sample``
and ``find_MAP``, which also need the Op), ``check_grainsize``,
``session_size``, and ``row_terms`` (step 2's graphs, pointwise, for
``compute_log_likelihood``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.replace import clone_replace, graph_replace
from pytensor.graph.traversal import ancestors, graph_inputs
from pytensor.tensor.shape import SpecifyShape

from .. import Data, Function, WorkerError, data, distribute, function, n_parallel
from . import _pymc_compat as compat
from ._model import check_copyable, rewrite
from ._rowsum import Part, RowSum, Values, register_backends, unpack
from ._rowsum import joined as joined_graph
from ._split import _choose_split, _data_roots, _data_value, _Group

__all__ = ["logp_dlogp_function", "build", "check_grainsize", "check_exact",
           "session_size", "row_terms", "sliced", "discrete_names"]

log = logging.getLogger("synkhronos")

# Split sum vs whole data: far above rounding, far below a wrong split. In float64
# 1e-7; in a lower precision 1000 of its epsilons (float32: 1.2e-4): with floatX
# float32, a right split of 3001 rows in 32 chunks failed 1e-7 (PyMC 5, C backend).
_CHECK_RTOL = 1e-7
_CHECK_EPSILONS = 1000
# The default grain: slices of about 1 MiB of row data (a core's L2 cache here), once a
# process's rows pass 16 MiB (half this machine's shared 32 MiB L3). At 10^6 rows on 2
# cores (32-44 MiB a process) slicing made an evaluation 1.2-1.6x faster than one block;
# at 10^5 rows (3-4 MiB a process) the rows stay in cache anyway and each slice's call
# (30-90 us) made it up to 1.5x slower (benchmarks/pymc_sampling.py).
_GRAIN_BYTES = 1 << 20
_SLICE_FROM_BYTES = 16 << 20
# Exact mode's default chunks (``_exact_chunks``): fixed whatever the number of
# processes, so it cannot follow the cache; 32 share evenly among 1, 2, 4, 8, 16 and
# 32 processes, and cost a call each (about 10-30 us of a process's time).
_EXACT_CHUNKS = 32


def _check_rtol(dtype) -> float:
    """The check's relative tolerance for sums in ``dtype``."""
    return max(_CHECK_RTOL, _CHECK_EPSILONS * float(np.finfo(dtype).eps))


def session_size() -> int | None:
    """The session's number of processes, or None before ``synk.fork()``."""
    try:
        return n_parallel()
    except RuntimeError:
        return None


# -- 2. the likelihood on row inputs -----------------------------------------------------
def row_terms(pm, model, group: _Group):
    """Each observed variable's elementwise log-probability on row inputs (and each
    potential's value), in terms of stand-ins for the free variables.

    Returns ``(terms, rows, stand_ins)``: the graphs (observed variables first, in
    order), the row input of each divided data variable they read, and the stand-in of
    each free variable.
    """
    rows = {var: pt.tensor(dtype=var.dtype, shape=(None, *var.type.shape[1:]),
                           name=f"{name}_rows")
            for var, name in group.roots.items()}
    # Cloning stops at these stand-ins for the free variables; at the end they become
    # the model's value variables, through their transforms, as in model.logp().
    stand_ins = {rv: rv.type(name=rv.name) for rv in model.free_RVs}
    terms = []
    for rv in group.observed:
        value = model.rvs_to_values[rv]
        # rebuild_strict=False makes every node again from its new inputs, so no static
        # shape of the whole data (a constant's length) survives into the row graphs.
        row_value = rows.get(value)
        if row_value is None:
            row_value = clone_replace(value, rows, rebuild_strict=False)
        graph = group.graphs.get(rv, rv)  # (its row selections moved onto the data)
        batch_ndim = row_value.ndim - rv.owner.op.ndim_supp
        size = row_value.shape[:batch_ndim]
        try:
            # Made again from its inputs on the rows where PyMC allows it; otherwise
            # cloned onto the rows and resized (PyMC's change_dist_size).
            inputs = clone_replace(graph.owner.inputs, {**stand_ins, **rows},
                                   rebuild_strict=False)
            row_rv = compat.rebuild_rv(graph, inputs, size)
            if row_rv is None:
                row_rv = clone_replace(graph, {**stand_ins, **rows}, rebuild_strict=False)
                if _pins_rows(row_rv, rows.values()):
                    raise NotImplementedError(f"{rv.owner.op} fixes its inputs' lengths")
                row_rv = compat.change_dist_size(row_rv, size)
        except NotImplementedError as exc:
            raise ValueError(f"observed variable {rv.name!r} cannot be divided by rows ({exc});"
                             " pass split=[...] without it") from exc
        terms.append(pm.logp(row_rv, row_value))
    for potential in group.potentials:
        terms.append(clone_replace(potential, {**stand_ins, **rows}, rebuild_strict=False))
    # A constant of the rows' length that the rebuilt graphs no longer read (the size
    # ``[1]`` of an observed variable of one row, now the row value's shape) is no row
    # input: a function refuses an input it does not use.
    read = set(ancestors(terms))
    return terms, {var: row for var, row in rows.items() if row in read}, stand_ins


def _row_likelihood(pm, model, group: _Group):
    """Step 2: a group's log-likelihood (its observed variables' log-probability and its
    potentials), as a graph of row inputs.

    Returns the graph and the row input of each divided data variable.
    """
    terms, rows, stand_ins = row_terms(pm, model, group)
    terms = [term.sum() for term in terms]
    loglik = terms[0] if len(terms) == 1 else pt.add(*terms)
    read = set(ancestors([loglik]))
    rvs = [rv for rv, stand_in in stand_ins.items() if stand_in in read]
    constrained = model.replace_rvs_by_values(rvs)
    loglik = graph_replace(loglik, {stand_ins[rv]: c for rv, c in zip(rvs, constrained,
                                                                       strict=True)})
    return loglik, rows


def _pins_rows(graph, row_inputs) -> bool:
    """Whether ``graph`` fixes a row input's length (``SpecifyShape``): an Op with an
    inner graph, cloned onto rows, keeps the whole data's static shapes."""
    row_inputs = set(row_inputs)
    return any(var.owner is not None and isinstance(var.owner.op, SpecifyShape)
               and var.owner.inputs[0] in row_inputs for var in ancestors([graph]))


# -- 3. the synkhronos function ------------------------------------------------------------
def check_grainsize(grainsize) -> int | None:
    if grainsize is None:
        return None
    if isinstance(grainsize, bool) or not isinstance(grainsize, (int, np.integer)):
        raise TypeError(f"grainsize must be a whole number of rows or None; got {grainsize!r}")
    if grainsize < 1:
        raise ValueError(f"grainsize must be at least 1 row; got {grainsize}")
    return int(grainsize)


def _join(plan, built: list, chunks: int | None = None
          ) -> tuple[Any, list, list, list[tuple[Any, str]]]:
    """Step 3's one graph: every group's log-likelihood (``built``: each group's graph
    and row inputs), summed, so that one call of one function evaluates them all.

    One group: its row inputs are the function's scattered inputs. Several: each is
    divided on its own length, but a call scatters inputs of one length; so the
    scattered input is ``positions`` (0 to P - 1, P the longest group's rows), every
    group's rows are broadcast whole (``synk.data`` in shared memory, which every
    process maps: no copy), and the graph takes from each group the rows that a block
    of positions stands for: positions ``[a, b)`` are rows ``[a L // P, b L // P)`` of
    a group of L rows. Any block of positions (a process's even share, its share
    balanced by measured speed, a slice of either) is then the same fraction of every
    group's rows, and blocks that cover the positions once cover every group's rows
    once: a group with fewer rows than processes leaves some processes none of its
    rows.

    ``chunks`` (exact mode, ``_exact_chunks``): the positions are that many fixed
    chunks instead, chunk ``c`` standing for rows ``[c L // chunks, (c + 1) L //
    chunks)`` of every group, whatever the number of processes; a call runs one chunk a
    slice and gathers each chunk's sums (``Part.total_of`` adds them in chunk order).

    Returns ``(loglik, scattered, whole, arrays)``: the graph, its scattered and its
    whole row inputs, and the array of each (with its label), in call order.
    """
    if len(plan.groups) == 1 and chunks is None:
        (group,), ((loglik, rows),) = plan.groups, built
        return loglik, list(rows.values()), [], [(_data_value(var), group.roots[var])
                                                 for var in rows]
    longest = chunks or max(group.rows for group in plan.groups)
    label = "chunks" if chunks else "positions"
    positions = pt.vector(dtype="int64", shape=(None,), name=label)
    start, stop = positions[0], positions[-1] + 1
    terms, whole = [], []
    arrays: list[tuple[Any, str]] = [(np.arange(longest, dtype="int64"), label)]
    for group, (loglik, rows) in zip(plan.groups, built, strict=True):
        if group.rows == longest:
            first, last = start, stop
        else:
            first, last = start * group.rows // longest, stop * group.rows // longest
        mine = {}
        for var, row in rows.items():
            whole.append(row.type(name=row.name))
            mine[row] = whole[-1][first:last]
            arrays.append((_data_value(var), group.roots[var]))
        terms.append(graph_replace(loglik, mine))
    return pt.add(*terms), [positions], whole, arrays


def check_exact(exact) -> bool:
    if not isinstance(exact, bool | np.bool_):
        raise TypeError(f"exact must be True or False; got {exact!r}")
    return bool(exact)


def _lengths(plan) -> list[tuple[int, int]]:
    """Each group's rows and the bytes of data a row holds."""
    return [(group.rows, sum(np.asarray(_data_value(var))[:1].nbytes for var in group.roots))
            for group in plan.groups]


def _num_slices(lengths: list[tuple[int, int]], n: int, grainsize: int | None) -> int:
    """Slices per process, for groups of ``(rows, bytes a row)`` run in one call: its
    positions (the longest group's rows, the others' in proportion: ``_join``; one
    group: its rows), the most any process has, in blocks of ``grainsize``; by default
    one block up to ``_SLICE_FROM_BYTES`` of row data a process, else blocks of about
    ``_GRAIN_BYTES`` (every group's rows count: one call computes them all before its
    gradient)."""
    longest = max([1, *(rows for rows, _ in lengths)])
    per_process = -(-longest // n)
    if grainsize is None:
        # the bytes of all groups' rows that one position stands for
        per_position = -(-sum(rows * row_bytes for rows, row_bytes in lengths) // longest)
        per_position = per_position or 1
        if per_process * per_position <= _SLICE_FROM_BYTES:
            return 1
        grainsize = max(1, _GRAIN_BYTES // per_position)
    return max(1, -(-per_process // grainsize))


def _one_block(plan, grainsize: int | None, n: int = 1) -> bool:
    """Whether each of ``n`` processes runs its rows in one block (nothing to slice)."""
    return _num_slices(_lengths(plan), n, grainsize) == 1


def _exact_chunks(plan, grainsize: int | None) -> int:
    """Exact mode's fixed chunks: the longest group's rows in blocks of ``grainsize``
    (default ``_EXACT_CHUNKS`` blocks), never more chunks than rows. The same at every
    number of processes, so the sums are too."""
    longest = max(group.rows for group in plan.groups)
    wanted = _EXACT_CHUNKS if grainsize is None else -(-longest // grainsize)
    return max(1, min(longest, wanted))


def discrete_names(model) -> list[str]:
    """The names of the model's discrete free variables (which NUTS cannot sample)."""
    return [v.name for v in model.value_vars if v not in model.continuous_value_vars]


def sliced(model, split, grainsize: int | None, n: int) -> bool:
    """Whether ``n`` processes would run their rows of ``model`` in slices (rows
    outgrowing the cache, or ``grainsize``), before anything is built."""
    return not _one_block(_choose_split(model, split), grainsize, n)


# -- 4. the one-time check -----------------------------------------------------------------
def _check_rows(fn: Function, row_data: list[Data], values: Values, model,
                groups: list[_Group], n: int, slices: int,
                total: Callable[[np.ndarray], np.ndarray]) -> None:
    """Step 4: the sum over processes must equal the same graph on the whole data.

    Compared at jittered points, where a term that mixes rows (a mean or a lag over the
    data inside the model) shows. The whole-data value is the master's own compiled
    function (``as_pytensor``): no extra compile. ``total``: the call's output summed
    (``Part.total_of``).
    """
    moved = [rv for group in groups for rv in group.observed
             if group.graphs.get(rv, rv) is not rv]
    if n == 1 and slices == 1 and not moved:
        return
    # Where rows were selected by a mask, the graph was rewritten (``_move_masks``):
    # its whole-data value must also equal PyMC's own log-probability of the groups.
    terms = [term for group in groups for term in [*group.observed, *group.potentials]]
    pymc_logp = (model.compile_logp(vars=terms, jacobian=False, sum=True) if moved else None)
    rng = np.random.default_rng(0)
    start = model.initial_point()
    for _ in range(3):
        jittered = {name: np.asarray(value + rng.uniform(-1, 1, size=np.shape(value)),
                                     dtype=np.asarray(value).dtype)
                    for name, value in start.items()}
        point = values.flat(jittered)
        whole_loglik, whole_grad = unpack(fn.as_pytensor(*[d.data for d in row_data], point))
        rtol = _check_rtol(np.asarray(whole_loglik).dtype)
        if not (np.isfinite(whole_loglik) and np.all(np.isfinite(whole_grad))):
            continue  # out of support there: another point
        if pymc_logp is not None:
            want = pymc_logp(jittered)
            if abs(whole_loglik - want) > rtol * (abs(want) + 1.0):
                raise ValueError(
                    f"observed variables {[rv.name for rv in moved]} select their observed "
                    "rows (missing values) from a graph that is not row-wise: moved onto "
                    f"the observed rows it gives {float(whole_loglik)!r}, PyMC "
                    f"{float(want)!r}; pass split=[...] without them")
        try:
            loglik, grad = unpack(total(fn(*row_data, point, num_slices=slices)))
        except WorkerError as exc:
            divided = sorted(label for group in groups for label in group.roots.values())
            raise ValueError(
                "the observed variables' log-likelihood fails on one process's rows: a data "
                "variable that it reads by rows is not divided; name every such pm.Data "
                f"container in split (divided now: {divided})"
            ) from exc
        scale = np.linalg.norm(whole_grad) + 1.0
        if (abs(loglik - whole_loglik) > rtol * (abs(whole_loglik) + 1.0)
                or np.linalg.norm(grad - whole_grad) > rtol * scale):
            names = [name for group in groups for name in group.names]
            raise ValueError(
                f"the log-likelihood of {names} is not a sum over the divided rows: "
                f"on {n} processes "
                f"({slices} slices each) it is {float(loglik)!r}, on the whole data "
                f"{float(whole_loglik)!r}. A term "
                "mixes rows (e.g. a mean, a standardisation or a lag over data inside the "
                "model); compute it before pm.Data, or leave that data out of split"
            )
        return
    log.info("synkhronos.pymc: no finite point found to check the row split; not checked")


# -- 3-5. the part, the Op and the rewritten model ------------------------------------------
def _flat_graph(joined: tuple, values: Values) -> tuple[list, Any, Any]:
    """The joined row graph (``_join``) over the values as one flat vector: ``(row
    inputs, theta, both)``, ``both`` the log-likelihood then its flat gradient in one
    vector (one reduction and one array to send a call; ``unpack``).

    Each value is a view of ``theta`` in the graph, and the gradient is taken with
    respect to those views: the compiled likelihood is the one on separate inputs.
    """
    loglik, scattered, whole, _ = joined
    theta = pt.vector(dtype=values.dtype, shape=(values.offsets[-1],), name="theta")
    pieces = []
    for i, var in enumerate(values.vars):
        piece = theta[values.offsets[i]:values.offsets[i + 1]].reshape(values.shapes[i])
        pieces.append(piece if piece.dtype == var.dtype else pt.cast(piece, var.dtype))
    loglik = graph_replace(loglik, dict(zip(values.vars, pieces, strict=True)))
    grads: Any = pytensor.grad(loglik, pieces)
    both = pt.concatenate([loglik.reshape((1,)), *[g.ravel() for g in grads]])
    if both.dtype != loglik.dtype:
        both = pt.cast(both, loglik.dtype)
    return [*scattered, *whole], theta, both


def _build_part(model, plan, joined: tuple, values: Values, size: int,
                grainsize: int | None, mode: Any = None, chunks: int | None = None) -> Part:
    """Steps 3-4 for the joined row graph (``_join``): its function, rows in shared
    memory, slices and check. ``chunks``: exact mode's (``_join``), one a slice, each
    chunk's sums gathered rather than summed over the processes."""
    _, scattered, whole, arrays = joined
    _, theta, both = _flat_graph(joined, values)
    # Exact mode gathers each chunk's sums, to add them in chunk order whatever process
    # ran which (``Part.total_of``); one process runs its chunks in that order, one a
    # slice, and sums them slice after slice: the same additions, nothing gathered.
    gathered = chunks if size > 1 else None
    fn = function(inputs=scattered, bcast_inputs=[*whole, theta],
                  outputs=(both, "gather" if gathered else "sum"),
                  mode=compat.pymc_mode(model, mode), name="pymc_loglik")
    distribute()
    row_data: list[Data] = []
    try:  # (the rows' shared memory is freed at once if anything here fails)
        for array, label in arrays:
            row_data.append(data(array, name=label))
        # (exact: a process's chunks, at most all of them, one a slice)
        slices = chunks or _num_slices(_lengths(plan), size, grainsize)
        _check_rows(fn, row_data, values, model, plan.groups, size, slices,
                    functools.partial(Part.total_of, chunks=gathered))
        for group in plan.groups:  # (several: one call, a process's slices cut them all)
            log.info("synkhronos.pymc: %d rows of %s divided over %d processes, %s",
                     group.rows, ", ".join(sorted(group.roots.values())), size,
                     f"exact: {chunks} fixed chunks" if chunks else f"{slices} slices each")
        part = Part.of(fn, row_data, len(scattered), slices, both.dtype,
                       tuple(group.rows for group in plan.groups), chunks=gathered)
        if size > 1:
            part.balance(values.flat(model.initial_point()), size)
    except BaseException:
        for item in row_data:
            item.free_memory()
        raise
    return part


def _whole_function(model, joined: tuple, values: Values, mode: Any = None
                    ) -> Callable[[np.ndarray], np.ndarray]:
    """The joined row graph on all the rows in this process, a plain PyTensor function
    of ``theta`` (what a deferred Op evaluates where no session is to be forked)."""
    inputs, theta, both = _flat_graph(joined, values)
    compiled = pytensor.function([*inputs, theta], both, mode=compat.pymc_mode(model, mode))
    arrays = [array for array, _ in joined[3]]
    return lambda x: compiled(*arrays, x)


def _read_by(model, group: _Group, loglik, rows: dict) -> list:
    """The data a group's likelihood reads whole and by rows, and the model's own (a
    container whose rows a mask selected was copied: pm.set_data on it must still be
    caught)."""
    return [*graph_inputs([loglik]), *rows, *_data_roots(
        [*group.observed, *[model.rvs_to_values[rv] for rv in group.observed],
         *group.potentials], model)]


def build(pm, model, split, grainsize, open_session: Callable[[], int] | None = None,
          processes: int | None = None, caller: str = "logp_dlogp_function",
          compile_kwargs: dict | None = None, exact: bool = False):
    """Steps 1-5: ``(rewritten model, its RowSum Op)``, the model in which PyMC's own
    functions evaluate the divided terms through the Op (``_model``); at
    ``n_parallel`` 1 with one block of rows, ``(model, None)``: nothing to divide.
    (``grainsize`` checked by the caller.)

    With ``open_session`` (a function that forks this process's session of
    ``processes`` processes and returns its size) no session is needed now: steps 3-4
    wait for the first evaluation in another process (a chain process forked from this
    one, which then has a session of its own), and the check's errors are raised
    there; evaluations in this process run all the rows in a plain function
    (``_whole_function``); at one process in one block no session is forked at all.
    ``caller``: the public function named in errors; ``compile_kwargs``: PyMC's
    (``pytensor.function``'s), for the rows' mode.
    ``exact``: the rows in fixed chunks summed in a fixed order (``_exact_chunks``),
    the same sums at every number of processes, one process included (never the model
    itself then).
    """
    size = session_size()
    if size is None and open_session is None:
        raise RuntimeError(f"synk.fork() must be called before synkhronos.pymc.{caller}()")
    mode = dict(compile_kwargs or {}).get("mode")
    discrete = discrete_names(model)
    if discrete:
        raise ValueError(f"synkhronos.pymc samples models whose free variables are all "
                         f"continuous (NUTS alone); {discrete[0]!r} is discrete")
    plan = _choose_split(model, split)
    with model:
        built = [_row_likelihood(pm, model, group) for group in plan.groups]
        used = set(ancestors([loglik for loglik, _ in built]))
        values = [v for v in model.value_vars if v in used]
        if not values:
            raise ValueError("the observed log-likelihood depends on no free variable")
        point = model.initial_point()
        one_process = size == 1 if open_session is None else processes == 1
        if one_process and not exact and _one_block(plan, grainsize):
            # One process, one block: nothing to divide or slice, so PyMC's own graph.
            # The Op's boundary alone (a second compiled function, a Python Op, on
            # Numba its object mode) costs about 10 us an evaluation, 5-12% of PyMC's
            # at 10^4 rows. Its sums are PyMC's, in PyMC's order: the draws are
            # pm.sample's bit for bit.
            return model, None
        check_copyable(model)
        flat = Values.of(values, point)
        read = [var for group, (loglik, rows) in zip(plan.groups, built, strict=True)
                for var in _read_by(model, group, loglik, rows)]
        chunks = _exact_chunks(plan, grainsize) if exact else None
        joined = _join(plan, built, chunks)

        def connect() -> Part:
            size = open_session() if open_session is not None else n_parallel()
            with model:
                return _build_part(model, plan, joined, flat, size, grainsize, mode, chunks)

        sources = [(var, var.get_value(borrow=True)) for var in dict.fromkeys(read)
                   if isinstance(var, SharedVariable) and _data_value(var) is not None]
        dtype = joined[0].dtype
        if open_session is None:
            op = RowSum(connect(), sources, flat, dtype)
        else:
            op = RowSum(None, sources, flat, dtype, connect=connect,
                        local=lambda: _whole_function(model, joined, flat, mode))
    removed = [var for group in plan.groups for var in [*group.observed, *group.potentials]]

    def term(values: dict) -> Any:  # (the rewritten model's value variables)
        outputs: Any = op(joined_graph([values[v] for v in flat.vars], flat.dtype))
        return outputs[0]  # (the log-likelihood; then its gradient)

    try:
        register_backends(mode)
        rewritten = rewrite(pm, model, removed, term)
    except BaseException:
        op.release()
        raise
    return rewritten, op


def logp_dlogp_function(model=None, *, split=None, grainsize=None, exact=False, backend=None):
    """PyMC's ``ValueGradFunction`` for ``model``, with the likelihood on every process.

    The observed log-likelihood and its gradient are summed over the session's
    processes, each over its own block of rows; the log-prior, Jacobians, potentials and
    any observed variable not divided are evaluated in the master. Pass it to PyMC's
    NUTS: ``pm.NUTS(logp_dlogp_func=f)``; sample with ``cores=1`` (chains in the master).

    Parameters
    ----------
    model : pymc.Model, optional
        The model (default: the one of the current ``with`` context). It is not changed.
    split : str or list of str, optional
        Names of the ``pm.Data`` containers and observed variables divided by rows.
        Default: every observed variable with rows of data and every container whose
        first axis has their length. Observed variables not divided are evaluated in
        the master; unnamed array constants of the rows' length are always divided.
    grainsize : int, optional
        Rows a process evaluates at a time (Stan's ``reduce_sum`` grain): each process
        runs its rows in consecutive slices of about this many and sums them, so that
        a slice's data and temporaries stay in cache between the log-likelihood and its
        gradient. Default: one block while a process's rows hold at most 16 MiB,
        beyond that slices of about 1 MiB of row data. Pass a number at least the rows
        per process for one block. With observed variables of several lengths, rows of
        the longest: every slice holds the same fraction of each one's rows.
    exact : bool, default False
        Sums that do not depend on the number of processes: the rows are cut into
        fixed chunks (of ``grainsize`` rows; default 32 chunks), whichever process
        evaluates a chunk, and the chunks' sums are added in chunk order in the master.
        The value and gradient are then bit for bit the same at every ``n_parallel``
        (one process included, which runs the same chunks), so NUTS draws are too; they
        differ from PyMC's own function by rounding, as the divided sums always do
        (PyMC adds all rows in one pass). It costs a call a chunk on each process and a
        gathered vector a chunk.
    backend : str, optional
        The backend the rows' function and the returned one compile with: ``"c"``,
        ``"numba"`` or ``"jax"`` (on the CPU, one XLA thread a process), as PyMC 6's
        ``backend`` keyword. Default: PyTensor's default mode.

    Returns
    -------
    pymc.model.ValueGradFunction
        Called with a raveled point, returns ``(logp, dlogp)`` equal to PyMC's
        ``model.logp_dlogp_function(ravel_inputs=True)`` up to rounding.

    Raises
    ------
    RuntimeError
        Before ``synk.fork()``.
    TypeError
        ``split`` is not a name or a list of names; ``grainsize`` is not a whole number.
    ValueError
        ``grainsize`` is below 1; ``split`` names something that is not a container or
        observed variable, or
        whose rows do not match; the model has discrete free variables; or the
        log-likelihood is not a sum over the divided rows (checked once, at a jittered
        point).

    Notes
    -----
    Collective: every process takes part in each evaluation, one parallel call an
    evaluation whatever the number of divided observed variables and of their lengths.
    The rows are copied into shared memory once: after ``pm.set_data`` on a divided
    container build a new function (the old one raises RuntimeError); the terms the
    master evaluates read the model's own containers and follow ``pm.set_data``.
    With one process (``n_parallel=1``) and one block of rows (the default up to 16
    MiB of rows) there is nothing to divide: the function is PyMC's own, which
    follows ``pm.set_data`` as in PyMC; with slices, the compiled likelihood is called
    in place, without a command.
    """
    grainsize = check_grainsize(grainsize)
    exact = check_exact(exact)
    compile_kwargs = compat.compile_kwargs(backend, None)
    pm = compat.import_pymc()
    model = pm.modelcontext(model)
    rewritten, _ = build(pm, model, split, grainsize, exact=exact,
                         compile_kwargs=compile_kwargs)
    return rewritten.logp_dlogp_function(ravel_inputs=True, **compile_kwargs)
