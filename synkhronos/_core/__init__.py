"""The engine: what a command is, who runs it, and how the master drives the ranks.

- ``protocol``: the typed messages every command carries, and failures as data;
- ``context``: ``RankContext``, each process's typed state, and ``RankVar``, the
  per-process state upper layers declare;
- ``execute``: one command on one rank -> a reply or a failure (the master's own
  share and the worker loop run the same function);
- ``session``: the master-only ``Session``: post, run its own share, wait, collect.

It knows nothing of PyTensor: upper layers register handlers for their messages in
one explicit table (``synkhronos/handlers.py``).
"""
