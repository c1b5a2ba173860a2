"""synkhronos.pymc: sample an unmodified PyMC model with its likelihood on every process.

Stan's ``reduce_sum``, for PyMC. A model's observed log-likelihood is a sum over data
rows; this module divides those rows among the session's processes and leaves the rest
of the log-density (priors with their Jacobians, potentials, observations that are not
divided) to the master. PyMC's own sampler drives it all, in the master.

One evaluation of the log-density, as NUTS asks for it at every leapfrog step::

    PyMC's NUTS (master)
      -> PyMC's ValueGradFunction over (log-prior + RowSum(values))
           |  log-prior, Jacobians, potentials and their gradient: the master
           +-> RowSum.perform(values)                one call per evaluation: PyTensor
                 -> synk Function(rows, values)      merges the Op's value and gradient
                      every process: its rows' log-likelihood and gradient, op "sum"
                 <- (log-likelihood, flat gradient)
      <- (logp, dlogp)

Building that function (``logp_dlogp_function``, once per model):

1. choose the split: the observed variables summed by rows and the data variables
   (``pm.Data`` containers, observed values, anonymous array constants of the same
   length) divided by rows;
2. rebuild each of those observed variables on row inputs (data replaced, size resized
   with ``change_dist_size``) and take ``pm.logp`` of it; free variables become the
   model's value variables;
3. compile that log-likelihood and its gradient as a ``synk.function`` in PyMC's mode
   (parameter checks give ``-inf``, as in PyMC), copy the rows into ``synk.data``, and
   choose the slices: each process runs its rows in blocks of about ``grainsize`` rows
   (``num_slices``), small enough that a block's data and temporaries stay in the
   core's cache between the log-likelihood and its gradient (Stan's ``grainsize``; by
   default only when a process's rows outgrow the shared cache);
4. check once, at a jittered point, that the sum over processes equals the same graph
   on the whole data: a term that mixes rows (a mean over the data inside the model)
   is refused instead of sampled wrongly;
5. wrap it in an Op whose gradient is the reduced gradient, and hand PyMC its own
   ``ValueGradFunction`` of log-prior + Op.

``sample`` runs PyMC's ``pm.init_nuts`` (jitter, mass matrix) and ``pm.sample`` with a
NUTS step over that function: the chains run one after another in the master, with the
seeds ``pm.sample`` would use, so the draws equal ``pm.sample``'s up to rounding.
PyMC is imported only when these functions are called.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
import pickle
import warnings
from collections.abc import Iterable

import numpy as np

from . import Data, Function, WorkerError, close, data, distribute, fork, function, n_parallel

__all__ = ["sample", "logp_dlogp_function"]

log = logging.getLogger("synkhronos")

_CHECK_RTOL = 1e-7  # split sum vs whole data: far above rounding, far below a wrong split
# The default grain: slices of about 1 MiB of row data (a core's L2 cache here), once a
# process's rows pass 16 MiB (half this machine's shared 32 MiB L3). At 10^6 rows on 2
# cores (32-44 MiB a process) slicing made an evaluation 1.2-1.6x faster than one block;
# at 10^5 rows (3-4 MiB a process) the rows stay in cache anyway and each slice's call
# (30-90 us) made it up to 1.5x slower (benchmarks/pymc_sampling.py).
_GRAIN_BYTES = 1 << 20
_SLICE_FROM_BYTES = 16 << 20


def _session_size() -> int | None:
    """The session's number of processes, or None before ``synk.fork()``."""
    try:
        return n_parallel()
    except RuntimeError:
        return None


def _import_pymc():
    try:
        import pymc
    except ImportError as exc:
        raise ImportError(
            "synkhronos.pymc needs PyMC: pip install 'synkhronos[pymc]' (PyMC 5.28 on "
            "Python 3.11, PyMC 6 on Python >= 3.12)"
        ) from exc
    return pymc


