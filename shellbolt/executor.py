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
import os
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
from .ratelog import RateLimitedLog
from .topology import ANY_FIELDS, ComponentDef, PythonBolt, PythonSpout, Topology

__all__ = ["Runtime", "RunResult", "ComponentStats", "DeadLetter"]

log = logging.getLogger("multilang.shellbolt")
_PY_LEVEL = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_INBOX_CAPACITY = 1024
#: the acker edges of every tick tuple: it belongs to no tree (§5.3), and
#: anchoring to it adds no edge (Acker.anchor skips anchors without roots)
_TICK_EDGES = TupleEdges()
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
    #: queued tuples dropped unsent because their tree had already failed,
    #: timed out or completed (a replay is on its way; delivering the stale
    #: copy would process the input twice)
    expired: int = 0
    dead_letters: int = 0  # spouts of the host: inputs given up on after multilang.max.replays
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class DeadLetter:
    """An input a spout of the host gave up on after ``multilang.max.replays``
    replays: what it was, which spout emitted it, and why its last try failed."""

    component: str
    task: int
    msg_id: Any
    input: list[Any]
    cause: str
    attempts: int

    def to_json(self) -> dict[str, Any]:
        return {"component": self.component, "task": self.task, "input": self.input, "cause": self.cause,
                "attempts": self.attempts}


