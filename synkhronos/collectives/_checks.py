"""What a collective call is checked against in the master, before any process moves.

The public functions of ``api.py`` all start here:

1. ``begin``: the session (forked, usable, distributed at least once) and the
   targets: the shared variables (or their names), resolved once per list to their
   ids in every process (``_resolve``; a variable no distributed function uses is a
   ``ValueError`` naming it) and cached by the ids of the variables;
2. ``reduce_op``, ``low_precision``, ``check_rank``: the op (``avg`` only for floating
   variables), the exchange (16-bit rounding only for float32 variables summed or
   averaged) and the rank;
3. ``filter_values``, ``rows_batch``, ``each_rows_batch``, ``check_fixed_length``:
   values filtered by each variable's own type (cast only where PyTensor would cast;
   a ``synk.Data`` kept as it is where it already fits), a ``batch`` of rows, and
   lengths a variable's type allows.

Nothing here moves data: ``fused.py`` and the backend do that afterwards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.tensor.type import TensorType

from .._core.context import RankVar
from .._core.session import Session, current, require
from .._reducers import ReduceOp, parse_op
from .._runtime.lowprec import Exchange, parse_exchange
from .._scatter import Batch, normalize_batch
from ..distribute import REGISTRY, Registry
from .backend import BACKEND, Backend, Targets

if TYPE_CHECKING:
    from .fused import Repeat

_OPS = {op.value: op for op in ReduceOp if op not in (ReduceOp.GATHER, ReduceOp.NONE)}
_CACHE_LIMIT = 256


# -- steps 1-3 ---------------------------------------------------------------------------
class Front:
    """The master's state of the collectives' front end: the registry, the backend, and
    the validated targets of recent calls, keyed by their variables' ids."""

    def __init__(self, registry: Registry, backend: Backend) -> None:
        self.registry = registry
        self.backend = backend
        self.targets: dict[Any, Targets] = {}
        self.repeat: Repeat | None = None  # the last all_reduce, if it may repeat
        self.rounded: Repeat | None = None  # the same for one with a low-precision exchange


FRONT: RankVar[Front] = RankVar(
    "collectives front", lambda ctx: Front(REGISTRY.get(ctx), BACKEND.get(ctx))
)


def begin(what: str, shared_vars: Any) -> tuple[Session, Front, Targets, bool]:
    """The session, its front, the validated targets, and whether one variable came."""
    session = current()
    if session is None:
        session = require(f"synk.{what}()")  # raises, saying to call synk.fork() first
    front = FRONT.get(session.ctx)
    if not front.registry.distributed_once:
        session.check_usable()
        raise RuntimeError(
            f"call synk.distribute() before synk.{what}(): collectives act on the shared "
            "variables of distributed functions"
        )
    single = not isinstance(shared_vars, (list, tuple))
    key = id(shared_vars) if single else tuple(map(id, shared_vars))
    targets = front.targets.get(key)  # it holds the variables, so their ids stay theirs
    if targets is None or targets.by_name:
        items = (shared_vars,) if single else tuple(shared_vars)
        variables = tuple(_by_name(front.registry, item, i, single) if isinstance(item, str)
                          else item for i, item in enumerate(items))
        targets = _resolve(front.registry, variables, single, variables != items)
        if len(front.targets) >= _CACHE_LIMIT:
            front.targets.clear()
        front.targets[key] = targets
    return session, front, targets, single


def _label(var: Any, index: int, single: bool) -> str:
    where = "" if single else f" (shared_vars[{index}])"
    name = getattr(var, "name", None)
    return f"shared variable {name!r}{where}" if name else f"unnamed shared variable{where}"


def _by_name(reg: Any, name: str, index: int, single: bool) -> Any:
    """The one distributed shared variable called ``name`` (the original's lookup)."""
    found = [var for var in reg.shared.values() if var.name == name]
    where = "" if single else f" (shared_vars[{index}])"
    if not found:
        raise ValueError(
            f"no shared variable named {name!r}{where} is used by a distributed function; "
            "pass the variable itself, or build and distribute a function that uses it"
        )
    if len(found) > 1:
        raise ValueError(
            f"{len(found)} shared variables of distributed functions are named "
            f"{name!r}{where}; pass the variable itself"
        )
    return found[0]


def _resolve(reg: Any, variables: tuple, single: bool, by_name: bool = False) -> Targets:
    if not variables:
        raise ValueError("shared_vars is empty; give a shared variable or a list of them")
    uids, labels = [], []
    for i, var in enumerate(variables):
        label = _label(var, i, single)
        if not isinstance(var, SharedVariable) or not isinstance(var.type, TensorType):
            raise TypeError(
                f"{label} must be a PyTensor tensor shared variable; got {type(var).__name__}"
            )
        uid = reg.uid(var)
        if uid is None:
            raise ValueError(
                f"{label} is not used by any distributed function, so the workers have "
                "no copy of it and collectives have nothing to act on; once a "
                "synk.function that uses it is distributed, the master's set_value "
                "reaches every process by itself before the next call"
            )
        if uid in uids:
            raise ValueError(f"{label} appears more than once in shared_vars")
        uids.append(uid)
        labels.append(label)
    dtypes = tuple(np.dtype(var.type.dtype) for var in variables)
    return Targets(
        variables=variables,
        uids=tuple(uids),
        labels=tuple(labels),
        dtypes=dtypes,
        ndims=tuple(var.type.ndim for var in variables),
        inexact=all(dtype.kind in "fc" for dtype in dtypes),
        by_name=by_name,
    )


