"""Mechanism under synkhronos: processes, shared memory, the control block, waits.

Everything here uses only the standard library, numpy and posix_ipc: it never imports
pytensor or the layers above, so it can be tested and reasoned about on its own.
"""
