"""Every use of PyMC beyond the functions the rest of :mod:`synkhronos.pymc` calls.

PyMC moves these between releases (5.28 on PyTensor 2.38, 6.x on PyTensor 3): where
``change_dist_size`` lives, how a random variable is made again from new inputs, the
rewrites its compile adds for parameter checks, the imputation it builds for masked
observations, how ``compute_log_likelihood`` lays out its dataset, ArviZ 0's
InferenceData against ArviZ 1's DataTree; and of PyTensor, what the likelihood's Op
needs: a shared variable's value cell and the Numba backend's dispatch of a Python Op.

One private PyMC name is read, here only: ``pymc.sampling.parallel._cpu_count``, the
count ``pm.sample`` takes its default ``cores`` from, because ``sample`` must know how
many chain processes PyMC will fork to give each its share of the cores
(``default_cores``). Nothing of PyMC's is replaced. (``sample`` also relies on one
behaviour of ``pm.sample``'s parallel sampler: with ``mp_ctx="fork"`` its chain
processes inherit the compiled model instead of unpickling it.) PyMC is imported only
when one of these functions runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = [
    "import_pymc",
    "change_dist_size",
    "default_cores",
    "default_chains",
    "chain_failure",
    "parameter_check_rewrite",
    "pymc_mode",
    "value_cell",
    "numba_object_call",
    "sample_parameters",
    "minibatch_variables",
    "rebuild_symbolic_rv",
    "untransformed",
    "log_likelihood_defaults",
    "log_likelihood_dataset",
    "set_group",
    "rebuild_rv",
    "inline_inner_graph",
    "is_symbolic_rv",
    "bind_arguments",
    "call_bound",
    "nutpie_options",
    "check_sampler",
    "compile_kwargs",
    "complete_idata",
]


def import_pymc() -> Any:
    """The ``pymc`` module, or an ImportError saying how to install it."""
    try:
        import pymc
    except ImportError as exc:
        raise ImportError(
            "synkhronos.pymc needs PyMC: pip install 'synkhronos[pymc]' (PyMC 5.28 on "
            "Python 3.11, PyMC 6 on Python >= 3.12)"
        ) from exc
    return pymc


def change_dist_size(rv: Any, size: Any) -> Any:
    """``rv`` rebuilt with batch shape ``size`` (PyMC's ``change_dist_size``)."""
    from pymc.distributions.shape_utils import change_dist_size as change

    return change(rv, size)




def default_cores() -> int:
    """The chains ``pm.sample`` runs at once when ``cores`` is not given (PyMC counts
    half the logical CPUs, taking the rest for hyperthreads)."""
    from pymc.sampling.parallel import _cpu_count

    return max(1, min(4, _cpu_count()))


def default_chains(cores: int | None) -> int:
    """The number of chains ``pm.sample`` runs when ``chains`` is not given."""
    return max(2, cores if cores is not None else default_cores())


def chain_failure(exc: BaseException) -> BaseException | None:
    """What failed in a chain process, where ``exc`` is the error ``pm.sample`` raised
    for it in the master (PyMC's ``ParallelSamplingError``, from the chain's own
    exception); None for any other error."""
    from pymc.sampling.parallel import ParallelSamplingError

    return exc.__cause__ if isinstance(exc, ParallelSamplingError) else None



def parameter_check_rewrite(model: Any) -> str:
    """The rewrite PyMC's compile adds for parameter checks: ``check_bounds`` models
    turn a failed check into ``-inf``, others drop the checks."""
    return ("local_check_parameter_to_ninf_switch" if model.check_bounds
            else "local_remove_check_parameter")


def pymc_mode(model: Any, mode: Any = None) -> Any:
    """PyTensor's default mode with PyMC's parameter-check rewrite included, and without
    PyTensor's BLAS rewrites (``BlasOpt``) where PyTensor has no BLAS library to link
    (``blas__ldflags`` empty, as after ``pip install``): their ``Gemv`` then runs as a
    Python ``perform`` through scipy, where the plain ``dot`` they replace is numpy's
    own call. The row likelihood of the hierarchical model at 10^4 rows, two processes,
    went from 1.29x to 1.48x PyMC's evaluation with them left out (paired rounds).
    ``mode``: the mode to start from instead of the default (a name or a ``Mode``, as
    ``compile_kwargs["mode"]`` gives it)."""
    import pytensor
    from pytensor.compile.mode import Mode, get_mode

    base = get_mode(mode)
    optimizer = base.provided_optimizer.including(parameter_check_rewrite(model))
    if not getattr(pytensor.config, "blas__ldflags", ""):
        optimizer = optimizer.excluding("BlasOpt")
    return Mode(linker=base.linker, optimizer=optimizer)


def value_cell(var: Any) -> list:
    """The one-element list in which PyTensor keeps a shared variable's value
    (``get_value(borrow=True)`` is its item; ``set_value``, as ``pm.set_data`` calls it,
    replaces the item): read in one index, where ``get_value`` costs a few calls."""
    return var.container.storage


_numba_registered: set[type] = set()


def numba_object_call(op_type: type, evaluate: Callable[[Any, Any], tuple]) -> None:
    """Where PyTensor compiles with Numba (PyTensor 3's default mode), run the nodes of
    ``op_type`` (one input; outputs as its node's) as ``evaluate(op, input)``, which
    returns the outputs' tuple, called from the compiled graph in Numba's object mode.

    PyTensor's own fallback for an Op without a Numba implementation does the same
    through ``perform``, with an output storage of lists made and read back at every
    call: 1.9 against 1.2 us a call here. Registered through PyTensor's documented
    extension point (``numba_funcify``), once a type, where something compiles with
    Numba (the caller says).
    """
    if op_type in _numba_registered:
        return
    import numba
    from pytensor.link.numba.dispatch import numba_funcify
    from pytensor.link.numba.dispatch.basic import get_numba_type

    @numba_funcify.register(op_type)
    def _object_call(op: Any, node: Any, **kwargs: Any) -> Any:
        returns = numba.types.Tuple([get_numba_type(out.type) for out in node.outputs])

        def call(value: Any) -> tuple:
            return evaluate(op, value)

        @numba.njit
        def run(value: Any) -> Any:
            with numba.objmode(outputs=returns):
                outputs = call(value)
            return outputs

        return run

    _numba_registered.add(op_type)


def sample_parameters() -> dict[str, inspect.Parameter]:
    """``pm.sample``'s parameters by name."""
    return dict(inspect.signature(import_pymc().sample).parameters)


def minibatch_variables(model: Any) -> list[str]:
    """The observed variables of ``model`` that read ``pm.Minibatch`` data (a
    ``MinibatchRandomVariable`` or a ``MinibatchOp`` slice; PyMC 5 and 6 alike)."""
    from pymc.data import MinibatchOp
    from pymc.variational.minibatch_rv import MinibatchRandomVariable
    from pytensor.graph.traversal import ancestors

    found = []
    for rv in model.observed_RVs:
        graphs = [rv, model.rvs_to_values[rv]]
        if any(var.owner is not None
               and isinstance(var.owner.op, MinibatchOp | MinibatchRandomVariable)
               for var in ancestors(graphs, blockers=list(model.free_RVs))):
            found.append(rv.name)
    return found










def rebuild_symbolic_rv(rv: Any, inputs: list, size: Any) -> Any | None:
    """``rv`` (a PyMC ``SymbolicRandomVariable``) made again from new ``inputs`` (its
    node's inputs, replaced) with batch shape ``size``, through the distribution's own
    ``rv_op``; None for an Op that cannot be rebuilt so.

    Cloning such a node on row inputs keeps its inner graph's static shapes of the whole
    data (``SpecifyShape(rows, 101)``); rebuilding makes the inner graph from the rows.
    """
    from pymc.distributions.distribution import SymbolicRandomVariable

    op = rv.owner.op
    if not isinstance(op, SymbolicRandomVariable) or not hasattr(op, "rv_op"):
        return None
    if op.extended_signature is None or op.size_param(rv.owner) is None:
        return None
    positions = [rv.owner.inputs.index(param) for param in op.dist_params(rv.owner)]
    return op.rebuild_rv(*[inputs[i] for i in positions], size=size)


def untransformed(model: Any) -> Any:
    """A copy of ``model`` without value transforms (its values are the draws an
    InferenceData keeps), as ``pm.compute_log_likelihood`` makes it."""
    from pymc.model.transform.conditioning import remove_value_transforms

    return remove_value_transforms(model)


def log_likelihood_defaults() -> dict[str, Any]:
    """``pm.compute_log_likelihood``'s defaults by name."""
    return {name: p.default for name, p in
            inspect.signature(import_pymc().compute_log_likelihood).parameters.items()}


def log_likelihood_dataset(fn: Any, idata: Any, model: Any, var_names: list[str],
                           progressbar: bool, sample_dims: tuple = ("chain", "draw")) -> Any:
    """``fn`` (a posterior point -> one array each of ``var_names``) applied to every
    draw of ``idata``'s posterior, as the dataset ``pm.compute_log_likelihood`` makes
    (its dims, coords and sample dims). ``fn`` needs an attribute ``f`` that PyMC sets
    ``trust_input`` on."""
    from pymc.backends.arviz import (
        apply_function_over_dataset,
        coords_and_dims_for_inferencedata,
    )

    coords, dims = coords_and_dims_for_inferencedata(untransformed(model))
    posterior = idata["posterior"]
    dataset = posterior.to_dataset() if hasattr(posterior, "to_dataset") else posterior
    dataset = dataset[[rv.name for rv in model.free_RVs]]
    return apply_function_over_dataset(fn, dataset, output_var_names=var_names,
                                       sample_dims=sample_dims, dims=dims,
                                       coords=coords, progressbar=progressbar)




def rebuild_rv(rv: Any, inputs: list, size: Any) -> Any | None:
    """``rv`` made again from new ``inputs`` (its node's inputs, replaced) with batch
    shape ``size``; None for an Op rebuilt only by ``change_dist_size``.

    Cloning the node itself would keep what its ``make_node`` derived from the whole
    data's size: PyTensor 3 fixes a random variable's parameters to a constant size
    (``SpecifyShape(p, 101, 3)``), and an inner graph keeps its inputs' lengths.
    """
    from pytensor.tensor.random.op import RandomVariable

    op = rv.owner.op
    if isinstance(op, RandomVariable) and type(op).make_node is RandomVariable.make_node:
        node = rv.owner
        rng = inputs[node.inputs.index(op.rng_param(node))]
        params = [inputs[node.inputs.index(p)] for p in op.dist_params(node)]
        return op.make_node(rng, size, *params).outputs[node.outputs.index(rv)]
    return rebuild_symbolic_rv(rv, inputs, size)


def inline_inner_graph(node: Any) -> list:
    """The outputs of an ``OpFromGraph`` node written out as its inner graph over the
    node's inputs. (PyTensor's, not PyMC's: PyTensor 3 keeps inner graphs frozen and
    binds them with ``inline_ofg_node``; 2.x's can be cloned. Here because the layering
    keeps :mod:`synkhronos.pymc` off the package's private ``_pytensor``.)"""
    try:
        from pytensor.compile.rewriting import inline_ofg_node
    except ImportError:  # PyTensor 2.x
        from pytensor.graph.replace import clone_replace

        op = node.op
        return list(clone_replace(op.inner_outputs,
                                  dict(zip(op.inner_inputs, node.inputs, strict=True))))
    return list(inline_ofg_node(node))


def is_symbolic_rv(op: Any) -> bool:
    """Whether ``op`` is a PyMC random variable built as an inner graph."""
    from pymc.distributions.distribution import SymbolicRandomVariable

    return isinstance(op, SymbolicRandomVariable)



def bind_arguments(pymc_function: Callable, called: str, args: tuple, kwargs: dict) -> dict:
    """``args`` and ``kwargs`` bound to ``pymc_function``'s parameters as Python binds
    them for a call of it: ``{name: value}`` of those given, the entries of its
    ``**kwargs`` by their own names, its ``*args`` (a tuple) by that parameter's name.
    Where the installed PyMC would refuse the call (a name it does not take, a value
    given twice, too many positional arguments) a TypeError that names ``called``."""
    signature = inspect.signature(pymc_function)
    try:
        bound = signature.bind_partial(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{called}() {exc}") from None
    given: dict = {}
    for name, value in bound.arguments.items():
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            given.update(value)
        else:
            given[name] = value
    return given







def check_sampler(sampler: str) -> None:
    """An ImportError saying how to install ``nuts_sampler`` "nutpie", "numpyro" or
    "blackjax" where it (or JAX) is missing (``pm.sample`` finds out only once sampling
    starts). Looked up, not imported: importing blackjax starts JAX's runtime, after
    which forking a session is refused."""
    import importlib.util

    needed = {"nutpie": ("nutpie",), "numpyro": ("jax", "numpyro"),
              "blackjax": ("jax", "blackjax")}.get(sampler, ())
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"nuts_sampler={sampler!r} needs {' and '.join(missing)}: "
                          f"pip install {' '.join(missing)}")


def compile_kwargs(backend: Any, given: dict | None) -> dict:
    """``given`` (``compile_kwargs``, as PyMC's functions take them) with ``backend``
    made its ``mode``, as PyMC 6 resolves its ``backend`` keyword ("c" the C backend,
    "numba", "jax", or any mode name); a new dict."""
    from pytensor.compile.mode import get_mode

    resolved = dict(given or {})
    if backend is None:
        return resolved
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a backend's name (\"c\", \"numba\", \"jax\"); "
                        f"got {backend!r}")
    if "mode" in resolved:
        raise ValueError("Can only define one of `backend` or `compile_kwargs['mode']`")
    name = {"c": "CVM"}.get(backend.lower(), backend.upper())
    try:
        resolved["mode"] = get_mode(name)
    except (ValueError, KeyError) as exc:
        raise ValueError(f"backend={backend!r} is not a PyTensor backend (\"c\", \"numba\", "
                         "\"jax\")") from exc
    return resolved


