"""The source state on the driver: the replay log, the supervised spout and
the bookkeeping of unacked message ids; pulls tuples into the log and acks
them to the spout once Spark committed their batch.

Two threads share it (docs/SPARK.md, "How it runs"):

* the **driver thread** (Spark's calls: ``latestOffset``, ``partitions``,
  ``commit``) reads and writes the replay log's files;
* the **loop thread** (the process's :class:`~multilang.adapters._sync.TrioHost`)
  runs the *pump*, a background task that talks to the spout between
  Spark's calls: it sends the acks of committed batches and prefetches tuples
  into a bounded buffer.

Everything about tuples in memory (the buffer, the unacked and in-flight
ids, the notices, the pump's state) is touched in the loop thread only; the
driver thread gets there through ``run``/``run_sync``. The id record (SQLite)
is used by both, behind its own lock.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from itertools import islice, takewhile
from typing import Any

import trio

from multilang.messages import Ack, Emit, Error, Fail, Log, Message, Metrics, Next
from multilang.shellbolt import SCHEMA, RateLimitedLog

from .options import _json_text, _Options, _RowConverter
from .replay_log import _digest, _id_key, _ReplayLog
from .spout_host import _live_states, _SupervisedSpout

log = logging.getLogger("multilang.spark.source")
_rated = RateLimitedLog(log)

_PY_LEVEL = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}

#: After a ``next`` that brought nothing the pump waits this long before the
#: next one, doubling up to the maximum (the spout wait strategy, §4.6); a
#: planning call cuts the wait short.
_IDLE_WAIT_MIN = 0.005
_IDLE_WAIT_MAX = 0.05
#: The most time closing spends delivering the acks of committed batches still queued.
_CLOSE_ACKS_SECS = 10.0


class _Signal:
    """Wake every waiter (loop thread only)."""

    def __init__(self) -> None:
        self._ev = trio.Event()

    def fire(self) -> None:
        self._ev.set()
        self._ev = trio.Event()

    async def wait(self, deadline: float = math.inf) -> None:
        ev = self._ev
        with trio.move_on_at(deadline):
            await ev.wait()


def _cancelled(exc: BaseException) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_cancelled(e) for e in exc.exceptions)
    return False


class _SourceState:
    """Replay log + supervised spout + bookkeeping of unacked message ids."""

    def __init__(self, opts: _Options, fields: list[str], convert: _RowConverter) -> None:
        self.opts = opts
        self.fields = fields
        self.convert = convert
        self.log = _ReplayLog(opts.replay_log, record_ids=opts.dedupe == "all", cache_mb=opts.dedupe_cache_mb)
        self.available_now = False
        self._drained = False  # availableNow: the spout had nothing for availableNowIdleMs
        # Reliable tuples taken and not yet acked: position-ordered (pos, id) for
        # logged ones; id key -> (pos or None while buffered, values digest).
        # Both hold only uncommitted tuples (at most maxPending, if set); the id
        # of every tuple ever logged is in the replay log's on-disk record (dedupe=all).
        self.unacked: deque[tuple[int, Any]] = deque()
        self.inflight: dict[str, tuple[int | None, bytes]] = {}
        self.buffer: list[tuple[Any, list[Any]]] = []  # taken (prefetched), not yet logged
        self.buffer_ids: list[tuple[str, int, bytes]] = []  # (id key, index in buffer, digest) to record
        self._buffered_reliable = 0  # tuples with an id in the buffer
        self._logging = 0  # tuples with an id taken from the buffer, being written to the log
        self.notices: deque[Message] = deque()  # acks/fails to deliver after the current command
        self.rejected = 0
        self.duplicates = 0
        self._received = 0  # emits of the stream so far (kept, dropped as repeats or rejected)
        pos = self.log.committed
        for rec in self.log.read(self.log.committed, self.log.end):
            if rec["id"] is not None:
                self.unacked.append((pos, rec["id"]))
                self.inflight[_id_key(rec["id"])] = (pos, _digest(rec["values"]))
            pos += 1
        # Positions below this are committed: the pump acks their ids, in order.
        # Written by the driver thread only (commit), read by the pump.
        self._ack_upto = self.log.committed
        # The pump (loop thread).
        self._pump_started = False
        self._pump_done: trio.Event | None = None
        self._pump_scope: trio.CancelScope | None = None
        self._pump_exited = False
        self._failed: BaseException | None = None  # why the pump stopped: raised by the next driver call
        self._closing = False
        self._busy = False  # a command is out, waiting for its sync
        self._nexts = 0  # `next` commands completed
        self._last_empty = False  # the last `next` brought nothing
        self._last_empty_at = 0.0
        self._idle_since: float | None = None  # since when every `next` brought nothing
        self._next_at = 0.0  # no `next` before this (the wait after an empty one)
        self._poked = False  # a planning call wants a fresh `next` now
        #: nexts in the next write, and the most commands per write (§9.5, to a spout that accepted batch)
        self._burst = 1
        self._most = int(opts.conf.get("topology.producer.batch.size") or SCHEMA["topology.producer.batch.size"].default)
        self._gather_want: float | None = None  # the rows a waiting planning call wants
        self._work = _Signal()  # for the pump: something to do
        self._progress = _Signal()  # for a planning call: the pump did something
        self.spout = _SupervisedSpout(opts, fields, self._on_events, before_close=self._stop_pump)
        _live_states.add(self)

    # offsets

    def offset(self, pos: int) -> dict:
        return {"log": self.log.id, "pos": pos}

    def check_offset(self, off: dict) -> int:
        if not isinstance(off, dict) or off.get("log") != self.log.id or not isinstance(off.get("pos"), int):
            raise RuntimeError(
                f"offset {off!r} does not belong to replay log {self.log.dir} (id {self.log.id}): "
                "restart the query with the replayLog directory it used before (or a fresh checkpoint)"
            )
        pos = off["pos"]
        if pos > self.log.end:
            raise RuntimeError(f"offset {off!r} is past the end ({self.log.end}) of replay log {self.log.dir}")
        return pos

    # spout events (loop thread)

    def _on_events(self, events: list[Message]) -> None:
        opts = self.opts
        for ev in events:
            t = type(ev)
            if t is Emit:
                self._received += 1
                self._on_emit(ev)
            elif t is Log:
                log.log(_PY_LEVEL.get(ev.level, logging.INFO), "[%s pid %s] %s", opts.component, self.spout.pid, ev.msg)
            elif t is Error:
                log.error("component %r task %d (pid %s) reported an error: %s",
                          opts.component, opts.task_id, self.spout.pid, ev.msg)
            elif t is Metrics:
                pass

    def _on_emit(self, ev: Emit) -> None:
        msg_id = ev.id
        why = None
        if ev.task is not None:
            why = f"direct emit to task {ev.task}; the Spark consumer (task {self.opts.consumer_task}) does not read directly"
        elif ev.stream != self.opts.stream:
            why = f"emit on stream {ev.stream!r}; this source reads stream {self.opts.stream!r}"
        else:
            why = self.convert.problem(msg_id, ev.values)
        if why is not None:
            self.rejected += 1
            log.error("component %r task %d (pid %s): tuple rejected and %s: %s (tuple %s)",
                      self.opts.component, self.opts.task_id, self.spout.pid,
                      "failed" if msg_id is not None else "dropped", why, _json_text(ev.values)[:200])
            if msg_id is not None:
                self.notices.append(Fail(id=msg_id))  # after this command's sync (§4.7 style)
            return
        if msg_id is not None and self.opts.dedupe != "none":
            key = _id_key(msg_id)
            digest = _digest(ev.values)
            seen = self.inflight.get(key)
            if seen is not None:  # taken before and not yet acked: its ack will answer this one too
                self._duplicate(key, seen[1] != digest, "not yet committed")
                return
            if self.opts.dedupe == "all":
                first = self.log.ids.lookup(key) if self.log.ids is not None else None
                if first is not None:  # logged before; not in flight, so committed (in the sink)
                    self._duplicate(key, first[1] is not None and first[1] != digest, "committed")
                    self.notices.append(Ack(id=msg_id))
                    return
                self.buffer_ids.append((key, len(self.buffer), digest))
            self.inflight[key] = (None, digest)
        elif msg_id is not None:
            self.inflight.setdefault(_id_key(msg_id), (None, _digest(ev.values)))
        if msg_id is not None:
            self._buffered_reliable += 1
        self.buffer.append((msg_id, ev.values))

    def _duplicate(self, key: str, other_values: bool, first_copy: str) -> None:
        self.duplicates += 1
        if other_values:  # rate-limited: a spout with unstable ids would do this for every tuple
            opts = self.opts
            why = ("dedupe=all takes ids for record identities; a spout that reuses ids for new data "
                   "needs dedupe=inflight") if opts.dedupe == "all" else "ids must be unique among pending tuples"
            _rated.log(f"{opts.component}:{opts.task_id}", logging.WARNING, time.monotonic(),
                       "component %r task %d emitted message id %s again with other values than its first "
                       "copy (%s); dropped: %s", opts.component, opts.task_id, key[:100], first_copy, why)

    def _pending(self) -> int:
        """Reliable tuples taken from the spout and not yet acked (maxPending counts these)."""
        return len(self.unacked) + self._buffered_reliable + self._logging

    def _acks_due(self) -> bool:
        return bool(self.unacked) and self.unacked[0][0] < self._ack_upto

    # the pump (loop thread)

    def _room(self) -> float:
        """How many more tuples the pump may take now: the buffer holds at
        most one batch (maxBatchSize), or what a planning call waiting now
        asks for if that is more (a read limit above it), within maxPending."""
        cap = self.opts.max_batch_size
        if self._gather_want is not None:
            cap = max(cap, self._gather_want)
        room = cap - len(self.buffer)
        mp = self.opts.max_pending
        return room if mp is None else min(room, mp - self._pending())

    def _may_pull(self) -> bool:
        if self._closing or (self.available_now and self._drained):
            return False
        return self._room() > 0

    async def _command(self, *cmds: Message) -> None:
        self._busy = True
        try:
            await self.spout.host.command(*cmds)
        finally:
            self._busy = False

    def _per_write(self) -> int:
        """How many commands may go in one write: topology.producer.batch.size
        to a spout that accepted batch (§9.5), else 1 (§4.2)."""
        return self._most if self.spout.host.pipelined else 1

    async def _deliver_notices(self) -> None:
        while self.notices:
            n = min(len(self.notices), self._per_write())
            await self._command(*islice(self.notices, n))
            for _ in range(n):  # (a notice added meanwhile is behind them)
                self.notices.popleft()

    async def _pump(self) -> None:
        assert self._pump_scope is not None and self._pump_done is not None
        try:
            with self._pump_scope:
                try:
                    await self._pump_loop()
                except BaseException as exc:
                    if _cancelled(exc):
                        raise
                    self._failed = exc
        finally:
            self._pump_exited = True
            self._pump_done.set()
            self._progress.fire()

    async def _pump_loop(self) -> None:
        """Acks of committed batches first, in position order, each with its
        sync; then the notices; then ``next`` while the buffer and maxPending
        allow it. While a planning call waits for its batch, its ``next``
        goes before the acks (they keep their order, and the call returns
        no empty batch before they are out). One command at a time (§4.2),
        or, to a spout that accepted batch, runs of them in one write
        (§9.5): the acks due, the notices, and ``next`` in bursts."""
        await self.spout.host.ensure_started()
        idle_wait = 0.0
        while True:
            may_pull = self._may_pull()
            pull_now = may_pull and (self._poked or trio.current_time() >= self._next_at)
            if self._acks_due() and not (pull_now and self._gather_want is not None):
                run = list(islice(takewhile(lambda e: e[0] < self._ack_upto, self.unacked), self._per_write()))
                await self._command(*[Ack(id=msg_id) for _p, msg_id in run])
                for p, msg_id in run:
                    self.unacked.popleft()
                    key = _id_key(msg_id)
                    if self.inflight.get(key, (None,))[0] == p:
                        del self.inflight[key]
                await self._deliver_notices()
                self._progress.fire()
                continue
            if self.notices:
                await self._deliver_notices()
                self._progress.fire()
                continue
            if self._closing:
                return
            if not may_pull:
                await self._work.wait()
                continue
            if not pull_now:
                await self._work.wait(self._next_at)
                continue
            self._poked = False
            before = self._received
            n = max(1, int(min(self._burst, self._room()))) if self.spout.host.pipelined else 1
            await self._command(*[Next()] * n)
            self._nexts += n
            now = trio.current_time()
            # As the runtime's shell spouts (issue 34): twice as many nexts after a
            # write whose nexts each brought at most one emit (kept, or a repeat of
            # a committed id: a restarted spout's), together at least one.
            brought = self._received - before
            self._burst = min(self._burst * 2, self._most) if 0 < brought <= n else 1
            if self._received > before:
                self._idle_since = None
                self._last_empty = False
                idle_wait = 0.0
                self._next_at = 0.0
            else:  # the spout had nothing
                if self._idle_since is None:
                    self._idle_since = now
                self._last_empty = True
                self._last_empty_at = now
                idle_wait = min(idle_wait * 2, _IDLE_WAIT_MAX) if idle_wait else _IDLE_WAIT_MIN
                self._next_at = now + idle_wait
            await self._deliver_notices()
            self._progress.fire()

    def _start_pump(self) -> None:  # loop thread
        if self._pump_started:
            return
        self._pump_started = True
        self._pump_done = trio.Event()
        self._pump_scope = trio.CancelScope()
        self.spout.start_soon(self._pump)

    def _ensure_pump(self) -> None:
        """Driver thread: start the spout and the pump on the first call that needs them."""
        self._raise_failed()
        if not self._pump_started:
            self.spout.run_sync(self._start_pump)

    def _raise_failed(self) -> None:
        if self._failed is not None:
            raise self._failed

    async def _stop_pump(self) -> None:
        """Before the spout closes: no more ``next``; the acks already due and
        the notices are delivered (for at most ``_CLOSE_ACKS_SECS``), then the
        pump ends. Prefetched tuples stay unlogged: abandoned."""
        self._closing = True
        if not self._pump_started or self._pump_exited:
            return
        assert self._pump_done is not None and self._pump_scope is not None
        self._work.fire()
        with trio.move_on_after(_CLOSE_ACKS_SECS):
            await self._pump_done.wait()
        if not self._pump_done.is_set():
            left = sum(1 for p, _ in self.unacked if p < self._ack_upto)
            log.warning("multilang source: closing with %d acks of committed tuples undelivered after %gs",
                        left, _CLOSE_ACKS_SECS)
            self._pump_scope.cancel()
            await self._pump_done.wait()

    # pulling (a planning call)

    def pull(self, start: int, max_rows: int | None) -> None:
        """Take the batch after ``start`` (what the pump prefetched, and more
        until the batch is full, the spout has nothing, maxPending is reached or
        maxBatchDurationMs passed) and log it durably (docs/SPARK.md,
        "Offsets, replay log, commit")."""
        self._ensure_pump()
        recs, ids = self.spout.run(self._gather, start, max_rows)
        if not recs:
            return
        try:
            a, _ = self.log.append(recs, ids)
        except BaseException:
            self.spout.run_sync(self._logged, None, recs)
            raise
        self.spout.run_sync(self._logged, a, recs)

    async def _gather(self, start: int, max_rows: int | None) -> tuple[list, list]:
        """Loop thread: wait until the buffer holds the batch's rows (or why
        not), then take them out of the buffer."""
        opts = self.opts
        want = None if max_rows is None else start + max_rows - self.log.end
        if (want is not None and want <= 0) or (self.available_now and self._drained):
            return self._take(0 if want is not None and want <= 0 else None)
        deadline = math.inf  # (set once the spout has answered a `next`: below)
        nexts = self._nexts
        self._gather_want = math.inf if want is None else want
        self._poked = True  # a fresh `next` now, as a planning call always made one
        self._work.fire()
        try:
            while True:
                self._raise_failed()
                if self._pump_exited:
                    break
                if want is not None and len(self.buffer) >= want:
                    break
                mp = opts.max_pending
                if mp is not None and self._pending() >= mp and not self._acks_due():
                    break  # nothing more until Spark commits
                have_data = bool(self.buffer) or self.log.end > start
                now = trio.current_time()
                # maxBatchDurationMs counts once the spout has answered a `next`, as Kafka's source
                # waits for its first fetch: a spout slower to start than that looked like one with
                # nothing, and processAllAvailable on a fresh query returned having processed nothing.
                # A start that never comes ends in the handshake timeout and the restart budget.
                if deadline == math.inf and self._nexts:
                    deadline = now + opts.max_batch_duration
                timed = deadline < math.inf and (have_data or not self.available_now)
                # availableNow must not return `start` (that ends the query) before the spout drained.
                if timed and now >= deadline:
                    break
                if self._nexts > nexts and self._last_empty:  # the spout had nothing, just now
                    if have_data:
                        break  # return what we have (availableNow: keep draining in the next call)
                    # No new batch: Spark may stop the query now (availableNow ends, a caller
                    # of processAllAvailable stops it), so not before the acks due are out.
                    if self._acks_due() or self.notices:
                        pass
                    elif not self.available_now:
                        break  # Spark polls again soon: that is the spout wait strategy (§4.6)
                    elif not self._busy and self._last_empty_at - self._idle_since >= self._idle_enough:  # type: ignore[operator]
                        self._drained = True
                        log.info("multilang source: spout drained after %d tuples (availableNow)", self.log.end)
                        break
                await self._progress.wait(deadline if timed else math.inf)
        finally:
            self._gather_want = None
        return self._take(want)

    @property
    def _idle_enough(self) -> float:
        """How long the spout's nexts must bring nothing before its data counts
        as drained (availableNow): ``availableNowIdleMs``, and before its first
        emit to the query ``multilang.spout.start.secs`` of its conf (a spout
        still connecting to its source answers `next` with nothing too; as
        the embedded engine waits for it, shellbolt/_runtime/spouts.py)."""
        if self._received or self.log.end:  # (or an earlier run of the query read from it)
            return self.opts.available_now_idle
        start = self.opts.conf.get("multilang.spout.start.secs")
        return max(self.opts.available_now_idle,
                   float(SCHEMA["multilang.spout.start.secs"].default if start is None else start))

    def _take(self, want: int | None) -> tuple[list, list]:
        """Loop thread: the first ``want`` buffered tuples (all if None), out of the buffer."""
        n = len(self.buffer) if want is None else max(0, min(want, len(self.buffer)))
        if n == 0:
            return [], []
        recs = self.buffer[:n]
        del self.buffer[:n]
        ids = [t for t in self.buffer_ids if t[1] < n]
        self.buffer_ids = [(k, i - n, d) for k, i, d in self.buffer_ids if i >= n]
        reliable = sum(1 for msg_id, _ in recs if msg_id is not None)
        self._buffered_reliable -= reliable
        self._logging += reliable
        self._work.fire()  # room in the buffer: the pump prefetches the next batch while this one is written
        return recs, ids

    def _logged(self, a: int | None, recs: list[tuple[Any, list[Any]]]) -> None:
        """Loop thread: ``recs`` are in the log from position ``a`` (None: the write failed)."""
        for off, (msg_id, values) in enumerate(recs):
            if msg_id is None:
                continue
            self._logging -= 1
            if a is None:
                continue
            pos = a + off
            self.unacked.append((pos, msg_id))
            key = _id_key(msg_id)
            entry = self.inflight.get(key)
            if entry is None or entry[0] is None:
                self.inflight[key] = (pos, entry[1] if entry else _digest(values))
        self._work.fire()

    # committing

    def commit(self, pos: int) -> None:
        """Spark committed everything below ``pos``: the pump acks it to the
        spout in the background; ``committed.json`` records it now."""
        self._raise_failed()
        if pos > self._ack_upto:
            self._ack_upto = pos
            if self._pump_started:
                self.spout.run_sync(self._work.fire)
            elif self.unacked and self.unacked[0][0] < pos:
                self._ensure_pump()
        if pos > self.log.committed:
            self.log.mark_committed(pos)

    # for tests and tools (driver thread)

    def wait_acked(self, timeout: float = 30.0) -> bool:
        """Wait until every committed tuple's ack went out; False on timeout."""
        return bool(self.spout.run(self._until, lambda: not self._acks_due() and not self.notices, timeout))

    def wait_buffered(self, n: int, timeout: float = 30.0) -> bool:
        """Wait until the pump prefetched at least ``n`` tuples; False on timeout."""
        return bool(self.spout.run(self._until, lambda: len(self.buffer) >= n, timeout))

    async def _until(self, cond: Any, timeout: float) -> bool:
        deadline = trio.current_time() + timeout
        while not cond():
            self._raise_failed()
            if trio.current_time() >= deadline or self._pump_exited:
                return bool(cond())
            await self._progress.wait(deadline)
        return True

    def close(self) -> None:
        _live_states.discard(self)
        _rated.flush(time.monotonic())  # the count of warnings held back
        try:
            self.spout.close()
        finally:
            self.log.close()