# -- 1. the split ------------------------------------------------------------------------
@dataclasses.dataclass
class _Split:
    """What the model's log-likelihood divides into.

    ``observed``: observed variables summed on every process; ``master_observed``: the
    other observed variables (their log-probability stays in the master); ``roots``:
    the data variables divided by rows, with a label for messages; ``rows``: their
    common length.
    """

    observed: list
    master_observed: list
    roots: dict
    rows: int


def _data_value(var) -> np.ndarray | None:
    """The array a data variable holds (a shared variable's value or a constant)."""
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.tensor.variable import TensorConstant

    if isinstance(var, SharedVariable):
        value = var.get_value(borrow=True)
        return value if isinstance(value, np.ndarray) else None
    if isinstance(var, TensorConstant):
        return np.asarray(var.data)
    return None


def _rows_of(var) -> int | None:
    """The first-axis length of a data variable, or None (not an array of rows)."""
    value = _data_value(var)
    return value.shape[0] if value is not None and value.ndim >= 1 else None


def _data_roots(graphs: list, model) -> list:
    """The data variables that ``graphs`` read, not looking into free variables."""
    from pytensor.graph.traversal import graph_inputs

    blockers = list(model.free_RVs)
    return [var for var in graph_inputs(graphs, blockers=blockers)
            if var not in blockers and _rows_of(var) is not None]


def _observed_rows(model, rv) -> int | None:
    """The number of rows of an observed variable's data, or None if it has no rows."""
    value = model.rvs_to_values[rv]
    if value.ndim == 0:
        return None
    lengths = {_rows_of(root) for root in _data_roots([value], model)
               if root.ndim == value.ndim}
    return lengths.pop() if len(lengths) == 1 else None


def _label(var) -> str:
    return repr(var.name) if var.name else f"an unnamed {var.type} constant"


def _choose_split(model, split) -> _Split:
    """Step 1: the observed variables and data variables that are divided by rows."""
    from pytensor.compile.sharedvalue import SharedVariable

    observed = list(model.observed_RVs)
    if not observed:
        raise ValueError("the model has no observed variables: there is no likelihood to "
                         "divide by rows")
    lengths = {rv: _observed_rows(model, rv) for rv in observed}
    named: list = []
    if split is None:
        chosen = [rv for rv in observed if lengths[rv] is not None]
        if not chosen:
            raise ValueError("no observed variable of the model has rows of data to divide "
                             "(every observed value is a scalar)")
    else:
        names = [split] if isinstance(split, str) else split
        if not isinstance(names, Iterable) or not all(isinstance(n, str) for n in names):
            raise TypeError(f"split must be a name or a list of names of pm.Data containers "
                            f"and observed variables; got {split!r}")
        names = list(names)
        if not names:
            raise ValueError("split must name at least one pm.Data container or observed "
                             "variable")
        chosen = []
        for name in names:
            var = model.named_vars.get(name)
            if var is None:
                raise ValueError(f"split names {name!r}, which is not a variable of the model")
            if var in observed:
                chosen.append(var)
            elif isinstance(var, SharedVariable) and _rows_of(var) is not None:
                named.append(var)
            else:
                raise ValueError(f"split names {name!r}, which is neither a pm.Data container "
                                 "with rows nor an observed variable")
        for rv in observed:  # an observed variable that reads a divided container is divided
            if rv not in chosen and any(
                root in named for root in _data_roots([rv, model.rvs_to_values[rv]], model)
            ):
                chosen.append(rv)
        for var in named:
            if not any(var in _data_roots([rv, model.rvs_to_values[rv]], model)
                       for rv in chosen):
                raise ValueError(f"split names {var.name!r}, which no observed variable's "
                                 "likelihood reads")
        unsplittable = [rv.name for rv in chosen if lengths[rv] is None]
        if unsplittable:
            raise ValueError(f"split names observed variable {unsplittable[0]!r}, whose data "
                             "have no rows to divide")
    counts = {n for n in (lengths[rv] for rv in chosen) if n is not None}
    if len(counts) > 1:
        listed = ", ".join(f"{rv.name!r}: {lengths[rv]}" for rv in chosen)
        raise ValueError(f"the observed variables have different numbers of rows ({listed});"
                         " pass split=[...] naming the ones to divide")
    rows = counts.pop()
    roots: dict = {}
    for rv in chosen:
        value = model.rvs_to_values[rv]
        value_roots = _data_roots([value], model)
        for root in _data_roots([rv, value], model):
            if root in roots:
                continue
            length = _rows_of(root)
            required = root in named or root in value_roots
            if required and length != rows:
                raise ValueError(f"split divides {_label(root)} by rows, but it has {length} "
                                 f"rows and the observed data {rows}")
            # Named containers and observed values are always divided; the default also
            # divides every container of the observations' length; anonymous constants
            # of that length are divided either way (they cannot be named).
            if required or (length == rows and (
                split is None or not isinstance(root, SharedVariable)
            )):
                roots[root] = root.name or f"rows{len(roots)}"
    master_observed = [rv for rv in observed if rv not in chosen]
    return _Split(chosen, master_observed, roots, rows)


