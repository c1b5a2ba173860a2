"""Every access to PyTensor beyond its public ``function``/``shared``/``tensor`` API.

PyTensor moves things between releases (2.38, which PyMC 5 pins, and 3.x): graph
traversal moved from ``graph.basic`` to ``graph.traversal``; 3.x dropped the call-time
``output_subset``; a shared variable's value lives in ``container.storage[0]``, which
the collectives read and rebind without copies; a compiled function's shared inputs
are in ``fn.maker.inputs``; the Numba backend's entry point is ``fn.vm.jit_fn``. The
rest of the package asks this module, so a new PyTensor release is one file's work.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np

try:  # PyTensor >= 3
    from pytensor.graph.traversal import ancestors as _ancestors
except ImportError:  # pragma: no cover - PyTensor 2.x
    from pytensor.graph.basic import ancestors as _ancestors  # type: ignore[no-redef]
from pytensor.graph.replace import clone_replace

__all__ = [
    "ancestors",
    "substitute",
    "storage",
    "value",
    "bind",
    "shared_inputs",
    "precompile",
]

log = logging.getLogger("synkhronos")


def ancestors(variables: Iterable[Any]) -> list[Any]:
    """Every variable the given ones are computed from, themselves included."""
    return list(_ancestors(list(variables)))


def substitute(variable: Any, replace: dict[Any, Any]) -> Any:
    """``variable`` with each key of ``replace`` swapped for its value (a new graph
    where anything changes; the variable itself, or its replacement, otherwise)."""
    if variable in replace:
        return replace[variable]
    if not any(var in replace for var in ancestors([variable])):
        return variable
    return clone_replace(variable, replace=replace)


def storage(var: Any) -> list:
    """The one-item list a shared variable's value lives in (PyTensor's storage cell;
    compiled functions read and write the value through it)."""
    return var.container.storage


def value(var: Any) -> Any:
    """A shared variable's current value, without a copy (``get_value(borrow=True)``
    without its checks, for the collectives' hot paths)."""
    return var.container.storage[0]


def bind(var: Any, array: np.ndarray) -> None:
    """Make ``array`` the value of ``var`` without a copy or a check.

    Only for arrays built with the variable's dtype and a shape its type accepts
    (the collectives' exchange buffers): its type's filter would pass them as they are.
    """
    var.container.storage[0] = array


def shared_inputs(fn: Any) -> list[Any]:
    """The shared variables a compiled function reads or updates."""
    return [inp.variable for inp in fn.maker.inputs if getattr(inp, "shared", False)]


def precompile(fn: Any) -> bool:
    """Compile a Numba-backed function for the C-contiguous signature calls use.

    Returns False when the function is not Numba-backed or this PyTensor version
    differs; the first call then compiles as usual.
    """
    jit_fn = getattr(getattr(fn, "vm", None), "jit_fn", None)
    if jit_fn is None or not hasattr(jit_fn, "compile"):
        return False
    try:
        from numba import types
        from pytensor.link.numba.dispatch.basic import get_numba_type

        signature = tuple(get_numba_type(v.type, layout="C") for v in fn.maker.fgraph.inputs)
        jit_fn.compile((types.Tuple(signature),))
    except Exception as exc:  # internals differ between versions: fall back quietly
        log.debug("precompile skipped: %s", exc)
        return False
    return True
