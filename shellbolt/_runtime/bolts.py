"""Bolt tasks: a shell bolt process (tuples in, bounded by max pending;
emits, acks and fails out) and an in-process Python bolt.

Hot paths follow DESIGN.md: a reader handles every frame of a chunk before it
awaits anything; a writer sends every ready frame in one ``send_all``;
backpressure is awaited once per chunk, not once per tuple.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import trio

from multilang.connection import Role, State
from multilang.errors import LocalProtocolError
from multilang.messages import Ack, Batch, Emit, Fail, Heartbeat, Message, StatePrepared, Tick, Tuple

from .._host.process import ShellProcess
from .._model.acker import edges_of
from .._model.results import brief, short_repr
from .._model.topology import ComponentDef, PythonBolt
from .._observe.observe import pick_probe
from .checkpoint import init_frames
from .shell_task import ShellTask
from .sinks import AckerSink, BoltSink
from .tasks import RuntimeSeam, Task, cannot_cross, log, new_tuple_id


__all__ = [Task, "PythonBoltTask"]

_new_tuple = tuple.__new__


class ShellBoltTask(ShellTask):
    """A bolt process: tuples in (bounded by max pending), emits/acks out.

    What becomes of its emits, acks and fails is its ``sink``'s business
    (``sinks.py``): the topology's router and acker by default."""

    role = Role.BOLT

    def __init__(self, runtime: RuntimeSeam, comp: ComponentDef, task_id: int, sink: BoltSink | None = None) -> None:
        super().__init__(runtime, comp, task_id)
        self.max_pending = int(self.conf.get("topology.shellbolt.max.pending") or 100)
        #: tuples per write: within max pending, and topology.producer.batch.size
        self.write_batch = min(self.max_pending, self.batch_size)
        self.heartbeat_interval = float(self.conf.get("multilang.heartbeat.interval.secs") or 1.0)
        self.max_frame = int(self.conf.get("multilang.max.frame.bytes") or 64 << 20)
        self.message_timeout = float(self.conf.get("topology.message.timeout.secs") or 30)
        self.sink: BoltSink = sink if sink is not None else AckerSink(
            runtime, hold=bool(self.conf.get("multilang.hold.emits.until.ack")))
        self._urgent: list[bytes] = []
        self._last_settled = 0.0  # when the process last acked or failed a tuple (or started)
        self._warned_holding = False
        self._holding_since: float | None = None  # since when it holds tuples (seen at a heartbeat)
        self._alone: str | None = None  # the id of a tuple being tried alone (§8.4)

    async def _serve(self, proc: ShellProcess, nursery: trio.Nursery) -> None:
        self._urgent = []
        self._last_settled = trio.current_time()
        self._warned_holding = False
        cp = self.runtime.checkpoints
        if cp is not None and "state" in proc.conn.extensions:  # §9.7: the committed state first
            txid, state = cp.attach(self)
            await proc.write(b"".join(init_frames(proc.conn, txid, state, self.max_frame)))
            cp.started(self)
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
        """One clear warning for a bolt that holds tuples whose trees wait
        for it and settles none of them for the message timeout
        (storm-starter's splitsentence.rb never acks): those trees time out
        and are replayed, and the host keeps every one of those ids until
        the bolt acks or fails it (§5.3). However few the tuples: a pipe of
        a few lines must say so too. Ticks and tuples of finished trees
        wait for nobody."""
        if self._warned_holding:
            return
        now = trio.current_time()
        if not self.in_flight:
            self._holding_since = None
            return
        if self._holding_since is None:
            self._holding_since = now
        quiet = now - max(self._last_settled, self._holding_since)
        if quiet >= self.message_timeout and any(self.sink.waited_for(t) for t in self.in_flight.values()):
            self._warned_holding = True
            log.warning("%s (pid %s) holds %d tuples and has acked or failed none for %.0fs; their trees time out "
                        "after topology.message.timeout.secs (%gs) and are replayed. A bolt must ack or fail every "
                        "tuple it gets (an unanchored emit does not ack its input).", self.where(), proc.pid,
                        len(self.in_flight), quiet, self.message_timeout)

    @property
    def busy(self) -> bool:
        """Work queued, or a tuple in flight that something still waits for:
        one whose tree is still pending, or one without a tree (acking off,
        or an unanchored emit upstream) while the bolt still acks or fails
        within the message timeout. A tuple whose trees have finished, or a
        tick, holds nothing up: a bolt that never acks it must not keep a
        run from ending (Storm's bolts ack ticks at will). Nor does a tree
        another host worker owns: that worker is busy while it is pending
        (a run ends when every worker is done)."""
        if self.inbox:
            return True
        if not self.in_flight:
            return False
        waited_for = self.sink.waited_for_here
        settling = trio.current_time() - self._last_settled < self.message_timeout
        for token in self.in_flight.values():
            w = waited_for(token)
            if w or (w is None and settling):
                return True
        return False

    def offers(self, extensions: list[str]) -> list[str]:
        # §9.7: state only where the runtime checkpoints it, on the general lane
        if self.runtime.checkpoints is None or not isinstance(self.sink, AckerSink):
            return [e for e in extensions if e != "state"]
        return extensions

    def send_state(self, msg: Message) -> None:
        """A state frame (§9.7) to the process, ahead of the tuples not yet
        written (as task ids and heartbeats, §5.3): a rollback precedes
        every tuple queued after it."""
        proc = self.proc
        if proc is None or proc.conn.state in (State.CLOSED, State.ERROR):
            return  # the session is being lost: its successor gets an init
        self._urgent.append(proc.conn.send(msg))  # refused: a bug of ours, not to be swallowed
        self.kick()

    def session_lost(self, cause: str) -> None:
        """Fail what the dead process had in flight, so it is replayed (§8.2, §8.4)."""
        self._alone = None
        self.obs.lost(trio.current_time())
        self.stats.failed += len(self.in_flight)
        self.sink.lost(self, cause)

    def _others_in_flight(self) -> bool:
        """A tuple in flight that could share the blame for a crash: one
        something still waits for (not a tick, not a finished tree)."""
        waited_for = self.sink.waited_for
        return any(waited_for(e) is not False for e in self.in_flight.values())

    async def _writer(self, proc: ShellProcess) -> None:
        conn = proc.conn
        inbox = self.inbox
        in_flight = self.in_flight
        sink = self.sink
        live, alone = sink.live, sink.alone
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
            room = self.write_batch if self._alone is None or self._alone not in in_flight else 0
            self._alone = None
            batch: list[Tuple] = []
            dropped = 0
            held_back = False  # a suspect waits for the process to hold nothing else
            isolating = sink.isolating()
            while inbox and len(batch) < room:
                d = inbox.popleft()
                token = d.edges
                if not live(token):
                    dropped += 1
                    continue
                by_itself = False
                if isolating and alone(token):
                    # §8.4: a suspect goes alone, so a crash on it is its own.
                    if batch or self._others_in_flight():
                        inbox.appendleft(d)
                        held_back = True
                        break
                    sink.cleared(token)
                    by_itself = True
                tid = new_tuple_id()
                while tid in in_flight:
                    tid = new_tuple_id()
                # tuple.__new__: the fields in order, without the named tuple's keyword __new__
                batch.append(_new_tuple(Tick if d.tick else Tuple, (tid, d.source, d.stream, d.source_task, d.values)))
                in_flight[tid] = token
                if by_itself:
                    self._alone = tid
                    break
            if dropped:
                self.stats.expired += dropped
                self._space.unpark_all()
                self.runtime.nudge()
            if batch:
                # One frame for the lot if the process accepted `batch` (§9.5).
                try:
                    written = conn.send_tuples(batch, self.max_frame)
                except LocalProtocolError:  # a tuple no frame can carry (all or none): the tuples one by one
                    written = self._send_each(conn, batch)
                parts.extend([frame for frame, _ in written])
                self.stats.executed += len(batch)
                probe = pick_probe(batch)  # its write-to-ack time stands for the batch's (observe.py)
                if type(probe) is Tuple and probe.id in in_flight:  # not a tick: a bolt may never ack those
                    self.obs.wrote(trio.current_time(), probe.id, len(batch))
                self._space.unpark_all()
            if parts:
                await proc.write(b"".join(parts))
            if held_back and not batch:
                await self._work.park()  # an ack, a fail or the next heartbeat wakes it

    def _send_each(self, conn: Any, batch: list[Tuple]) -> list[tuple[bytes, list[Tuple]]]:
        """The frames of a batch that the connection refused as a whole
        (a value no frame can carry: a lone surrogate, nesting deeper than
        the encoder goes, or a frame over the reader's limit, §1.3), tuple
        by tuple: a tuple refused alone is failed with the reason, and its
        input is replayed or given up on; the others go on."""
        out = []
        for tup in batch:
            try:
                out.extend(conn.send_tuples([tup], self.max_frame))
            except LocalProtocolError as exc:
                self._unsent(tup, f"a tuple from {tup.component} cannot be sent: {exc}")
        return out

    def _unsent(self, tup: Tuple, msg: str) -> None:
        """A tuple taken for writing that cannot be written: logged, and failed
        through the sink (its input is replayed or given up on)."""
        log.error("%s: %s; failed", self.where(), msg)
        self.stats.failed += 1
        self.sink.unsent(self, self.in_flight.pop(tup.id), f"{self.where()}: {msg}")

    async def _handle(self, proc: ShellProcess, events: list[Any]) -> None:
        touched: set[Task] = set()
        sink = self.sink
        settled = 0
        for ev in events:
            t = type(ev)
            if t is Batch:  # §9.5 (or a take_outputs run): the emits, then the acks, then the fails
                if ev.emits:
                    sink.emits(self, ev.emits, touched)
                if ev.acks:
                    sink.acked(self, ev.acks, touched)
                    self.stats.acked += len(ev.acks)
                for tid in ev.fails:
                    sink.failed(self, tid, self._fail_cause())
                self.stats.failed += len(ev.fails)
                settled += len(ev.acks) + len(ev.fails)
            elif t is Emit:
                ids = sink.emit(self, ev, touched)
                if ev.wants_task_ids and (reply := proc.task_ids_reply(ids)):
                    self._urgent.append(reply)
                    self.kick()
            elif t is Ack:
                sink.acked(self, [ev.id], touched)
                self.stats.acked += 1
                settled += 1
            elif t is Fail:
                sink.failed(self, ev.id, self._fail_cause())
                self.stats.failed += 1
                settled += 1
            elif t is StatePrepared:
                self.runtime.checkpoints.prepared(self, ev)  # type: ignore[union-attr]  (offered only with one)
            else:
                self._common(ev, proc)
        if settled:
            self._worked = True
            self._last_settled = now = trio.current_time()
            self.obs.settled(now, self.in_flight)
            self.kick()
        await self._after_batch(touched)

    def _fail_cause(self) -> str:
        """Why the process failed a tuple: its own word, the last `error` it
        reported (a BasicBolt reports the exception, then fails), if any."""
        pid = self.proc.pid if self.proc is not None else None
        cause = f"failed by {self.where()} (pid {pid})"
        if self._last_error is not None:
            cause += f": {brief(self._last_error)}"
            self._last_error = None
        return cause


