"""The original Synkhronos' arguments to ``fork``, each in a session of its own."""

from __future__ import annotations

import warnings

import pytest

import synkhronos as synk


def test_fork_takes_the_originals_arguments():
    assert isinstance(synk.get_n_gpu(), int)
    assert synk.fork(1, False) == 1  # fork(n_parallel, use_gpu) positionally
    assert synk.device() == "cpu"
    synk.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        synk.fork(1, use_gpu=False, profile_workers=True, max_n_var=10, max_dim=4)
    synk.close()
    messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert len(messages) == 3 and all("no longer needed" in m for m in messages)
    if synk.get_n_gpu() == 0:
        with pytest.raises(RuntimeError, match="device='gpu'"):
            synk.fork(1, True)
    with pytest.raises(TypeError, match="device or use_gpu, not both"):
        synk.fork(1, "gpu", use_gpu=False)
