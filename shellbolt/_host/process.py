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
``run_process``): :meth:`aclose` closes stdin, waits (reading and dropping
what the child still writes), sends SIGTERM, waits, sends SIGKILL and waits,
under a shielded scope.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
from collections import deque
from typing import Any, Awaitable, Callable, Protocol, Sequence

import trio

from multilang.connection import NEED_DATA, Connection, Role, Side, State
from multilang.errors import ComponentCrashed, HeartbeatTimeout, ProtocolError
from multilang.messages import ConnectionClosed, Handshake, Message, Pid, TaskIds

from .._model.conf import ProcessConf
from .._observe.ratelog import LineBudget
from . import scratch
from .pids import group, start_time

_STDERR = {"stream": "stderr"}

__all__ = ["ShellProcess", "Transport", "Spawn", "spawn_child", "ChildTransport", "StreamTransport"]

_READ_SIZE = 1 << 16
_STDERR_TAIL = 20
_TAIL_LINE = 1000
_PID_FILE_WAIT = 1.0  # seconds a pid file may lag the pid reply before a warning (§2.3)
_SETTLE = 0.5  # seconds an exiting child gets to report its status and last stderr lines
_LATE_SECS = 1.0  # a subprocess timeout found this late: the host did not run at the deadline
_CONFIRM_SECS = 0.1  # ... and it looks again this much later, before the kill

log = logging.getLogger("multilang.shellbolt")


# --- the transport: how a ShellProcess reaches its child --------------------------------------


class Transport(Protocol):
    """A child as a :class:`ShellProcess` sees it: stdin, stdout and stderr as
    trio streams, a pid, an exit status, and signals."""

    pid: int
    stdin: trio.abc.SendStream
    stdout: trio.abc.ReceiveStream
    stderr: trio.abc.ReceiveStream

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def signal(self, sig: int) -> None: ...


#: ``await spawn(argv, cwd, env)``: start a child, return its transport.
Spawn = Callable[[list[str], "str | None", dict[str, str]], Awaitable[Transport]]


class ChildTransport:
    """A real subprocess (``trio.Process``) as a :class:`Transport`."""

    def __init__(self, proc: trio.Process) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.process = proc
        self.pid = proc.pid
        self.stdin = proc.stdin
        self.stdout = proc.stdout
        self.stderr = proc.stderr

    def batch_scheduling(self) -> None:
        """Put the process under SCHED_BATCH (Linux; elsewhere nothing): as a
        CPU-bound task, it does not preempt the one that woke it (the host,
        handing it tuples) but waits for the next scheduling point. Its
        share of the CPU is unchanged."""
        try:
            os.sched_setscheduler(self.pid, os.SCHED_BATCH, os.sched_param(0))
        except (AttributeError, OSError):
            pass  # not Linux, or gone already: it runs as it is

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def wait(self) -> int:
        return await self.process.wait()

    def signal(self, sig: int) -> None:
        if self.process.returncode is not None:
            return
        try:
            # The child leads its own session: signal its whole group so
            # a wrapper script's children go too.
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            self.process.send_signal(sig)


async def spawn_child(argv: list[str], cwd: str | None, env: dict[str, str]) -> ChildTransport:
    """Start ``argv`` with piped stdio in a session of its own (the default :data:`Spawn`)."""
    proc = await trio.lowlevel.open_process(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
        # Own session: a Ctrl-C at the terminal reaches only us, and
        # we shut the children down in order (§5.4).
        start_new_session=True,
    )
    return ChildTransport(proc)


class StreamTransport:
    """Any three trio streams as a :class:`Transport` (an in-memory component
    for tests, under ``MockClock``).

    The far side ends the "process" with :meth:`exit`; SIGTERM and SIGKILL end
    it as a real process would (status ``-signal``), and :attr:`signals`
    records what was sent."""

    def __init__(
        self, stdin: trio.abc.SendStream, stdout: trio.abc.ReceiveStream, stderr: trio.abc.ReceiveStream,
        *, pid: int = 4242,
    ) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.signals: list[int] = []
        self._status: int | None = None
        self._exited = trio.Event()

    @property
    def returncode(self) -> int | None:
        return self._status

    async def wait(self) -> int:
        await self._exited.wait()
        assert self._status is not None
        return self._status

    def exit(self, status: int) -> None:
        if self._status is None:
            self._status = status
            self._exited.set()

    def signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig in (signal.SIGTERM, signal.SIGKILL):
            self.exit(-sig)


# --- the process ---------------------------------------------------------------------------------


