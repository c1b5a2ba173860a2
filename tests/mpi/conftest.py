"""Fixtures for the MPI tests: the MPI library found here, transports, namespaces.

Tests that launch ``mpiexec`` skip, saying why, when mpi4py or an MPI library is
missing (``.ci/mpi.sh`` installs the ``mpi`` extra and runs them); the namespace
transport skips, saying why, where network namespaces cannot be made.
"""

from __future__ import annotations

import os
import shutil

import pytest

from . import harness

TRANSPORTS = ("shm", "tcp", "netns")


@pytest.fixture(scope="session")
def library() -> str:
    reason = harness.unavailable_reason()
    if reason:
        pytest.skip(reason)
    return harness.mpi_library()


@pytest.fixture(scope="session")
def netns():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            pytest.skip(f"network namespaces need the '{tool}' command, not found")
    try:
        return harness.Netns.shared()  # deleted at exit (tests/unit/mpi takes it too)
    except RuntimeError as exc:
        pytest.skip(f"network namespaces cannot be made here: {exc}")


@pytest.fixture(scope="module")
def launcher(library, request):
    """``launch(script, *args, transport=..., out=..., ft=False, timeout=60) -> Result``."""

    def launch(script, *args, transport, out, ft=False, timeout=60):
        namespaces = request.getfixturevalue("netns") if transport == "netns" else None
        return harness.run(library, script, *args, transport=transport, out=out, ft=ft,
                           netns=namespaces, timeout=timeout)

    return launch