class PythonBoltTask(Task):
    """An in-process bolt (``PythonBolt``): the BasicBolt contract. Each
    task calls its own copy of the function (``copy.deepcopy``: a callable
    that keeps state keeps it per task, as Storm deserializes a bolt per
    task, in one process or on N host workers). One that cannot be copied
    (it holds a lock or a connection) is shared by the tasks in a process."""

    def __init__(self, runtime: RuntimeSeam, comp: ComponentDef, task_id: int) -> None:
        super().__init__(runtime, comp, task_id)
        assert isinstance(comp.impl, PythonBolt)
        try:  # (a run's own copy even of a single task's: each run starts afresh)
            self.fn = copy.deepcopy(comp.impl.fn)
        except Exception as exc:  # (what the callable's own __deepcopy__ or __reduce__ raises)
            self.fn = comp.impl.fn
            if self.index == 0 and len(comp.tasks) > 1:
                log.warning("bolt %r: its function cannot be copied for each of its %d tasks (%s: %s); "
                            "the tasks in this process share it", comp.name, len(comp.tasks),
                            type(exc).__name__, exc)

    async def run(self) -> None:
        fn = self.fn
        rt = self.runtime
        inbox = self.inbox
        while True:
            while not inbox:
                await self._work.park()
            touched: set[Task] = set()
            batch = 0
            acker = rt.acker
            t0 = trio.current_time()
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
                edges = edges_of(d.edges)  # its emits are anchored to it
                try:
                    outputs = list(fn(d.values) or ())
                    if rt.placement is not None:  # (host workers: every emit may go to another; all or none)
                        for values in outputs:
                            why = cannot_cross(values)
                            if why is not None:
                                raise TypeError(f"emit {brief(short_repr(values))}: {why}")
                    for values in outputs:
                        rt.route(self, Emit(values=list(values), need_task_ids=False), [edges], touched)
                except Exception as exc:
                    self.stats.failed += 1
                    self.stats.errors += 1
                    what = f"{type(exc).__name__}: {exc}"
                    cause = f"{self.where()}: {what}"
                    self.stats.error(what)
                    rt.errlog.log(self.where(), logging.ERROR, trio.current_time(), "%s: %s on %r: %s",
                                  self.where(), type(exc).__name__, d.values, exc)
                    acker.fail(edges, cause)
                else:
                    self.stats.acked += 1
                    rt.acker.ack(edges)
            self.obs.ran(t0, trio.current_time(), batch)
            self._space.unpark_all()
            rt.settle()
            rt.nudge()
            for t in touched:
                await t.wait_for_space()
            await trio.lowlevel.checkpoint()