def complete_idata(result: Any, model: Any, log_likelihood: Any,
                   idata_kwargs: dict | None = None) -> Any:
    """``pm.sample``'s result on the rewritten model with what the rewrite took from it:
    the ``observed_data`` group as the user's ``model`` makes it (``idata_kwargs``'
    coords and dims too), ``constant_data`` without the divided observed values
    (containers of the rewritten model's, its observed values in the user's), and,
    with ``log_likelihood`` (True, or the names of the variables), the pointwise
    log-likelihood of its observed variables (PyMC's ``compute_log_likelihood``). A
    ``MultiTrace`` comes back as it is."""
    pm = import_pymc()
    if type(result).__name__ not in ("InferenceData", "DataTree"):
        return result
    from pymc.backends import arviz as pm_arviz

    observed = pm_arviz.find_observations(model)
    if observed:
        coords, dims = pm_arviz.coords_and_dims_for_inferencedata(model)
        coords.update((idata_kwargs or {}).get("coords") or {})
        dims.update((idata_kwargs or {}).get("dims") or {})
        if _is_datatree(result):  # ArviZ 1 (PyMC 6)
            dataset = pm_arviz.dict_to_dataset(observed, inference_library=pm, coords=coords,
                                               dims=dims, sample_dims=[])
        else:
            from arviz import dict_to_dataset

            dataset = dict_to_dataset(observed, library=pm, coords=coords, dims=dims,
                                      default_dims=[])
        set_group(result, "observed_data", dataset)
    constants = _group(result, "constant_data")
    if constants is not None:
        kept = pm_arviz.find_constants(model)
        extra = [name for name in constants.data_vars if name not in kept]
        if extra:
            constants = constants.drop_vars(extra)
            used = {dim for var in constants.data_vars.values() for dim in var.dims}
            constants = constants.drop_vars([name for name in constants.coords
                                             if name not in used])
            set_group(result, "constant_data", constants)
    if log_likelihood:
        pm.compute_log_likelihood(
            result, var_names=None if log_likelihood is True else list(log_likelihood),
            model=model, extend_inferencedata=True, progressbar=False)
    return result


