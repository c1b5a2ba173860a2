"""What a failing, dying or stopped worker looks like from the master."""

import os
import signal
import time

import numpy as np
import pytensor.tensor as pt
from pytensor.raise_op import Assert

import synkhronos as synk


def worker_pids() -> list[int]:
    """This process's children (the workers), from /proc."""
    pid = os.getpid()
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def my_segments() -> list[str]:
    """Shared-memory entries of this program: synk_<pid>_<token>_..."""
    return [e for e in os.listdir("/dev/shm") if f"synk_{os.getpid()}_" in e]


# -- 1. an exception in one process: WorkerError, and the session stays usable --------
synk.fork(3)
x = pt.dmatrix("x")
checked = Assert("negative value in x")(x, pt.all(x >= 0))
total = synk.function(inputs=[x], outputs=(checked.sum(), "sum"))
synk.distribute()

data = np.ones((9, 2))
data[4, 0] = -1.0  # row 4 is in rank 1's block (rows 3-5)
try:
    total(data)
except synk.WorkerError as exc:
    print(f"WorkerError: {str(exc).splitlines()[0]}")  # (PyTensor 2.38 adds the node)
    print(f"  rank={exc.rank} exc_type={exc.exc_type}")
    cause = [line for line in exc.remote_traceback.splitlines() if line.startswith("Assert")]
    print("  from the remote traceback:", cause[-1])
    assert exc.rank == 1 and exc.exc_type == "AssertionError"
print("next call:", total(np.ones((9, 2))))  # every process is back in step

# -- 2. a worker dies: WorkerDiedError at once, and on every later call ---------------
os.kill(worker_pids()[0], signal.SIGKILL)
start = time.monotonic()
try:
    total(np.ones((9, 2)))
except synk.WorkerDiedError as exc:
    elapsed = time.monotonic() - start
    print(f"WorkerDiedError after {elapsed:.2f} s: {exc}")
    assert elapsed < 2.0
try:
    total(np.ones((9, 2)))
except synk.WorkerDiedError:
    print("the session stays broken until close()")
synk.close()
assert my_segments() == []

# -- 3. a stopped worker: WorkerTimeoutError once the timeout has passed --------------
synk.fork(2, timeout=1.0)  # or SYNK_TIMEOUT=1 in the environment
double = synk.function(inputs=[x], outputs=(2 * x, "gather"))
synk.distribute()
os.kill(worker_pids()[0], signal.SIGSTOP)
start = time.monotonic()
try:
    double(np.ones((4, 2)))
except synk.WorkerTimeoutError as exc:
    print(f"WorkerTimeoutError after {time.monotonic() - start:.1f} s: {exc}")
synk.close()  # kills the stopped worker and sweeps its segments
assert my_segments() == [] and worker_pids() == []
print("closed: no worker and no /dev/shm segment left")
