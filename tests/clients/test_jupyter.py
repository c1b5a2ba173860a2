"""synkhronos in a real Jupyter kernel: fork, call, interrupt, restart, shut down.

A notebook user's session, through ``jupyter_client`` and ``ipykernel`` (the ``test``
extra), with the kernel started on this interpreter (and this checkout on its
``PYTHONPATH``):

1. a cell forks 2 processes, builds and distributes a small function, and calls it;
2. a cell calls it in an endless loop; the test interrupts the kernel as Jupyter's
   Interrupt button does (SIGINT to the kernel's process group): the cell ends with
   ``KeyboardInterrupt`` and the next cell gets the plain PyTensor function's values;
3. the kernel is restarted hard (SIGKILL to its process group, as Jupyter restarts a
   busy kernel): the workers are gone within seconds and nothing of the session is
   left in ``/dev/shm`` (the session's watcher);
4. the new kernel forks again, calls, and is shut down cleanly: workers gone, nothing
   left.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from ..processes import leader_alive, poll, shm_entries, sweep

jupyter_client = pytest.importorskip("jupyter_client", reason="needs jupyter_client (test extra)")
pytest.importorskip("ipykernel", reason="needs ipykernel (test extra)")

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
GONE_S = 5.0

SETUP = """
import json, os
import numpy as np
import pytensor
import pytensor.tensor as pt
import synkhronos as synk
from synkhronos import testing

testing.skip_backend_preimport()  # nothing here is compiled for Numba
x = pt.dvector("x")
w = pytensor.shared(np.arange(3.0), name="w")
outputs = [pt.sum(x ** 2), x * w.sum()]
plain = pytensor.function([x], outputs, mode="FAST_COMPILE")
synk.fork(2)
f = synk.function([x], [(outputs[0], "sum"), (outputs[1], "gather")], mode="FAST_COMPILE")
synk.distribute()
values = np.linspace(-1.0, 2.0, 13)

def same():
    got, want = f(values), plain(values)
    return all(np.allclose(a, b, rtol=1e-12, atol=0) for a, b in zip(got, want))

print(json.dumps({"pids": testing.run_on_ranks(os.getpid), "prefix": testing.program_prefix(),
                  "same": same()}))
"""

LOOP = """
print("looping", flush=True)
while True:
    f(values)
"""

AFTER = """
print(json.dumps({"same": same(), "state": testing.session_state()}))
"""


class Kernel:
    """One kernel of this interpreter, and what its cells printed."""

    def __init__(self, tmp: Path):
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import KernelManager

        spec = tmp / "kernels" / "synk-test"
        spec.mkdir(parents=True, exist_ok=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "synkhronos test", "language": "python"}))
        self.manager = KernelManager(
            kernel_name="synk-test", connection_file=str(tmp / "connection.json"),
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(tmp / "kernels")]))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        self.manager.start_kernel(env=env, cwd=str(tmp))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 60) -> tuple[dict, str]:
        """Run a cell; its reply's content and its stdout."""
        out: list[str] = []

        def hook(msg: dict) -> None:
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                out.append(msg["content"]["text"])

        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=hook)
        return reply["content"], "".join(out)

    def close(self) -> None:
        self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=True)


def _last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_a_notebook_session(tmp_path):
    kernel = Kernel(tmp_path)
    prefixes: list[str] = []
    workers: list[int] = []
    try:
        reply, out = kernel.run(SETUP, timeout=120)
        assert reply["status"] == "ok", reply
        info = _last_json(out)
        assert info["same"] is True
        prefixes.append(info["prefix"])
        workers += info["pids"][1:]

        # 2. interrupt a loop of calls
        msg_id = kernel.client.execute(LOOP, stop_on_error=False)  # the next cell runs
        deadline = time.monotonic() + 30
        while True:  # the loop runs once the cell has printed
            msg = kernel.client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream"
                    and "looping" in msg["content"]["text"]):
                break
        time.sleep(0.5)
        sent = time.monotonic()
        kernel.manager.interrupt_kernel()
        reply = kernel.client.get_shell_msg(timeout=30)
        took = time.monotonic() - sent
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
        assert took < 2.0, took
        reply, out = kernel.run(AFTER)
        assert reply["status"] == "ok", reply
        assert _last_json(out) == {"same": True, "state": "ready"}

        # 3. restart hard: SIGKILL to the kernel's process group, workers included
        start = time.monotonic()
        kernel.manager.restart_kernel(now=True)
        assert poll(lambda: not any(leader_alive(pid) for pid in workers), GONE_S)
        assert poll(lambda: shm_entries(prefixes[0]) == [], GONE_S), shm_entries(prefixes[0])
        assert time.monotonic() - start < 2 * GONE_S
        kernel.client.wait_for_ready(timeout=60)

        # 4. the new kernel forks again; a clean shutdown leaves nothing
        reply, out = kernel.run(SETUP, timeout=120)
        assert reply["status"] == "ok", reply
        info = _last_json(out)
        assert info["same"] is True
        prefixes.append(info["prefix"])
        second = info["pids"][1:]
        workers += second
        kernel.manager.shutdown_kernel(now=False)
        assert poll(lambda: not any(leader_alive(pid) for pid in second), GONE_S)
        assert poll(lambda: shm_entries(prefixes[1]) == [], GONE_S), shm_entries(prefixes[1])
    finally:
        kernel.close()
        for pid in workers:
            if leader_alive(pid):
                os.kill(pid, 9)
        for prefix in prefixes:
            sweep(prefix)
