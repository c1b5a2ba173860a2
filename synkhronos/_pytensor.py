"""Every access to PyTensor beyond its public ``function``/``shared``/``tensor`` API.

PyTensor moves things between releases (2.38, which PyMC 5 pins, and 3.x): graph
traversal moved from ``graph.basic`` to ``graph.traversal``; 3.x dropped the call-time
``output_subset``; a shared variable's value lives in ``container.storage[0]``, which
the collectives read and rebind without copies; a compiled function's shared inputs
are in ``fn.maker.inputs``; the Numba backend's entry point is ``fn.vm.jit_fn``; a
compiled function's storage cells, update cells and VM, which a trusted call fills and
runs without ``Function.__call__`` (``trusted_call``), are named differently in 2.38 and
3.x. The rest of the package asks this module, so a new PyTensor release is one file's
work.
"""

from __future__ import annotations

import copy
import logging
import pickle
import types
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytensor

try:  # PyTensor >= 3
    from pytensor.graph.traversal import ancestors as _ancestors
    from pytensor.graph.traversal import graph_inputs as _graph_inputs
except ImportError:  # pragma: no cover - PyTensor 2.x
    from pytensor.graph.basic import ancestors as _ancestors  # type: ignore[no-redef]
    from pytensor.graph.basic import graph_inputs as _graph_inputs  # type: ignore[no-redef]
from pytensor.compile.builders import OpFromGraph
from pytensor.graph.basic import Constant, clone_get_equiv
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.replace import clone_replace
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.graph.utils import Scratchpad
from pytensor.link.utils import raise_with_op
from pytensor.raise_op import CheckAndRaise
from pytensor.scan.op import Scan
from pytensor.tensor.random.type import RandomType
from pytensor.tensor.rewriting.shape import ShapeFeature
from pytensor.tensor.shape import Shape, Shape_i

