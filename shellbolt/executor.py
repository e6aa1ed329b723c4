"""The topology executor: tasks, routing, the acker, spout driving, supervision.

Every task of a topology is one trio task under the runtime's nursery. A
shell task runs *sessions*: spawn + handshake, then reader, writer, stderr
drain, heartbeats and a watchdog in a nursery of their own. When a session
ends badly (crash, EOF, hang, protocol error) the task fails the tuples that
were in flight in that process, so their spouts replay them, and starts a new
session after a backoff, until the component's restart budget is spent
(spec/PROTOCOL.md §8.2). Tuples still queued for the task are not lost: the
next process gets them.

Hot paths follow DESIGN.md: a reader handles every frame of a chunk before it
awaits anything; a writer sends every ready frame in one ``send_all``;
backpressure is awaited once per chunk, not once per tuple.
"""

from __future__ import annotations

import logging
import math
import random
import shutil
import tempfile
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import trio

from multilang._state import Role
from multilang.errors import ComponentError, ComponentReportedError, HeartbeatTimeout
from multilang.messages import (
    DEFAULT_STREAM,
    SYSTEM_COMPONENT,
    SYSTEM_TASK,
    TICK_STREAM,
    Ack,
    Activate,
    Batch,
    Deactivate,
    Emit,
    Error,
    Fail,
    Heartbeat,
    Log,
    Metrics,
    Next,
    Sync,
    TaskIds,
    Tick,
    Tuple,
)

from .acker import Acker, TupleEdges
from .grouping import Grouping, Router
from .process import ShellProcess
from .topology import ANY_FIELDS, ComponentDef, PythonBolt, PythonSpout, Topology

__all__ = ["Runtime", "RunResult", "ComponentStats"]

log = logging.getLogger("multilang.shellbolt")
_PY_LEVEL = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_INBOX_CAPACITY = 1024
_new_tuple = tuple.__new__


class _PlainEmit(NamedTuple):
    """An emit read like an :class:`Emit` by :meth:`Runtime.route`, never
    direct, never wanting task ids: a batch's (§9.5, or a ``take_outputs``
    run) in hold mode, or one that :meth:`Runtime.route_plain` hands to
    ``route``. A named tuple built by :func:`_plain_emit` because a frozen
    dataclass costs about 1 µs per emit to build (bench/)."""

    values: list[Any]
    stream: str
    anchors: tuple[str, ...]
    id: Any = None
    task: int | None = None
    need_task_ids: bool = False
    is_direct: bool = False
    wants_task_ids: bool = False


def _plain_emit(values: list[Any], stream: str, anchors: tuple[str, ...] = (), msg_id: Any = None) -> _PlainEmit:
    """A :class:`_PlainEmit` without the named tuple's keyword ``__new__``."""
    return _new_tuple(_PlainEmit, (values, stream, anchors, msg_id, None, False, False, False))


@dataclass
class ComponentStats:
    """Counters per component (all its tasks)."""

    emitted: int = 0  # tuples emitted by the component
    executed: int = 0  # tuples delivered to it (bolts)
    acked: int = 0  # bolts: inputs acked; spouts: trees completed
    failed: int = 0  # bolts: inputs failed (incl. by crashes); spouts: trees failed
    restarts: int = 0
    errors: int = 0  # `error` commands and emit errors
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunResult:
    """What a run did. ``ok`` is False if a component gave up or trees were
    still incomplete when the run ended."""

    stats: dict[str, ComponentStats]
    completed: int
    failed: int
    timed_out: int
    pending: int
    gave_up: list[ComponentError]
    outputs: list[dict[str, Any]]

    @property
    def ok(self) -> bool:
        return not self.gave_up and self.pending == 0


class Delivery(NamedTuple):
    """A tuple on its way to one task. A named tuple: one is built per
    delivery, and ``_new_tuple(Delivery, (...))`` builds it without a
    Python-level call."""

    values: list[Any]
    source: str | None
    stream: str
    source_task: int
    edges: TupleEdges
    tick: bool = False


