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
collective messages    ``collectives.fused.HANDLERS``  broadcast, reduce, gather, ...
=====================  =============================  ==============================
"""

from __future__ import annotations

from ._call import Call
from ._core.execute import Handler
from ._core.protocol import Message
from ._shard import run_call
from .collectives.fused import HANDLERS as COLLECTIVE_HANDLERS
from .distribute import Distribute, receive

__all__ = ["TABLE"]

TABLE: dict[type[Message], Handler] = {
    Call: run_call,
    Distribute: receive,
    **COLLECTIVE_HANDLERS,
}
