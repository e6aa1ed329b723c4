"""One multilang subprocess: spawn, handshake, framed I/O, stderr, reaping.

A :class:`ShellProcess` owns the child and a sans-IO host
:class:`~multilang.connection.Connection`. It does no routing and no acking;
the task that owns it (the runtime's shell task, or the Spark streaming
source) decides what the events mean. Writes are serialised through
:meth:`ShellProcess.write` (one ``send_all`` at a time, as trio requires);
reads come in bulk through :meth:`read_events`.

The child is reached through a :class:`Transport` (three byte streams, a pid,
an exit status, signals). :func:`spawn_child` starts a real subprocess; a
:class:`StreamTransport` over ``trio.testing.memory_stream_pair`` lets the
supervision rules (§2.4 handshake timeout, §5.2 subprocess timeout, §8.2
restarts) be tested under ``trio.testing.MockClock`` with no process and no
real time.

Readiness is ``nursery.start`` (DESIGN.md style rule 6): :meth:`start` returns
once the child exists and its stderr is being drained. The subprocess timeout
is a cancel scope whose deadline every read moves (:meth:`watch`, rule 8).

Cancellation always reaps the child (DESIGN.md style rule 7, after trio's
``run_process``): :meth:`aclose` closes stdin, waits, sends SIGTERM, waits,
sends SIGKILL and waits, under a shielded scope.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
from collections import deque
from typing import Any, Awaitable, Callable, Protocol

import trio

from multilang.connection import NEED_DATA, Connection, Role, Side, State
from multilang.errors import ComponentCrashed, HeartbeatTimeout, ProtocolError
from multilang.messages import ConnectionClosed, Handshake, Message, Pid

from .conf import ProcessConf

__all__ = ["ShellProcess", "Transport", "Spawn", "spawn_child", "ChildTransport", "StreamTransport"]

_READ_SIZE = 1 << 16
_STDERR_TAIL = 20
_TAIL_LINE = 1000
_PID_FILE_WAIT = 1.0  # seconds a pid file may lag the pid reply before a warning (§2.3)
_SETTLE = 0.5  # seconds an exiting child gets to report its status and last stderr lines

log = logging.getLogger("multilang.shellbolt")


class ShellProcess:
    """A running component process and its connection."""

    def __init__(
        self,
        *,
        component: str,
        task: int,
        role: Role,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        pid_dir: str,
        max_frame_size: int,
    ) -> None:
        self.component = component
        self.task = task
        self.role = role
        self.argv = argv
        self.cwd = cwd
        self.env = env
        self.pid_dir = pid_dir
        self.conn = Connection(role, Side.HOST, max_frame_size=max_frame_size)
        self.proc: trio.Process | None = None
        self.pid: int | None = None
        self.stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL)
        self.last_inbound = trio.current_time()
        self._send_lock = trio.Lock()
        self._pending_error: Exception | None = None
        self._stderr_log = logging.getLogger(f"multilang.component.{component}")

    @property
    def open(self) -> bool:
        """False once the child's stdout closed or broke the protocol: the
        reader is about to raise, so writers must stop sending."""
        return self.conn.state not in (State.CLOSED, State.ERROR)

    async def wait_if_closed(self) -> None:
        if not self.open:
            await trio.sleep_forever()

    # -- identity for errors -------------------------------------------------

    def error(self, cls: type, msg: str) -> Exception:
        """A ComponentError of ``cls`` naming this process, with its context."""
        status = self.proc.returncode if self.proc is not None else None
        if status is not None:
            msg += f" (exit status {status})" if status >= 0 else f" (killed by signal {-status})"
        return cls(
            msg,
            component=self.component,
            task=self.task,
            pid=self.pid or (self.proc.pid if self.proc else None),
            stderr_tail="\n".join(self.stderr_tail),
            last_frames=tuple(self.conn.last_frames),
        )

    # -- lifecycle -----------------------------------------------------------

    async def start(self, conf: dict[str, Any], context: dict[str, Any], timeout: float) -> list[Message]:
        """Spawn and handshake (§2). Returns events that arrived right after
        the pid reply (a spout may emit while opening, §4.4)."""
        try:
            self.proc = await trio.lowlevel.open_process(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.cwd,
                env=self.env,
                # Own session: a Ctrl-C at the terminal reaches only us, and
                # we shut the children down in order (§5.4).
                start_new_session=True,
            )
        except OSError as exc:
            raise self.error(ComponentCrashed, f"could not start {self.argv!r}: {exc}") from None
        data = self.conn.send(Handshake(pid_dir=self.pid_dir, conf=conf, context=context))
        await self.write(data)
        events: list[Message] = []
        with trio.move_on_after(timeout) as scope:
            while True:
                batch = await self.read_events()
                if batch and isinstance(batch[0], Pid):
                    self.pid = batch[0].pid
                    events = batch[1:]
                    break
        if scope.cancelled_caught:
            raise self.error(HeartbeatTimeout, f"no pid reply within the {timeout:g}s handshake timeout (§2.4)")
        if not await self._pid_file_appears():
            log.warning(
                "%s:%d (pid %s) did not create its pid file in %s within %gs of its pid reply (§2.3); continuing",
                self.component, self.task, self.pid, self.pid_dir, _PID_FILE_WAIT,
            )
        return events

    async def _pid_file_appears(self) -> bool:
        """storm.py and storm.rb write the pid file just *after* the pid
        reply: give it a moment before calling it missing (§2.3)."""
        path = os.path.join(self.pid_dir, str(self.pid))
        delay, waited = 0.001, 0.0
        while not os.path.exists(path):
            if waited >= _PID_FILE_WAIT:
                return False
            await trio.sleep(delay)
            waited += delay
            delay = min(delay * 2, 0.1)
        return True

    async def read_events(self) -> list[Message]:
        """Read one chunk and return every complete event in it (maybe none).

        Raises ComponentCrashed on EOF and on any protocol error, with the
        process's identity, last frames and stderr tail."""
        assert self.proc is not None and self.proc.stdout is not None
        if self._pending_error is not None:
            raise self._pending_error
        try:
            data = await self.proc.stdout.receive_some(_READ_SIZE)
        except trio.BrokenResourceError:
            data = b""
        conn = self.conn
        conn.receive_data(data)
        events: list[Message] = []
        take = conn.take_outputs
        try:
            while True:
                plain = take()  # a bolt's emits and acks, in bulk
                if plain is not None:
                    events.append(plain)
                ev = conn.next_event()
                if ev is NEED_DATA:
                    break
                if type(ev) is ConnectionClosed:
                    await self._settle()
                    exc = self.error(ComponentCrashed, "closed its stdout (the process exited or crashed)")
                    if not events:
                        raise exc
                    self._pending_error = exc  # deliver what came before the EOF first
                    break
                events.append(ev)
        except ProtocolError as perr:
            exc = self.error(ComponentCrashed, f"protocol error: {perr}")
            if not events:
                raise exc from None
            self._pending_error = exc  # hand over the good events first
        if events:
            self.last_inbound = trio.current_time()
        return events

    async def write(self, data: bytes) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        async with self._send_lock:
            try:
                await self.proc.stdin.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                await self._settle()
                raise self.error(ComponentCrashed, "stdin closed (the process exited or crashed)") from None

    async def drain_stderr(self) -> None:
        """Log stderr continuously (a chatty child must never block, §8.3)."""
        assert self.proc is not None and self.proc.stderr is not None
        buf = b""
        prefix = f"[{self.component}:{self.task} pid {self.proc.pid}] "
        while True:
            try:
                chunk = await self.proc.stderr.receive_some(_READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                chunk = b""
            if not chunk:
                if buf:
                    self._stderr_line(prefix, buf)
                return
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                self._stderr_line(prefix, line)
            if len(buf) > 65536:  # a line that never ends: log it in pieces
                self._stderr_line(prefix, buf)
                buf = b""

    def _stderr_line(self, prefix: str, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip("\r")
        # The tail goes into error messages: bound each line too.
        self.stderr_tail.append(text if len(text) <= _TAIL_LINE else f"{text[:_TAIL_LINE]}... ({len(text)} characters)")
        self._stderr_log.info("%s%s", prefix, text)

    async def _settle(self) -> None:
        """Give an exiting child a moment so its exit status and last stderr
        lines make it into the error message."""
        if self.proc is not None:
            with trio.move_on_after(0.5):
                await self.proc.wait()
            await trio.sleep(0.01)

    async def aclose(self, grace: float = 2.0, hurry: trio.Event | None = None) -> None:
        """Close stdin (a component exits on EOF, §5.4), then SIGTERM, then
        SIGKILL; always reap. Safe to call twice and under cancellation.
        ``hurry``, once set, cuts every grace short (a second Ctrl-C)."""
        proc = self.proc
        if proc is None:
            return
        with trio.CancelScope(shield=True):
            if proc.returncode is None and proc.stdin is not None:
                try:
                    await proc.stdin.aclose()
                except trio.BrokenResourceError:
                    pass
                await self._wait_exit(grace, hurry)
            if proc.returncode is None:
                self._signal(signal.SIGTERM)
                await self._wait_exit(grace, hurry)
            if proc.returncode is None:
                self._signal(signal.SIGKILL)
                await proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    await stream.aclose()
            try:
                os.unlink(os.path.join(self.pid_dir, str(self.pid)))
            except (OSError, TypeError):
                pass

    async def _wait_exit(self, grace: float, hurry: trio.Event | None) -> None:
        """Wait up to ``grace`` for the child to exit, less once ``hurry`` is set."""
        proc = self.proc
        assert proc is not None
        if hurry is not None and hurry.is_set():
            return
        with trio.move_on_after(grace):
            async with trio.open_nursery() as n:
                async def exited() -> None:
                    await proc.wait()
                    n.cancel_scope.cancel()

                n.start_soon(exited)
                if hurry is not None:
                    await hurry.wait()
                    n.cancel_scope.cancel()

    def kill(self) -> None:
        """SIGKILL now (hung process); the caller still reaps with aclose."""
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            try:
                # The child leads its own session: signal its whole group so
                # a wrapper script's children go too.
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            except PermissionError:
                self.proc.send_signal(sig)

