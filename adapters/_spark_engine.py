"""The in-partition engine: one warm trio runtime per spec (``_Engine``), the
rows fed in by ``_Feeder`` (general path) or straight into the bolt, whose
results ``_LeaseSink`` takes back to the lease (the direct lane), and the
runtime's recent errors kept for messages.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import trio

from multilang.errors import MultilangError
from multilang.messages import DEFAULT_STREAM, Emit
from multilang.shellbolt.bolts import ShellBoltTask
from multilang.shellbolt.sinks import BoltSink
from multilang.shellbolt.runtime import Runtime
from multilang.shellbolt.tasks import SpoutTask, Task, plain_emit
from multilang.shellbolt.topology import ANY_FIELDS, ComponentDef

from ._spark_spec import _select_outputs, _Spec

if TYPE_CHECKING:
    from ._spark_lease import _Lease, _Row
    from ._spark_pool import _Pool


class _RecentErrors(logging.Handler):
    """Keeps the runtime's last ERROR lines for error messages; still prints
    them to stderr where nothing else is configured (Spark's executor logs)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: deque[tuple[float, str]] = deque(maxlen=8)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append((time.monotonic(), record.getMessage()[:800]))
            if not logging.getLogger().handlers:
                logging.lastResort.handle(record)  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - logging must never raise
            pass

    def since(self, t: float) -> list[str]:
        return [m for ts, m in self.lines if ts >= t]


_RECENT: _RecentErrors | None = None


def _recent_errors() -> _RecentErrors:
    global _RECENT
    if _RECENT is None:
        _RECENT = _RecentErrors()
        logging.getLogger("multilang.shellbolt").addHandler(_RECENT)
    return _RECENT


class _Feeder(SpoutTask):
    """The spout of a partition runtime: emits the rows the current lease
    queued, reliably (msg id = (lease, row, attempt)); acks and fails go
    straight to the lease (no replay here: the lease decides)."""

    host_replays = True  # the lease decides about retries; an emit the host refuses is final

    def __init__(self, runtime: Runtime, comp: ComponentDef, task_id: int, engine: "_Engine") -> None:
        super().__init__(runtime, comp, task_id)  # notices stay empty: notify() acts at once
        self.idle = True
        self.engine = engine
        self.queue: deque[tuple[tuple[int, int, int], str, list[Any]]] = deque()

    def notify(self, kind: str, msg_id: Any, cause: str | None = None) -> None:
        lease = self.engine.lease
        if lease is not None:
            lease.notice(kind, msg_id)
        if self.queue:
            self.kick()  # a finished tree frees room under max spout pending (kick wakes only a waiter)

    async def run(self) -> None:
        rt = self.runtime
        queue = self.queue
        while True:
            if not queue or rt.spouts_stopped or not rt.may_emit(self):
                self.idle = not queue and self.pending_roots == 0
                await self._work.park()
                continue
            self.idle = False
            touched: set[Task] = set()
            lease = self.engine.lease
            now = trio.current_time()
            for _ in range(256):
                if not queue or not rt.may_emit(self):
                    break
                msg_id, stream, values = queue.popleft()
                if lease is not None and msg_id[0] == lease.id:
                    row = lease.rows.get(msg_id[1])
                    if row is None or row.attempt != msg_id[2]:
                        continue
                    row.sent_at = now
                rt.route_plain(self, values, stream, None, touched, msg_id)
            rt.settle()
            for t in touched:
                await t.wait_for_space()
            await trio.lowlevel.checkpoint()


class _LeaseSink(BoltSink):
    """The direct lane: a partition's only bolt, fed by the lease itself.

    The common shape, one shell bolt reading the rows and every stream of it
    an output, needs no routing and no XOR acker: a row's tree is the one
    tuple sent to the bolt, complete when the bolt acks it, failed when the
    bolt fails it, its process dies or the message timeout passes. So the
    lease puts each row into the bolt task's inbox with its attempt as the
    tuple's token (``(lease id, row, attempt)`` in place of acker edges), and
    this sink takes the bolt's emits, acks and fails straight to the lease.
    The bolt task is the runtime's own :class:`ShellBoltTask` (handshake,
    heartbeats, max pending, restarts, frame limits); only what a tuple
    becomes on the way in and out is shorter. Same guarantees as the general
    path (docs/SPARK.md); see :meth:`_Engine._direct_shape` for when it is
    used. ``multilang.hold.emits.until.ack`` needs nothing here: every output
    is held until its row's tuple is acked anyway."""

    def __init__(self, engine: "_Engine", comp: ComponentDef) -> None:
        self.engine = engine
        self.comp = comp
        #: stream -> number of fields (-1: any) and whether the lease takes it, or None: undeclared
        self._out: dict[str, tuple[int, bool] | None] = {}

    def _out_plan(self, stream: str) -> tuple[int, bool] | None:
        fields = self.comp.outputs.get(stream)
        plan = None
        if fields is not None:
            eng = self.engine
            plan = (-1 if fields == ANY_FIELDS else len(fields),
                    eng.all_outputs or (self.comp.name, stream) in eng.outputs)
        self._out[stream] = plan
        return plan

    def live(self, token: Any) -> bool:
        """A queued row whose attempt the lease no longer waits for (it
        timed out or failed, and its retry is queued) is not written."""
        if type(token) is not tuple:  # a tick's (TupleEdges)
            return True
        lease = self.engine.lease
        return lease is not None and lease.is_current(token)

    def waited_for(self, token: Any) -> bool | None:
        return type(token) is tuple and self.live(token)  # a tick is waited for by nobody

    def _tree_failed(self, token: Any) -> None:
        lease = self.engine.lease
        if lease is not None and type(token) is tuple:  # not a tick's (TupleEdges)
            lease.notice("fail", token)

    def unsent(self, task: ShellBoltTask, token: Any, cause: str) -> None:
        self._tree_failed(token)

    def lost(self, task: ShellBoltTask, cause: str) -> None:
        """The lease replays the rows the dead process had in flight."""
        tokens = list(task.in_flight.values())
        task.in_flight.clear()
        for token in tokens:
            self._tree_failed(token)

    def acked(self, task: ShellBoltTask, tids: list[str], touched: set[Task]) -> None:
        pop = task.in_flight.pop
        tokens = [pop(tid) for tid in tids]
        lease = self.engine.lease
        if lease is not None:
            lease.acked(tokens)

    def failed(self, task: ShellBoltTask, tid: str, cause: str) -> None:
        self._tree_failed(task.in_flight.pop(tid))

    def emits(self, task: ShellBoltTask, emits: list[list[Any]], touched: set[Task]) -> None:
        lease = self.engine.lease
        in_flight = task.in_flight
        out = self._out
        name = task.name
        last_tok: Any = None
        last_row: _Row | None = None
        for e in emits:
            n = len(e)
            values = e[0]
            stream = e[2] if n > 2 and e[2] is not None else DEFAULT_STREAM
            ids = e[1] if n > 1 else None
            plan = out[stream] if stream in out else self._out_plan(stream)
            if plan is None or plan[0] >= 0 and len(values) != plan[0]:
                self.emit(task, plain_emit(values, stream, tuple(ids) if ids else ()), touched)
                last_tok = None  # that may have failed the row: its next attempt must not get what follows
                continue
            task.stats.emitted += 1
            if lease is None or not plan[1]:
                continue  # between partitions, or a stream not selected as output
            if ids and len(ids) == 1:
                tok = in_flight[ids[0]]
                if tok is last_tok:
                    last_row.outputs.append((name, stream, values))  # type: ignore[union-attr]
                    continue
                if type(tok) is tuple:  # else a tick's: no tree, the emit goes out as unanchored
                    row = lease.current(tok)
                    if row is not None:
                        row.outputs.append((name, stream, values))
                        last_tok, last_row = tok, row
                    continue
            lease.direct_output((name, stream, values), [in_flight[a] for a in ids] if ids else [])

    def emit(self, task: ShellBoltTask, ev: Emit, touched: set[Task]) -> list[int]:
        """An emit off the plain path: checked by the runtime (undeclared
        stream, wrong arity, a direct emit nobody can receive: reported, and
        the trees it was anchored to fail), else an output."""
        toks = [task.in_flight[a] for a in ev.anchors]
        targets = task.runtime.targets(task, ev)
        if targets is None:
            for tok in dict.fromkeys(toks):
                self._tree_failed(tok)
            return []
        task.stats.emitted += 1
        lease = self.engine.lease
        plan = self._out[ev.stream] if ev.stream in self._out else self._out_plan(ev.stream)
        if lease is not None and plan is not None and plan[1]:
            lease.direct_output((task.name, ev.stream, ev.values), toks)
        return targets


_STAT_KEYS = ("executed", "emitted", "acked", "failed", "restarts", "errors")


class _Engine:
    """One warm runtime: the spec's bolts as supervised processes, fed by one
    partition (lease) at a time."""

    _ids = 0

    def __init__(self, spec: _Spec, pool: "_Pool") -> None:
        self.spec = spec
        self.pool = pool
        topo = spec.topology(on_worker=True)
        #: a stateful stage of the streaming topology engine names its state
        #: store (adapters/_spark_state.py): the runtime checkpoints to it (§9.7)
        self.stateful = "topology.state.provider" in spec.conf
        self.runtime = rt = Runtime(topo, on_tracked_output=self._on_output, checkpointing=self.stateful)
        self.feeders: dict[str, _Feeder] = {}
        for name in spec.sources:
            comp = topo.components[name]
            for t in comp.tasks:
                f = _Feeder(rt, comp, t, self)
                rt.tasks[t] = f
                self.feeders[name] = f
        self.outputs = set(spec.outputs)
        # The runtime calls _on_output only for streams nobody subscribes to.
        self.all_outputs = self.outputs == set(_select_outputs(topo, None))
        #: the direct lane (_LeaseSink): the bolt's grouping over its tasks, or None
        self.direct: Any = None
        comp = None if self.stateful else self._direct_shape(rt, spec)  # held acks need the acker
        if comp is not None:
            for t in comp.tasks:
                rt.tasks[t] = ShellBoltTask(rt, comp, t, sink=_LeaseSink(self, comp))
            self.direct = rt.router.subscribers(*spec.single_source)[0]  # type: ignore[misc]
        self.bolt_tasks = [t for t in rt.tasks.values() if not isinstance(t, SpoutTask)]
        self.lease: _Lease | None = None
        self.finished = trio.Event()
        self.error: BaseException | None = None
        self.idle_since = 0.0
        self.leases = 0
        _recent_errors()

    @staticmethod
    def _direct_shape(rt: Runtime, spec: _Spec) -> ComponentDef | None:
        """The one shell bolt of a spec that the direct lane can run, or
        None: the rows are one spout stream, acking is on, and the spec is a
        single shell bolt subscribing to them by a grouping that picks one
        task per row (not ``all``, not ``direct``). Off with
        ``MULTILANG_SPARK_DIRECT=0`` in the workers' environment."""
        if os.environ.get("MULTILANG_SPARK_DIRECT", "1").strip() == "0":
            return None
        single = spec.single_source
        bolts = [c for c in rt.topology.components.values() if c.kind == "bolt"]
        if single is None or not rt.acking or len(bolts) != 1 or not bolts[0].is_shell:
            return None
        comp = bolts[0]
        subs = rt.router.subscribers(*single)
        if len(comp.inputs) != 1 or len(subs) != 1 or subs[0].kind in ("all", "direct"):
            return None
        return comp

    async def serve(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            if self.direct is None:
                await self.runtime.run()
            else:
                async with trio.open_nursery() as n:
                    n.start_soon(self._expire_rows)
                    await self.runtime.run()
                    n.cancel_scope.cancel()
        except Exception as exc:  # noqa: BLE001 - reported to the lease that waits
            self.error = exc
        finally:
            self.finished.set()
            if self.lease is not None:
                self.lease.wake()

    async def stop(self) -> None:
        self.runtime.request_stop()
        await self.finished.wait()

    def failure(self) -> BaseException | None:
        if not self.finished.is_set():
            return None
        if self.runtime.gave_up:
            return self.runtime.gave_up[0]
        return self.error or MultilangError("the bolt runtime stopped unexpectedly")

    def healthy(self) -> bool:
        rt = self.runtime
        if self.finished.is_set() or rt.gave_up or rt.stopping:
            return False
        for t in self.bolt_tasks:
            sp = getattr(t, "proc", None)
            p = getattr(sp, "proc", None)
            if p is not None and p.returncode is not None:
                return False
        return True

    async def _expire_rows(self) -> None:
        """The direct lane's message timeout (the acker's, §7.3): a row whose
        tuple is not acked within ``topology.message.timeout.secs`` of being
        queued fails, and is replayed or given up like any failed row."""
        timeout = self.runtime.acker.timeout
        while True:
            await trio.sleep(min(1.0, timeout / 4))
            lease = self.lease
            if lease is None:
                continue
            limit = trio.current_time() - timeout
            late = [(lease.id, seq, row.attempt) for seq, row in lease.rows.items()
                    if not row.done and row.sent_at is not None and row.sent_at <= limit]
            for tok in late:
                lease.notice("fail", tok)

    def quiet(self, since: float | None = None) -> bool:
        """Nothing left that could still produce output for the lease: no queued
        rows or tuples and no tuple in flight whose tree is alive. A tuple in
        flight whose tree already failed (a bolt that never acks it) does not
        count; unanchored tuples in flight (acking off) are waited for up to the
        message timeout after ``since``. In the direct lane every tuple is a
        row's, so a lease without rows left is quiet."""
        if self.direct is not None:
            return self.lease is None or not self.lease.rows
        if any(f.queue for f in self.feeders.values()) or self.runtime.acker.pending:
            return False
        roots = self.runtime.acker.roots
        patient = since is not None and trio.current_time() - since < self.runtime.acker.timeout
        for t in self.bolt_tasks:
            if t.inbox:
                return False
            for edges in t.in_flight.values():
                if not edges.ids:
                    if patient or since is None:
                        return False
                elif any(r in roots for r in edges.ids):
                    return False
        return True

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {name: {k: getattr(s, k) for k in _STAT_KEYS} for name, s in self.runtime.stats.items()
                if name not in self.spec.sources}

    def _on_output(self, component: str, stream: str, values: list[Any], roots: list[int]) -> None:
        lease = self.lease
        if lease is not None and (self.all_outputs or (component, stream) in self.outputs):
            lease.output(component, stream, values, roots)