# -- 2. the likelihood on row inputs -----------------------------------------------------
def _row_likelihood(pm, model, plan: _Split):
    """Step 2: the divided observations' log-likelihood, as a graph of row inputs.

    Returns the graph and the row input of each divided data variable.
    """
    import pytensor.tensor as pt
    from pymc.distributions.shape_utils import change_dist_size
    from pytensor.graph.replace import clone_replace, graph_replace
    from pytensor.graph.traversal import ancestors

    rows = {var: pt.tensor(dtype=var.dtype, shape=(None, *var.type.shape[1:]),
                           name=f"{name}_rows")
            for var, name in plan.roots.items()}
    # Cloning stops at these stand-ins for the free variables; at the end they become
    # the model's value variables, through their transforms, as in model.logp().
    stand_ins = {rv: rv.type(name=rv.name) for rv in model.free_RVs}
    terms = []
    for rv in plan.observed:
        value = model.rvs_to_values[rv]
        # rebuild_strict=False makes every node again from its new inputs, so no static
        # shape of the whole data (a constant's length) survives into the row graphs.
        row_value = rows.get(value)
        if row_value is None:
            row_value = clone_replace(value, rows, rebuild_strict=False)
        row_rv = clone_replace(rv, {**stand_ins, **rows}, rebuild_strict=False)
        batch_ndim = row_value.ndim - rv.owner.op.ndim_supp
        try:
            row_rv = change_dist_size(row_rv, row_value.shape[:batch_ndim])
        except NotImplementedError as exc:
            raise ValueError(f"observed variable {rv.name!r} cannot be divided by rows ({exc});"
                             " pass split=[...] without it") from exc
        terms.append(pm.logp(row_rv, row_value).sum())
    loglik = terms[0] if len(terms) == 1 else pt.add(*terms)
    read = set(ancestors([loglik]))
    rvs = [rv for rv, stand_in in stand_ins.items() if stand_in in read]
    constrained = model.replace_rvs_by_values(rvs)
    loglik = graph_replace(loglik, {stand_ins[rv]: c for rv, c in zip(rvs, constrained,
                                                                       strict=True)})
    return loglik, rows


# -- 3. the synkhronos function ------------------------------------------------------------
def _pymc_mode(model):
    """PyTensor's default mode with the rewrite PyMC's compile adds for parameter checks.

    ``check_bounds`` models turn a failed parameter check into ``-inf`` (not an error
    raised in some process); others drop the checks, as ``pm.compile`` does.
    """
    from pytensor.compile.mode import Mode, get_mode

    base = get_mode(None)
    rewrite = ("local_check_parameter_to_ninf_switch" if model.check_bounds
               else "local_remove_check_parameter")
    return Mode(linker=base.linker, optimizer=base.provided_optimizer.including(rewrite))


