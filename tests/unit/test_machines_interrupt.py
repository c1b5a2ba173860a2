"""Ctrl-C in the master's link to the other machines (``Machines``), on a stand-in link.

Every status round between machines is the same collective, in the same order, on
every leader (``_machines/link.py``); a master interrupted there must still take part
in each round the other leaders take part in, with the codes that keep them in step:

- at a meeting point, or at the end of a command, Ctrl-C raises at once and leaves the
  round posted; the next ``finish`` waits for that same round (it posts no second one)
  and then ends the command with the others;
- from ``exchange`` to the end of the transfers after it (``end_transfers``), Ctrl-C
  waits, and is raised once they are over; a wait that it finds past
  ``INTERRUPT_GRACE`` breaks the link instead, with a note saying so.

The stand-in completes each round after a few polls with the other machine's code
from a script, delivers SIGINT (``signal.raise_signal``, to the session's handler)
inside the waits the test names, and never completes the ones it calls stuck. No MPI,
no fork.
"""

from __future__ import annotations

import signal
import time
import types

import numpy as np
import pytest

from synkhronos._machines import link as link_module
from synkhronos._machines.link import Machines
from synkhronos._runtime.remote import BarrierAborted

from .test_interruption import session_handlers

HERE, ENDED = 0, 2  # the status codes (``_HERE_YES``, ``_ENDED``)


class Link:
    """Stands in for the leaders' communicator (machine 0 of 2): status rounds and
    transfers, named ``round<k>`` and ``transfer<k>`` in the order posted."""

    def __init__(self, others: list[int], interrupt: tuple[str, ...] = (),
                 stuck: tuple[str, ...] = ()):
        self.rank, self.size = 0, 2
        self.hosts, self.pids = ("a", "b"), (10, 20)
        self.local_sizes, self.offsets, self.total = (1, 1), (0, 1), 2
        self.timeout = None
        self.liveness = None
        self.broken: str | None = None
        self.others = list(others)  # the other machine's code in each status round
        self.interrupt = set(interrupt)  # waits during which Ctrl-C comes
        self.stuck = set(stuck)  # operations that never complete
        self.posted: list[int] = []  # this machine's code in each status round
        self.transfers = 0
        self.waits: list[str] = []  # every wait, by operation, in order

    def check_usable(self) -> None:
        assert self.broken is None, self.broken

    def post_all_gather_fixed(self, record: np.ndarray):
        self.check_usable()
        name = f"round{len(self.posted)}"
        self.posted.append(int(record[:8].view(np.int64)[0]))
        every = np.zeros((2,) + record.shape, record.dtype)
        every[0] = record
        every[1, :8] = np.frombuffer(np.int64(self.others.pop(0)).tobytes(), np.uint8)
        return name, every

    def all_gather_fixed(self, record: np.ndarray, timeout=None):
        request, every = self.post_all_gather_fixed(record)
        self.wait([request], "status", keep=[record, every])
        return every

    def broadcast(self, buffer, root=0):
        self.check_usable()
        name = f"transfer{self.transfers}"
        self.transfers += 1
        self.wait([name], "a transfer")
        return buffer

    def wait(self, requests, what, *, timeout=None, spin=None, keep=(),
             interruptible=False):
        try:
            for request in requests:
                self.waits.append(request)
                for polls in range(100_000):
                    if self.liveness is not None:
                        self.liveness()
                    if request in self.interrupt:
                        self.interrupt.discard(request)
                        signal.raise_signal(signal.SIGINT)
                    if polls >= 3 and request not in self.stuck:
                        break
                    time.sleep(0.002)
        except BaseException as exc:
            if interruptible and isinstance(exc, KeyboardInterrupt):
                raise  # (as Leaders.wait: the request stays posted)
            self.broken = f"{what} was interrupted"
            raise


