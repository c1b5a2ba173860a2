"""Unit tests of the collectives' pure parts (never forks): fused layouts, how ranks
split the work, the backend registry, and misuse before ``synk.fork()``."""

from __future__ import annotations

import itertools

import numpy as np
import pytensor
import pytest

import synkhronos as synk
from synkhronos._core.context import RankContext
from synkhronos.collectives import backend
from synkhronos.collectives.backend import ALIGN, FusedLayout
from synkhronos.collectives.cpu import _complement
from synkhronos.collectives.staged import StagedBackend

LAYOUTS = [
    (["float32"], [(1,)]),
    (["float64", "int8", "float16"], [(3, 5), (7,), ()]),
    (["float32", "int32", "complex128"], [(1000,), (0,), (17, 3)]),
    (["float32"] * 4, [(100_003,), (1,), (64,), (33, 33)]),
]


@pytest.mark.parametrize("dtypes, shapes", LAYOUTS)
def test_layout_offsets_are_aligned_and_views_round_trip(dtypes, shapes):
    layout = FusedLayout(dtypes, shapes)
    assert all(offset % ALIGN == 0 for offset in layout.offsets)
    assert layout.total % ALIGN == 0
    assert layout.total >= sum(layout.nbytes)
    buffer = bytearray(layout.total + 128)
    values = [np.arange(np.prod(s, dtype=int)).reshape(s).astype(d)
              for d, s in zip(dtypes, shapes, strict=True)]
    for view, value in zip(layout.views(buffer, base=128), values, strict=True):
        assert view.shape == value.shape and view.dtype == value.dtype
        view[...] = value
    for view, value in zip(layout.views(buffer, base=128), values, strict=True):
        np.testing.assert_array_equal(view, value)


@pytest.mark.parametrize("case, parts", list(itertools.product(LAYOUTS, [1, 2, 3, 4, 7])))
def test_pieces_tile_every_array_once(case, parts):
    layout = FusedLayout(*case)
    pieces = layout.pieces(parts)
    assert len(pieces) == parts
    covered = [np.zeros(size, int) for size in layout.sizes]
    for mine in pieces:
        for index, first, stop in mine:
            assert 0 <= first < stop <= layout.sizes[index]
            covered[index][first:stop] += 1
    assert all((c == 1).all() for c in covered)


def test_pieces_are_balanced_in_bytes():
    layout = FusedLayout(["float32", "float64"], [(1_000_000,), (250_000,)])
    per_part = [sum((stop - first) * layout.dtypes[i].itemsize for i, first, stop in mine)
                for mine in layout.pieces(3)]
    assert max(per_part) - min(per_part) <= 2 * ALIGN


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "int8", "complex128"])
@pytest.mark.parametrize("size", [1, 5, 18, 1000, 100_003])
def test_a_padded_vector_is_cut_into_pieces_of_one_length(size, dtype):
    """even_piece_length: ceil(size / parts) to a whole cache line, and the layout's cut
    of parts * L elements is then exactly [r * L, (r + 1) * L) (what the sharded update
    on the JAX backend relies on)."""
    itemsize = np.dtype(dtype).itemsize
    for parts in (1, 2, 3, 7, 16):
        length = backend.even_piece_length(size, parts, dtype)
        assert length * itemsize % ALIGN == 0
        assert -(-size // parts) <= length < -(-size // parts) + ALIGN // itemsize
        pieces = FusedLayout([dtype], [(parts * length,)]).pieces(parts)
        assert pieces == [[(0, r * length, (r + 1) * length)] for r in range(parts)]
    with pytest.raises(ValueError, match="size and parts >= 1"):
        backend.even_piece_length(0, 2, dtype)


def test_complement_of_ranges():
    assert _complement(10, []) == [(0, 10)]
    assert _complement(10, [(0, 10)]) == []
    assert _complement(10, [(2, 4), (6, 7)]) == [(0, 2), (4, 6), (7, 10)]
    assert _complement(0, []) == []


def _context(device: str) -> RankContext:
    """A one-process context of another device: nothing forks, nothing is created."""
    return RankContext(rank=0, size=1, master_rank=0, prefix="synk_test_", arena=None,
                       control=None, master_pid=0, device=device)


def test_backend_for_a_device_without_backend_names_it():
    with pytest.raises(RuntimeError, match="not implemented for device 'tpu'.*cpu, gpu"):
        backend.BACKEND.get(_context("tpu"))


def test_gpu_backend_is_staged_and_never_pairs():
    """device="gpu" values are device arrays: no group is resident in a host slot and
    the two-process pair path (which rebinds the master's slot in place) is off."""
    ctx = _context("gpu")
    staged = backend.BACKEND.get(ctx)
    assert isinstance(staged, StagedBackend) and staged.device == "gpu"
    assert staged.current(ctx, None) is None


def test_backend_is_one_per_process():
    ctx = _context("cpu")
    assert backend.BACKEND.get(ctx) is backend.BACKEND.get(ctx)
    assert backend.BACKEND.get(ctx).device == "cpu"


@pytest.mark.parametrize("call, name", [
    (lambda v: synk.broadcast(v), "broadcast"),
    (lambda v: synk.scatter(v, [1.0]), "scatter"),
    (lambda v: synk.gather(v), "gather"),
    (lambda v: synk.all_gather(v), "all_gather"),
    (lambda v: synk.reduce(v), "reduce"),
    (lambda v: synk.all_reduce(v), "all_reduce"),
    (lambda v: synk.set_value(0, v, [1.0]), "set_value"),
    (lambda v: synk.get_value(0, v), "get_value"),
    (lambda v: synk.get_lengths(v), "get_lengths"),
    (lambda v: synk.get_shapes(v), "get_shapes"),
])
def test_every_collective_before_fork_says_to_fork(call, name):
    var = pytensor.shared(np.zeros(1), name="w")
    with pytest.raises(RuntimeError, match=rf"synk.fork\(\) must be called before synk.{name}"):
        call(var)


def test_fused_uses_only_what_the_backend_declares():
    """Every attribute ``fused.py`` (the master's steps) and ``ranks.py`` (each rank's
    handlers) read of a backend or a group is declared by ``backend.Backend`` or
    ``backend.Group`` (no backend-specific feature reached by name), and every abstract
    primitive is one they call."""
    import ast
    from pathlib import Path

    from synkhronos.collectives import fused, ranks

    used: dict[str, set] = {"backend": set(), "group": set()}
    for module in (fused, ranks):
        for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in used):
                used[node.value.id].add(node.attr)
    declared_group = backend.Group(0, FusedLayout([], []), [])
    assert used["backend"] and used["group"]
    assert {a for a in used["backend"] if not hasattr(backend.Backend, a)} == set()
    assert {a for a in used["group"] if not hasattr(declared_group, a)} == set()
    unused = backend.Backend.__abstractmethods__ - used["backend"]
    assert unused == set(), f"declared but never called by fused.py or ranks.py: {sorted(unused)}"