def _check_grainsize(grainsize) -> int | None:
    if grainsize is None:
        return None
    if isinstance(grainsize, bool) or not isinstance(grainsize, (int, np.integer)):
        raise TypeError(f"grainsize must be a whole number of rows or None; got {grainsize!r}")
    if grainsize < 1:
        raise ValueError(f"grainsize must be at least 1 row; got {grainsize}")
    return int(grainsize)


def _num_slices(row_data: list[Data], rows: int, n: int, grainsize: int | None) -> int:
    """Slices per process: its rows (the most any process has) in blocks of
    ``grainsize`` rows; by default one block up to ``_SLICE_FROM_BYTES`` of row data a
    process, else blocks of about ``_GRAIN_BYTES``."""
    per_process = -(-rows // n)
    if grainsize is None:
        row_bytes = sum(d.data[:1].nbytes for d in row_data) or 1
        if per_process * row_bytes <= _SLICE_FROM_BYTES:
            return 1
        grainsize = max(1, _GRAIN_BYTES // row_bytes)
    return max(1, -(-per_process // grainsize))


# -- 4. the one-time check -----------------------------------------------------------------
def _check_rows(fn: Function, row_data: list[Data], values: list, model, plan: _Split,
                n: int, slices: int) -> None:
    """Step 4: the sum over processes must equal the same graph on the whole data.

    Compared at jittered points, where a term that mixes rows (a mean or a lag over the
    data inside the model) shows. The whole-data value is the master's own compiled
    function (``as_pytensor``): no extra compile.
    """
    if n == 1 and slices == 1:
        return
    rng = np.random.default_rng(0)
    start = model.initial_point()
    for _ in range(3):
        point = [start[v.name] + rng.uniform(-1, 1, size=np.shape(start[v.name]))
                 for v in values]
        point = [np.asarray(p, dtype=v.dtype) for p, v in zip(point, values, strict=True)]
        whole_loglik, whole_grad = fn.as_pytensor(*[d.data for d in row_data], *point)
        if not (np.isfinite(whole_loglik) and np.all(np.isfinite(whole_grad))):
            continue  # out of support there: another point
        try:
            loglik, grad = fn(*row_data, *point, num_slices=slices)
        except WorkerError as exc:
            raise ValueError(
                "the observed variables' log-likelihood fails on one process's rows: a data "
                "variable that it reads by rows is not divided; name every such pm.Data "
                f"container in split (divided now: {sorted(plan.roots.values())})"
            ) from exc
        scale = np.linalg.norm(whole_grad) + 1.0
        if (abs(loglik - whole_loglik) > _CHECK_RTOL * (abs(whole_loglik) + 1.0)
                or np.linalg.norm(grad - whole_grad) > _CHECK_RTOL * scale):
            raise ValueError(
                f"the log-likelihood is not a sum over the divided rows: on {n} processes "
                f"({slices} slices each) it is {float(loglik)!r}, on the whole data "
                f"{float(whole_loglik)!r}. A term "
                "mixes rows (e.g. a mean, a standardisation or a lag over data inside the "
                "model); compute it before pm.Data, or leave that data out of split"
            )
        return
    log.info("synkhronos.pymc: no finite point found to check the row split; not checked")


# -- 5. the Op PyMC's function calls ---------------------------------------------------------
def _row_sum_op(fn: Function, row_data: list[Data], sources: list, values: list,
                shapes: list[tuple[int, ...]], dtype: str, slices: int):
    """An Op: value variables -> (log-likelihood, flat gradient), summed over processes."""
    import pytensor.tensor as pt
    from pytensor.gradient import DisconnectedType, grad_not_implemented
    from pytensor.graph.basic import Apply
    from pytensor.graph.op import Op

    sizes = [int(np.prod(shape, dtype=int)) for shape in shapes]
    total = sum(sizes)

    class RowSum(Op):
        """The split observed log-likelihood and its gradient (one synk call)."""

        def make_node(self, *inputs):
            inputs = [pt.as_tensor_variable(x) for x in inputs]
            outputs = [pt.scalar(dtype=dtype), pt.vector(dtype=dtype, shape=(total,))]
            return Apply(self, inputs, outputs)

        def perform(self, node, inputs, output_storage):
            # (A process forked from the master, such as a PyMC chain process with
            # cores > 1, gets the session's RuntimeError from this call.)
            for var, value in sources:
                if var.get_value(borrow=True) is not value:
                    raise RuntimeError(
                        f"the model's data {var.name!r} changed (pm.set_data) after "
                        "synkhronos.pymc.logp_dlogp_function() copied it; build a new one"
                    )
            loglik, grad = fn(*row_data, *inputs, num_slices=slices)
            output_storage[0][0] = np.array(loglik, dtype=dtype)  # copies: PyMC keeps them
            output_storage[1][0] = np.array(grad, dtype=dtype)

        def pullback(self, inputs, outputs, cotangents):
            """The gradient: the reduced gradient, times the log-likelihood's cotangent."""
            g_loglik, g_flat = cotangents
            if not isinstance(g_flat.type, DisconnectedType) or isinstance(
                g_loglik.type, DisconnectedType
            ):
                return [grad_not_implemented(self, i, x, "second derivatives of a "
                                             "synkhronos likelihood are not available")
                        for i, x in enumerate(inputs)]
            flat = outputs[1]  # the same node as the value: one call computes both
            pieces, begin = [], 0
            for x, size in zip(inputs, sizes, strict=True):
                pieces.append(g_loglik * flat[begin:begin + size].reshape(x.shape))
                begin += size
            return pieces

        L_op = pullback  # PyTensor < 3.3 asks for the same thing under this name

        def infer_shape(self, *args):  # (fgraph, node, shapes) before PyTensor 3.3
            return [(), (total,)]

        def __deepcopy__(self, memo):
            return self  # holds handles to processes and shared memory, never copies

        def __reduce__(self):
            # PyMC catches this and samples its chains in the master instead of spawned
            # processes (which could not reach the session).
            raise pickle.PicklingError("a synkhronos likelihood cannot be pickled: it is "
                                       "evaluated by the session of this master process")

        num_slices = slices  # each process's blocks of rows (grainsize)

        def release(self) -> None:
            """Free the rows' shared memory now (otherwise when the Op is collected)."""
            for item in row_data:
                item.free_memory()

    return RowSum()


def _build(pm, model, split, grainsize):
    """Steps 1-5: PyMC's ValueGradFunction over log-prior + the split likelihood
    (``grainsize`` checked by the caller)."""
    import pytensor
    import pytensor.tensor as pt
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.graph.traversal import ancestors, graph_inputs

    size = _session_size()
    if size is None:
        raise RuntimeError("synk.fork() must be called before "
                           "synkhronos.pymc.logp_dlogp_function()")
    discrete = [v.name for v in model.value_vars if v not in model.continuous_value_vars]
    if discrete:
        raise ValueError(f"synkhronos.pymc samples models whose free variables are all "
                         f"continuous (NUTS alone); {discrete[0]!r} is discrete")
    plan = _choose_split(model, split)
    with model:
        loglik, rows = _row_likelihood(pm, model, plan)
        used = set(ancestors([loglik]))
        values = [v for v in model.value_vars if v in used]
        if not values:
            raise ValueError("the observed log-likelihood depends on no free variable")
        point = model.initial_point()
        shapes = [np.shape(point[v.name]) for v in values]
        grads = pytensor.grad(loglik, values)
        flat = pt.concatenate([g.ravel() for g in grads]) if len(grads) > 1 else grads[0].ravel()
        fn = function(inputs=list(rows.values()), bcast_inputs=values,
                      outputs=[(loglik, "sum"), (flat, "sum")], mode=_pymc_mode(model),
                      name="pymc_loglik")
        distribute()
        row_data = [data(_data_value(var), name=plan.roots[var]) for var in rows]
        slices = _num_slices(row_data, plan.rows, size, grainsize)
        _check_rows(fn, row_data, values, model, plan, size, slices)
        read = [*graph_inputs([loglik]), *rows]  # the data it reads whole, and by rows
        sources = [(var, var.get_value(borrow=True)) for var in read
                   if isinstance(var, SharedVariable) and _data_value(var) is not None]
        op = _row_sum_op(fn, row_data, sources, values, shapes, loglik.dtype, slices)
        rest = [*model.free_RVs, *model.potentials, *plan.master_observed]
        cost = model.logp(vars=rest, jacobian=True) + op(*values)[0]
        with warnings.catch_warnings():
            # PyTensor's Numba backend runs a Python Op in object mode, as intended here
            # (one call per evaluation); it says so in a warning at every compile.
            warnings.filterwarnings("ignore", message="Numba will use object mode to run "
                                    "RowSum", category=UserWarning)
            vgf = pm.model.ValueGradFunction([cost], model.continuous_value_vars, {},
                                             model=model, initial_point=point,
                                             ravel_inputs=True)
    log.info("synkhronos.pymc: %d rows of %s divided over %d processes, %d slices each",
             plan.rows, ", ".join(sorted(plan.roots.values())), size, slices)
    return vgf, op


def logp_dlogp_function(model=None, *, split=None, grainsize=None):
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
        per process for one block.

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
    Collective: every process takes part in each evaluation. The rows are copied into
    shared memory once; after ``pm.set_data`` build a new function.
    """
    grainsize = _check_grainsize(grainsize)
    pm = _import_pymc()
    model = pm.modelcontext(model)
    vgf, _ = _build(pm, model, split, grainsize)
    return vgf


# -- sampling --------------------------------------------------------------------------------
def sample(model=None, *, split=None, grainsize=None, **pm_sample_kwargs):
    """``pm.sample`` with the observed log-likelihood evaluated on every process.

    The rows of the observed data are divided among the session's processes and the
    log-likelihood and its gradient summed; the prior is evaluated in the master. PyMC
    initialises NUTS as usual (``pm.init_nuts``: jitter, mass-matrix adaptation) and
    runs the chains one after another in the master. With the same ``random_seed`` the
    draws equal ``pm.sample(nuts_sampler="pymc")``'s, up to floating-point rounding.

    Parameters
    ----------
    model : pymc.Model, optional
        The model (default: the one of the current ``with`` context). It is not changed.
    split : str or list of str, optional
        Names of the ``pm.Data`` containers and observed variables divided by rows; see
        :func:`logp_dlogp_function`.
    grainsize : int, optional
        Rows a process evaluates at a time; see :func:`logp_dlogp_function`.
    **pm_sample_kwargs
        Passed to ``pm.sample`` (``draws``, ``tune``, ``chains``, ``random_seed``,
        ``target_accept``, ``init``, ``initvals``, ``progressbar``, ...). ``cores`` only
        sets the default number of chains, as in PyMC: the chains run in the master,
        whose processes already use the cores. ``nuts_sampler="nutpie"`` samples with
        nutpie (if installed) over the same function. ``step`` is not accepted: build
        your own steps over :func:`logp_dlogp_function`.

    Returns
    -------
    arviz.InferenceData or MultiTrace
        What ``pm.sample`` returns.

    Raises
    ------
    TypeError
        ``step`` was passed, or ``split`` is not a name or list of names.
    ValueError
        See :func:`logp_dlogp_function`; or ``nuts_sampler`` is not "pymc" or "nutpie".

    Notes
    -----
    Without a session it forks one (``synk.fork()``, a process per core) and closes it
    when sampling ends; with a session, it uses that one.
    """
    pm = _import_pymc()
    model = pm.modelcontext(model)
    kwargs = dict(pm_sample_kwargs)
    if "step" in kwargs:
        raise TypeError("synkhronos.pymc.sample() builds its own NUTS step; for other steps "
                        "pass synkhronos.pymc.logp_dlogp_function() to them and call pm.sample")
    sampler = kwargs.pop("nuts_sampler", None) or "pymc"
    if sampler not in ("pymc", "nutpie"):
        raise ValueError(f"nuts_sampler must be 'pymc' or 'nutpie' with synkhronos.pymc; "
                         f"got {sampler!r}")
    cores = kwargs.pop("cores", None)
    grainsize = _check_grainsize(grainsize)  # before a session is forked for nothing
    own_session = _session_size() is None
    if own_session:
        fork()
    try:
        vgf, op = _build(pm, model, split, grainsize)
        try:
            if sampler == "nutpie":
                return _sample_nutpie(pm, model, vgf, cores, kwargs)
            return _sample_nuts(pm, model, vgf, cores, kwargs)
        finally:
            op.release()
    finally:
        if own_session:
            close()


def _chains_and_seeds(random_seed, chains: int | None, cores: int | None):
    """The number of chains and the per-chain seeds that ``pm.sample`` would use.

    PyMC internals, reproduced (``pm.sample`` does this inline): its default chain count
    follows its ``cores`` default, and ``init_nuts`` jitters each chain with a seed drawn
    this way from ``random_seed``. Drawing the same seeds makes the starting points, and
    so the draws, equal to ``pm.sample``'s.
    """
    if chains is None:
        from pymc.sampling.parallel import _cpu_count

        chains = max(2, cores if cores is not None else min(4, _cpu_count()))
    seed = copy.deepcopy(random_seed) if isinstance(
        random_seed, np.random.Generator | np.random.BitGenerator) else random_seed
    return chains, [int(rng.integers(2**30)) for rng in np.random.default_rng(seed).spawn(chains)]


def _sample_nuts(pm, model, vgf, cores, kwargs):
    """PyMC's init_nuts and pm.sample, with a NUTS step over ``vgf``, chains in the master."""
    params = inspect.signature(pm.sample).parameters
    # pm.sample hands its unnamed keywords (and the "nuts" dict) to the NUTS step.
    step_kwargs = {name: kwargs.pop(name) for name in list(kwargs) if name not in params}
    for name, value in (step_kwargs.pop("nuts", None) or {}).items():
        step_kwargs.setdefault(name, value)
    if cores is not None and cores > 1:
        warnings.warn(f"cores={cores}: the chains run one after another in the master, whose "
                      "processes already use the cores for the likelihood", stacklevel=3)

    def default(name):
        return kwargs.pop(name, params[name].default)

    random_seed = kwargs.pop("random_seed", None)
    if random_seed is None:  # one seed for init_nuts and pm.sample alike
        random_seed = int(np.random.default_rng().integers(2**30))
    chains, seeds = _chains_and_seeds(random_seed, kwargs.pop("chains", None), cores)
    quiet = kwargs.get("quiet", False)
    initial_points, initialised = pm.init_nuts(
        init=default("init"), chains=chains, n_init=default("n_init"), model=model,
        random_seed=seeds, progressbar=bool(kwargs.get("progressbar", True)) and not quiet,
        quiet=quiet, jitter_max_retries=default("jitter_max_retries"),
        tune=kwargs.get("tune", params["tune"].default), initvals=kwargs.pop("initvals", None),
        compile_kwargs=kwargs.get("compile_kwargs"), **step_kwargs,
    )
    # The same step init_nuts made (its adapted potential, seed and options), over vgf.
    step = pm.NUTS(potential=initialised.potential, model=model, rng=seeds[0],
                   initial_point=initial_points[0], logp_dlogp_func=vgf, **step_kwargs)
    return pm.sample(model=model, step=step, initvals=initial_points, chains=chains, cores=1,
                     random_seed=random_seed, **kwargs)


def _sample_nutpie(pm, model, vgf, cores, kwargs):
    """nutpie's sampler over ``vgf``, through its public ``from_pyfunc`` hook.

    nutpie calls the log-density from its own (Rust) threads; the session serializes
    the calls. Its chains run one at a time (``cores=1``): the processes already use
    the cores.
    """
    try:
        import nutpie
        from nutpie.compiled_pyfunc import from_pyfunc
    except ImportError as exc:
        raise ImportError("nuts_sampler='nutpie' needs nutpie: pip install nutpie") from exc
    from pymc.initial_point import make_initial_point_fn

    options = dict(kwargs.pop("nuts", None) or {})
    for name in ("target_accept", "max_treedepth"):
        if name in kwargs:
            options[name] = kwargs.pop(name)
    if "max_treedepth" in options:
        options["maxdepth"] = options.pop("max_treedepth")
    draws = kwargs.pop("draws", 1000)
    tune = kwargs.pop("tune", 1000)
    chains = kwargs.pop("chains", None)
    random_seed = kwargs.pop("random_seed", None)
    progress = bool(kwargs.pop("progressbar", True)) and not kwargs.pop("quiet", False)
    save_warmup = not kwargs.pop("discard_tuned_samples", True)
    initvals = kwargs.pop("initvals", None)
    if kwargs:
        raise TypeError(f"unexpected keyword arguments for nuts_sampler='nutpie': "
                        f"{', '.join(sorted(kwargs))}")
    if chains is None:
        chains, _ = _chains_and_seeds(0, None, cores)
    seed = int(np.random.default_rng(random_seed).integers(2**30))

    values = model.continuous_value_vars
    point = model.initial_point()
    shapes = [np.shape(point[v.name]) for v in values]
    sizes = [int(np.prod(shape, dtype=int)) for shape in shapes]
    n_dim = sum(sizes)
    traced = [*model.free_RVs, *model.deterministics]
    expand_fn = model.compile_fn(model.replace_rvs_by_values(traced), inputs=values,
                                 on_unused_input="ignore", point_fn=False)
    vgf.set_extra_values({})

    def unravel(x):
        pieces, begin = [], 0
        for v, shape, size in zip(values, shapes, sizes, strict=True):
            pieces.append(np.asarray(x[begin:begin + size], dtype=v.dtype).reshape(shape))
            begin += size
        return pieces

    expanded = [np.asarray(out) for out in expand_fn(*unravel(np.zeros(n_dim)))]

    def make_logp_fn():
        def logp(x, **_):
            value, grad = vgf(x)
            return float(value), np.array(grad, dtype="float64", order="C")  # a copy
        return logp

    def make_expand_fn(seed1, seed2, chain):
        def expand(x, **_):
            outs = expand_fn(*unravel(x))
            return {var.name: np.asarray(out, dtype="float64", order="C")
                    for var, out in zip(traced, outs, strict=True)}
        return expand

    start = make_initial_point_fn(model=model, overrides=initvals,
                                  jitter_rvs=set(model.free_RVs), return_transformed=True)

    def initial_point(seed):
        values_at = start(seed)
        return np.concatenate([np.ravel(values_at[v.name]) for v in values]).astype("float64")

    compiled = from_pyfunc(
        n_dim, make_logp_fn, make_expand_fn, [np.dtype("float64")] * len(traced),
        [out.shape for out in expanded], [var.name for var in traced],
        make_initial_point_fn=initial_point,
    )
    return nutpie.sample(compiled, draws=draws, tune=tune, chains=chains, cores=1, seed=seed,
                         save_warmup=save_warmup, progress_bar=progress, **options)
