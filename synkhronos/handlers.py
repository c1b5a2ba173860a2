"""The handler table: every kind of command, and the function each rank runs for it.

One explicit table, built here and handed to the session and to every worker by
``fork()``: nothing registers itself by being imported. The core's own messages
(``Ping``, ``RunCallable``, ``Sequence``) are the executor's; the rest belong to the
layers that define them:

=====================  =============================  ==============================
message                handler                        owner
=====================  =============================  ==============================
``Call``               ``_shard.run_call``            function calls
``Distribute``         ``distribute.receive``         shipping compiled functions
collective messages    ``collectives.ranks.HANDLERS``  broadcast, reduce, gather, ...
``Join``               ``_machines.transport.join``    several machines
=====================  =============================  ==============================

``LANES`` names, per message type, a worker's shortcut for a command that repeats the
last one (``Executor.lanes``): ``_shard.lane`` for a call in a training loop,
``collectives.ranks.reduce_lane`` for an ``all_reduce`` between steps (with
``exchange=`` or not).

Over several machines, two more tables serve the leaders of the other machines
(``_machines.leader``): ``LEADERS_ONLY``, the messages for them alone (a ``Data`` write
to each machine's replica: ``_machines.transport.LEADERS_ONLY_HANDLERS``), and ``PREPARE``,
what a leader does with a command before its workers see it (``distribute.prepare``: this machine
unpickles and compiles the functions once, before its workers load them).
"""

from __future__ import annotations

from ._call import Call
from ._core.execute import Handler, Lane
from ._core.protocol import Message
from ._machines.transport import HANDLERS as MACHINE_HANDLERS
from ._machines.transport import LEADERS_ONLY_HANDLERS
from ._shard import lane, run_call
from .collectives.fused import AllReduce, LowPrecisionReduce
from .collectives.ranks import HANDLERS as COLLECTIVE_HANDLERS
from .collectives.ranks import reduce_lane
from .distribute import Distribute, prepare, receive

__all__ = ["TABLE", "LANES", "LEADERS_ONLY", "PREPARE"]

TABLE: dict[type[Message], Handler] = {
    Call: run_call,
    Distribute: receive,
    **COLLECTIVE_HANDLERS,
    **MACHINE_HANDLERS,
}

LANES: dict[type[Message], Lane] = {  # a worker's shortcut for a command repeated
    Call: lane,
    AllReduce: reduce_lane,
    LowPrecisionReduce: reduce_lane,
}

LEADERS_ONLY: dict[type[Message], Handler] = dict(LEADERS_ONLY_HANDLERS)

PREPARE: dict[type[Message], Handler] = {
    Distribute: prepare,
}