def reduce_op(op: Any, targets: Targets) -> ReduceOp:
    parsed: ReduceOp | None = _OPS.get(op) if isinstance(op, str) else None
    if parsed is None:
        parsed = parse_op(op, allow_gather=False)
    if parsed is ReduceOp.AVG and not targets.inexact:
        for label, dtype in zip(targets.labels, targets.dtypes, strict=True):
            if dtype.kind not in "fc":
                raise TypeError(
                    f"op 'avg' needs floating-point variables; {label} has dtype {dtype} "
                    "(use op='sum' and divide, or a float variable)"
                )
    return parsed


def low_precision(exchange: Any, op: ReduceOp, targets: Targets) -> Exchange | None:
    """The format of a low-precision exchange (None: exact), for float32 variables
    combined by ``sum`` or ``avg`` only: anything else is refused, not exchanged
    exactly behind the caller's back."""
    rounding = parse_exchange(exchange)
    if rounding is None:
        return None
    if op is not ReduceOp.SUM and op is not ReduceOp.AVG:
        raise ValueError(f"exchange={rounding.value!r} rounds values for a sum or an "
                         f"average; op {op.value!r} takes the exact exchange "
                         "(exchange=None)")
    for label, dtype in zip(targets.labels, targets.dtypes, strict=True):
        if dtype != np.float32:
            raise TypeError(f"exchange={rounding.value!r} rounds float32 values; {label} "
                            f"has dtype {dtype} (exchange it exactly, exchange=None, in "
                            "a call of its own)")
    return rounding


def check_rank(session: Session, rank: Any) -> int:
    if isinstance(rank, (bool, np.bool_)) or not isinstance(rank, (int, np.integer)):
        raise TypeError(f"rank must be an integer; got {type(rank).__name__}")
    if not 0 <= rank < session.n:
        raise ValueError(f"rank must be in 0..{session.n - 1} for {session.n} processes; "
                         f"got {rank}")
    return int(rank)


def _is_data(value: Any) -> bool:
    return hasattr(value, "ref") and hasattr(value, "alloc_size")


def filter_values(targets: Targets, values: Any, single: bool, keep_data: bool) -> list:
    """One value per variable, filtered by the variable's type.

    A ``synk.Data`` of the variable's dtype and ndim is kept as is when ``keep_data``
    (the ranks read it in place); any other value becomes a numpy array the variable
    could hold.
    """
    if single:
        values = [values]
    elif not isinstance(values, (list, tuple)):
        raise TypeError(f"values must be a list with one value per shared variable "
                        f"({len(targets.uids)}); got {type(values).__name__}")
    elif len(values) != len(targets.uids):
        raise ValueError(f"values must hold one value per shared variable "
                         f"({len(targets.uids)}); got {len(values)}")
    result = []
    for var, label, dtype, ndim, value in zip(
        targets.variables, targets.labels, targets.dtypes, targets.ndims, values, strict=True
    ):
        if _is_data(value):
            if keep_data and value.dtype == dtype and value.ndim == ndim:
                result.append(value)
                continue
            value = value.data
        try:
            result.append(np.asarray(var.type.filter(value, strict=False)))
        except (TypeError, ValueError) as exc:
            kind = TypeError if isinstance(exc, TypeError) else ValueError
            raise kind(f"value for {label} does not fit it: {exc}") from exc
    return result


def rows_batch(targets: Targets, values: list, batch: Any, what: str) -> Batch:
    """The one row selection of ``values``, which must agree in length (axis 0)."""
    lengths = []
    for label, value in zip(targets.labels, values, strict=True):
        if value.ndim == 0:
            raise ValueError(f"{what} splits values along axis 0, but the value for "
                             f"{label} is 0-d")
        lengths.append(value.shape[0])
    if len(set(lengths)) > 1:
        pairs = zip(lengths, targets.labels, strict=True)
        got = ", ".join(f"{n} for {label}" for n, label in pairs)
        raise ValueError(f"{what} values must share their length along axis 0; got {got}")
    return normalize_batch(batch, lengths[0])


def each_rows_batch(targets: Targets, values: list, batch: Any, what: str) -> tuple:
    """One row selection per value, each against that value's own length (axis 0)."""
    selections = []
    for label, value in zip(targets.labels, values, strict=True):
        if value.ndim == 0:
            raise ValueError(f"{what} splits values along axis 0, but the value for "
                             f"{label} is 0-d")
        try:
            selections.append(normalize_batch(batch, value.shape[0]))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{what} of {label}: {exc}") from exc
    return tuple(selections)


def check_fixed_length(targets: Targets, lengths: list[list[int]], what: str) -> None:
    """Refuse new lengths that a variable's static shape forbids (``lengths[var]``)."""
    for var, label, per_rank in zip(targets.variables, targets.labels, lengths, strict=True):
        fixed = var.type.shape[0] if var.type.ndim else None
        if fixed is not None and any(length != fixed for length in per_rank):
            raise ValueError(f"{what} would give {label} lengths {per_rank}, but its type "
                             f"fixes its length to {fixed}")


def one_or_list(results: list, single: bool) -> Any:
    return results[0] if single else results


# -- the collectives ---------------------------------------------------------------------
