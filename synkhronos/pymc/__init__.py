"""synkhronos.pymc: sample an unmodified PyMC model with its likelihood on every process.

Stan's ``reduce_sum``, for PyMC. A model's observed log-likelihood is a sum over data
rows; this package divides those rows among the session's processes and leaves the rest
of the log-density (priors with their Jacobians, potentials, observations that are not
divided) to the master. It rewrites the model, not PyMC's functions: a copy of the
model in which the divided terms are one potential over the row-sum Op is handed to
PyMC's own ``pm.sample``, ``pm.find_MAP`` and ``logp_dlogp_function``.

One evaluation of the log-density, as NUTS asks for it at every leapfrog step::

    the sampler (PyMC's NUTS, nutpie, numpyro or blackjax: master)
      -> PyMC's log-density of the rewritten model: log-prior + RowSum(theta)
           |  log-prior, Jacobians, potentials and their gradient: the master;
           |  theta: the values the likelihood reads, end to end in one vector
           +-> RowSum.evaluate(theta)                one call per evaluation: PyTensor
                 -> synk Function(rows, theta)       merges the Op's value and gradient
                      every process: its rows' log-likelihood and gradient, op "sum"
                      (its share of every observed variable's rows, whatever their
                      lengths: one function, one command)
                 <- (log-likelihood, flat gradient)
      <- (logp, dlogp)

The modules, each one concern:

- ``_split``: which observed variables and data rows are divided (step 1);
- ``_likelihood``: the building: the row graphs, the ``synk.function``, the one-time
  check, the Op; ``logp_dlogp_function`` (steps 2-5);
- ``_model``: the rewritten model, the Op standing in for the divided terms;
- ``_rowsum``: the ``RowSum`` Op, which runs every evaluation (the box above), its
  rows balanced by measured speed where an evaluation is long; its Numba and JAX
  forms (a host callback where JAX compiles the sampler);
- ``_choice``: whether dividing pays at all, measured against PyMC's own function
  (``sample(divide=None)``);
- ``_sampling``: ``sample``: ``pm.sample`` on the rewritten model;
- ``_loglik``: ``compute_log_likelihood`` (pointwise, for LOO and WAIC);
- ``_map``: ``find_MAP``: ``pm.find_MAP`` on the rewritten model;
- ``_pymc_compat``: what differs between PyMC 5 and 6, and the one private PyMC
  name read.

PyMC is imported only when these functions are called.
"""

from __future__ import annotations

from ._likelihood import logp_dlogp_function
from ._loglik import compute_log_likelihood
from ._map import find_MAP
from ._sampling import sample

__all__ = ["sample", "logp_dlogp_function", "compute_log_likelihood", "find_MAP"]
