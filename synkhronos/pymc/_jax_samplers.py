"""numpyro's and blackjax's NUTS over the divided log-density.

``sample(nuts_sampler="numpyro")`` (or "blackjax") is ``pm.sample`` with that
sampler, its keywords, seeds and InferenceData all PyMC's, except for the one
function PyMC would compile with JAX: the model's log-density. In its place stands a
JAX function whose value and gradient come from the divided ``ValueGradFunction``
through a host callback (``jax.pure_callback``). The sampler's loop stays compiled;
at each leapfrog step it calls back into this process, which evaluates the rows on
every process of the session (one command, as for PyMC's NUTS) and returns both. A
custom VJP hands ``jax.grad`` the gradient already computed, so one evaluation serves
the value and the gradient. Chains a sampler runs at once (numpyro's ``pmap`` over
several host devices, or PyMC 5's blackjax route) call back from XLA's threads, one
at a time.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from . import _pymc_compat as compat

__all__ = ["callback_logp", "sample_jax"]


def callback_logp(vgf: Any, model: Any, negative_logp: bool, failures: list) -> Any:
    """What PyMC's ``get_jaxified_logp(model, negative_logp)`` returns, a function of
    the list of value arrays (``model.value_vars``' order) giving a JAX scalar, here
    evaluated by ``vgf`` (the divided function, over ``model.continuous_value_vars``:
    the same variables for a model NUTS samples). PyMC's flag is read as PyMC reads
    it: False gives minus the log-density (numpyro's potential energy). An exception
    the evaluation raises is appended to ``failures``, for the caller to raise in
    place of the one JAX reports."""
    import jax

    values = model.value_vars
    point = model.initial_point()
    shapes = [np.shape(point[v.name]) for v in values]
    sizes = [int(np.prod(shape, dtype=int)) for shape in shapes]
    dtypes = [np.dtype(v.dtype) for v in values]
    value_dtype = np.asarray(vgf(np.concatenate([np.ravel(point[v.name])
                                                 for v in values]))[0]).dtype
    sign = 1 if negative_logp else -1
    result = (jax.ShapeDtypeStruct((), value_dtype),
              [jax.ShapeDtypeStruct(shape, dtype)
               for shape, dtype in zip(shapes, dtypes, strict=True)])

    lock = threading.Lock()

    def evaluate(*arrays):
        try:
            with lock:  # (one PyTensor function: its storage is not for two threads)
                value, grad = vgf(np.concatenate([np.ravel(a) for a in arrays]))
        except BaseException as exc:
            failures.append(exc)
            raise
        pieces, begin = [], 0
        for shape, size, dtype in zip(shapes, sizes, dtypes, strict=True):
            pieces.append(np.asarray(sign * grad[begin:begin + size], dtype=dtype)
                          .reshape(shape))
            begin += size
        return np.asarray(sign * value, dtype=value_dtype), pieces

    def value_and_grad(arrays):
        return jax.pure_callback(evaluate, result, *arrays, vmap_method="sequential")

    @jax.custom_vjp
    def logp(arrays):
        return value_and_grad(arrays)[0]

    def backward(grad, cotangent):
        return ([cotangent * g for g in grad],)

    logp.defvjp(value_and_grad, backward)

    def logp_fn(x):
        return logp(list(x))

    return logp_fn


def sample_jax(pm: Any, model: Any, vgf: Any, asked: dict) -> Any:
    """``pm.sample(model=model, **asked)`` (``nuts_sampler`` "numpyro" or "blackjax"
    in ``asked``) with the log-density evaluated by ``vgf``. An evaluation's error is
    raised as itself (JAX would report it as a runtime error of its callback)."""
    failures: list = []
    vgf.set_extra_values({})

    def replacement(model, negative_logp=True):
        return callback_logp(vgf, model, negative_logp, failures)

    try:
        with compat.jaxified_logp_replaced(replacement):
            return pm.sample(model=model, **asked)
    except Exception as exc:
        if failures:
            raise failures[0] from exc
        raise
    finally:
        # Before the session can close: computations pm.sample started and did not
        # wait for (blackjax leaves some) run their callbacks now, and no compiled
        # sampler holding this callback is reused by a later pm.sample.
        import jax

        try:
            jax.effects_barrier()
        finally:
            jax.clear_caches()
