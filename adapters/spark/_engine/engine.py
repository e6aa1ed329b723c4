"""The in-partition engine: one warm trio runtime per spec (``_Engine``), the
rows fed in by ``_Feeder`` (general path) or straight into the bolt, whose
results ``_LeaseSink`` takes back to the lease (the direct lane), and the
runtime's log records routed to Spark's executor logs (``_WorkerLog``).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections import OrderedDict, deque
from typing import Any

import trio

from multilang.errors import MultilangError
from multilang.messages import Emit
from multilang.shellbolt import (
    BoltSink, ComponentDef, Delivery, RateLimitedLog, Runtime, ShellBoltTask, SpoutTask, Task,
    grouping_class, kind_of, plain_emit, roots_of,
)

from .spec import _select_outputs, _Spec


_new_tuple = tuple.__new__  # a named tuple's fields in order, without its keyword __new__


# --- the runtime's log records, routed to Spark's executor logs ------------------------

#: where a record comes from: "[split:2 pid 77] ...", "split:2 crashed; ...", "split:2: 5 more like this ..."
_WHERE = re.compile(r"\[?([^\s\[\]:']+):(\d+)(?: pid (\d+))?")
#: ... or a ComponentError's text: "component 'split' task 2 (pid 77): ..."
_COMPONENT = re.compile(r"component '([^']+)' task (\d+)(?: \(pid (\d+)\))?")
#: the tags of a line, stripped from its kind
_PREFIX = re.compile(r"^(?:\[[^\]]*\]\s*|component '[^']*' task \d+(?: \(pid \d+\))?:\s*)")
#: what varies between lines of one kind: quoted values, and numbers or words holding digits
_VARYING = re.compile(r"(?<!\w)'[^'\n]*'|(?<!\w)\"[^\"\n]*\"|\S*\d\S*")
#: seconds: a kind of WARN/ERROR line is logged once per interval per component task, then counted
_LOG_INTERVAL = 10.0
#: kinds of WARN/ERROR line logged per component task per interval; the rest are counted as one kind
_LOG_KINDS = 5
_TAIL_LINES = 8  # stderr lines kept per process: the crash cause of its rows
_TAIL_PIDS = 64  # processes whose tails are kept
_SOURCES = ("multilang.shellbolt", "multilang.component")


def _headline(first: str) -> str:
    """The kind of a WARN/ERROR line, for the rate limit, from its first
    line without tags: what varies masked, up to the first ": " (an
    exception's class, not its message), so the same error with another
    row's value in it is the same kind."""
    return _VARYING.sub("#", first).split(": ", 1)[0][:160]


def _task_tags() -> tuple[str, dict[str, Any]]:
    """The Spark task running now in this Python worker (``TaskContext``),
    as text and as record attributes; empty outside a Spark task."""
    try:
        from pyspark import TaskContext

        tc = TaskContext.get()
    except Exception:  # noqa: BLE001 - no pyspark, or not a worker
        tc = None
    if tc is None:
        return "", {}
    extra = {"spark_stage": tc.stageId(), "spark_partition": tc.partitionId(),
             "spark_attempt": tc.attemptNumber(), "spark_task_id": tc.taskAttemptId()}
    return ("[stage {spark_stage} partition {spark_partition} attempt {spark_attempt} "
            "TID {spark_task_id}]".format(**extra)), extra


class _Capture:
    """The logger of the rate limit (``RateLimitedLog``): keeps what it
    would log, for :class:`_WorkerLog` to write with the record's tags."""

    def __init__(self) -> None:
        self.out: list[tuple[int, str]] = []

    def log(self, level: int, fmt: str, *args: Any) -> None:
        self.out.append((level, fmt % args if args else fmt))


class _WorkerLog(logging.Handler):
    """The runtime's records in a Spark Python worker, written again to
    ``multilang.spark.<component>`` tagged with the component task, the
    process and the Spark task (stage, partition, attempt, TID), so they
    land in the executor's log (docs/SPARK.md, "Logs"): a bolt's ``log``
    frames and stray prints, its stderr lines, and the runtime's errors
    and warnings. WARN and ERROR lines are rate-limited per component task
    (``multilang.shellbolt._observe.ratelog``): a kind of line is logged once per
    :data:`_LOG_INTERVAL` and then counted, at most :data:`_LOG_KINDS`
    kinds per interval (the rest counted as one), so an error with each
    row's value in it costs a few lines, not one per row. Also keeps the
    last stderr lines of each process, for the cause of the rows it held
    when it died (:meth:`stderr_tail`)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.capture = _Capture()
        self.gate = RateLimitedLog(self.capture, _LOG_INTERVAL)  # type: ignore[arg-type]
        self.windows: dict[str, list[Any]] = {}  # where -> [window start, kinds logged in it]
        self.tails: OrderedDict[int, deque[str]] = OrderedDict()
        self.leases: dict[int, tuple[Any, str, dict[str, Any]]] = {}  # id(lease) -> (engine, tags, attributes)

    # -- the partitions running now ------------------------------------------------------

    def enter(self, lease: Any, engine: "_Engine") -> None:
        tags, extra = _task_tags()
        self.leases[id(lease)] = (engine, tags, extra)

    def leave(self, lease: Any) -> None:
        self.flush_counts()
        self.leases.pop(id(lease), None)

    def _context(self, comp: str | None) -> tuple[str, dict[str, Any]]:
        leases = list(self.leases.values())
        for engine, tags, extra in leases:
            if comp is not None and comp in engine.runtime.topology.components:
                return tags, extra
        if comp is None and len(leases) == 1:
            return leases[0][1], leases[0][2]
        return "[between Spark tasks]", {}

    # -- records -------------------------------------------------------------------------

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._route(record)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)

    def _route(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        comp: str | None = None
        task = pid = None
        m = _WHERE.match(msg) or _COMPONENT.search(msg.split("\n", 1)[0])
        if m is not None:
            comp, task, pid = m.group(1), int(m.group(2)), m.group(3)
        if record.name.startswith("multilang.component."):  # a log() line or a stderr line: "[comp:task pid N] text"
            comp = record.name[len("multilang.component."):]
            if getattr(record, "stream", None) == "stderr" and m is not None and m.start() == 0 \
                    and msg.startswith("[", 0):
                text = msg[m.end() + 2:]
                if pid is not None:
                    self._keep_tail(int(pid), text)
                msg = f"{msg[:m.end()]}] stderr: {text}"
        if record.levelno < logging.WARNING:
            self._write(record.levelno, comp, task, pid, msg)
            return
        now = time.monotonic()
        where = f"{comp}:{task}" if comp is not None else "runtime"
        first = _PREFIX.sub("", msg.split("\n", 1)[0], count=1)  # (the line as it reads: quoted by a count)
        head = _headline(first)
        win = self.windows.get(where)
        if win is None or now - win[0] >= _LOG_INTERVAL:
            if len(self.windows) > 1000:
                self.windows.clear()
            win = self.windows[where] = [now, set()]
        kind = kind_of(where, head)
        if kind not in win[1]:
            if len(win[1]) >= _LOG_KINDS:
                head = f"other kinds of WARN/ERROR line (over {_LOG_KINDS} in {_LOG_INTERVAL:g}s)"
                kind = kind_of(where, head)
            win[1].add(kind)
        self.gate.log(where, record.levelno, now, "%s", first, kind=kind)
        self._drain_capture(comp, task, pid, msg, first)

    def _drain_capture(self, comp: str | None, task: int | None, pid: str | None, msg: str | None,
                       first: str | None) -> None:
        out, self.capture.out = self.capture.out, []
        for level, text in out:
            if msg is not None and text == first:  # the first of its kind in this interval: the whole record
                self._write(level, comp, task, pid, msg)
            else:  # "split:2: 1234 more like this in the last 10s: ..."
                m = _WHERE.match(text)
                self._write(level, m.group(1) if m else comp, int(m.group(2)) if m else task, None, text)

    def flush_counts(self) -> None:
        """Write the counts of lines not logged yet (at the end of a partition)."""
        self.gate.flush(time.monotonic())
        self._drain_capture(None, None, None, None, None)

    def _write(self, level: int, comp: str | None, task: int | None, pid: str | None, msg: str) -> None:
        logger = logging.getLogger(f"multilang.spark.{comp or 'runtime'}")
        if not logger.isEnabledFor(level):
            return
        tags, extra = self._context(comp)
        rec = logger.makeRecord(logger.name, level, "(multilang)", 0, f"{tags} {msg}" if tags else msg, None, None,
                                extra={**extra, "component": comp, "task": task,
                                       "pid": int(pid) if pid is not None else None})
        logger.handle(rec)

    # -- stderr tails --------------------------------------------------------------------

    def _keep_tail(self, pid: int, text: str) -> None:
        tail = self.tails.get(pid)
        if tail is None:
            tail = self.tails[pid] = deque(maxlen=_TAIL_LINES)
            if len(self.tails) > _TAIL_PIDS:
                self.tails.popitem(last=False)
        tail.append(text if len(text) <= 300 else text[:300] + "...")

    def stderr_tail(self, pid: int) -> list[str]:
        """The last stderr lines of process ``pid`` (of a bolt of this worker)."""
        return list(self.tails.get(pid, ()))


_LOG: _WorkerLog | None = None


def _log_level() -> int:
    name = os.environ.get("MULTILANG_SPARK_LOG_LEVEL", "INFO").strip().upper() or "INFO"
    level = logging.getLevelName("WARNING" if name == "WARN" else name)
    return level if isinstance(level, int) else logging.INFO


def _worker_log() -> _WorkerLog:
    """This process's :class:`_WorkerLog`, installed on first use on the
    runtime's loggers (whose level becomes INFO, or DEBUG if asked, unless
    set: stderr tails are kept whatever is written). ``multilang.spark``
    gets the level of ``MULTILANG_SPARK_LOG_LEVEL`` (default INFO) unless
    set, and, when nothing in this process configured logging (a Spark
    worker), a handler writing to stderr in the layout of Spark's lines."""
    global _LOG
    if _LOG is None:
        _LOG = _WorkerLog()
        level = _log_level()
        for name in _SOURCES:
            src = logging.getLogger(name)
            if src.level == logging.NOTSET:
                src.setLevel(min(level, logging.INFO))
            src.addHandler(_LOG)
        out = logging.getLogger("multilang.spark")
        if out.level == logging.NOTSET:
            out.setLevel(level)
        if not out.handlers and not logging.getLogger().handlers:
            h = logging.StreamHandler(sys.stderr)
            h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%y/%m/%d %H:%M:%S"))
            out.addHandler(h)
    return _LOG