@dataclass
class RunResult:
    """What a run did.

    ``ok`` is False if a component gave up or an input was given up on (a
    dead letter). Trees still in flight when a run is stopped (``duration``,
    a signal) are *abandoned at stop*: counted in ``pending``, neither acked
    nor failed, and not a failure (spec §5.4). ``stopped_by`` says why the
    run ended: ``"done"``, ``"duration"``, ``"max_tuples"``, ``"gave_up"``,
    ``"signal"`` or ``"request"``."""

    stats: dict[str, ComponentStats]
    completed: int
    failed: int
    timed_out: int
    pending: int
    gave_up: list[ComponentError]
    outputs: list[dict[str, Any]]
    dead_letters: int = 0
    #: the first dead letters (at most 10), for the summary
    dead_letter_sample: list[DeadLetter] = field(default_factory=list)
    #: shell spouts: (component, msg_id, times failed, last cause) of the ids
    #: that failed most often, at most 5 per spout (Storm semantics: the
    #: spout decides about replays; the host only names them)
    repeated_failures: list[tuple[str, Any, int, str | None]] = field(default_factory=list)
    stopped_by: str = "done"

    @property
    def ok(self) -> bool:
        return not self.gave_up and not self.dead_letters



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
        """Work queued or in flight."""
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
        self.kill_grace = float(c.get("multilang.kill.grace.secs", 2))  # 0 is valid: no grace
        self.budget = int(c.get("multilang.restart.budget", 5))
        self.window = float(c.get("multilang.restart.window.secs", 60))
        self._blocked = False  # our reader waits on downstream space: not the child's fault
        self._starts = 0  # process starts of this task: each gets a fresh pid directory (§2.1)
        self._last_error: str | None = None  # the last `error` frame of the current process

    async def run(self) -> None:
        # The budget is per component, as documented (§8.2): every task of
        # the component counts its restarts in the same window.
        restarts = self.runtime.restart_times(self.name)
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
            self._on_session_lost(f"{self.where()}'s process was lost: {_first_line(str(err))}")
            now = trio.current_time()
            if now - started > 10:
                backoff = 0.1
            restarts.append(now)
            while restarts and restarts[0] < now - self.window:
                restarts.popleft()
            if len(restarts) > self.budget:
                log.error("%s: giving up after %d restarts of component %r in %gs: %s", self.where(),
                          len(restarts) - 1, self.name, self.window, err)
                self.runtime.give_up(err)
                return
            self.stats.restarts += 1
            log.error("%s crashed; restarting in %.1fs (restart %d of %d allowed per %gs for component %r): %s",
                      self.where(), backoff, len(restarts), self.budget, self.window, self.name, err)
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def _on_session_lost(self, cause: str) -> None:
        """Fail what the dead process had in flight, so spouts replay (§8.2)."""
        if self.in_flight:
            acker = self.runtime.acker
            for edges in self.in_flight.values():
                acker.fail(edges, cause)
            self.stats.failed += len(self.in_flight)
            self.in_flight.clear()
            self.runtime.settle()

    async def _session(self) -> None:
        rt = self.runtime
        argv, cwd, env = rt.topology.resolve_command(self.comp)
        # §2.1: a fresh pid directory for every process start, inside the
        # run's private (0700) directory.
        self._starts += 1
        pid_dir = os.path.join(rt.pid_dir, f"{self.task_id}-{self._starts}")
        os.mkdir(pid_dir, 0o700)
        self._last_error = None
        proc = ShellProcess(
            component=self.name, task=self.task_id, role=self.role, argv=argv, cwd=cwd, env=env,
            pid_dir=pid_dir, max_frame_size=int(self.conf.get("multilang.max.frame.bytes") or 64 << 20),
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
            await proc.aclose(self.kill_grace, self.runtime.hurry)
            self.proc = None
            shutil.rmtree(pid_dir, ignore_errors=True)

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
            level = _PY_LEVEL.get(ev.level, logging.INFO)
            if level >= logging.WARNING:  # a component's own errors, maybe one per tuple: rate-limited
                self.runtime.errlog.log(self.where(), level, trio.current_time(), "[%s pid %s] %s",
                                        self.where(), proc.pid, ev.msg)
            else:
                log.log(level, "[%s pid %s] %s", self.where(), proc.pid, ev.msg)
        elif t is Error:
            self.stats.errors += 1
            err = ComponentReportedError(ev.msg, component=self.name, task=self.task_id, pid=proc.pid)
            self.runtime.reported_errors.append(err)
            self._last_error = ev.msg
            self.runtime.errlog.log(self.where(), logging.ERROR, trio.current_time(), "%s", err)
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
        self._last_settled = 0.0  # when the process last acked or failed a tuple (or started)
        self._warned_holding = False
        #: (spout task, msg id) of the inputs in flight when a process of this
        #: task died with several tuples: each is retried alone (§8.4)
        self._suspects: set[Any] = set()
        self._alone: str | None = None  # the id of the suspect being tried alone

    async def _serve(self, proc: ShellProcess, nursery: trio.Nursery) -> None:
        self._urgent = []
        self._held = {}
        self._last_settled = trio.current_time()
        self._warned_holding = False
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
            self._check_holding(proc)

    def _check_holding(self, proc: ShellProcess) -> None:
        """One clear warning for a bolt that keeps taking tuples and settles
        none of them (storm-starter's splitsentence.rb never acks): its
        trees time out and are replayed, and the host keeps every one of
        those ids until the bolt acks or fails it (§5.3)."""
        if self._warned_holding or len(self.in_flight) < self.max_pending:
            return
        quiet = trio.current_time() - self._last_settled
        if quiet >= self.message_timeout:
            self._warned_holding = True
            log.warning("%s (pid %s) holds %d tuples and has acked or failed none for %.0fs; their trees time out "
                        "after topology.message.timeout.secs (%gs) and are replayed. A bolt must ack or fail every "
                        "tuple it gets (an unanchored emit does not ack its input).", self.where(), proc.pid,
                        len(self.in_flight), quiet, self.message_timeout)

    @property
    def busy(self) -> bool:
        """Work queued, or a tuple in flight that something still waits for:
        one whose tree is still pending, or an unanchored one (acking off, or
        an unanchored emit upstream) while the bolt still acks or fails
        within the message timeout. A tuple whose trees have finished, or a
        tick, holds nothing up: a bolt that never acks it must not keep a
        run from ending (Storm's bolts ack ticks at will)."""
        if self.inbox:
            return True
        if not self.in_flight:
            return False
        stale = self._stale
        settling = trio.current_time() - self._last_settled < self.message_timeout
        for e in self.in_flight.values():
            if e is _TICK_EDGES:
                continue
            if type(e) is TupleEdges and not e.ids:
                if settling:
                    return True
            elif not stale(e):
                return True
        return False

    def _on_session_lost(self, cause: str) -> None:
        """Fail what the dead process had in flight (§8.2). Who is to blame
        (§8.4): a tuple alone in the process is; tuples that were in flight
        together are not (the failure does not count against their inputs'
        replays) and become suspects, each tried alone when it comes back."""
        live = [tid for tid, e in self.in_flight.items() if e is not _TICK_EDGES]
        # Every input in flight is (still) a suspect: its next try goes alone.
        roots = self.runtime.acker.roots
        suspects = self._suspects
        for tid in live:
            e = self.in_flight[tid]
            if type(e) is TupleEdges and len(suspects) < _MAX_SUSPECTS:
                for r in e.ids:
                    root = roots.get(r)
                    if root is not None:
                        suspects.add((root.spout_task, _id_key(root.msg_id)))
        if len(live) == 1:
            cause = Cause.make(f"{cause} (the only tuple in that process)", crashed_alone=True)
        elif live:
            cause = Cause.make(f"{cause} (with {len(live) - 1} other tuples in flight; retried alone, "
                               "not counted against multilang.max.replays)", blamed=False)
        self._alone = None
        super()._on_session_lost(cause)

    def _suspect(self, edges: Any) -> bool:
        """Whether a queued tuple belongs to an input under suspicion (§8.4)."""
        if type(edges) is not TupleEdges:
            return False
        roots, suspects = self.runtime.acker.roots, self._suspects
        for r in edges.ids:
            root = roots.get(r)
            if root is not None and (root.spout_task, _id_key(root.msg_id)) in suspects:
                return True
        return False

    def _clear_suspect(self, edges: Any) -> None:
        roots = self.runtime.acker.roots
        for r in edges.ids:
            root = roots.get(r)
            if root is not None:
                self._suspects.discard((root.spout_task, _id_key(root.msg_id)))

    def _others_in_flight(self) -> bool:
        """A tuple in flight that could share the blame for a crash: not a
        tick, not one whose trees already finished."""
        stale = self._stale
        return any(e is not _TICK_EDGES and not stale(e) for e in self.in_flight.values())

    def _stale(self, edges: Any) -> bool:
        """A queued tuple whose tree has already failed, timed out or
        completed: writing it would process an input whose replay is on its
        way (a duplicate). Overridden where a tuple's tree is not acker edges."""
        return not self.runtime.acker.is_live(edges)

    async def _writer(self, proc: ShellProcess) -> None:
        conn = proc.conn
        inbox = self.inbox
        in_flight = self.in_flight
        stale = self._stale
        while True:
            while not self._urgent and not (inbox and (self._alone is None or self._alone not in in_flight)):
                await self._work.park()
            await proc.wait_if_closed()
            # §5.3: task-id replies and heartbeats jump the tuple queue.
            parts, self._urgent = self._urgent, []
            # §5.3, Storm's meaning of topology.shellbolt.max.pending: it
            # bounds the tuples taken from the queue and not yet written
            # (ShellBolt's pendingWrites), not the tuples the process holds
            # unacked. A bolt that acks late or in groups keeps getting
            # tuples as fast as it reads them; the spouts' max pending and
            # the input queue bound the rest.
            room = self.max_pending if self._alone is None or self._alone not in in_flight else 0
            self._alone = None
            batch: list[Tuple] = []
            dropped = 0
            held_back = False  # a suspect waits for the process to hold nothing else
            while inbox and len(batch) < room:
                d = inbox.popleft()
                if stale(d.edges):
                    dropped += 1
                    continue
                alone = False
                if self._suspects and self._suspect(d.edges):
                    # §8.4: a suspect goes alone, so a crash on it is its own.
                    if batch or self._others_in_flight():
                        inbox.appendleft(d)
                        held_back = True
                        break
                    self._clear_suspect(d.edges)
                    alone = True
                tid = _new_tuple_id()
                while tid in in_flight:
                    tid = _new_tuple_id()
                # tuple.__new__: the fields in order, without the named tuple's keyword __new__
                batch.append(_new_tuple(Tick if d.tick else Tuple, (tid, d.source, d.stream, d.source_task, d.values)))
                in_flight[tid] = d.edges
                if alone:
                    self._alone = tid
                    break
            if dropped:
                self.stats.expired += dropped
                self._space.unpark_all()
            if batch:
                # One frame for the lot if the process accepted `batch` (§9.5).
                for frame, tuples in conn.send_tuples(batch, self.max_frame):
                    if len(frame) > self.max_frame:  # §1.3: never write what the reader would reject
                        tid = tuples[0].id
                        msg = (f"a {len(frame)}-byte tuple from {tuples[0].component} exceeds "
                               f"multilang.max.frame.bytes ({self.max_frame})")
                        log.error("%s: %s; failed", self.where(), msg)
                        conn.pending.discard(tid)
                        self.stats.failed += 1
                        self._fail_unsent(in_flight.pop(tid), f"{self.where()}: {msg}")
                        continue
                    parts.append(frame)
                self.stats.executed += len(batch)
                self._space.unpark_all()
            if parts:
                await proc.write(b"".join(parts))
            if held_back and not batch:
                await self._work.park()  # an ack, a fail or the next heartbeat wakes it

    def _fail_unsent(self, edges: TupleEdges, cause: str) -> None:
        """Fail the tree of a tuple that could not be sent (too large)."""
        self.runtime.acker.fail(edges, cause)
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
                    in_flight, ack = self.in_flight, self.runtime.acker.ack
                    for tid in ev.acks:
                        ack(in_flight.pop(tid))
                    self.stats.acked += len(ev.acks)
                for tid in ev.fails:
                    self._on_fail(tid)
                freed = freed or bool(ev.acks or ev.fails)
            else:
                self._common(ev, proc)
        if freed:
            self._last_settled = trio.current_time()
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
        if self._held:
            self._release(tid, edges, touched)
        self.runtime.acker.ack(edges)
        self.stats.acked += 1

    def _on_fail(self, tid: str) -> None:
        edges = self.in_flight.pop(tid)
        if self._held:
            self._drop(tid)
        self.runtime.acker.fail(edges, self._fail_cause())
        self.stats.failed += 1

    def _fail_cause(self) -> str:
        """Why the process failed a tuple: its own word, the last `error` it
        reported (a BasicBolt reports the exception, then fails), if any."""
        pid = self.proc.pid if self.proc is not None else None
        cause = f"failed by {self.where()} (pid {pid})"
        if self._last_error is not None:
            cause += f": {_brief(self._last_error)}"
            self._last_error = None
        return cause

    def _release(self, tid: str, edges: TupleEdges, touched: set[Task]) -> None:
        """Hold mode: the input was acked, so the emits anchored to it go out
        now, before the ack reaches the acker (the tree must not complete in
        between). An emit whose every tree has meanwhile failed or timed out
        is dropped: the replay will emit it again, and releasing it too
        would be a duplicate (§5.3, no delivery after expiry)."""
        is_live = self.runtime.acker.is_live
        for held in self._held.pop(tid, ()):
            if held.done:
                continue
            held.done = True
            anchors = [self.in_flight[a] for a in held.anchors if a in self.in_flight and a != tid]
            anchors.append(edges)
            if not any(is_live(a) for a in anchors):
                self.stats.expired += 1
                continue
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
        #: msg id key -> [times failed, last cause, msg id]: the spout decides about
        #: replays (Storm semantics); the host only names the ids that keep
        #: failing. Forgotten on ack; at most _MAX_FAIL_IDS ids are tracked.
        self.fail_counts: dict[Any, list[Any]] = {}

    def notify(self, kind: str, msg_id: Any, cause: str | None = None) -> None:
        self.notices.append((kind, msg_id))
        self.kick()
        if len(self.notices) == _OWED_WARNING:
            # Acks and fails reach a spout only between its commands (§4):
            # the one queue the host cannot bound is the one owed to a spout
            # that emits without returning from `next`.
            log.warning("%s owes %d acks/fails to a spout that has not returned from its current command; they are "
                        "queued (about 100 bytes each) until it does. Keep each `next` short, as Storm requires.",
                        self.where(), _OWED_WARNING)
        counts = self.fail_counts
        if kind == "fail" or counts:
            key = _id_key(msg_id)
            if kind == "fail":
                entry = counts.get(key)
                if entry is not None:
                    entry[0] += 1
                    entry[1] = cause
                    if entry[0] % _FAIL_WARNING == 0:
                        self.runtime.errlog.log(
                            self.where(), logging.WARNING, trio.current_time(),
                            "%s: message id %s has failed %d times (last cause: %s); this spout replays it "
                            "(a shell spout decides, as in Storm)", self.where(), _brief(repr(msg_id), 100),
                            entry[0], cause)
                elif len(counts) < _MAX_FAIL_IDS:
                    counts[key] = [1, cause, msg_id]
            else:
                counts.pop(key, None)

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
            # Past --max-tuples a spout that has failed ids outstanding still
            # gets `next`: that is where a shell spout replays them.
            if rt.may_emit(self, replay=bool(self.fail_counts)):
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
            acker = rt.acker
            while inbox and batch < 256:
                d = inbox.popleft()
                batch += 1
                if d.tick:
                    self.stats.executed += 1
                    acker.ack(d.edges)
                    continue
                if not acker.is_live(d.edges):  # its tree failed or timed out: a replay is on its way
                    self.stats.expired += 1
                    continue
                self.stats.executed += 1
                try:
                    outputs = list(impl.fn(d.values) or ())
                    for values in outputs:
                        rt.route(self, Emit(values=list(values), need_task_ids=False), [d.edges], touched)
                except Exception as exc:
                    self.stats.failed += 1
                    self.stats.errors += 1
                    cause = f"{self.where()}: {type(exc).__name__}: {exc}"
                    rt.errlog.log(self.where(), logging.ERROR, trio.current_time(), "%s: %s on %r: %s",
                                  self.where(), type(exc).__name__, d.values, exc)
                    acker.fail(d.edges, cause)
                else:
                    self.stats.acked += 1
                    rt.acker.ack(d.edges)
            self._space.unpark_all()
            rt.settle()
            for t in touched:
                await t.wait_for_space()
            await trio.lowlevel.checkpoint()


class PythonSpoutTask(Task):
    """An in-process spout (``PythonSpout``): reliable, replays failures.

    An open-ended source (``multilang pipe``'s stdin, the asyncio feed) is an
    iterator whose ``StopIteration`` means "nothing now": while its ``open``
    attribute is true the run does not count the spout as finished, and the
    source calls :meth:`resume` when it has more."""

    def __init__(self, runtime: "Runtime", comp: ComponentDef, task_id: int) -> None:
        super().__init__(runtime, comp, task_id)
        self.notices: deque[tuple[str, Any, str | None]] = deque()
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
        #: msg id -> times failed so far; an input failed more than
        #: multilang.max.replays times is a dead letter, not replayed again
        self._fails: dict[int, int] = {}
        self._crashes: dict[int, int] = {}  # msg id -> times its tuple was alone in a process that died
        self.max_replays = int(self.conf.get("multilang.max.replays", 3))

    def notify(self, kind: str, msg_id: Any, cause: str | None = None) -> None:
        self.notices.append((kind, msg_id, cause))
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
                kind, msg_id, cause = self.notices.popleft()
                if kind == "ack":
                    self._values.pop(msg_id, None)
                    self._fails.pop(msg_id, None)
                    self._crashes.pop(msg_id, None)
                elif msg_id in self._values:
                    if not getattr(cause, "blamed", True):  # §8.4: it only shared a crashed process
                        self._replay.append(msg_id)
                        continue
                    fails = self._fails.get(msg_id, 0) + 1
                    if getattr(cause, "crashed_alone", False):
                        crashes = self._crashes[msg_id] = self._crashes.get(msg_id, 0) + 1
                    else:
                        crashes = 0
                    if fails > self.max_replays or crashes >= _CRASHES_ALONE or getattr(cause, "final", False):
                        self._crashes.pop(msg_id, None)
                        self._fails.pop(msg_id, None)
                        rt.dead_letter(self, msg_id, self._values.pop(msg_id), cause, fails)
                    else:
                        self._fails[msg_id] = fails
                        self._replay.append(msg_id)
            if rt.spouts_stopped or not rt.may_emit(self, replay=bool(self._replay)) or (
                    self._exhausted and not self._replay):
                self.idle = (self._exhausted and not self._replay and self.pending_roots == 0
                             and not getattr(self._items, "open", False))
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
        #: the latest `error` commands (at most 100: a bolt may report one per tuple)
        self.reported_errors: deque[ComponentReportedError] = deque(maxlen=100)
        self.spouts_stopped = False
        self.stopping = False
        self.emitted_by_spouts = 0  # tuples emitted by spouts, any stream (what max_tuples counts)
        self.max_tuples: int | None = None
        self.pid_dir = ""
        self._stop: trio.Event | None = None  # made by run(), inside trio
        self._stop_requested = False
        self._stopped_by: str | None = None
        #: set by abort(): every process is closed without its kill grace
        self.hurry: trio.Event | None = None
        #: errors that may repeat per tuple: logged once per kind per 10 s, with a count
        self.errlog = RateLimitedLog(log)
        self._last_emit_error: str | None = None
        self._restart_times: dict[str, deque[float]] = {}
        #: receives each DeadLetter (``multilang run --dead-letter FILE``)
        self.on_dead_letter: Callable[[DeadLetter], None] | None = None
        self.dead_letters = 0
        self._dead_letter_sample: list[DeadLetter] = []
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
            cause = self._last_emit_error
            if anchors:
                for a in anchors:
                    self.acker.fail(TupleEdges(dict(a.ids)), cause)
            elif emit.id is not None and isinstance(src, (ShellSpoutTask, PythonSpoutTask)):
                # The host's own check fails the same way on every replay.
                src.notify("fail", emit.id, Cause.make(cause or "", final=isinstance(src, PythonSpoutTask)))
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
        who = src.where() if pid is None else f"{src.where()} (pid {pid})"
        self._last_emit_error = f"{who}: {msg}"
        self.errlog.log(src.where(), logging.ERROR, trio.current_time(),
                        "%s: %s; the tuple %r is dropped and its tree failed", who, msg, _brief(repr(emit.values)))
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
        acked, failed, causes = self.acker.drain_with_causes()
        if not acked and not failed:
            return
        tasks = self.tasks
        for task_id, msg_id in acked:
            t = tasks[task_id]
            t.pending_roots -= 1  # type: ignore[attr-defined]
            t.stats.acked += 1
            t.notify("ack", msg_id)  # type: ignore[attr-defined]
        for (task_id, msg_id), cause in zip(failed, causes):
            t = tasks[task_id]
            t.pending_roots -= 1  # type: ignore[attr-defined]
            t.stats.failed += 1
            t.notify("fail", msg_id, cause)  # type: ignore[attr-defined]

    def may_emit(self, spout: Task, replay: bool = False) -> bool:
        """Whether a spout may emit now. A replay may go past ``max_tuples``
        (the limit counts what the spouts emitted; a failed tree of those
        must still be replayed), not past max spout pending."""
        if not replay and self.max_tuples is not None and self.emitted_by_spouts >= self.max_tuples:
            return False
        msp = self.max_spout_pending
        return msp is None or spout.pending_roots < msp  # type: ignore[attr-defined]

    def restart_times(self, component: str) -> deque[float]:
        """The recent restart times of a component, shared by its tasks."""
        return self._restart_times.setdefault(component, deque())

    def dead_letter(self, spout: Task, msg_id: Any, values: list[Any], cause: str | None, attempts: int) -> None:
        """A spout of the host gives up on an input after multilang.max.replays."""
        letter = DeadLetter(spout.name, spout.task_id, msg_id, values, cause or "failed (cause unknown)", attempts)
        self.dead_letters += 1
        spout.stats.dead_letters += 1
        if len(self._dead_letter_sample) < 10:
            self._dead_letter_sample.append(letter)
        if attempts:
            self.errlog.log(spout.where(), logging.ERROR, trio.current_time(),
                            "%s: gave up on input %s after %d attempt(s); last cause: %s",
                            spout.where(), _brief(repr(values)), attempts, letter.cause)
        else:
            self.errlog.log(spout.where(), logging.ERROR, trio.current_time(), "%s: input %s not sent: %s",
                            spout.where(), _brief(repr(values)), letter.cause)
        if self.on_dead_letter is not None:
            self.on_dead_letter(letter)

    def abort(self) -> None:
        """Stop at once: the caller cancels the run; this makes the processes
        go without their grace periods (a second Ctrl-C)."""
        self._stopped_by = self._stopped_by or "signal"
        if self.hurry is not None:
            self.hurry.set()

    def give_up(self, err: ComponentError) -> None:
        self.gave_up.append(err)
        self.request_stop("gave_up")

    def request_stop(self, reason: str = "request") -> None:
        """Stop the run: spouts are deactivated and in-flight trees get up to
        ``multilang.shutdown.grace.secs`` to finish (§5.4); then it returns
        its result. A signal handler calls this with ``reason="signal"``."""
        self._stop_requested = True
        if self._stopped_by is None:
            self._stopped_by = reason
        if self._stop is not None:
            self._stop.set()

    # -- running -------------------------------------------------------------------

    def done(self) -> bool:
        """Every spout is idle (exhausted, or stopped by ``max_tuples``) and
        nothing is queued or in flight anywhere."""
        limit_reached = self.max_tuples is not None and self.emitted_by_spouts >= self.max_tuples
        for t in self.tasks.values():
            if isinstance(t, (ShellSpoutTask, PythonSpoutTask)):
                if t.notices or getattr(t, "_replay", None) or not (
                        t.idle or (limit_reached and t.pending_roots == 0 and not getattr(t, "fail_counts", None))):
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
        (``until_done``), a component gives up, :meth:`request_stop` is
        called, or the caller cancels. Every way but cancellation drains the
        trees in flight for up to the shutdown grace (§5.4) and returns the
        result; what is still in flight then is abandoned at stop."""
        self._stop = trio.Event()
        self.hurry = trio.Event()
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
                with trio.move_on_after(math.inf if duration is None else duration) as timer:
                    await self._wait_for_stop(until_done or max_tuples is not None)
                if self._stopped_by is None:
                    self._stopped_by = ("duration" if timer.cancelled_caught else
                                        "max_tuples" if max_tuples is not None else "done")
                await self._drain()
                self.stopping = True
                nursery.cancel_scope.cancel()
        finally:
            self.stopping = True
            self.errlog.flush(trio.current_time())
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
        """Deactivate spouts, let in-flight trees finish and hand the spouts
        the acks and fails owed to them, within the shutdown grace (§5.4).
        A component that gave up cuts this short; nothing else does."""
        self.spouts_stopped = True
        for t in self.tasks.values():
            t.kick()
        grace = float(self.topology.conf.get("multilang.shutdown.grace.secs") or 0)
        with trio.move_on_after(grace):
            while self.acker.pending and not self.gave_up:
                await trio.sleep(0.02)
        # The acks and fails owed to spouts, also after the grace ran out: a
        # spout told "ack" commits its position; one left untold replays.
        self.settle()
        with trio.move_on_after(max(grace, 1.0)):
            while any(getattr(t, "notices", None) for t in self.tasks.values()) and not self.gave_up:
                await trio.sleep(0.02)

    async def _expire_loop(self) -> None:
        while True:
            await trio.sleep(1.0)
            if self.acker.expire(trio.current_time()):
                self.settle()

    async def _ticks(self, comp: ComponentDef, freq: float) -> None:
        while True:
            await trio.sleep(freq)
            for task_id in comp.tasks:
                self.tasks[task_id].deliver(Delivery([int(freq) if freq == int(freq) else freq], SYSTEM_COMPONENT,
                                                     TICK_STREAM, SYSTEM_TASK, _TICK_EDGES, tick=True))

    async def _progress(self, report: Callable[["Runtime"], None], interval: float) -> None:
        while True:
            await trio.sleep(interval)
            report(self)

    def result(self) -> RunResult:
        outputs = list(self.outputs_by_key.values())
        if self._key_index is not None:
            outputs.sort(key=lambda r: [_sort_key(r[k]) for k in self.topology.output.key or []])
        repeated: list[tuple[str, Any, int, str | None]] = []
        for t in self.tasks.values():
            counts = getattr(t, "fail_counts", None)
            if counts:
                worst = sorted(counts.values(), key=lambda e: -e[0])[:5]
                repeated.extend((t.name, e[2], e[0], e[1]) for e in worst if e[0] > 1)
        return RunResult(
            stats=self.stats,
            completed=self.acker.stats["completed"],
            failed=self.acker.stats["failed"],
            timed_out=self.acker.stats["timed_out"],
            pending=self.acker.pending,
            gave_up=list(self.gave_up),
            outputs=outputs,
            dead_letters=self.dead_letters,
            dead_letter_sample=list(self._dead_letter_sample),
            repeated_failures=repeated,
            stopped_by=self._stopped_by or "request",
        )


def _first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def _brief(text: str, limit: int = 300) -> str:
    """One line for a log or a dead letter: a traceback's first and last lines."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return text.strip()
    out = lines[0] if len(lines) <= 1 else f"{lines[0]} ... {lines[-1].strip()}"
    return out if len(out) <= limit else out[:limit] + "..."


_MAX_FAIL_IDS = 10_000
_MAX_SUSPECTS = 10_000


class Cause(str):
    """Why a tree failed, as the spout hears it. ``blamed`` False: the input
    was only in flight in a process that died with other tuples, so the
    failure does not count against its replays (spec §8.4); it is retried
    alone, and then a crash is its own."""

    blamed: bool = True
    #: the input's tuple was alone in a process that died or hung: twice is
    #: enough to give up on it (a deterministic crash costs restarts, §8.4)
    crashed_alone: bool = False
    #: the host's own check failed (an emit error of a host spout): the same
    #: every time, so not worth a replay
    final: bool = False

    @classmethod
    def make(cls, text: str, **flags: bool) -> "Cause":
        c = cls(text)
        for k, v in flags.items():
            setattr(c, k, v)
        return c


_OWED_WARNING = 100_000
_FAIL_WARNING = 10  # a shell spout's id failed this often: warn while the run goes on
_CRASHES_ALONE = 2


def _id_key(msg_id: Any) -> Any:
    return _hashable(msg_id)


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v


def _sort_key(v: Any) -> tuple[str, str]:
    return (type(v).__name__, repr(v)) if not isinstance(v, str) else ("str", v)
