"""synkhronos.pymc: sample an unmodified PyMC model with its likelihood on every process.

Stan's ``reduce_sum``, for PyMC. A model's observed log-likelihood is a sum over data
rows; this package divides those rows among the session's processes and leaves the rest
of the log-density (priors with their Jacobians, potentials, observations that are not
divided) to the master. PyMC's own sampler drives it all, in the master.

One evaluation of the log-density, as NUTS asks for it at every leapfrog step::

    PyMC's NUTS (master)
      -> PyMC's ValueGradFunction over (log-prior + RowSum(theta))
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
  check and the Op put into PyMC's function; ``logp_dlogp_function`` (steps 2-5);
- ``_rowsum``: the ``RowSum`` Op, which runs every evaluation (the box above), its
  rows balanced by measured speed where an evaluation is long;
- ``_choice``: whether dividing pays at all, measured against PyMC's own function
  (``sample(divide=None)``);
- ``_sampling``: ``sample``, with PyMC's NUTS or nutpie;
- ``_jax_samplers``: numpyro's and blackjax's NUTS over the divided function, a JAX
  host callback in ``pm.sample``'s own JAX route;
- ``_loglik``: ``compute_log_likelihood`` (pointwise, for LOO and WAIC);
- ``_map``: ``find_MAP`` over the divided log-density;
- ``_pymc_compat``: every access to PyMC's (and nutpie's) internals (the JAX route's
  log-density hook among them).

PyMC is imported only when these functions are called.
"""

from __future__ import annotations

from ._likelihood import logp_dlogp_function
from ._loglik import compute_log_likelihood
from ._map import find_MAP
from ._sampling import sample

__all__ = ["sample", "logp_dlogp_function", "compute_log_likelihood", "find_MAP"]
