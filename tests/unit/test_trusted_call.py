"""``_pytensor.trusted_call``: a compiled function's trusted call without
``Function.__call__``, checked against that call on the same function."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos import _pytensor


def _compiled(updates: bool = False, trusted: bool = True):
    x = pt.matrix("x", dtype="float64")
    w = pytensor.shared(np.zeros(3), name="w")
    outputs = [(x * 2.0).sum(axis=0), x.max()]
    fn = pytensor.function([x], outputs, updates=[(w, w + outputs[0])] if updates else None)
    fn.trust_input = trusted
    return fn, w


@pytest.mark.parametrize("updates", [False, True])
def test_outputs_and_updates_equal_the_functions_own_call(updates):
    direct_fn, direct_w = _compiled(updates)
    plain_fn, plain_w = _compiled(updates)
    run = _pytensor.trusted_call(direct_fn)
    assert run is not direct_fn
    for k in range(3):
        x = np.arange(12.0).reshape(4, 3) + k
        got, want = run(x), plain_fn(x)
        assert type(got) is list and len(got) == len(want) == 2
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(direct_w.get_value(), plain_w.get_value())
    if updates:
        assert direct_w.get_value().any()


def test_a_single_output_comes_back_in_a_list():
    x = pt.vector("x")
    fn = pytensor.function([x], x + 1.0)
    fn.trust_input = True
    assert [a.tolist() for a in _pytensor.trusted_call(fn)(np.zeros(2))] == [[1.0, 1.0]]


def test_no_reference_to_the_arguments_stays(gc_of_this_test):
    fn, _ = _compiled()
    run = _pytensor.trusted_call(fn)
    x = np.ones((4, 3))
    ref = weakref.ref(x)
    run(x)
    del x
    gc.collect()
    assert ref() is None


def test_an_error_is_raised_as_the_functions_own_call_raises_it():
    a, b = pt.vector("a"), pt.vector("b")
    fn = pytensor.function([a, b], a + b)
    fn.trust_input = True
    with pytest.raises(ValueError) as want:
        fn(np.ones(3), np.ones(4))
    with pytest.raises(ValueError) as got:
        _pytensor.trusted_call(fn)(np.ones(3), np.ones(4))
    assert str(got.value).splitlines()[0] == str(want.value).splitlines()[0]


def test_a_function_that_checks_its_inputs_is_called_as_it_is():
    fn, _ = _compiled(trusted=False)
    assert _pytensor.trusted_call(fn) is fn


def test_the_input_cells_are_cleared_after_an_error():
    """PyTensor's own call leaves a failed call's arguments in its input cells; the
    trusted call clears them (Data views must not outlive a freed segment there)."""
    a, b = pt.vector("a"), pt.vector("b")
    fn = pytensor.function([a, b], a + b)
    fn.trust_input = True
    with pytest.raises(ValueError):
        _pytensor.trusted_call(fn)(np.ones(3), np.ones(4))
    assert all(c.storage[0] is None for c in fn.input_storage if c.required)


class _CountingVM:
    """A compiled function's VM that counts its runs (its cells and compiled graph as
    the VM's own)."""

    def __init__(self, vm):
        self.vm, self.runs = vm, 0
        self.jit_fn, self.inputs, self.outputs = vm.jit_fn, vm.inputs, vm.outputs
        self.allow_gc = vm.allow_gc

    def __call__(self):
        self.runs += 1
        return self.vm()


@pytest.mark.parametrize("updates", [False, True])
def test_on_a_jit_backend_the_compiled_graph_is_called_without_the_vm(updates):
    fn, w = _compiled(updates)
    plain_fn, plain_w = _compiled(updates)
    if getattr(fn.vm, "jit_fn", None) is None:
        pytest.skip("PyTensor's default backend here is not a JIT one (its C VM runs)")
    fn.vm = _CountingVM(fn.vm)
    run = _pytensor.trusted_call(fn)
    for k in range(2):
        x = np.arange(12.0).reshape(4, 3) + k
        for a, b in zip(run(x), plain_fn(x), strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(w.get_value(), plain_w.get_value())
    assert fn.vm.runs == 0
    assert all(c.storage[0] is None for c in fn.input_storage if c.required)
