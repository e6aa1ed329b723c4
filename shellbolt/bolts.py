"""Bolt tasks: a shell bolt process (tuples in, bounded by max pending;
emits, acks and fails out) and an in-process Python bolt.

Hot paths follow DESIGN.md: a reader handles every frame of a chunk before it
awaits anything; a writer sends every ready frame in one ``send_all``;
backpressure is awaited once per chunk, not once per tuple.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from multilang.connection import Role
from multilang.messages import DEFAULT_STREAM, Ack, Batch, Emit, Fail, Heartbeat, TaskIds, Tick, Tuple

from .acker import TupleEdges
from .process import ShellProcess
from .results import Cause, brief, id_key
from .shell_task import ShellTask
from .tasks import TICK_EDGES, Task, log, new_tuple_id, plain_emit
from .topology import ComponentDef, PythonBolt

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = ["ShellBoltTask", "PythonBoltTask"]

_new_tuple = tuple.__new__
_MAX_SUSPECTS = 10_000


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
            self._urgent.append(proc.conn.send(Heartbeat(id=new_tuple_id())))
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
            if e is TICK_EDGES:
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
        live = [tid for tid, e in self.in_flight.items() if e is not TICK_EDGES]
        # Every input in flight is (still) a suspect: its next try goes alone.
        roots = self.runtime.acker.roots
        suspects = self._suspects
        for tid in live:
            e = self.in_flight[tid]
            if type(e) is TupleEdges and len(suspects) < _MAX_SUSPECTS:
                for r in e.ids:
                    root = roots.get(r)
                    if root is not None:
                        suspects.add((root.spout_task, id_key(root.msg_id)))
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
            if root is not None and (root.spout_task, id_key(root.msg_id)) in suspects:
                return True
        return False

    def _clear_suspect(self, edges: Any) -> None:
        roots = self.runtime.acker.roots
        for r in edges.ids:
            root = roots.get(r)
            if root is not None:
                self._suspects.discard((root.spout_task, id_key(root.msg_id)))

    def _others_in_flight(self) -> bool:
        """A tuple in flight that could share the blame for a crash: not a
        tick, not one whose trees already finished."""
        stale = self._stale
        return any(e is not TICK_EDGES and not stale(e) for e in self.in_flight.values())

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
                tid = new_tuple_id()
                while tid in in_flight:
                    tid = new_tuple_id()
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
                        self._on_emit(plain_emit(e[0], stream, anchors), proc, touched)
                elif ev.emits:  # the connection checked the anchors are pending
                    self.runtime.route_emits(self, ev.emits, self.in_flight, touched)
                if self._held:
                    for tid in ev.acks:
                        self._on_ack(tid, touched)
                elif ev.acks:  # _on_ack without a call per ack
                    pop = self.in_flight.pop
                    self.runtime.acker.ack_many([pop(tid) for tid in ev.acks])
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
            cause += f": {brief(self._last_error)}"
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