class ShellProcess:
    """A running component process and its connection."""

    def __init__(
        self,
        *,
        component: str,
        task: int,
        role: Role,
        argv: list[str],
        cwd: str | None,
        env: dict[str, str],
        pid_dir: str,
        conf: ProcessConf,
        spawn: Spawn = spawn_child,
    ) -> None:
        self.component = component
        self.task = task
        self.role = role
        self.argv = argv
        self.cwd = cwd
        self.env = env
        self.pid_dir = pid_dir
        self.conf = conf
        self._spawn = spawn
        self.conn = Connection(role, Side.HOST, max_frame_size=conf.max_frame_bytes)
        self.proc: Transport | None = None
        self.pid: int | None = None
        self._spawned: tuple[int, str] | None = None  # (pid, start time) of self.proc: spawned
        self.stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL)
        self._last_inbound = trio.current_time()
        self._watch: trio.CancelScope | None = None  # the subprocess timeout (§5.2), see watch()
        self._stderr_done = trio.Event()
        self._send_lock = trio.Lock()
        self._pending_error: Exception | None = None
        #: what the component says: its log frames and stderr lines (shown by default, shellbolt/_observe/logs.py setup_logging)
        self._component_log = logging.getLogger(f"multilang.component.{component}")
        self._log_budget = LineBudget()

    @property
    def spawned(self) -> tuple[int, str] | None:
        """The process the host started (the leader of its process group, not
        the one its pid reply names: a wrapper's child may answer): its pid and
        start time (read once; Linux), or None (not started, or no start time
        to tell it from a later process given its pid)."""
        if self._spawned is None and self.proc is not None:
            started = start_time(self.proc.pid)
            if started is not None:
                self._spawned = (self.proc.pid, started)
        return self._spawned

    @property
    def open(self) -> bool:
        """False once the child's stdout closed or broke the protocol: the
        reader is about to raise, so writers must stop sending."""
        return self.conn.state not in (State.CLOSED, State.ERROR)

    def task_ids_reply(self, ids: list[int]) -> bytes:
        """The frame answering an emit that wants task ids (§4.3), or b"" if
        the connection broke behind that emit (garbage or EOF read with it):
        the process is being replaced, and there is nobody to answer."""
        return self.conn.send(TaskIds(task_ids=ids)) if self.open else b""

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

    async def start(self, nursery: trio.Nursery, conf: dict[str, Any], context: dict[str, Any],
                    offers: Sequence[str] = ()) -> list[Message]:
        """Spawn and handshake (§2), offering the extensions ``offers``
        (§9.1). The stderr drain runs in ``nursery`` until stderr's EOF.
        Returns events that arrived right after the pid reply (a spout may
        emit while opening, §4.4)."""
        await nursery.start(self._run_stderr)
        timeout = self.conf.handshake_timeout
        events: list[Message] = []
        # §2.4: measured from the process start, so a child that does not
        # even read its handshake is caught too.
        with trio.move_on_after(timeout) as scope:
            await self.write(self.conn.send(Handshake(pid_dir=self.pid_dir, conf=conf, context=context,
                                                          extensions=tuple(offers))))
            while True:
                batch = await self.read_events()
                if batch and isinstance(batch[0], Pid):
                    self.pid = batch[0].pid
                    events = batch[1:]
                    break
        if scope.cancelled_caught:
            raise self.error(HeartbeatTimeout, f"no pid reply within the {timeout:g}s handshake timeout (§2.4)")
        await self._check_pid_file()
        return events

    async def _run_stderr(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the child; ready once it exists; then drain its stderr to EOF."""
        # (written down for the sweep after a kill -9: by a mark in its environment while it starts, then by its pid)
        what = f"component '{self.component}' task {self.task}"
        mark = scratch.note_spawning(self.pid_dir, what)
        env = self.env if mark is None else {**self.env, scratch.CHILD_ENV: mark}
        try:
            self.proc = await self._spawn(self.argv, self.cwd, env)
        except OSError as exc:
            if mark is not None:
                scratch.forget_spawning(self.pid_dir, mark)
            raise self.error(ComponentCrashed, f"could not start {self.argv!r}: {exc}") from None
        if self.conf.sched_batch and isinstance(self.proc, ChildTransport):
            self.proc.batch_scheduling()
        if isinstance(self.proc, ChildTransport) and self.spawned is not None:
            scratch.note_child(self.pid_dir, *self.spawned, what)
        if mark is not None:
            scratch.forget_spawning(self.pid_dir, mark)
        task_status.started()
        await self.drain_stderr()

    async def _check_pid_file(self) -> None:
        """storm.py and storm.rb write the pid file just *after* the pid
        reply: give it a moment before calling it missing (§2.3). Nothing
        signals a file appearing (short of inotify, which is not portable),
        so this is a short poll, bounded by _PID_FILE_WAIT. It is awaited
        (not run beside the session) so that even a run shorter than the
        wait reports a missing file; a conforming component costs one check."""
        path = os.path.join(self.pid_dir, str(self.pid))
        delay, waited = 0.001, 0.0
        while not os.path.exists(path):
            if waited >= _PID_FILE_WAIT:
                log.warning(
                    "%s:%d (pid %s) did not create its pid file in %s within %gs of its pid reply (§2.3); "
                    "continuing", self.component, self.task, self.pid, self.pid_dir, _PID_FILE_WAIT,
                )
                return
            await trio.sleep(delay)
            waited += delay
            delay = min(delay * 2, 0.1)

    # -- the subprocess timeout (§5.2) ---------------------------------------

    @property
    def last_inbound(self) -> float:
        """When the last frame was read (or the host last excused the silence)."""
        return self._last_inbound

    @last_inbound.setter
    def last_inbound(self, when: float) -> None:
        self._last_inbound = when
        if self._watch is not None:  # §5.2: measured from the last frame read
            self._watch.deadline = when + self.conf.subprocess_timeout

    async def watch(self, due: Callable[[], float | None]) -> None:
        """Kill the child when it sends nothing for the subprocess timeout (§5.2).

        ``due()`` says since when a frame is due: None while none is (a spout
        between commands, or a reader that waits for downstream space, which
        is not the child's fault). The timeout is a cancel scope whose
        deadline moves on every read (``last_inbound``) and is armed by a
        write when it was off; when it expires, the rule is checked again
        (maybe nothing is due any more), so nothing polls in between."""
        timeout = self.conf.subprocess_timeout
        looked_again = False
        while True:
            since = due()
            if since is None:
                deadline = math.inf
            else:
                deadline = max(since, self._last_inbound) + timeout
                now = trio.current_time()
                if deadline <= now:
                    if now - deadline > _LATE_SECS and not looked_again:
                        # Found late: the host did not run at the deadline (stopped at a terminal, or
                        # starved). A moment later, a frame read meanwhile or the runtime's excuse for
                        # the time it did not run (Runtime._excuse_silence) may have moved it.
                        looked_again = True
                        await trio.sleep(_CONFIRM_SECS)
                        continue
                    self.kill()
                    raise self.error(HeartbeatTimeout, f"sent nothing for {timeout:g}s (subprocess timeout, §5.2); killed")
            looked_again = False
            with trio.CancelScope(deadline=deadline) as self._watch:
                await trio.sleep_forever()
            self._watch = None

    # -- I/O -------------------------------------------------------------------

    async def read_events(self) -> list[Message]:
        """Read one chunk and return every complete event in it (maybe none).

        Raises ComponentCrashed on EOF and on any protocol error, with the
        process's identity, last frames and stderr tail."""
        assert self.proc is not None
        if self._pending_error is not None:
            raise self._pending_error
        try:
            data = await self.proc.stdout.receive_some(_READ_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if type(data) is not bytes:  # a memory stream's bytearray: the Connection takes bytes
            data = bytes(data)
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
        assert self.proc is not None
        watch = self._watch
        if watch is not None and watch.deadline == math.inf:
            # A command to an idle spout: a frame is due from now on (§5.2).
            watch.deadline = trio.current_time() + self.conf.subprocess_timeout
        async with self._send_lock:
            try:
                await self.proc.stdin.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                await self._settle()
                raise self.error(ComponentCrashed, "stdin closed (the process exited or crashed)") from None

    async def drain_stderr(self) -> None:
        """Log stderr continuously (a chatty child must never block, §8.3)."""
        assert self.proc is not None
        buf = b""
        try:
            while True:
                try:
                    chunk = await self.proc.stderr.receive_some(_READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    chunk = b""
                if not chunk:
                    if buf:
                        self._stderr_line(buf)
                    return
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    self._stderr_line(line)
                if len(buf) > 65536:  # a line that never ends: log it in pieces
                    self._stderr_line(buf)
                    buf = b""
        finally:
            self._stderr_done.set()
            if self._log_budget.dropped:  # the count of the last window: the process is gone
                self._component_log.info("[%s:%s pid %s] %d more lines not shown in its last %.0fs", self.component,
                                         self.task, self.pid, self._log_budget.dropped, self._log_budget.interval)

    def _stderr_line(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip("\r")
        # The tail goes into error messages: bound each line too.
        self.stderr_tail.append(text if len(text) <= _TAIL_LINE else f"{text[:_TAIL_LINE]}... ({len(text)} characters)")
        self.component_log(logging.INFO, text, stderr=True)

    def component_log(self, level: int, text: str, *, stderr: bool = False) -> None:
        """A line the component wrote (a ``log`` frame below WARN, a stderr
        line), prefixed with its component, task and pid, within the
        process's line budget; a count says how many were not shown. A
        stderr line's record has ``stream = "stderr"`` (the Spark executor
        log tags it so)."""
        logger = self._component_log
        if not logger.isEnabledFor(level):
            return
        dropped = self._log_budget.take(trio.current_time())
        if dropped is None:
            return
        where = f"[{self.component}:{self.task} pid {self.pid or (self.proc.pid if self.proc else '?')}]"
        if dropped:
            logger.info("%s %d more lines not shown in the last %.0fs (at most %d per %.0fs a process)", where,
                        dropped, self._log_budget.interval, self._log_budget.lines, self._log_budget.interval)
        logger.log(level, "%s %s", where, text, extra=_STDERR if stderr else None)

    async def _settle(self) -> None:
        """Give an exiting child a moment so its exit status and last stderr
        lines make it into the error message: wait for the exit and for the
        stderr drain to reach EOF (both bounded: a grandchild may hold the
        pipes open)."""
        if self.proc is not None:
            with trio.move_on_after(_SETTLE):
                await self.proc.wait()
                await self._stderr_done.wait()

    async def aclose(self, grace: float | None = None, hurry: trio.Event | None = None) -> None:
        """Close stdin (a component exits on EOF, §5.4), then SIGTERM, then
        SIGKILL; always reap. Safe to call twice and under cancellation.
        ``grace`` defaults to the kill grace of the conf; ``hurry``, once
        set, cuts every grace short (a second Ctrl-C)."""
        proc = self.proc
        if proc is None:
            return
        if grace is None:
            grace = self.conf.kill_grace
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                try:
                    await proc.stdin.aclose()
                except trio.BrokenResourceError:
                    pass
                async with trio.open_nursery() as n:
                    n.start_soon(self._discard_stdout)
                    await self._wait_exit(grace, hurry)
                    n.cancel_scope.cancel()
            if proc.returncode is None:
                proc.signal(signal.SIGTERM)
                await self._wait_exit(grace, hurry)
            if proc.returncode is None:
                proc.signal(signal.SIGKILL)
                await proc.wait()
            await self._end_the_rest(grace, hurry)
            for stream in (proc.stdout, proc.stderr):
                await stream.aclose()
            try:
                os.unlink(os.path.join(self.pid_dir, str(self.pid)))
            except (OSError, TypeError):
                pass
            scratch.forget_child(self.pid_dir, proc.pid)

    async def _end_the_rest(self, grace: float, hurry: trio.Event | None) -> None:
        """What is left of the process's group once it has exited (a
        wrapper's child in the background: ``sh -c "helper & exec bolt"``):
        SIGTERM, the grace, SIGKILL, as for the process (§5.4). A trial's
        wrapper left its child running after every run; the group's id keeps
        the leader's pid from being given to another process while the group
        has members (pids.signal_group)."""
        if self._spawned is None:
            return  # (not a process of ours, or no start time to tell it by)
        pid, started = self._spawned
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not group(pid, started):
                return
            try:
                os.killpg(pid, sig)
            except OSError:
                return
            waited = 0.0
            while sig == signal.SIGTERM and waited < grace and not (hurry is not None and hurry.is_set()):
                await trio.sleep(0.05)
                waited += 0.05
                if not group(pid, started):
                    return

    async def _discard_stdout(self) -> None:
        """While a closed child is given its grace: read what it still
        writes, and drop it. A child blocked writing to a full stdout pipe
        (its reader gone, as the run stops while the host waits for room
        downstream) would never read the EOF on its stdin, and would wait out
        the grace: a trial's stop on host workers took 2 s more, 2 runs in 7."""
        assert self.proc is not None
        try:
            while await self.proc.stdout.receive_some(_READ_SIZE):
                pass
        except (trio.BusyResourceError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # (its owner still reads it; or it is closed)

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
        if self.proc is not None:
            self.proc.signal(signal.SIGKILL)