class _Feeder(SpoutTask):
    """The spout of a partition runtime: emits the rows the current lease
    queued, reliably (msg id = (lease, row, attempt)); acks and fails go
    straight to the lease (no replay here: the lease decides)."""

    def __init__(self, runtime: Runtime, comp: ComponentDef, task_id: int, engine: "_Engine") -> None:
        super().__init__(runtime, comp, task_id)  # notices stay empty: notify() acts at once
        self.idle = True
        self.engine = engine
        self.queue: deque[tuple[tuple[int, int, int], str, list[Any]]] = deque()

    def notify(self, kind: str, msg_id: Any, cause: str | None = None) -> None:
        lease = self.engine.lease
        if lease is not None:
            lease.notice(kind, msg_id, cause)  # the cause of this row's failure, from the acker
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


class _Many(tuple):
    """The token of a tuple in a chain (the direct lane) anchored to the
    tuples of several rows: their tokens."""

    __slots__ = ()


#: the token of a tuple in a chain that belongs to no row (an unanchored emit upstream)
FREE = object()


def row_tokens(toks: Any) -> list[tuple[int, int, int]]:
    """The row tokens among the tokens of a tuple's anchors (a tick's and
    :data:`FREE` have none)."""
    out = []
    for t in toks:
        if type(t) is tuple:
            out.append(t)
        elif type(t) is _Many:
            out.extend(t)
    return out


