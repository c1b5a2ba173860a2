"""Every access to PyTensor beyond its public ``function``/``shared``/``tensor`` API.

PyTensor moves things between releases (2.38, which PyMC 5 pins, and 3.x): graph
traversal moved from ``graph.basic`` to ``graph.traversal``; 3.x dropped the call-time
``output_subset``; a shared variable's value lives in ``container.storage[0]``. The
rest of the package asks this module, so a new PyTensor release is one file's work.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

try:  # PyTensor >= 3
    from pytensor.graph.traversal import ancestors as _ancestors
except ImportError:  # pragma: no cover - PyTensor 2.x
    from pytensor.graph.basic import ancestors as _ancestors
from pytensor.graph.replace import clone_replace

__all__ = ["ancestors", "substitute"]


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