def link_machines(link: Link) -> Machines:
    machines = Machines(link)  # type: ignore[arg-type]
    machines.set_liveness(lambda: None)
    machines.owed = True  # inside a command the master sent
    return machines


def test_ctrl_c_at_a_meeting_point_leaves_the_round_to_finish():
    link = Link(others=[HERE, ENDED], interrupt=("round0",))
    machines = link_machines(link)
    with session_handlers():
        with pytest.raises(KeyboardInterrupt):
            machines.meet(True)
        assert link.posted == [HERE] and machines.owed
        assert machines.finish() is not None  # (the master gets the replies)
    # the meeting's round was waited for again, not posted twice; then one round
    # with "ended", which the other machine, ending too, answered alike
    assert link.posted == [HERE, ENDED]
    assert link.waits == ["round0", "round0", "round1"]
    assert not machines.owed and link.broken is None


def test_ctrl_c_while_the_master_waits_at_the_end_is_taken_up_by_the_next_finish():
    link = Link(others=[HERE, HERE, ENDED], interrupt=("round0", "round1"))
    machines = link_machines(link)
    with session_handlers():
        for _ in range(2):  # and a second Ctrl-C in the next command's wait
            with pytest.raises(KeyboardInterrupt):
                machines.finish()
            assert machines.owed
        machines.finish()
    assert link.posted == [ENDED, ENDED, ENDED]  # one round each, none twice
    assert link.waits == ["round0", "round0", "round1", "round1", "round2"]
    assert not machines.owed


def test_ctrl_c_during_a_transfer_is_raised_once_it_is_over():
    link = Link(others=[HERE, ENDED], interrupt=("round0", "transfer0"))
    machines = link_machines(link)
    with session_handlers():
        machines.exchange()  # Ctrl-C came inside its round: held
        machines.broadcast(np.zeros(3))  # and inside the transfer: held
        with pytest.raises(KeyboardInterrupt):
            machines.end_transfers()
        assert link.broken is None and machines.owed
        machines.finish()
    assert link.posted == [HERE, ENDED] and link.transfers == 1
    assert not machines.owed


def test_ctrl_c_held_past_the_grace_breaks_the_link_with_a_note(monkeypatch):
    monkeypatch.setattr(link_module, "INTERRUPT_GRACE", 0.05)
    link = Link(others=[HERE], interrupt=("round0",), stuck=("round0",))
    machines = link_machines(link)
    with session_handlers():
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt) as raised:
            machines.exchange()  # the other machine never comes
        assert time.monotonic() - start < 5.0
        machines.end_transfers()  # nothing held any more
    assert link.broken is not None
    assert "did not end within 0.05 s" in raised.value.__notes__[0]
    assert "session is broken" in raised.value.__notes__[0]


def test_an_exchange_another_machine_ended_before_raises_after_a_held_ctrl_c():
    """The other machine failed before the exchange: no transfer follows, so the held
    Ctrl-C is raised at once, as ``BarrierAborted`` would have been."""
    link = Link(others=[ENDED], interrupt=("round0",))
    machines = link_machines(link)
    with session_handlers():
        with pytest.raises(KeyboardInterrupt):
            machines.exchange()
    link2 = Link(others=[ENDED])
    with pytest.raises(BarrierAborted):
        link_machines(link2).exchange()


def test_a_command_sent_is_owed_whatever_interrupts_it():
    link = Link(others=[], interrupt=("send",))
    sent: list[object] = []

    def broadcast_object(obj=None, **kwargs):
        sent.append(obj)
        link.wait(["send"], "sending a command")
        return obj

    link.broadcast_object = broadcast_object  # type: ignore[attr-defined]
    machines = Machines(link)  # type: ignore[arg-type]
    machines.set_liveness(lambda: None)
    with session_handlers():
        with pytest.raises(KeyboardInterrupt):  # held while it went, raised after
            machines.begin(types.SimpleNamespace(), ())
    assert machines.owed and len(sent) == 1 and link.broken is None