class _LeaseSink(BoltSink):
    """The direct lane: the bolts of a partition fed by the lease itself.

    The common shape, one shell bolt reading the rows and every stream of it
    an output, needs no routing and no XOR acker: a row's tree is the one
    tuple sent to the bolt, complete when the bolt acks it, failed when the
    bolt fails it, its process dies or the message timeout passes. So the
    lease puts each row into the bolt task's inbox with its attempt as the
    tuple's token (``(lease id, row, attempt)`` in place of acker edges), and
    this sink takes the bolt's emits, acks and fails straight to the lease.
    A chain of such bolts (each reading the one before it) works the same
    way: an emit to the next bolt goes straight into the inbox of the task
    its grouping picks, with the token of the row it is anchored to, and the
    row counts the tuples of its tree not yet acked instead of XORing edge
    ids; the tree completes when that count is back at 0. The bolt task is
    the runtime's own :class:`ShellBoltTask` (handshake, heartbeats, max
    pending, restarts, frame limits); only what a tuple becomes on the way
    in and out is shorter. Same guarantees as the general path
    (docs/SPARK.md); see :meth:`_Engine._lane_shape` for when it is used.
    ``multilang.hold.emits.until.ack`` needs nothing for a single bolt:
    every output is held until its row's tuple is acked anyway; a chain with
    it takes the general path."""

    def __init__(self, engine: "_Engine", comp: ComponentDef) -> None:
        self.engine = engine
        self.comp = comp
        #: stream -> (number of fields (-1: any), whether the lease takes it, the next bolt's
        #: subscription or None), or None: undeclared
        self._out: dict[str, tuple[int, bool, Any] | None] = {}

    def _out_plan(self, task: Task, stream: str) -> tuple[int, bool, Any] | None:
        """The runtime's emit plan of the stream (``Runtime.emit_plan``), and
        what the lane adds to it: whether the lease takes the stream as an
        output."""
        eng = self.engine
        p = eng.runtime.emit_plan(task, stream)
        plan = None if p.fields is None else (
            p.n_fields, eng.all_outputs or (self.comp.name, stream) in eng.outputs,
            p.subs[0] if p.subs else None)  # the lane's shape: at most one subscriber, the next bolt
        self._out[stream] = plan
        return plan

    def live(self, token: Any) -> bool:
        """A queued row whose attempt the lease no longer waits for (it
        timed out or failed, and its retry is queued) is not written; nor is
        a chained tuple of such an attempt."""
        t = type(token)
        if t is tuple:
            lease = self.engine.lease
            return lease is not None and lease.is_current(token)
        if t is _Many:
            lease = self.engine.lease
            return lease is not None and any(lease.is_current(x) for x in token)
        return True  # a tick's (TupleEdges), or FREE

    def waited_for(self, token: Any) -> bool | None:
        if token is FREE:
            return None  # no tree: an unanchored emit upstream
        return type(token) in (tuple, _Many) and self.live(token)  # a tick is waited for by nobody

    def _tree_failed(self, token: Any, cause: str | None, alone: bool = False) -> None:
        lease = self.engine.lease
        if lease is not None:
            for tok in row_tokens((token,)):  # none for a tick's (TupleEdges) or FREE
                lease.notice("fail", tok, cause, alone)

    def unsent(self, task: ShellBoltTask, token: Any, cause: str) -> None:
        self._tree_failed(token, cause)

    def lost(self, task: ShellBoltTask, cause: str) -> None:
        """The lease replays the rows the dead process had in flight (one
        that was alone in it is to blame; others are tried alone first:
        :meth:`_Lease.notice`); the cause names the process (its pid: the
        lease adds its stderr tail)."""
        tokens = list(task.in_flight.values())
        task.in_flight.clear()
        rows = len(row_tokens(tokens))
        if rows > 1:
            cause = f"{cause} (with {rows - 1} other rows in flight)"
        for token in tokens:
            self._tree_failed(token, cause, rows == 1)

    def acked(self, task: ShellBoltTask, tids: list[str], touched: set[Task]) -> None:
        pop = task.in_flight.pop
        tokens = [pop(tid) for tid in tids]
        lease = self.engine.lease
        if lease is not None:
            lease.acked(tokens)

    def failed(self, task: ShellBoltTask, tid: str, cause: str) -> None:
        self._tree_failed(task.in_flight.pop(tid), cause)  # the bolt's fail, with the error it sent before

    def emits(self, task: ShellBoltTask, emits: list[list[Any]], touched: set[Task]) -> None:
        lease = self.engine.lease
        in_flight = task.in_flight
        out = self._out
        name = task.name
        last_tok: Any = None
        last_row: Any = None  # a lease._Row
        for values, ids, stream in emits:
            plan = out[stream] if stream in out else self._out_plan(task, stream)
            if plan is None or plan[0] >= 0 and len(values) != plan[0]:
                self.emit(task, plain_emit(values, stream, tuple(ids) if ids else ()), touched)
                last_tok = None  # that may have failed the row: its next attempt must not get what follows
                continue
            task.stats.emitted += 1
            if lease is None:
                continue  # between partitions
            if plan[2] is not None:  # to the next bolt of the chain
                self._forward(task, lease, plan[2], values, stream, [in_flight[a] for a in ids] if ids else [],
                              None, touched)
                continue
            if not plan[1]:
                continue  # a stream not selected as output
            if ids and len(ids) == 1:
                tok = in_flight[ids[0]]
                if tok is last_tok:
                    last_row.outputs.append((name, stream, values))  # type: ignore[union-attr]
                    continue
                if type(tok) is tuple:  # else a tick's, FREE or several rows': the general call below
                    row = lease.current(tok)
                    if row is not None:
                        row.outputs.append((name, stream, values))
                        last_tok, last_row = tok, row
                    continue
            lease.direct_output((name, stream, values), [in_flight[a] for a in ids] if ids else [])

    def _forward(self, task: ShellBoltTask, lease: Any, sub: Any, values: list[Any], stream: str,
                 toks: list[Any], targets: list[int] | None, touched: set[Task]) -> None:
        """An emit to the next bolt of the chain: a tuple for each task the
        grouping picks, the rows' trees one tuple larger for each."""
        if targets is None:
            targets = sub.choose(values)
        tok = lease.forward(toks, len(targets))
        if tok is None:
            return  # a row whose attempt is over: the emit is void
        tasks = self.engine.runtime.tasks
        for target in targets:
            t = tasks[target]
            t.deliver(_new_tuple(Delivery, (values, task.name, stream, task.task_id, tok, False)))
            touched.add(t)

    def emit(self, task: ShellBoltTask, ev: Emit, touched: set[Task]) -> list[int]:
        """An emit off the plain path: checked by the runtime (undeclared
        stream, wrong arity, a direct emit nobody can receive: reported, and
        the trees it was anchored to fail), else an output or a tuple for
        the next bolt."""
        toks = [task.in_flight[a] for a in ev.anchors]
        targets = task.runtime.targets(task, ev)
        if targets is None:
            # targets() reported why just now, and route() fails the trees with the same words
            cause = task.runtime.last_emit_error or "an emit of the bolt was refused"
            for tok in dict.fromkeys(toks):
                self._tree_failed(tok, cause)
            return []
        task.stats.emitted += 1
        lease = self.engine.lease
        plan = self._out[ev.stream] if ev.stream in self._out else self._out_plan(task, ev.stream)
        if lease is not None and plan is not None:
            if plan[2] is not None:
                self._forward(task, lease, plan[2], ev.values, ev.stream, toks, targets, touched)
            elif plan[1]:
                lease.direct_output((task.name, ev.stream, ev.values), toks)
        return targets


