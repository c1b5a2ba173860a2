"""The rewritten model: the divided terms as one term over the row-sum Op.

PyMC samples, optimises and checks the model it is given. Handing it a model in which
the divided observed variables (and the potentials named in ``split``) are gone, and
one ``pm.Potential`` stands in for them all, ``RowSum(values)[0]`` (``_rowsum``), lets
every PyMC function run as it would on the user's model: ``pm.sample`` with its
seeds, initialisation, start-value checks, samplers (PyMC's NUTS, nutpie, numpyro,
blackjax) and InferenceData, ``pm.find_MAP``, ``model.logp_dlogp_function``. What
the rewrite changes, it gives back: the observed data of the removed variables
(``observed_data``, from the user's model) and their pointwise log-likelihood
(``log_likelihood``, PyMC's ``compute_log_likelihood`` on the user's model).

Built with PyMC's public model graph (``fgraph_from_model``, ``model_from_fgraph``):
the removed variables are outputs taken off that graph. Two things PyMC's own cloning
does not keep are set back: the order of the free variables (it sorts them by the
graph, and the raveled point NUTS moves in, so its draws, follow that order) and
``check_bounds`` (whether parameter checks give ``-inf``); and the copy reads the
user's own data containers (the graph copies them), so that ``pm.set_data`` reaches it
as it reaches the model. A model
whose variables carry an ``initval`` is refused by the model graph: pass them to the
function as ``initvals`` instead.
"""

from __future__ import annotations

from typing import Any

from pytensor.compile.sharedvalue import SharedVariable

__all__ = ["rewrite", "check_copyable", "variables", "named_keys", "POTENTIAL"]

# The stand-in's name in the rewritten model (not a name the user's model can hold: it
# is never stored in an InferenceData, potentials are not).
POTENTIAL = "__synkhronos_loglik__"


def rewrite(pm: Any, model: Any, removed: list, term: Any) -> Any:
    """``model`` without the variables ``removed`` (divided observed variables and
    potentials), with ``term(values)`` as one potential: ``values`` are the rewritten
    model's value variables that correspond to ``model.value_vars``."""
    from pymc.model.fgraph import fgraph_from_model, model_from_fgraph

    check_copyable(model)
    fgraph, memo = fgraph_from_model(model)
    # The model graph copies every data container: the copy reads the user's own, so
    # that pm.set_data reaches it as it reaches the model (and no data is held twice)
    own = {var.name: var for var in model.named_vars.values()
           if isinstance(var, SharedVariable)}
    for var in list(fgraph.inputs):
        if isinstance(var, SharedVariable) and own.get(var.name, var) is not var:
            fgraph.replace(var, own[var.name], import_missing=True)
    observed = set(model.observed_RVs)
    for var in removed:
        index = fgraph.outputs.index(memo[var])
        if var in observed:
            # What reads an observed variable (the deterministic that joins PyMC's
            # imputed and observed values) reads its value, as in PyMC's log-density
            fgraph.replace(memo[var], memo[var].owner.inputs[1], import_missing=True)
        fgraph.remove_output(index)
    kept = [var.name for var in removed if memo[var] in fgraph.variables]
    clone = model_from_fgraph(fgraph, mutate_fgraph=True)
    if kept:
        raise ValueError(f"{kept[0]!r} is read by another variable of the model, so it "
                         "cannot be divided by rows; pass split=[...] without it")
    clone.check_bounds = model.check_bounds  # (a model-wide option, not in the graph)
    order = {rv.name: i for i, rv in enumerate(model.free_RVs)}
    clone.free_RVs.sort(key=lambda rv: order[rv.name])
    by_name = {rv.name: clone.rvs_to_values[rv] for rv in clone.free_RVs}
    values = {v: by_name[model.values_to_rvs[v].name] for v in model.value_vars
              if v in model.values_to_rvs and model.values_to_rvs[v].name in by_name}
    with clone:
        pm.Potential(POTENTIAL, term(values))
    return clone



def check_copyable(model: Any) -> None:
    """A ValueError where PyMC's model graph cannot copy ``model``: a variable with an
    ``initval`` (before anything is built)."""
    given = [rv.name for rv, value in model.rvs_to_initial_values.items()
             if value is not None]
    if given:
        raise ValueError(f"synkhronos.pymc cannot divide a model whose variables have an "
                         f"initval ({given[0]!r}): PyMC's model graph refuses them; pass "
                         "them as initvals={...} instead")


def variables(model: Any, rewritten: Any, given: Any) -> Any:
    """``given`` (a variable of ``model``, a name, or a list of them, as ``vars=`` takes
    them) as the rewritten model's same variables: its random variables by name, value
    variables by their random variable's."""
    if given is None:
        return None
    many = isinstance(given, list | tuple)

    def same(var):
        if isinstance(var, str) or getattr(var, "name", None) is None:
            return var
        if var in model.values_to_rvs:
            return rewritten.rvs_to_values[rewritten[model.values_to_rvs[var].name]]
        return rewritten[var.name] if var.name in rewritten.named_vars else var

    return [same(var) for var in given] if many else same(given)


def named_keys(values: Any) -> Any:
    """Start values (``initvals``: a dict, or a list of them, one a chain) keyed by
    name: the rewritten model's variables are the user's names, not its objects."""
    if isinstance(values, list | tuple):
        return type(values)(named_keys(one) for one in values)
    if not isinstance(values, dict):
        return values
    return {getattr(key, "name", key): value for key, value in values.items()}
