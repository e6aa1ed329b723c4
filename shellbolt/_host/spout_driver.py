"""Commands to one spout process and the syncs that answer them (spec/PROTOCOL.md §4).

The one spout driver: the runtime's shell spout tasks and the Spark streaming
source both talk to their spout process through it.

    driver = SpoutDriver(proc, handle)
    nursery.start_soon(driver.serve)      # the reader: every frame to handle(), syncs counted
    await driver.command(Activate())      # §4.1: always first; returns at its sync
    await driver.command(Next())
    await driver.command(Next(), Next())  # pipelined: only to a spout that accepted batch (§9.5)

``serve`` reads the process's stdout for as long as it lives: each chunk's
frames go to ``handle`` in order, without their syncs, and only then are the
syncs counted, so what a command brought has been handed on (and an emit
that wants task ids answered, §4.3) when the command returns. A frame that
comes after a command's sync (a spout may emit while idle, §4.4) is handed
on the same way. ``due`` is the watchdog's (``ShellProcess.watch``): since
when a sync is due, None between commands (§5.2).
"""

from __future__ import annotations

from typing import Awaitable, Callable

import trio

from multilang.connection import State
from multilang.errors import ComponentCrashed, ComponentError, ProtocolError
from multilang.messages import Activate, Message, Sync

from .process import ShellProcess

__all__ = ["SpoutDriver"]


class SpoutDriver:
    """One spout process's commands, one sync back per command (§4.2).

    ``handle(events)`` gets the frames of each chunk read, syncs left out, in
    order; it answers emits that want task ids before it returns (§4.3).
    ``worked`` turns true once a command other than ``activate`` was
    answered: a process that never answered one is a crash loop's
    (``RestartPolicy``)."""

    def __init__(self, proc: ShellProcess, handle: Callable[[list[Message]], Awaitable[None]]) -> None:
        self.proc = proc
        self._handle = handle
        self.worked = False
        self._since: float | None = None  # a sync is due since then (the last write, or the last sync)
        self._owed = 0  # syncs still due for the commands of the last write
        self._on_sync: Callable[[int], None] | None = None
        self._answered: trio.Event | None = None
        self._lost: Exception | None = None

    def due(self) -> float | None:
        """Since when a sync is due, or None (the watchdog's question, §5.2)."""
        return self._since

    async def command(self, *cmds: Message, on_sync: Callable[[int], None] | None = None) -> None:
        """Write ``cmds`` in one write and return when each has its sync: one
        command (§4.2), or several pipelined to a spout that accepted
        ``batch`` (§9.5). ``on_sync(n)``: ``n`` more of them were answered
        (called before the next frame is read). Raises the process's
        :class:`ComponentError` if it is lost first, or was lost before."""
        proc = self.proc
        if self._lost is not None:
            raise self._lost
        await proc.wait_if_closed()
        if proc.conn.state is not State.IDLE:
            raise proc.error(ComponentCrashed, "connection is not usable")
        try:
            data = b"".join([proc.conn.send(c) for c in cmds])
        except ProtocolError as exc:  # our bug, or a message id that is not JSON
            raise proc.error(ComponentCrashed, f"cannot send {cmds[0]!r}: {exc}") from None
        self._answered = done = trio.Event()
        self._owed = len(cmds)
        self._on_sync = on_sync
        self._since = trio.current_time()
        await proc.write(data)
        await done.wait()
        self._since = None
        if self._lost is not None and self._owed:
            raise self._lost
        if type(cmds[0]) is not Activate:
            self.worked = True

    async def serve(self) -> None:
        """Read frames until the process is lost; raises how (a
        :class:`ComponentError`), after waking a command waiting for its sync."""
        proc = self.proc
        try:
            while True:
                events = await proc.read_events()
                syncs = sum(1 for ev in events if type(ev) is Sync)
                if syncs:
                    events = [ev for ev in events if type(ev) is not Sync]
                if events:
                    await self._handle(events)
                if syncs:
                    self._synced(syncs)
        except ComponentError as err:
            self.lose(err)
            raise

    def lose(self, err: Exception) -> None:
        """The process is lost (``err``, a :class:`ComponentError`; or
        whatever stopped a reader running elsewhere): a command waiting for
        its sync raises it, and so does every later one."""
        if self._lost is None:
            self._lost = err
        if self._answered is not None:
            self._answered.set()

    def _synced(self, n: int) -> None:
        # (never more than owed: the connection refuses a sync no command is owed, §4.2)
        self._owed -= n
        if self._on_sync is not None:
            self._on_sync(n)
        if self._owed > 0:
            self._since = trio.current_time()  # progress: the watchdog waits for the next one
        elif self._answered is not None:
            self._answered.set()
            self._answered = None
