"""The MPI layer's own tests: ``synkhronos._machines.mpi`` under ``mpiexec``.

They exercise one private module, as every unit test does, so they live under
``tests/unit`` (the only tests that may import private modules); the test process
itself never forks, its ``mpiexec`` launches do. They skip, saying why, where mpi4py
or an MPI library is missing; ``.ci/mpi.sh`` runs them with ``tests/mpi``, whose
launcher and fixtures they share.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mpi import harness
from tests.mpi.conftest import TRANSPORTS, library, netns  # noqa: F401 (fixtures)

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(scope="module")
def launcher(library, request):  # noqa: F811 (the fixture imported above)
    """``launch(script, *args, transport=..., out=..., ft=False, timeout=60) -> Result``
    for a script of this folder's ``scripts/``."""

    def launch(script, *args, transport, out, ft=False, timeout=60):
        namespaces = request.getfixturevalue("netns") if transport == "netns" else None
        return harness.run(library, str(SCRIPTS / script), *args, transport=transport,
                           out=out, ft=ft, netns=namespaces, timeout=timeout)

    return launch
