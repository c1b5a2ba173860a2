"""Every access to PyMC (and nutpie) beyond their public, documented API.

PyMC moves its internals between releases (5.28 on PyTensor 2.38, 6.x on PyTensor 3):
where ``change_dist_size`` lives, the ``ValueGradFunction`` constructor, the default
cores and chain count of ``pm.sample``, the error its parallel sampler raises for a
chain, the initial-point function it jitters with, the rewrites its compile adds for
parameter checks, the imputation it builds for masked observations, nutpie's
``from_pyfunc`` hook, and the function ``pm.sample``'s numpyro and blackjax route
compiles the log-density with; and of PyTensor, what the likelihood's Op needs: a shared
variable's value cell and the Numba backend's dispatch of a Python Op. The rest of
:mod:`synkhronos.pymc` asks this module, so a new PyMC release is one file's work.
PyMC is imported only when one of these functions runs. (``sample`` also relies on
one behaviour of ``pm.sample``'s parallel sampler: with ``mp_ctx="fork"`` its chain
processes inherit the step instead of unpickling it.)
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = [
    "import_pymc",
    "change_dist_size",
    "value_grad_function",
    "step_function",
    "default_cores",
    "default_chains",
    "chain_failure",
    "initial_point_fn",
    "parameter_check_rewrite",
    "pymc_mode",
    "value_cell",
    "numba_object_call",
    "sample_parameters",
    "minibatch_variables",
    "nutpie_from_pyfunc",
    "nutpie_seed",
    "check_jax_sampler",
    "jaxified_logp_replaced",
    "patch_nutpie_idata",
    "pymc_default_sampler_is_auto",
    "default_nuts_sampler",
    "nutpie_sample_parameters",
    "bind_arguments",
    "resolved_compile_kwargs",
    "map_start_fn",
    "map_parameters",
    "log_likelihood_defaults",
    "map_method",
    "map_minimize",
    "map_value_vars",
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


def value_grad_function(cost: Any, model: Any, point: dict,
                        compile_kwargs: dict | None = None) -> Any:
    """PyMC's ``ValueGradFunction`` of ``cost`` over the model's continuous values,
    called with a raveled point (what ``pm.NUTS(logp_dlogp_func=...)`` takes), compiled
    with ``compile_kwargs`` (``pytensor.function``'s, as PyMC passes them)."""
    pm = import_pymc()
    return pm.model.ValueGradFunction([cost], model.continuous_value_vars, {}, model=model,
                                      initial_point=point, ravel_inputs=True,
                                      **(compile_kwargs or {}))


def step_function(step: Any) -> Any:
    """The ``ValueGradFunction`` a NUTS step evaluates (PyMC's own, where the step
    compiled it)."""
    return step._logp_dlogp_func


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


def initial_point_fn(model: Any, initvals: Any) -> Any:
    """A function of a seed giving a jittered starting point in the transformed space,
    as ``pm.init_nuts`` makes them."""
    from pymc.initial_point import make_initial_point_fn

    return make_initial_point_fn(model=model, overrides=initvals,
                                 jitter_rvs=set(model.free_RVs), return_transformed=True)


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
    extension point (``numba_funcify``), once a type; elsewhere nothing to do.
    """
    from pytensor.compile.mode import get_default_mode

    if op_type in _numba_registered or type(get_default_mode().linker).__name__ != "NumbaLinker":
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


def nutpie_from_pyfunc() -> tuple[Any, Any]:
    """``(nutpie, nutpie.compiled_pyfunc.from_pyfunc)``, or an ImportError."""
    try:
        import nutpie
        from nutpie.compiled_pyfunc import from_pyfunc
    except ImportError as exc:
        raise ImportError("nuts_sampler='nutpie' needs nutpie: pip install nutpie") from exc
    return nutpie, from_pyfunc


def check_jax_sampler(sampler: str) -> None:
    """An ImportError saying how to install ``nuts_sampler`` "numpyro" or "blackjax"
    where it or JAX is missing (``pm.sample`` finds out only once sampling starts).
    Looked up, not imported: importing blackjax starts JAX's runtime, after which
    forking a session is refused."""
    import importlib.util

    missing = [name for name in ("jax", sampler) if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"nuts_sampler={sampler!r} needs {' and '.join(missing)}: "
                          f"pip install {' '.join(missing)}")


# One replacement of PyMC's JAX log-density at a time (jaxified_logp_replaced).
_JAXIFIED_LOGP_LOCK = threading.Lock()


@contextlib.contextmanager
def jaxified_logp_replaced(replacement: Callable[..., Any]) -> Iterator[None]:
    """While inside: ``pm.sample``'s numpyro and blackjax route takes its log-density
    from ``replacement(model, negative_logp)`` instead of compiling the model's with
    JAX. PyMC has no keyword for it: its ``sample_jax_nuts`` calls the module's
    ``get_jaxified_logp`` (the flag as PyMC names it: False gives minus the
    log-density, numpyro's potential energy). One at a time: the replacement is the
    module's for everyone while it stands."""
    from pymc.sampling import jax as pymc_jax

    with _JAXIFIED_LOGP_LOCK:
        original = pymc_jax.get_jaxified_logp
        pymc_jax.get_jaxified_logp = replacement
        try:
            yield
        finally:
            pymc_jax.get_jaxified_logp = original


def nutpie_seed(random_seed: Any, chains: int) -> int:
    """The seed ``pm.sample``'s nutpie route hands ``nutpie.sample`` for ``random_seed``:
    PyMC 6 spawns one generator a chain and takes the first one's draw below 2**30;
    PyMC 5 draws one seed for the whole run (``_get_seeds_per_chain``)."""
    from pymc.util import _get_seeds_per_chain, get_random_generator

    if pymc_default_sampler_is_auto():
        return int(get_random_generator(random_seed).spawn(chains)[0].integers(2**30))
    return int(_get_seeds_per_chain(random_seed, 1)[0])


def pymc_default_sampler_is_auto() -> bool:
    """Whether ``pm.sample``'s ``nuts_sampler`` defaults to None, PyMC 6's choice of
    nutpie where it is installed (PyMC 5: ``"pymc"``)."""
    return sample_parameters()["nuts_sampler"].default is None


def default_nuts_sampler(kwargs: dict, compile_kwargs: dict, nutpie_keywords: set[str]
                         ) -> str:
    """The sampler ``pm.sample(nuts_sampler=None, **kwargs)`` picks for a model whose
    free variables are all continuous: PyMC 6 takes nutpie where it is installed (at
    the version PyMC asks for), ``init`` is "auto", InferenceData is returned, there
    is no ``trace`` or ``callback``, ``initvals`` is one dict or none, and the mode
    compiles with Numba or JAX; PyMC 5 always its own NUTS. Here also only where
    every keyword has an equivalent on the nutpie route (``nutpie_keywords``)."""
    if not pymc_default_sampler_is_auto():
        return "pymc"
    from pymc.sampling import mcmc
    from pytensor.compile.mode import get_mode
    from pytensor.link.jax.linker import JAXLinker
    from pytensor.link.numba.linker import NumbaLinker

    meets = getattr(mcmc, "_nutpie_meets_min_version", None)
    if not getattr(mcmc, "NUTPIE_INSTALLED", False) or meets is None or not meets():
        return "pymc"
    initvals = kwargs.get("initvals")
    usable = (kwargs.get("init", "auto") == "auto"
              and kwargs.get("return_inferencedata", True)
              and kwargs.get("trace") is None and kwargs.get("callback") is None
              and (initvals is None or isinstance(initvals, dict))
              and isinstance(get_mode(compile_kwargs.get("mode")).linker,
                             NumbaLinker | JAXLinker)
              and set(kwargs) <= nutpie_keywords)
    return "nutpie" if usable else "pymc"


def patch_nutpie_idata(idata: Any, model: Any, sampling_time: float, tune: int) -> None:
    """Complete ``nutpie.sample``'s InferenceData in place as ``pm.sample``'s nutpie
    route does: the model's ``constant_data`` and ``observed_data`` groups, and the
    posterior's ``sampling_time`` and ``tuning_steps`` (PyMC 6: its own function; PyMC
    5: the same steps, written inline there)."""
    from pymc.backends import arviz as pm_arviz

    patch = getattr(pm_arviz, "patch_nutpie_idata", None)
    if patch is not None:
        patch(idata, model, sampling_time=sampling_time)
        return
    import nutpie
    import pymc
    from arviz import dict_to_dataset
    from arviz.data.base import make_attrs

    coords, dims = pm_arviz.coords_and_dims_for_inferencedata(model)
    groups = {name: dict_to_dataset(found(model), library=pymc, coords=coords, dims=dims,
                                    default_dims=[])
              for name, found in (("constant_data", pm_arviz.find_constants),
                                  ("observed_data", pm_arviz.find_observations))}
    for key, value in make_attrs({"sampling_time": sampling_time, "tuning_steps": tune},
                                 library=nutpie).items():
        idata.posterior.attrs[key] = value
    idata.add_groups(groups, coords=coords, dims=dims)


def nutpie_sample_parameters() -> set[str]:
    """``nutpie.sample``'s keyword names (empty where nutpie is not installed)."""
    try:
        import nutpie
    except ImportError:
        return set()
    return set(inspect.signature(nutpie.sample).parameters)


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


def add_group(idata: Any, name: str, dataset: Any) -> Any:
    """``idata`` with ``dataset`` as its group ``name`` (ArviZ 0.x InferenceData or
    ArviZ 1 DataTree), as ``pm.compute_log_likelihood`` extends it."""
    if hasattr(idata, "add_groups"):
        idata.add_groups({name: dataset})
    else:
        idata[name] = dataset
    return idata


def start_point_fn(model: Any, start: Any) -> Any:
    """A function of a seed giving ``pm.find_MAP``'s starting point (no jitter), in
    the transformed space."""
    from pymc.initial_point import make_initial_point_fn

    return make_initial_point_fn(model=model, jitter_rvs=set(), return_transformed=True,
                                 overrides=start)


def map_point(model: Any, point: dict, include_transformed: bool) -> dict:
    """The values ``pm.find_MAP`` returns for a point of the value variables: every
    free variable (and, with ``include_transformed``, its transformed value) and
    deterministic."""
    from pymc.util import get_default_varnames

    names = get_default_varnames(model.unobserved_value_vars, include_transformed)
    outputs = model.compile_fn(names)(point)
    return {var.name: np.asarray(value) for var, value in zip(names, outputs, strict=True)}


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


def nutpie_coords(model: Any) -> dict:
    """The model's coords as nutpie's ``from_pyfunc`` takes them: a pandas ``Index``
    each (nutpie refuses plain lists of numbers), a range for a dim without labels."""
    import pandas as pd

    coords = {}
    for name, labels in model.coords.items():
        if labels is None:
            labels = pd.RangeIndex(int(model.dim_lengths[name].eval()))
        coords[name] = pd.Index(labels)
    return coords


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


def resolved_compile_kwargs(backend: Any, compile_kwargs: dict | None) -> dict:
    """``compile_kwargs`` with PyMC 6's ``backend`` shortcut made its ``mode`` (a new
    dict; PyMC's own resolution, which refuses both at once)."""
    if backend is None:
        return dict(compile_kwargs or {})
    from pymc.pytensorf import resolve_backend_compile_kwargs

    return resolve_backend_compile_kwargs(backend, compile_kwargs)


def map_parameters() -> set[str]:
    """``pm.find_MAP``'s parameter names (PyMC 6's include ``initvals``)."""
    return set(inspect.signature(import_pymc().find_MAP).parameters)


def map_start_fn(model: Any, overrides: Any, jittered: set) -> Any:
    """A function of a seed giving ``pm.find_MAP``'s starting point in the transformed
    space: the initial point with ``overrides``, the value variables ``jittered``
    jittered (PyMC 6's ``find_MAP(jitter=True)`` jitters those it optimises)."""
    from pymc.initial_point import make_initial_point_fns_per_chain

    jitter_rvs = {model.values_to_rvs[v] for v in jittered}
    return make_initial_point_fns_per_chain(model=model, overrides=overrides,
                                            jitter_rvs=jitter_rvs, chains=1)[0]


def map_value_vars(model: Any, user_vars: Any) -> list:
    """The value variables ``pm.find_MAP(vars=...)`` optimises over (free variables, their
    value variables, or the free variables a Deterministic or Potential reads)."""
    import warnings

    from pymc.util import get_value_vars_from_user_vars
    from pytensor.graph.traversal import graph_inputs

    try:
        return get_value_vars_from_user_vars(user_vars, model)
    except ValueError:
        read = set(graph_inputs(model.replace_rvs_by_values(user_vars)))
        found = [v for v in model.value_vars if v in read]
        if not found:
            raise
        warnings.warn("Intermediate variables (such as Deterministic or Potential) were "
                      "passed. find_MAP will optimize the underlying free_RVs instead.",
                      UserWarning, stacklevel=4)
        return found


def map_method(method: Any, use_grad: bool | None, options: dict) -> tuple[Any, bool]:
    """``(method, whether the gradient is used)`` as the installed ``pm.find_MAP`` decides
    them: PyMC 5 uses it for every method but Powell; PyMC 6 names the method by its
    canonical spelling and uses the gradient where the method (``basinhopping``'s inner
    one, from ``options["minimizer_kwargs"]``) takes one, unless ``use_grad=False``."""
    try:
        from pymc.tuning.scipy_interface import set_optimizer_function_defaults
        from pymc.tuning.starting import _canonical_method
    except ImportError:  # PyMC 5
        return method, method != "Powell"
    method = _canonical_method(method)
    inner = method
    if method == "basinhopping":
        minimizer = dict(options.get("minimizer_kwargs") or {})
        inner = minimizer["method"] = _canonical_method(minimizer.get("method", "L-BFGS-B"))
        options["minimizer_kwargs"] = minimizer
    use_grad, _, _ = set_optimizer_function_defaults(inner, use_grad, False, False)
    return method, use_grad


def map_minimize(fused: Callable, x0: np.ndarray, method: Any, use_grad: bool,
                 progressbar: Any, progressbar_theme: Any, maxeval: int | None,
                 args: tuple, options: dict, rng: Any) -> tuple[np.ndarray, Any]:
    """The optimisation of ``pm.find_MAP`` over ``fused`` (a raveled point -> (logp,
    dlogp), to be maximised), as the installed PyMC runs it: ``(x at the optimum,
    the optimizer's result)``.

    PyMC 5: scipy's ``minimize`` through PyMC's cost wrapper, whose progress bar it
    shows and which stops after ``maxeval`` evaluations (the result is then None and x
    the last point with a finite gradient, as there); ``args`` are scipy's. PyMC 6:
    ``better_optimize``'s ``minimize`` or ``basinhopping`` (``method="basinhopping"``),
    as ``pm.find_MAP`` calls them, with a warning where the optimizer did not converge.
    """
    import warnings

    try:
        from pymc.tuning.starting import CostFuncWrapper
    except ImportError:  # PyMC 6
        CostFuncWrapper = None
    if CostFuncWrapper is not None:
        from scipy.optimize import minimize

        last: dict = {}

        def both(x):
            if "x" not in last or not np.array_equal(last["x"], x):
                last["x"] = np.array(x, copy=True)
                last["value"], last["grad"] = fused(x)
            return last["value"], last["grad"]

        cost = CostFuncWrapper(maxeval, progressbar, progressbar_theme,
                               lambda x: both(x)[0], (lambda x: both(x)[1]) if use_grad else None)
        with cost.progress:
            try:
                result = minimize(cost, x0, *args, method=method, jac=use_grad, **options)
                x = result["x"]
            except (KeyboardInterrupt, StopIteration):
                x, result = cost.previous_x, None
            finally:
                cost.progress.update(cost.task, completed=cost.n_eval, refresh=True)
        return x, result
    from better_optimize import basinhopping, minimize

    def loss(x):
        value, grad = fused(x)
        return (-float(value), -np.asarray(grad, dtype="float64")) if use_grad else -float(value)

    if method == "basinhopping":
        minimizer = dict(options.pop("minimizer_kwargs", None) or {})
        options.setdefault("rng", rng)
        result = basinhopping(func=loss, x0=x0, progressbar=bool(progressbar),
                              minimizer_kwargs=minimizer, **options)
    else:
        result = minimize(f=loss, x0=x0, method=method, progressbar=bool(progressbar),
                          **options)
    if not result.get("success", True):
        warnings.warn(f"The optimizer did not converge: {result.get('message', '')}",
                      UserWarning, stacklevel=4)
    return np.asarray(result.x), result