def _is_datatree(value: Any) -> bool:
    return type(value).__name__ == "DataTree"


def _group(idata: Any, name: str) -> Any:
    """``idata``'s group ``name`` as a Dataset, or None."""
    if _is_datatree(idata):
        return idata[name].to_dataset() if name in idata.children else None
    return getattr(idata, name) if name in idata.groups() else None


def set_group(idata: Any, name: str, dataset: Any) -> Any:
    """``idata`` with its group ``name`` replaced by ``dataset`` (None: removed), for
    ArviZ 0.x's InferenceData and ArviZ 1's DataTree alike."""
    if _is_datatree(idata):
        if name in idata.children:
            del idata[name]
        if dataset is not None:
            from xarray import DataTree

            idata[name] = DataTree(dataset)
        return idata
    if name in idata.groups():
        delattr(idata, name)
    if dataset is not None:
        idata.add_groups({name: dataset})
    return idata


def call_bound(function: Callable, given: dict) -> Any:
    """``function`` called with ``given`` (``bind_arguments``' dict, by parameter name):
    where its ``*args`` holds values, every parameter before it by position."""
    parameters = inspect.signature(function).parameters
    star = next((name for name, p in parameters.items()
                 if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    given = dict(given)
    extra = tuple(given.pop(star, ()) or ()) if star is not None else ()
    args: list = []
    if extra:
        for name, parameter in parameters.items():
            if name == star:
                break
            args.append(given.pop(name, parameter.default))
        args.extend(extra)
    return function(*args, **given)


def nutpie_options(kwargs: dict) -> None:
    """``pm.sample``'s NUTS options given as keywords (``target_accept``,
    ``max_treedepth``) moved in ``kwargs`` to where ``pm.sample``'s nutpie route reads
    them: its ``nuts`` dict, with PyMC 6 ``nuts_sampler_kwargs`` too (deprecated there,
    and refused beside ``nuts``); PyMC 5 reads ``target_accept`` alone there, its
    ``max_treedepth`` goes to nutpie itself as ``maxdepth``."""
    nuts = dict(kwargs.pop("nuts", None) or {})
    for name in ("target_accept", "max_treedepth"):
        if name in kwargs:
            nuts[name] = kwargs.pop(name)
    if "backend" in sample_parameters():  # PyMC 6: nutpie's options all in nuts
        nuts.update(kwargs.pop("nuts_sampler_kwargs", None) or {})
        if "store_unconstrained" in nuts:  # (PyMC 6 passes it, as include_transformed)
            kwargs["idata_kwargs"] = dict(kwargs.get("idata_kwargs") or {},
                                          include_transformed=nuts.pop("store_unconstrained"))
    elif "max_treedepth" in nuts:  # PyMC 5: to nutpie itself
        options = dict(kwargs.get("nuts_sampler_kwargs") or {})
        options.setdefault("maxdepth", nuts.pop("max_treedepth"))
        kwargs["nuts_sampler_kwargs"] = options
    if nuts:
        kwargs["nuts"] = nuts