_STAT_KEYS = ("executed", "emitted", "acked", "failed", "restarts", "errors")


class _Engine:
    """One warm runtime: the spec's bolts as supervised processes, fed by one
    partition (lease) at a time."""

    _ids = 0

    def __init__(self, spec: _Spec, pool: Any) -> None:
        self.spec = spec
        self.pool = pool
        topo = spec.topology(on_worker=True)
        #: a stateful stage of the streaming topology engine names its state
        #: store (adapters/spark/_streaming/state.py): the runtime checkpoints to it (§9.7)
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
        #: the direct lane (_LeaseSink): the first bolt's grouping over its tasks, or None
        self.direct: Any = None
        #: the direct lane's bolts, the first (reading the rows) first
        self.chain: list[ComponentDef] = [] if self.stateful else self._lane_shape(rt, spec)  # held acks need the acker
        for comp in self.chain:
            for t in comp.tasks:
                rt.tasks[t] = ShellBoltTask(rt, comp, t, sink=_LeaseSink(self, comp))
        if self.chain:
            self.direct = rt.subscribers(*spec.single_source)[0]  # type: ignore[misc]
        self.bolt_tasks = [t for t in rt.tasks.values() if not isinstance(t, SpoutTask)]
        self.lease: Any = None  # the lease._Lease of the partition being served, or None
        self.finished = trio.Event()
        self.error: BaseException | None = None
        self.idle_since = 0.0
        self.leases = 0
        _worker_log()

    @staticmethod
    def _lane_shape(rt: Runtime, spec: _Spec) -> list[ComponentDef]:
        """The shell bolts of a spec that the direct lane can run, in chain
        order, or []: the rows are one spout stream, acking is on, and the
        spec is one shell bolt subscribing to them, or a chain of shell bolts
        each subscribing to the one before it, every subscription by a
        grouping that picks one task per tuple (not ``all``, not ``direct``)
        and every stream read by at most that one next bolt. A chain with
        ``multilang.hold.emits.until.ack`` takes the general path. Off with
        ``MULTILANG_SPARK_DIRECT=0`` in the workers' environment."""
        if os.environ.get("MULTILANG_SPARK_DIRECT", "1").strip() == "0":
            return []
        single = spec.single_source
        bolts = {c.name: c for c in rt.topology.components.values() if c.kind == "bolt"}
        if single is None or not rt.acking or not bolts or not all(c.is_shell for c in bolts.values()):
            return []
        chain: list[ComponentDef] = []
        source, streams = single[0], [single[1]]
        while True:
            subs = [(c, i) for st in streams for c, i in rt.topology.subscribers(source, st)]
            if not subs:
                break
            if len(subs) != 1:
                return []
            comp, inp = subs[0]
            if len(comp.inputs) != 1 or not grouping_class(inp.grouping).one_task or comp in chain:
                return []
            chain.append(comp)
            source, streams = comp.name, list(comp.outputs)
        if len(chain) != len(bolts):
            return []
        if len(chain) > 1 and any(rt.topology.conf_for(c.name).get("multilang.hold.emits.until.ack") for c in chain):
            return []
        return chain

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
            cause = f"timed out: not completed within {timeout:g}s (topology.message.timeout.secs)"
            for tok in late:
                lease.notice("fail", tok, cause)

    def quiet(self, since: float | None = None) -> bool:
        """Nothing left that could still produce output for the lease: no queued
        rows or tuples and no tuple in flight whose tree is alive. A tuple in
        flight whose tree already failed (a bolt that never acks it) does not
        count; unanchored tuples in flight (acking off) are waited for up to the
        message timeout after ``since``. In the direct lane every tuple is a
        row's, so a lease without rows left is quiet, but for the chained
        tuples of unanchored emits (FREE), waited for like those."""
        if self.direct is not None:
            if self.lease is not None and self.lease.rows:
                return False
            if len(self.chain) == 1:
                return True
            patient = since is None or trio.current_time() - since < self.runtime.acker.timeout
            for t in self.bolt_tasks:
                if any(d.edges is FREE for d in t.inbox):
                    return False
                if patient and any(tok is FREE for tok in t.in_flight.values()):
                    return False
            return True
        if any(f.queue for f in self.feeders.values()) or self.runtime.acker.pending:
            return False
        roots = self.runtime.acker.roots
        patient = since is not None and trio.current_time() - since < self.runtime.acker.timeout
        for t in self.bolt_tasks:
            if t.inbox:
                return False
            for edges in t.in_flight.values():
                ids = roots_of(edges)
                if not ids:
                    if patient or since is None:
                        return False
                elif any(r in roots for r in ids):
                    return False
        return True

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {name: {k: getattr(s, k) for k in _STAT_KEYS} for name, s in self.runtime.stats.items()
                if name not in self.spec.sources}

    def _on_output(self, component: str, stream: str, values: list[Any], roots: list[int]) -> None:
        lease = self.lease
        if lease is not None and (self.all_outputs or (component, stream) in self.outputs):
            lease.output(component, stream, values, roots)