__all__ = [
    "ancestors",
    "substitute",
    "substitute_all",
    "shape_inference",
    "lengths_read",
    "simplified",
    "row_length_of",
    "scan_steps",
    "moved_type",
    "storage",
    "value",
    "bound_to",
    "bind",
    "shared_inputs",
    "reduce_for_pickle",
    "graph_nodes",
    "precompile",
    "is_random_generator",
    "scalar_mode",
    "trusted_call",
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


def substitute_all(variables: list[Any], replace: dict[Any, Any]) -> list[Any]:
    """``substitute`` over several variables at once: what they share stays shared."""
    if not any(var in replace for var in ancestors(variables)):
        return list(variables)
    return list(clone_replace(list(variables), replace=replace))


def shape_inference(roots: list[Any]) -> Any:
    """PyTensor's shape inference over the graph of ``roots``, which stays as it is.

    Returns ``shape(var)``: each dimension of a variable of that graph as a symbolic
    scalar, in terms of ``Shape_i`` of the graph's own inputs where PyTensor can tell
    (and of an intermediate variable where its op cannot say). The inference runs on
    a copy of the graph whose inputs are the graph's inputs themselves, so that those
    dimensions name them.
    """
    inputs = [var for var in _graph_inputs(roots) if not isinstance(var, Constant)]
    equivalent: dict[Any, Any] = clone_get_equiv(inputs, roots, copy_inputs=False,
                                                 copy_orphans=True)
    graph = FunctionGraph(inputs, [equivalent[var] for var in roots],
                          features=[ShapeFeature()], clone=False)
    feature = graph.shape_feature

    def shape(var: Any) -> tuple:
        copy = equivalent[var]
        if not hasattr(feature, "init_r"):  # PyTensor >= 3.3: shapes derived on demand
            return tuple(feature.shape_tuple(copy))
        feature.init_r(copy)  # (an input that no op reads has none yet)
        return tuple(feature.shape_of[copy])

    return shape


def lengths_read(dims: Iterable[Any], candidates: Iterable[Any]) -> list[Any]:
    """Which of ``candidates`` (inputs of a graph) the symbolic ``dims`` (from
    ``shape_inference``) grow with along axis 0: those whose ``Shape_i{0}`` or
    ``Shape`` they read, and, where they read the shape of an intermediate variable
    (one whose op could not infer it), every candidate that variable is computed from.
    """
    wanted = list(candidates)
    found: list[Any] = []
    for var in _ancestors(list(dims)):
        node = var.owner
        if node is None or not isinstance(node.op, (Shape_i, Shape)):
            continue
        read = node.inputs[0]
        if isinstance(node.op, Shape_i) and node.op.i != 0 and read.owner is None:
            continue
        sources = [read] if read.owner is None else _ancestors([read])
        found += [c for c in wanted if any(c is s for s in sources) and
                  not any(c is f for f in found)]
    return found


def simplified(dims: list[Any]) -> list[Any]:
    """Symbolic scalars (from ``shape_inference``) rewritten by PyTensor's canonical
    rewrites with shape tracking: ``Shape_i`` of a view (a transpose, a slice's
    bounds) becomes ``Shape_i`` of what it views, so each dimension names the inputs
    it is computed from."""
    # A copy whose inputs are the graph's own (``rewrite_graph``'s own copy copies
    # them too in PyTensor 2.38), rewritten in place
    inputs = [var for var in _graph_inputs(dims) if not isinstance(var, Constant)]
    equivalent: dict[Any, Any] = clone_get_equiv(inputs, dims, copy_inputs=False,
                                                 copy_orphans=True)
    graph = FunctionGraph(inputs, [equivalent[dim] for dim in dims], clone=False)
    rewrite_graph(graph, include=("canonicalize", "ShapeOpt"))
    return list(graph.outputs)


def row_length_of(dim: Any, rows: list[Any]) -> tuple[Any | None, Any | None]:
    """Which of ``rows`` (inputs whose axis 0 holds the rows) a ``simplified``
    dimension is the length of, and which one's length it reads.

    ``(var, var)``: the dimension is exactly ``var.shape[0]``; ``(None, var)``: it is
    computed from the row count of ``var``, the first of ``rows`` it reads
    (``x.shape[0] - 1``, ``2 * x.shape[0]``, or a constant written the long way:
    ``36 * L // max(L, 1)``); ``(None, None)``: it reads none (or only through an op
    whose shape PyTensor cannot say: then nothing can be told)."""
    owner = getattr(dim, "owner", None)
    while owner is not None and isinstance(owner.op, CheckAndRaise):
        owner = getattr(owner.inputs[0], "owner", None)  # (broadcasting's checks)
    if owner is not None and isinstance(owner.op, Shape_i) and owner.op.i == 0:
        read = owner.inputs[0]
        for var in rows:
            if var is read:
                return var, var
    read = [var.owner.inputs[0] for var in _ancestors([dim]) if var.owner is not None
            and isinstance(var.owner.op, Shape_i) and var.owner.op.i == 0]
    for row in rows:  # (the first of ``rows`` it reads)
        if any(var is row for var in read):
            return None, row
    return None, None


def scan_steps(roots: list[Any]) -> list[Any]:
    """The number of steps (a symbolic scalar) of every ``scan`` in the graph of
    ``roots``."""
    return [var.owner.inputs[0] for var in _ancestors(list(roots))
            if var.owner is not None and isinstance(var.owner.op, Scan)
            and var is var.owner.outputs[0]]


def moved_type(var: Any, axis: int) -> Any:
    """A new input like ``var`` with its axis ``axis`` first (its static shape moved
    too), named as ``var``."""
    shape = list(var.type.shape)
    shape.insert(0, shape.pop(axis))
    return var.type.clone(shape=tuple(shape))(name=var.name)


def storage(var: Any) -> list:
    """The one-item list a shared variable's value lives in (PyTensor's storage cell;
    compiled functions read and write the value through it)."""
    return var.container.storage


def value(var: Any) -> Any:
    """A shared variable's current value, without a copy (``get_value(borrow=True)``
    without its checks, for the collectives' hot paths)."""
    return var.container.storage[0]


def bound_to(variables: Any, arrays: Any) -> bool:
    """Whether each variable's value is the very array beside it (the collectives'
    check that values still live in their exchange buffers)."""
    for var, array in zip(variables, arrays, strict=True):
        if var.container.storage[0] is not array:
            return False
    return True


def bind(var: Any, array: np.ndarray) -> None:
    """Make ``array`` the value of ``var`` without a copy or a check.

    Only for arrays built with the variable's dtype and a shape its type accepts
    (the collectives' exchange buffers): its type's filter would pass them as they are.
    """
    var.container.storage[0] = array


def shared_inputs(fn: Any) -> list[Any]:
    """The shared variables a compiled function reads or updates."""
    return [inp.variable for inp in fn.maker.inputs if getattr(inp, "shared", False)]


def _local_function(obj: Any) -> bool:
    """Whether ``obj`` is a function defined inside another one (pickle refuses it)."""
    return isinstance(obj, types.FunctionType) and "<locals>" in obj.__qualname__


def reduce_for_pickle(obj: Any) -> Any:
    """A pickler's ``reducer_override``: a reduction for the objects PyTensor cannot
    pickle itself, ``NotImplemented`` for every other.

    PyTensor caches closures it rebuilds on demand; they travel without them:

    - an ``OpFromGraph`` that was differentiated caches its gradient as a local
      closure (PyTensor 3.3 keeps e.g. ``LogSumExp`` reachable from a compiled
      function); workers never differentiate;
    - a node's ``tag`` (a ``Scratchpad``) caches functions made for it: on PyTensor
      2.38 a ``Blockwise`` node (batched linear algebra, ``pt.vectorize``) keeps its
      ``np.vectorize``'d perform as ``tag.gufunc``, which its ``prepare_node`` and
      ``perform`` make again when it is missing.
    """
    if isinstance(obj, OpFromGraph) and (obj._lop_op_cache or obj._rop_op_cache):
        bare = copy.copy(obj)
        bare._lop_op_cache, bare._rop_op_cache = {}, None
        return bare.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    if isinstance(obj, Scratchpad) and any(_local_function(v) for v in vars(obj).values()):
        pad = type(obj).__new__(type(obj))  # (Scratchpad's __setattr__ is its own)
        vars(pad).update((k, v) for k, v in vars(obj).items() if not _local_function(v))
        return pad.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    return NotImplemented


def graph_nodes(fn: Any) -> list[Any]:
    """Every Apply node of a compiled function's graph and of its Ops' inner graphs
    (Composite, OpFromGraph, Scan), each listed after the nodes it reads from.

    Pickling this list before the function keeps pickle's nesting shallow: each node
    finds its inputs already pickled. Without it the nesting grows with the graph's
    depth, past Python 3.12's fixed C recursion limit, which no
    ``sys.setrecursionlimit`` raises.
    """
    nodes: list[Any] = []
    graphs, seen = [fn.maker.fgraph], set()
    while graphs:
        graph = graphs.pop()
        if id(graph) in seen:
            continue
        seen.add(id(graph))
        order = graph.toposort()
        nodes[:0] = order  # an inner graph's nodes before the graph holding it
        graphs.extend(
            inner for node in order if (inner := getattr(node.op, "fgraph", None)) is not None
        )
    return nodes


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


def is_random_generator(var: Any) -> bool:
    """Whether a shared variable holds a random generator (``RandomStream``'s, or one
    made with ``pytensor.shared(np.random.default_rng())``)."""
    return isinstance(getattr(var, "type", None), RandomType)


def scalar_mode() -> Any:
    """The fastest mode for a tiny graph of scalars evaluated once per call in the
    master (the slice pattern's bounds): the C VM, about 1 us a call, where PyTensor
    3's default (Numba) takes about 30 and the Python linker about 80; the Python
    linker where there is no C compiler."""
    from pytensor.compile.mode import Mode

    linker = "cvm" if pytensor.config.cxx else "py"
    return Mode(linker=linker, optimizer="fast_run")


def _call_parts(fn: Any) -> tuple | None:
    """A compiled function's parts for ``trusted_call`` (2.38's names or 3.x's), or None
    where its call does more than fill, run, update and clear (profiling, default
    values, keyed outputs, checked inputs)."""
    if not getattr(fn, "trust_input", False) or getattr(fn, "profile", None):
        return None
    if getattr(fn, "has_defaults", False) or getattr(fn, "output_keys", None) is not None:
        return None
    if hasattr(fn, "_clear_input_storage_data"):  # PyTensor 3.x
        required = fn._clear_input_storage_data
        updates = fn._update_input_storage
        returned = fn._n_returned_outputs
        produced = fn._clear_output_storage_data
    elif hasattr(fn, "clear_input_storage_data"):  # PyTensor 2.38
        required = fn.clear_input_storage_data
        updates = fn.update_input_storage
        returned = fn.n_returned_outputs
        produced = fn.clear_output_storage_data
    else:
        return None
    inputs = [container.storage for container in fn.input_storage]
    outputs = [container.storage for container in fn.output_storage]
    updated = [(i, container.storage) for i, container in updates]
    # (the update outputs are cut off even where the VM applied them itself and
    # ``updated`` is empty)
    cut = returned if returned < len(outputs) else None
    return inputs, fn.vm, outputs, updated, cut, list(required), list(produced)


def trusted_call(fn: Any) -> Any:
    """``fn`` (a compiled function whose inputs are trusted) as a callable that returns
    the list of its outputs, as its own call does, less that call's per-call branches
    (about 1 us a call on this machine): the inputs go into their cells, the VM runs,
    updates land, and the cells are cleared as PyTensor's call clears them (the
    required inputs' always, as 2.38 does: no reference to a call's arrays stays). An
    error is raised as PyTensor's call raises it, naming the node. ``fn`` itself where
    its call does more (``_call_parts``)."""
    parts = _call_parts(fn)
    if parts is None:
        return fn
    inputs, vm, outputs, updated, cut, required, produced = parts
    direct = _jit_call(fn, vm, inputs, outputs, updated, cut)
    if direct is not None:
        return direct
    collects = hasattr(vm, "allow_gc")  # (2.38's VMs need not say)

    def run(*args: Any) -> list:
        for cell, arg in zip(inputs, args):  # noqa: B905 (the explicit inputs come first)
            cell[0] = arg
        try:
            results = vm()
        except Exception:
            try:
                _raise_as_pytensor(fn, vm)
            finally:
                for cell in required:
                    cell[0] = None
        if results is None:  # a VM that leaves its outputs in their cells
            results = [cell[0] for cell in outputs]
        if cut is not None:
            for i, cell in updated:
                cell[0] = results[i]
            results = results[:cut]
        for cell in required:
            cell[0] = None
        if collects and vm.allow_gc:  # (PyTensor reads it every call: it may change)
            for cell in produced:
                cell[0] = None
        return results

    return run


def _jit_call(fn: Any, vm: Any, inputs: list, outputs: list, updated: list,
              cut: int | None) -> Any:
    """On PyTensor's JIT backends (Numba, PyTensor 3's default, and JAX),
    ``trusted_call``'s callable as the graph's compiled function called directly, or
    None. There the VM is one thunk that reads its input cells, calls that function
    (``vm.jit_fn``) and writes its output cells; called directly on the arguments (the
    shared variables' values read from their cells), nothing is written to the cells
    and nothing needs clearing after, and a tiny function's call costs about half
    (2.6 -> 1.2-1.5 us here). Updates land in their cells as the VM's call would land
    them, and an error is raised as the thunk raises it."""
    jit = getattr(vm, "jit_fn", None)
    cells, produced_cells = getattr(vm, "inputs", None), getattr(vm, "outputs", None)
    if jit is None or cells is None or produced_cells is None:
        return None
    if not (_same(cells, inputs) and _same(produced_cells, outputs)):
        return None  # (not the VM this linker makes: its cells are not the function's)
    explicit = sum(not spec.implicit for spec in fn.maker.inputs)
    implicit = cells[explicit:]  # the shared variables' cells, read at every call
    owners = [out.owner for out in fn.maker.fgraph.outputs if out.owner is not None]
    failed_at = owners[0] if owners else None  # where the VM's own call says it failed

    def run(*args: Any) -> list:
        try:
            if implicit:
                results = jit(*args, *[cell[0] for cell in implicit])
            else:
                results = jit(*args)
        except Exception:
            if failed_at is None:
                raise
            raise_with_op(fn.maker.fgraph, node=failed_at, thunk=vm)
        if cut is not None:
            for i, cell in updated:
                cell[0] = results[i]
            return list(results[:cut])
        return list(results)

    return run


def _same(cells: list, others: list) -> bool:
    """Whether two lists hold the very same cells, in order."""
    return len(cells) == len(others) and all(
        a is b for a, b in zip(cells, others, strict=True))


def _raise_as_pytensor(fn: Any, vm: Any) -> None:
    """Inside the handler of the VM's exception: raise it as ``Function.__call__`` does,
    naming the node that failed where the VM knows it."""
    position = getattr(vm, "position_of_error", None)
    if position is None:
        raise  # noqa: PLE0704 (the VM's exception, being handled by the caller)
    thunks = getattr(vm, "thunks", None)
    raise_with_op(fn.maker.fgraph, node=vm.nodes[position],
                  thunk=None if thunks is None else thunks[position],
                  storage_map=getattr(vm, "storage_map", None))