def _component_error(exc: BaseException) -> ComponentError | None:
    if isinstance(exc, ComponentError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for e in exc.exceptions:
            found = _component_error(e)
            if found is not None:
                return found
    return None


def _new_tuple_id() -> str:
    # §3.1: the decimal string of a random signed 64-bit number.
    return str(random.getrandbits(64) - (1 << 63))


# --- tasks ------------------------------------------------------------------------


class Task:
    """One task of one component: an inbox, stats, and a run loop."""

    def __init__(self, runtime: "Runtime", comp: ComponentDef, task_id: int) -> None:
        self.runtime = runtime
        self.comp = comp
        self.name = comp.name
        self.task_id = task_id
        self.conf = runtime.topology.conf_for(comp.name)
        self.stats = runtime.stats[comp.name]
        self.inbox: deque[Delivery] = deque()
        self.capacity = _INBOX_CAPACITY
        self._space = trio.lowlevel.ParkingLot()
        self._work = trio.lowlevel.ParkingLot()
        self.in_flight: dict[str, TupleEdges] = {}
        #: stream -> (fields, subscriptions, direct targets); see Runtime._stream_info
        self.streams: dict[str, tuple[list[str] | None, list[Grouping], set[int]]] = {}
        #: stream -> (fields, subscription) for Runtime.route_plain
        self.plain: dict[str, tuple[int, Any]] = {}
        self.idle = True  # spouts: the last `next` emitted nothing and nothing is owed

    def deliver(self, d: Delivery) -> None:
        self.inbox.append(d)
        # Wake the consumer if it waits. It runs only after the producer
        # yields, so one wake serves a whole batch; later calls find the
        # lot empty and skip the unpark.
        if self._work:
            self._work.unpark_all()

    def full(self) -> bool:
        return len(self.inbox) >= self.capacity

    async def wait_for_space(self) -> None:
        while len(self.inbox) >= self.capacity:
            await self._space.park()

    def kick(self) -> None:
        if self._work:  # an empty lot: nothing to wake (this runs per completed tree)
            self._work.unpark_all()

    @property
    def busy(self) -> bool:
        return bool(self.inbox) or bool(self.in_flight)

    async def run(self) -> None:
        raise NotImplementedError

    def where(self) -> str:
        return f"{self.name}:{self.task_id}"


class ShellTask(Task):
    """Supervision common to shell bolts and spouts (§8.2)."""

    role = Role.BOLT

    def __init__(self, runtime: "Runtime", comp: ComponentDef, task_id: int) -> None:
        super().__init__(runtime, comp, task_id)
        self.proc: ShellProcess | None = None
        c = self.conf
        self.timeout = float(c.get("topology.subprocess.timeout.secs") or c.get("supervisor.worker.timeout.secs") or 30)
        self.handshake_timeout = float(c.get("multilang.handshake.timeout.secs") or 30)
        self.kill_grace = float(c.get("multilang.kill.grace.secs") or 2)
        self.budget = int(c.get("multilang.restart.budget", 5))
        self.window = float(c.get("multilang.restart.window.secs", 60))
        self._blocked = False  # our reader waits on downstream space: not the child's fault

    async def run(self) -> None:
        restarts: deque[float] = deque()
        backoff = 0.1
        while True:
            started = trio.current_time()
            try:
                await self._session()
                return
            except BaseException as exc:
                err = _component_error(exc)
                if err is None or self.runtime.stopping:
                    if err is not None:
                        return
                    raise
            self._on_session_lost()
            now = trio.current_time()
            if now - started > 10:
                backoff = 0.1
            restarts.append(now)
            while restarts and restarts[0] < now - self.window:
                restarts.popleft()
            if len(restarts) > self.budget:
                log.error("%s: giving up after %d restarts in %gs: %s", self.where(), len(restarts) - 1, self.window, err)
                self.runtime.give_up(err)
                return
            self.stats.restarts += 1
            log.error("%s crashed; restarting in %.1fs (restart %d of %d allowed per %gs): %s",
                      self.where(), backoff, len(restarts), self.budget, self.window, err)
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def _on_session_lost(self) -> None:
        """Fail what the dead process had in flight, so spouts replay (§8.2)."""
        if self.in_flight:
            acker = self.runtime.acker
            for edges in self.in_flight.values():
                acker.fail(edges)
            self.stats.failed += len(self.in_flight)
            self.in_flight.clear()
            self.runtime.settle()

    async def _session(self) -> None:
        rt = self.runtime
        argv, cwd, env = rt.topology.resolve_command(self.comp)
        proc = ShellProcess(
            component=self.name, task=self.task_id, role=self.role, argv=argv, cwd=cwd, env=env,
            pid_dir=rt.pid_dir, max_frame_size=int(self.conf.get("multilang.max.frame.bytes") or 64 << 20),
        )
        self.proc = proc
        try:
            conf = {**self.conf}
            context = rt.topology.context_for(self.name, self.task_id).to_json()
            async with trio.open_nursery() as n:
                n.start_soon(self._stderr, proc)
                early = await proc.start(conf, context, self.handshake_timeout)
                log.debug("%s started: pid %s", self.where(), proc.pid)
                await self._handle(proc, early)
                await self._serve(proc, n)
        finally:
            await proc.aclose(self.kill_grace)
            self.proc = None

    async def _stderr(self, proc: ShellProcess) -> None:
        while proc.proc is None:
            await trio.sleep(0.005)
        await proc.drain_stderr()

    async def _watchdog(self, proc: ShellProcess, expecting: Callable[[], float | None]) -> None:
        """Kill a process that sends nothing for the subprocess timeout (§5.2).

        ``expecting()`` returns since when a frame is due, or None when
        nothing is (an idle spout)."""
        period = min(1.0, self.timeout / 4)
        while True:
            await trio.sleep(period)
            since = expecting()
            if since is None or self._blocked:
                continue
            if trio.current_time() - max(since, proc.last_inbound) > self.timeout:
                proc.kill()
                raise proc.error(HeartbeatTimeout, f"sent nothing for {self.timeout:g}s (subprocess timeout, §5.2); killed")

    def _common(self, ev: Any, proc: ShellProcess) -> None:
        """log / error / metrics / sync / unknown commands (§3.7)."""
        t = type(ev)
        if t is Log:
            log.log(_PY_LEVEL.get(ev.level, logging.INFO), "[%s pid %s] %s", self.where(), proc.pid, ev.msg)
        elif t is Error:
            self.stats.errors += 1
            err = ComponentReportedError(ev.msg, component=self.name, task=self.task_id, pid=proc.pid)
            self.runtime.reported_errors.append(err)
            log.error("%s", err)
        elif t is Metrics:
            self.stats.metrics[ev.name] = ev.params
        elif t is Sync:
            pass
        else:  # UnknownCommand on a bolt: Storm ignores it; so do we, loudly once
            log.warning("%s (pid %s) sent unknown command %r; ignored (§3.7)", self.where(), proc.pid, getattr(ev, "command", ev))

    async def _after_batch(self, touched: set["Task"]) -> None:
        """Settle the acker, then wait (once per chunk) for downstream space."""
        self.runtime.settle()
        full = [t for t in touched if t.full()]
        if full:
            self._blocked = True
            try:
                for t in full:
                    await t.wait_for_space()
            finally:
                self._blocked = False
                if self.proc is not None:
                    self.proc.last_inbound = trio.current_time()

    async def _handle(self, proc: ShellProcess, events: list[Any]) -> None:
        raise NotImplementedError

    async def _serve(self, proc: ShellProcess, nursery: trio.Nursery) -> None:
        raise NotImplementedError


class ShellBoltTask(ShellTask):
    """A bolt process: tuples in (bounded by max pending), emits/acks out."""

    role = Role.BOLT

    def __init__(self, runtime: "Runtime", comp: ComponentDef, task_id: int) -> None:
        super().__init__(runtime, comp, task_id)
        self.max_pending = int(self.conf.get("topology.shellbolt.max.pending") or 100)
        self.heartbeat_interval = float(self.conf.get("multilang.heartbeat.interval.secs") or 1.0)
        self.hold = bool(self.conf.get("multilang.hold.emits.until.ack"))
        self.max_frame = int(self.conf.get("multilang.max.frame.bytes") or 64 << 20)
        self.message_timeout = float(self.conf.get("topology.message.timeout.secs") or 30)
        self._urgent: list[bytes] = []
        # hold mode: input id -> emits waiting for it to be acked
        self._held: dict[str, list[_Held]] = {}
        # §5.3: a tuple in flight past the message timeout stops counting
        # toward max pending, so a bolt that never acks (storm.rb's example
        # split bolt) slows down instead of stalling.
        self._sent: deque[tuple[float, str]] = deque()
        self._expired: set[str] = set()

    def _room(self) -> int:
        sent = self._sent
        if sent:
            limit = trio.current_time() - self.message_timeout
            in_flight = self.in_flight
            while sent and sent[0][0] <= limit:
                tid = sent.popleft()[1]
                if tid in in_flight:
                    self._expired.add(tid)
        return self.max_pending - (len(self.in_flight) - len(self._expired))

    async def _serve(self, proc: ShellProcess, nursery: trio.Nursery) -> None:
        self._urgent = []
        self._held = {}
        self._sent.clear()
        self._expired.clear()
        nursery.start_soon(self._writer, proc)
        nursery.start_soon(self._heartbeats, proc)
        nursery.start_soon(self._watchdog, proc, lambda: proc.last_inbound)
        while True:
            await self._handle(proc, await proc.read_events())

    async def _heartbeats(self, proc: ShellProcess) -> None:
        while True:
            await trio.sleep(self.heartbeat_interval)
            await proc.wait_if_closed()
            self._urgent.append(proc.conn.send(Heartbeat(id=_new_tuple_id())))
            self.kick()

    async def _writer(self, proc: ShellProcess) -> None:
        conn = proc.conn
        inbox = self.inbox
        in_flight = self.in_flight
        sent = self._sent
        while True:
            while not self._urgent and not (inbox and self._room() > 0):
                await self._work.park()
            await proc.wait_if_closed()
            # §5.3: task-id replies and heartbeats jump the tuple queue.
            parts, self._urgent = self._urgent, []
            room = self._room()
            batch: list[Tuple] = []
            while inbox and len(batch) < room:
                d = inbox.popleft()
                tid = _new_tuple_id()
                while tid in in_flight:
                    tid = _new_tuple_id()
                # tuple.__new__: the fields in order, without the named tuple's keyword __new__
                batch.append(_new_tuple(Tick if d.tick else Tuple, (tid, d.source, d.stream, d.source_task, d.values)))
                in_flight[tid] = d.edges
            if batch:
                now = trio.current_time()
                # One frame for the lot if the process accepted `batch` (§9.5).
                for frame, tuples in conn.send_tuples(batch, self.max_frame):
                    if len(frame) > self.max_frame:  # §1.3: never write what the reader would reject
                        tid = tuples[0].id
                        log.error("%s: a %d-byte tuple from %s exceeds multilang.max.frame.bytes (%d); failed",
                                  self.where(), len(frame), tuples[0].component, self.max_frame)
                        conn.pending.discard(tid)
                        self.stats.failed += 1
                        self._fail_unsent(in_flight.pop(tid))
                        continue
                    parts.append(frame)
                    for u in tuples:
                        sent.append((now, u.id))
                self.stats.executed += len(batch)
                self._space.unpark_all()
            if parts:
                await proc.write(b"".join(parts))

    def _fail_unsent(self, edges: TupleEdges) -> None:
        """Fail the tree of a tuple that could not be sent (too large)."""
        self.runtime.acker.fail(edges)
        self.runtime.settle()

    async def _handle(self, proc: ShellProcess, events: list[Any]) -> None:
        touched: set[Task] = set()
        freed = False
        for ev in events:
            t = type(ev)
            if t is Emit:
                self._on_emit(ev, proc, touched)
            elif t is Ack:
                self._on_ack(ev.id, touched)
                freed = True
            elif t is Fail:
                self._on_fail(ev.id)
                freed = True
            elif t is Batch:  # §9.5 (or a take_outputs run): the emits, then the acks, then the fails
                if self.hold:
                    for e in ev.emits:
                        n = len(e)
                        stream = e[2] if n > 2 and e[2] is not None else DEFAULT_STREAM
                        anchors = tuple(e[1]) if n > 1 and e[1] else ()
                        self._on_emit(_plain_emit(e[0], stream, anchors), proc, touched)
                elif ev.emits:  # the connection checked the anchors are pending
                    self.runtime.route_emits(self, ev.emits, self.in_flight, touched)
                if self._held:
                    for tid in ev.acks:
                        self._on_ack(tid, touched)
                elif ev.acks:  # _on_ack without a call per ack
                    in_flight, expired, ack = self.in_flight, self._expired, self.runtime.acker.ack
                    for tid in ev.acks:
                        ack(in_flight.pop(tid))
                        if expired:
                            expired.discard(tid)
                    self.stats.acked += len(ev.acks)
                for tid in ev.fails:
                    self._on_fail(tid)
                freed = freed or bool(ev.acks or ev.fails)
            else:
                self._common(ev, proc)
        if freed:
            self.kick()
        await self._after_batch(touched)

    def _on_emit(self, ev: Emit, proc: ShellProcess, touched: set[Task]) -> None:
        rt = self.runtime
        anchors = [self.in_flight[a] for a in ev.anchors]  # the connection checked they are pending
        if self.hold and ev.anchors:
            targets = rt.targets(self, ev)
            if targets is None:  # an emit error (reported once): fail the tree now, hold nothing
                ids = rt.route(self, ev, anchors, touched, targets=None, invalid=True)
            else:
                held = _Held(ev, targets, set(ev.anchors))
                for a in ev.anchors:
                    self._held.setdefault(a, []).append(held)
                ids = targets
        else:
            ids = rt.route(self, ev, anchors, touched)
        if ev.wants_task_ids:
            self._urgent.append(proc.conn.send(TaskIds(task_ids=ids)))
            self.kick()

    def _on_ack(self, tid: str, touched: set[Task]) -> None:
        edges = self.in_flight.pop(tid)
        self._expired.discard(tid)
        if self._held:
            self._release(tid, edges, touched)
        self.runtime.acker.ack(edges)
        self.stats.acked += 1

    def _on_fail(self, tid: str) -> None:
        edges = self.in_flight.pop(tid)
        self._expired.discard(tid)
        if self._held:
            self._drop(tid)
        self.runtime.acker.fail(edges)
        self.stats.failed += 1

    def _release(self, tid: str, edges: TupleEdges, touched: set[Task]) -> None:
        """Hold mode: the input was acked, so the emits anchored to it go out
        now, before the ack reaches the acker (the tree must not complete in
        between)."""
        for held in self._held.pop(tid, ()):
            if held.done:
                continue
            held.done = True
            anchors = [self.in_flight[a] for a in held.anchors if a in self.in_flight and a != tid]
            anchors.append(edges)
            self.runtime.route(self, held.emit, anchors, touched, targets=held.targets)

    def _drop(self, tid: str) -> None:
        for held in self._held.pop(tid, ()):
            held.anchors.discard(tid)
            if not held.anchors:
                held.done = True


@dataclass(slots=True)
class _Held:
    emit: Emit
    targets: list[int] | None
    anchors: set[str]
    done: bool = False


class ShellSpoutTask(ShellTask):
    """A spout process: commands out, one sync back per command (§4)."""

    role = Role.SPOUT

    def __init__(self, runtime: "Runtime", comp: ComponentDef, task_id: int) -> None:
        super().__init__(runtime, comp, task_id)
        self.notices: deque[tuple[str, Any]] = deque()  # ("ack"|"fail", msg_id) to deliver
        self.pending_roots = 0
        self.idle = False
        self._sync: trio.Event | None = None
        self._command_since: float | None = None
        self._empty_nexts = 0
        self._deactivated = False

    def notify(self, kind: str, msg_id: Any) -> None:
        self.notices.append((kind, msg_id))
        self.kick()

    async def _serve(self, proc: ShellProcess, nursery: trio.Nursery) -> None:
        self._sync = None
        self._command_since = None
        self._deactivated = False
        nursery.start_soon(self._watchdog, proc, lambda: self._command_since)
        nursery.start_soon(self._driver, proc)
        while True:
            await self._handle(proc, await proc.read_events())

    async def _command(self, proc: ShellProcess, cmd: Any) -> None:
        await proc.wait_if_closed()
        self._sync = trio.Event()
        self._command_since = trio.current_time()
        await proc.write(proc.conn.send(cmd))
        await self._sync.wait()
        self._command_since = None

    async def _driver(self, proc: ShellProcess) -> None:
        rt = self.runtime
        await self._command(proc, Activate())  # §4.1: always first
        idle_sleep = 0.001
        while True:
            if self.notices:
                kind, msg_id = self.notices[0]
                # Dequeued only once the spout synced: if the process dies
                # first, its successor gets the ack or fail (§8.2). A lost
                # fail would be a lost tuple.
                await self._command(proc, Ack(id=msg_id) if kind == "ack" else Fail(id=msg_id))
                self.notices.popleft()
                continue
            if rt.spouts_stopped:
                if not self._deactivated:
                    self._deactivated = True
                    await self._command(proc, Deactivate())
                self.idle = True
                await self._work.park()
                continue
            if rt.may_emit(self):
                before = self.stats.emitted
                await self._command(proc, Next())
                if self.stats.emitted == before:
                    self._empty_nexts += 1
                    self.idle = self._empty_nexts >= 2 and self.pending_roots == 0
                    # Storm's spout wait strategy: back off while there is nothing to emit.
                    with trio.move_on_after(idle_sleep):
                        await self._work.park()
                    idle_sleep = min(idle_sleep * 2, 0.05)
                else:
                    self._empty_nexts = 0
                    self.idle = False
                    idle_sleep = 0.001
            else:
                self.idle = self.pending_roots == 0 and self._empty_nexts >= 2
                await self._work.park()

    async def _handle(self, proc: ShellProcess, events: list[Any]) -> None:
        rt = self.runtime
        touched: set[Task] = set()
        replies: list[bytes] = []
        for ev in events:
            t = type(ev)
            if t is Emit:
                ids = rt.route(self, ev, None, touched)
                if ev.wants_task_ids:
                    # §4.3: answered before the spout's next frame is read.
                    replies.append(proc.conn.send(TaskIds(task_ids=ids)))
            elif t is Batch:  # §9.5: a spout's emits carry message ids
                for e in ev.emits:
                    n = len(e)
                    rt.route(self, Emit(values=e[0], stream=e[2] if n > 2 and e[2] is not None else DEFAULT_STREAM,
                                        id=e[1] if n > 1 else None, need_task_ids=False), None, touched)
            elif t is Sync:
                if self._sync is not None:
                    self._sync.set()
            else:
                self._common(ev, proc)
        if replies:
            await proc.write(b"".join(replies))
        await self._after_batch(touched)


class PythonBoltTask(Task):
    """An in-process bolt (``PythonBolt``): the BasicBolt contract."""

    async def run(self) -> None:
        impl = self.comp.impl
        assert isinstance(impl, PythonBolt)
        rt = self.runtime
        inbox = self.inbox
        while True:
            while not inbox:
                await self._work.park()
            touched: set[Task] = set()
            batch = 0
            while inbox and batch < 256:
                d = inbox.popleft()
                batch += 1
                self.stats.executed += 1
                if d.tick:
                    rt.acker.ack(d.edges)
                    continue
                try:
                    outputs = list(impl.fn(d.values) or ())
                    for values in outputs:
                        rt.route(self, Emit(values=list(values), need_task_ids=False), [d.edges], touched)
                except Exception as exc:
                    self.stats.failed += 1
                    self.stats.errors += 1
                    log.error("%s: %s on %r: %s", self.where(), type(exc).__name__, d.values, exc)
                    rt.acker.fail(d.edges)
                else:
                    self.stats.acked += 1
                    rt.acker.ack(d.edges)
            self._space.unpark_all()
            rt.settle()
            for t in touched:
                await t.wait_for_space()
            await trio.lowlevel.checkpoint()


class PythonSpoutTask(Task):
    """An in-process spout (``PythonSpout``): reliable, replays failures."""

    def __init__(self, runtime: "Runtime", comp: ComponentDef, task_id: int) -> None:
        super().__init__(runtime, comp, task_id)
        self.notices: deque[tuple[str, Any]] = deque()
        self.pending_roots = 0
        self.idle = False
        impl = comp.impl
        assert isinstance(impl, PythonSpout)
        src = impl.source() if callable(impl.source) else impl.source
        self._items = iter(src)
        self._values: dict[int, list[Any]] = {}
        self._replay: deque[int] = deque()
        self._seq = 0
        self._exhausted = False

    def notify(self, kind: str, msg_id: Any) -> None:
        self.notices.append((kind, msg_id))
        self.kick()

    def resume(self) -> None:
        """The source ran dry (``StopIteration``) but may have more now: ask
        it again. For open-ended sources such as the asyncio feed."""
        self._exhausted = False
        self.kick()

    async def run(self) -> None:
        rt = self.runtime
        while True:
            while self.notices:
                kind, msg_id = self.notices.popleft()
                if kind == "ack":
                    self._values.pop(msg_id, None)
                elif msg_id in self._values:
                    self._replay.append(msg_id)
            if rt.spouts_stopped or not rt.may_emit(self) or (self._exhausted and not self._replay):
                self.idle = self._exhausted and not self._replay and self.pending_roots == 0
                await self._work.park()
                continue
            self.idle = False
            touched: set[Task] = set()
            now = trio.current_time()
            for _ in range(64):
                if self._replay:
                    msg_id = self._replay.popleft()
                else:
                    try:
                        values = list(next(self._items))
                    except StopIteration:
                        self._exhausted = True
                        break
                    msg_id = self._seq
                    self._seq += 1
                    self._values[msg_id] = values
                rt.route_plain(self, self._values[msg_id], DEFAULT_STREAM, None, touched, msg_id, now)
                if self.notices or not rt.may_emit(self):
                    break
            rt.settle()
            for t in touched:
                await t.wait_for_space()
            await trio.lowlevel.checkpoint()


# --- the runtime ---------------------------------------------------------------------


class Runtime:
    """Runs a :class:`~multilang.shellbolt.topology.Topology` on trio.

    ``on_output(record)`` receives each output tuple (a dict with
    ``component``, ``stream`` and the fields) unless the topology's output has
    a ``key``, in which case the last tuple per key is kept and returned in
    :class:`RunResult` when the run ends.

    ``on_tracked_output(component, stream, values, roots)``, if given, gets
    every output tuple instead (no record building, no ``key``), with the
    acker root ids it belongs to (empty if unanchored): the Spark adapter
    holds a root's outputs until its tree completes."""

    def __init__(
        self, topology: Topology, *, on_output: Callable[[dict[str, Any]], None] | None = None,
        on_tracked_output: Callable[[str, str, list[Any], list[int]], None] | None = None,
    ) -> None:
        self.topology = topology
        self.on_tracked_output = on_tracked_output
        conf = topology.conf
        self.acking = conf.get("topology.acker.executors") != 0
        self.acker = Acker(float(conf.get("topology.message.timeout.secs") or 30))
        self.max_spout_pending = conf.get("topology.max.spout.pending")
        self.stats = {name: ComponentStats() for name in topology.components}
        self.on_output = on_output
        self.outputs_by_key: dict[Any, dict[str, Any]] = {}
        self.router = Router()
        self.tasks: dict[int, Task] = {}
        self.gave_up: list[ComponentError] = []
        self.reported_errors: list[ComponentReportedError] = []
        self.spouts_stopped = False
        self.stopping = False
        self.emitted_by_spouts = 0  # tuples emitted by spouts, any stream (what max_tuples counts)
        self.max_tuples: int | None = None
        self.pid_dir = ""
        self._stop: trio.Event | None = None  # made by run(), inside trio
        self._stop_requested = False
        self._build()

    def _build(self) -> None:
        topo = self.topology
        for comp in topo.components.values():
            if comp.is_shell:
                topo.resolve_command(comp)  # a missing program is a TopologyError now, not a crash loop
        for comp in topo.components.values():
            for t in comp.tasks:
                if comp.kind == "spout":
                    cls = ShellSpoutTask if comp.is_shell else PythonSpoutTask
                else:
                    cls = ShellBoltTask if comp.is_shell else PythonBoltTask
                self.tasks[t] = cls(self, comp, t)
        for comp in topo.components.values():
            for inp in comp.inputs:
                src_fields = topo.components[inp.source].outputs[inp.stream]
                self.router.add(inp.source, inp.stream, Grouping(
                    kind=inp.grouping, target=comp.name, tasks=list(comp.tasks),
                    field_index=[src_fields.index(f) for f in inp.fields],
                ))
        out = topo.output
        self._key_index: list[int] | None = None
        if out.component and out.key:
            fields = topo.components[out.component].outputs[out.stream or "default"]
            self._key_index = [fields.index(k) for k in out.key]

    # -- routing -----------------------------------------------------------------

    def _stream_info(self, src: Task, stream: str) -> tuple[list[str] | None, list[Grouping], set[int]]:
        """(declared fields, subscriptions, direct targets) of a task's
        stream, computed once per task and stream: read for every emit."""
        info = src.streams.get(stream)
        if info is None:
            subs = self.router.subscribers(src.name, stream)
            info = (src.comp.outputs.get(stream), subs, self.router.direct_targets(src.name, stream))
            src.streams[stream] = info
        return info

    def targets(self, src: Task, emit: Emit) -> list[int] | None:
        """Destination tasks of an emit, or None if it is invalid (reported)."""
        fields, subs, direct = self._stream_info(src, emit.stream)
        if fields is None:
            return self._emit_error(src, emit, f"emitted to undeclared stream {emit.stream!r}; "
                                               f"declared: {sorted(src.comp.outputs)}")
        if len(emit.values) != len(fields) and fields != ANY_FIELDS:
            return self._emit_error(src, emit, f"emitted {len(emit.values)} values on stream {emit.stream!r}, "
                                               f"which declares {len(fields)} fields {fields}")
        if emit.task is not None:
            if emit.task not in direct:
                return self._emit_error(src, emit, f"direct emit to task {emit.task}, which does not subscribe to "
                                                   f"{src.name}/{emit.stream} with a direct grouping")
            return [emit.task]
        if len(subs) == 1 and subs[0].kind != "direct":
            return subs[0].choose(emit.values)
        out: list[int] = []
        for g in subs:
            if g.kind == "direct":
                return self._emit_error(src, emit, f"normal emit on stream {emit.stream!r}, which {g.target!r} "
                                                   "subscribes to with a direct grouping; use emit_direct")
            out.extend(g.choose(emit.values))
        return out

    def route(
        self, src: Task, emit: Emit, anchors: list[TupleEdges] | None, touched: set[Task],
        targets: list[int] | None = None, invalid: bool = False,
    ) -> list[int]:
        """Deliver an emit: acker bookkeeping, then one Delivery per task.
        Returns the task ids (the reply to an emit that wants them).
        ``invalid``: :meth:`targets` already found and reported it bad."""
        if targets is None and not invalid:
            targets = self.targets(src, emit)
        if targets is None:  # invalid emit: already reported; fail what it belonged to
            if anchors:
                for a in anchors:
                    self.acker.fail(TupleEdges(dict(a.ids)))
            elif emit.id is not None and isinstance(src, (ShellSpoutTask, PythonSpoutTask)):
                src.notify("fail", emit.id)
            return []
        self._deliver(src, emit.values, emit.stream, targets, anchors, emit.id, touched)
        return targets

    def route_plain(self, src: Task, values: list[Any], stream: str, anchors: list[TupleEdges] | None,
                    touched: set[Task], msg_id: Any = None, now: float | None = None) -> None:
        """:meth:`route` for an emit that is not direct and wants no task
        ids (a bolt's from a batch, §9.5, or an in-process spout's), without
        building an emit object: the stream's checks are worked out once per
        task and stream. Anything unusual (an undeclared stream, a wrong
        number of values, direct or several subscriptions) goes through
        :meth:`route`. ``now``: a spout's clock reading for its burst."""
        plan = src.plain.get(stream)
        if plan is None:
            plan = src.plain[stream] = self._plain_plan(src, stream)
        n_fields, grouping = plan
        if grouping is False or n_fields >= 0 and len(values) != n_fields:
            self.route(src, _plain_emit(values, stream, msg_id=msg_id), anchors, touched)
            return
        self._deliver(src, values, stream, [] if grouping is None else grouping.choose(values), anchors, msg_id, touched,
                      now)

    def route_emits(self, src: Task, emits: list[list[Any]], in_flight: dict[str, TupleEdges],
                    touched: set[Task]) -> None:
        """A bolt's batch of emits (§9.5, or a run from ``take_outputs``), each
        ``[values, anchor ids or None, stream or None]``, anchored to tuples
        in ``in_flight`` (the connection checked they are pending): each as
        :meth:`route_plain` would. The common case of a topology output (a
        stream nobody subscribes to, with tracked outputs, one anchor) is
        handed over here, without the calls of the general route: a Spark
        ``split`` partition makes two dozen per row."""
        plain = src.plain
        on_output = self.on_tracked_output
        name = src.name
        outputs = 0
        for e in emits:
            n = len(e)
            values = e[0]
            stream = e[2] if n > 2 and e[2] is not None else DEFAULT_STREAM
            ids = e[1] if n > 1 else None
            plan = plain.get(stream)
            if (on_output is not None and plan is not None and plan[1] is None and ids and len(ids) == 1
                    and (plan[0] < 0 or len(values) == plan[0])):
                on_output(name, stream, values, list(in_flight[ids[0]].ids))
                outputs += 1
            else:
                self.route_plain(src, values, stream, [in_flight[a] for a in ids] if ids else [], touched)
        src.stats.emitted += outputs

    def _deliver(self, src: Task, values: list[Any], stream: str, targets: list[int],
                 anchors: list[TupleEdges] | None, msg_id: Any, touched: set[Task], now: float | None = None) -> None:
        """A valid emit to ``targets``: acker bookkeeping, then one Delivery
        per task, or the topology's output if nobody subscribes."""
        src.stats.emitted += 1
        n = len(targets)
        if anchors is None:  # a spout emit
            self.emitted_by_spouts += 1
            if msg_id is not None and self.acking:
                _, edges = self.acker.spout_emit(src.task_id, msg_id, n, trio.current_time() if now is None else now)
                src.pending_roots += 1  # type: ignore[attr-defined]
            else:
                if msg_id is not None:  # §4.7: acking off, acked after this command's sync
                    src.notify("ack", msg_id)  # type: ignore[attr-defined]
                edges = [TupleEdges() for _ in range(n)]
        elif n:
            edges = self.acker.anchor(anchors, n) if anchors else [TupleEdges() for _ in range(n)]
        if not n:  # an output (a bolt's: no new edges, §7.1)
            self._emit_output(src, stream, values, anchors)
            return
        tasks = self.tasks
        name, src_task = src.name, src.task_id
        for task_id, e in zip(targets, edges):
            t = tasks[task_id]
            t.deliver(_new_tuple(Delivery, (values, name, stream, src_task, e, False)))
            touched.add(t)

    def _plain_plan(self, src: Task, stream: str) -> tuple[int, Grouping | None | bool]:
        """(number of fields or -1 for any, the one subscription or None for
        none) of a stream for :meth:`route_plain`; (0, False): use route."""
        fields, subs, _direct = self._stream_info(src, stream)
        if fields is None or len(subs) > 1 or any(g.kind == "direct" for g in subs):
            return 0, False
        return (-1 if fields == ANY_FIELDS else len(fields)), (subs[0] if subs else None)

    def _emit_output(self, src: Task, stream: str, values: list[Any], anchors: list[TupleEdges] | None) -> None:
        """An emit nobody subscribes to: a topology output."""
        if self.on_tracked_output is not None:
            if not anchors:
                roots = []
            elif len(anchors) == 1:
                roots = list(anchors[0].ids)
            else:
                roots = list({r for a in anchors for r in a.ids})
            self.on_tracked_output(src.name, stream, values, roots)
        else:
            self._output(src.name, stream, values)

    def _emit_error(self, src: Task, emit: Emit, msg: str) -> None:
        src.stats.errors += 1
        pid = getattr(getattr(src, "proc", None), "pid", None)
        log.error("%s (pid %s): %s; the tuple %r is dropped and its tree failed", src.where(), pid, msg, emit.values)
        return None

    def _output(self, component: str, stream: str, values: list[Any]) -> None:
        out = self.topology.output
        if out.component is not None and (component != out.component or stream != (out.stream or "default")):
            return
        fields = self.topology.components[component].outputs[stream]  # cached per component
        # Records carry their origin unless the output names it already.
        record: dict[str, Any] = {} if out.component is not None else {"component": component, "stream": stream}
        if fields == ANY_FIELDS:
            record["values"] = values
        else:
            record.update(zip(fields, values))
        if self._key_index is not None:
            key = tuple(_hashable(values[i]) for i in self._key_index)
            self.outputs_by_key[key] = record
        elif self.on_output is not None:
            self.on_output(record)

    # -- acker results -------------------------------------------------------------

    def settle(self) -> None:
        """Tell spouts about trees that completed or failed."""
        acked, failed = self.acker.drain()
        if not acked and not failed:
            return
        tasks = self.tasks
        for task_id, msg_id in acked:
            t = tasks[task_id]
            t.pending_roots -= 1  # type: ignore[attr-defined]
            t.stats.acked += 1
            t.notify("ack", msg_id)  # type: ignore[attr-defined]
        for task_id, msg_id in failed:
            t = tasks[task_id]
            t.pending_roots -= 1  # type: ignore[attr-defined]
            t.stats.failed += 1
            t.notify("fail", msg_id)  # type: ignore[attr-defined]

    def may_emit(self, spout: Task) -> bool:
        if self.max_tuples is not None and self.emitted_by_spouts >= self.max_tuples:
            return False
        msp = self.max_spout_pending
        return msp is None or spout.pending_roots < msp  # type: ignore[attr-defined]

    def give_up(self, err: ComponentError) -> None:
        self.gave_up.append(err)
        self.request_stop()

    def request_stop(self) -> None:
        self._stop_requested = True
        if self._stop is not None:
            self._stop.set()

    # -- running -------------------------------------------------------------------

    def done(self) -> bool:
        """Every spout is idle (exhausted, or stopped by ``max_tuples``) and
        nothing is queued or in flight anywhere."""
        limit_reached = self.max_tuples is not None and self.emitted_by_spouts >= self.max_tuples
        for t in self.tasks.values():
            if isinstance(t, (ShellSpoutTask, PythonSpoutTask)):
                if t.notices or not (t.idle or (limit_reached and t.pending_roots == 0)):
                    return False
            elif t.busy:
                return False
        return self.acker.pending == 0

    async def run(
        self, *, duration: float | None = None, max_tuples: int | None = None, until_done: bool = False,
        progress: Callable[["Runtime"], None] | None = None, progress_interval: float = 2.0,
    ) -> RunResult:
        """Run until ``duration`` passes, ``max_tuples`` spout tuples are
        emitted and their trees finish, every spout is exhausted
        (``until_done``), a component gives up, or the caller cancels."""
        self._stop = trio.Event()
        if self._stop_requested:
            self._stop.set()
        self.max_tuples = max_tuples
        self.pid_dir = tempfile.mkdtemp(prefix="multilang-pids-")  # mode 0700 (§2.1)
        try:
            async with trio.open_nursery() as nursery:
                for t in self.tasks.values():
                    nursery.start_soon(t.run)
                nursery.start_soon(self._expire_loop)
                for comp in self.topology.components.values():
                    freq = self.topology.conf_for(comp.name).get("topology.tick.tuple.freq.secs")
                    if freq and comp.kind == "bolt":
                        nursery.start_soon(self._ticks, comp, float(freq))
                if progress is not None:
                    nursery.start_soon(self._progress, progress, progress_interval)
                with trio.move_on_after(math.inf if duration is None else duration):
                    await self._wait_for_stop(until_done or max_tuples is not None)
                await self._drain()
                self.stopping = True
                nursery.cancel_scope.cancel()
        finally:
            self.stopping = True
            shutil.rmtree(self.pid_dir, ignore_errors=True)
        return self.result()

    async def _wait_for_stop(self, until_done: bool) -> None:
        assert self._stop is not None
        if not until_done:
            await self._stop.wait()
            return
        while not self._stop.is_set():
            if self.done():
                # Confirm over a short quiet period: a spout may be between nexts.
                await trio.sleep(0.05)
                if self.done():
                    return
            with trio.move_on_after(0.05):
                await self._stop.wait()

    async def _drain(self) -> None:
        """Deactivate spouts and let in-flight trees finish, up to the grace (§5.4)."""
        self.spouts_stopped = True
        for t in self.tasks.values():
            t.kick()
        grace = float(self.topology.conf.get("multilang.shutdown.grace.secs") or 0)
        with trio.move_on_after(grace):
            while self.acker.pending and not self.gave_up:
                await trio.sleep(0.02)
            # let deactivate commands and final acks be delivered
            while any(getattr(t, "notices", None) for t in self.tasks.values()) and not self.gave_up:
                await trio.sleep(0.02)

    async def _expire_loop(self) -> None:
        while True:
            await trio.sleep(1.0)
            if self.acker.expire(trio.current_time()):
                self.settle()
            for t in self.tasks.values():
                if t.inbox:
                    t.kick()  # expired in-flight tuples may have freed room (§5.3)

    async def _ticks(self, comp: ComponentDef, freq: float) -> None:
        while True:
            await trio.sleep(freq)
            for task_id in comp.tasks:
                self.tasks[task_id].deliver(Delivery([int(freq) if freq == int(freq) else freq], SYSTEM_COMPONENT,
                                                     TICK_STREAM, SYSTEM_TASK, TupleEdges(), tick=True))

    async def _progress(self, report: Callable[["Runtime"], None], interval: float) -> None:
        while True:
            await trio.sleep(interval)
            report(self)

    def result(self) -> RunResult:
        outputs = list(self.outputs_by_key.values())
        if self._key_index is not None:
            outputs.sort(key=lambda r: [_sort_key(r[k]) for k in self.topology.output.key or []])
        return RunResult(
            stats=self.stats,
            completed=self.acker.stats["completed"],
            failed=self.acker.stats["failed"],
            timed_out=self.acker.stats["timed_out"],
            pending=self.acker.pending,
            gave_up=list(self.gave_up),
            outputs=outputs,
        )


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v


def _sort_key(v: Any) -> tuple[str, str]:
    return (type(v).__name__, repr(v)) if not isinstance(v, str) else ("str", v)
