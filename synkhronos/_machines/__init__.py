"""Several machines: everything a session that spans machines adds, behind the
transport and backend interfaces.

Above this package nothing knows how many machines there are: ``fork()``
(``lifecycle.py``) chooses the transport and meeting here once, and the backends'
factory finds the several-machines collectives by the context (they register on
import). Inside it, by concern:

- ``transport.py``: the master's transport over several machines (``Several``), the
  meeting that spans them (``AcrossMachines``), the ``Data`` writes to the other
  machines' replicas and their leaders' handlers, ``Join``;
- ``link.py``: the link between the machines' leaders (``Machines``), the only holder
  of the communicator: commands and their journal, meeting points, replies, failures;
- ``leader.py``: the loop of a leader on a machine other than the master's;
- ``backend.py``: the collectives within each machine through shared memory, between
  machines through the leaders (``MachinesBackend``);
- ``mpi/``: every MPI call (mpi4py), the launch's detection, the leaders' collectives.
"""
