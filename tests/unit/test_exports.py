"""What the package exports: the contract's names, each real and documented.

Trio's ``test_exports`` is the model: a public name that appears or disappears by
accident is a change to the contract, so the list is written out here.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

import synkhronos as synk

CONTRACT = {  # SPEC.md sections 2-7, and the public helper modules
    "fork", "close", "n_parallel", "device", "master_rank", "get_n_gpu",
    "function", "Function", "distribute", "data", "Data",
    "broadcast", "scatter", "gather", "all_gather", "reduce", "all_reduce",
    "set_value", "get_value", "get_lengths", "get_shapes",
    "profile", "Profile", "steps",
    "SynkhronosError", "WorkerError", "WorkerDiedError", "WorkerTimeoutError",
}

PUBLIC_MODULES = ["synkhronos", "synkhronos.testing", "synkhronos.steps",
                  "synkhronos.errors", "synkhronos.extensions",
                  "synkhronos.extensions.updates", "synkhronos.extensions.train",
                  "synkhronos.extensions.conv", "synkhronos.data"]


def test_top_level_names_are_the_contracts():
    assert set(synk.__all__) == CONTRACT
    assert len(synk.__all__) == len(set(synk.__all__))


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_exported_name_exists_and_is_documented(module):
    mod = importlib.import_module(module)
    assert mod.__doc__ and mod.__doc__.strip(), f"{module} has no docstring"
    for name in mod.__all__:
        assert not name.startswith("_"), f"{module} exports the private {name}"
        obj = getattr(mod, name)  # raises if it does not exist
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert obj.__doc__, f"{module}.{name} has no docstring"


def test_the_original_names_stay_importable():
    """The original Synkhronos' programs import these (renamed theano -> pytensor)."""
    from synkhronos.extensions import updates
    from synkhronos.extensions.train import make_train_function, make_train_function_theano

    for name in ("flatten_vars", "vars_flat_size", "unflatten_vars", "flat_unflat_grads",
                 "nonflat_grads", "apply_momentum", "apply_nesterov_momentum", "sgd_nonflat",
                 "sgd", "momentum", "nesterov_momentum", "adagrad", "rmsprop", "adadelta",
                 "adam", "adamax"):
        assert callable(getattr(updates, name)), name
    assert callable(make_train_function) and callable(make_train_function_theano)
    assert synk.Function.as_theano is synk.Function.as_pytensor
