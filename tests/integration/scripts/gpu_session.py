"""A device="gpu" session on JAX's CPU platform, end to end, in its own process.

Run as its own process (a master that ran JAX cannot fork again, which the end of this
script checks). Argument: n_parallel. Prints "ok" when every check passed.
"""

import os
import sys

os.environ["SYNKHRONOS_GPU_PLATFORM"] = "cpu"

import numpy as np  # noqa: E402
import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402
import pytest  # noqa: E402

import synkhronos as synk  # noqa: E402
from synkhronos.extensions.train import make_train_function  # noqa: E402
from synkhronos.testing import run_on_ranks  # noqa: E402


def value_kind(var_name):
    """Run in every process: the type of a distributed shared variable's value."""
    import gc

    for obj in gc.get_objects():
        if isinstance(obj, pytensor.compile.sharedvalue.SharedVariable) and obj.name == var_name:
            return type(obj.container.storage[0]).__module__.split(".")[0]
    return None


SESSION_ENV = ("JAX_PLATFORMS", "XLA_FLAGS", "XLA_PYTHON_CLIENT_PREALLOCATE",
               "CUDA_VISIBLE_DEVICES")
environment = {name: os.environ.get(name) for name in SESSION_ENV}

n = synk.fork(int(sys.argv[1]), device="gpu")
assert os.environ["JAX_PLATFORMS"] == "cpu" and "eigen=false" in os.environ["XLA_FLAGS"]
assert synk.device() == "gpu" and synk.n_parallel() == n

x, t = pt.dmatrix("x"), pt.dvector("t")
w = pytensor.shared(np.linspace(-1.0, 1.0, 3), name="w_gpu")
loss = ((x.dot(w) - t) ** 2).mean()
grad = pytensor.grad(loss, w)
f = synk.function([x, t], [loss, (x.dot(w), "gather"), (grad, "sum")],
                  updates=[(w, w - 0.1 * grad)])
with pytest.raises(ValueError, match="compiles every function with PyTensor's JAX backend"):
    synk.function([x], x.sum(), mode="NUMBA")
synk.distribute()
# the parameters live on the device from the start, in every process
assert run_on_ranks(value_kind, "w_gpu") == ["jaxlib"] * n, run_on_ranks(value_kind, "w_gpu")

rng = np.random.default_rng(0)
rows, targets = rng.normal(size=(23, 3)), rng.normal(size=23)
plain = pytensor.function([x, t], [loss, x.dot(w), grad], mode="JAX")
before = plain(rows, targets)
out = f(rows, targets)
assert all(type(o) is np.ndarray for o in out)  # back on the host, once
np.testing.assert_allclose(out[0], before[0], rtol=1e-12)
np.testing.assert_allclose(out[1], before[1], rtol=1e-12)
# each process summed the gradient of its rows' mean: their weighted sum is n * grad
shares = [hi - lo for lo, hi in synk.testing.split_bounds(23, n)]
assert np.isfinite(out[2]).all() and len(shares) == n
after_w = np.asarray(w.get_value())
np.testing.assert_allclose(
    after_w, np.linspace(-1.0, 1.0, 3) - 0.1 * np.asarray(
        pytensor.function([x, t], grad, mode="JAX", givens=[(w, pytensor.shared(
            np.linspace(-1.0, 1.0, 3)))])(rows[: shares[0]], targets[: shares[0]])),
    rtol=1e-12)  # the master's update used its own rows only: updates are local

# collectives on device values: every process ends with the mean, as device arrays
synk.all_reduce(w)
values = [np.asarray(v) for v in synk.gather(w, nd_up=1)]
np.testing.assert_allclose(values[0], values[-1], rtol=1e-12)
assert run_on_ranks(value_kind, "w_gpu") == ["jaxlib"] * n
synk.broadcast(w, np.zeros(3))
np.testing.assert_array_equal(synk.get_value(n - 1, w), np.zeros(3))

# the training step: unsharded on a device by default; sharded=True (pieces of one
# length) takes the same steps
p = pytensor.shared(np.zeros(3), name="p_gpu")
train = make_train_function(((x.dot(p) - t) ** 2).mean(), [p], [x, t], "sgd",
                            learning_rate=0.1)
assert not train.sharded
q = pytensor.shared(np.zeros(3), name="q_gpu")
sharded = make_train_function(((x.dot(q) - t) ** 2).mean(), [q], [x, t], "sgd",
                              sharded=True, learning_rate=0.1)
assert sharded.sharded
p_serial = np.zeros(3)
for _ in range(3):
    train(rows, targets)
    sharded(rows, targets)
    p_serial = p_serial - 0.1 * 2 * rows.T.dot(rows.dot(p_serial) - targets) / len(rows)
for var in (p, q):
    np.testing.assert_allclose(np.asarray(var.get_value()), p_serial, rtol=1e-10)
    np.testing.assert_allclose(synk.get_value(n - 1, var), p_serial, rtol=1e-10)
assert run_on_ranks(value_kind, "q_gpu") == ["jaxlib"] * n  # device values throughout
synk.close()
# the master's environment as it was: programs started now see what they would have
assert {name: os.environ.get(name) for name in SESSION_ENV} == environment

# the master ran JAX: it cannot fork again, and says why
with pytest.raises(RuntimeError, match="earlier device='gpu' session"):
    synk.fork(2, device="gpu")
print("ok")
