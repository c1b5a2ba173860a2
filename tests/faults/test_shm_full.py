"""A segment that does not fit in /dev/shm is refused with a message that says why and
what to do (SPEC section 6), before anything is created; the session goes on.

Two ways, neither of which fills the machine's /dev/shm:

- in this process: requests larger than what ``statvfs`` reports free (a ``synk.data``
  from a shape alone, a ``set_shape`` that grows one, a ``broadcast`` of a zero-stride
  value): the check before creating a segment refuses them;
- a program in a private 64 MiB /dev/shm (Docker's default; ``unshare -m``, root only),
  where a ``synk.data``, a ``set_value`` growth, a staged numpy input and a collective's
  buffers are refused for real (``scripts/small_shm.py``).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.testing import leftover_segments, rank_values, session_state

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(__file__).parent / "scripts" / "small_shm.py"
MARGIN = 4 << 30  # asked beyond what is free: room for other programs freeing meanwhile


def _free() -> int:
    stat = os.statvfs("/dev/shm")
    return stat.f_bavail * stat.f_frsize


def _check_message(exc: OSError, asked: int) -> None:
    message = str(exc)
    assert exc.errno == errno.ENOSPC
    assert f"segment of {asked} bytes" in message, message
    free = int(re.search(r": (\d+) bytes \(.*\) free", message).group(1))
    assert 0 < free < asked
    assert "/dev/shm" in message and "--shm-size" in message, message


def test_a_segment_larger_than_dev_shm_is_refused_and_the_session_goes_on():
    x = pt.dvector("x")
    w = pytensor.shared(np.zeros(3), name="w")
    synk.fork(2)
    try:
        f = synk.function([x], (pt.sum(x) + w.sum(), "sum"), mode="FAST_COMPILE")
        synk.distribute()
        items = (_free() + MARGIN) // 8
        with pytest.raises(OSError) as info:
            synk.data(dtype="float64", shape=(items,))
        _check_message(info.value, items * 8)

        d = synk.data(np.arange(5.0))
        with pytest.raises(OSError) as info:
            d.set_shape((items,))
        _check_message(info.value, items * 8)
        assert d.shape == (5,) and np.array_equal(d.data, np.arange(5.0))

        with pytest.raises(OSError) as info:
            synk.broadcast(w, np.broadcast_to(np.float64(1.0), (items,)))
        assert info.value.errno == errno.ENOSPC and "--shm-size" in str(info.value)

        assert session_state() == "ready"
        synk.broadcast(w, np.arange(3.0))
        assert [v.tolist() for v in rank_values(w)] == [[0.0, 1.0, 2.0]] * 2
        assert f(np.ones(6)) == 6.0 + 2 * 3.0
        sizes = {e: os.stat(os.path.join("/dev/shm", e)).st_size for e in leftover_segments()}
        assert all(size < 1 << 20 for size in sizes.values()), sizes  # none was made
    finally:
        synk.close()


def _can_mount_private_tmpfs() -> str | None:
    """None if this process may run a program in a private /dev/shm, else why not."""
    if os.geteuid() != 0:
        return "needs root to mount a private /dev/shm (unshare -m)"
    if shutil.which("unshare") is None:
        return "no unshare(1) here"
    probe = subprocess.run(["unshare", "-m", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot mount a private /dev/shm: {probe.stderr.strip()}"
    return None


def test_a_docker_sized_dev_shm_refuses_what_does_not_fit():
    why = _can_mount_private_tmpfs()
    if why is not None:
        pytest.skip(why)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH")) if p))
    command = (f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} "
               f"{SCRIPT}")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True,
                          text=True, timeout=100, env=env, start_new_session=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    for name, outcome in result["errors"].items():
        assert outcome[0] is True, (name, outcome)
        assert "free" in outcome[1] and "--shm-size" in outcome[1], (name, outcome)
    assert sorted(result["errors"]) == ["broadcast", "data", "input", "set_value"]
    assert result["checks"] == []
    assert result["left"] == []
