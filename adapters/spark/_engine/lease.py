"""The lease: one partition's session with an engine, which carries the
exactly-once promise: rows are roots, a row's outputs are held until its tree
completes, failed rows are replayed, then raised or dead-lettered with the
cause of their own last failure.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, NamedTuple

import trio

from multilang.shellbolt import Delivery

from .engine import _STAT_KEYS, FREE, _Engine, _Many, _worker_log, row_tokens
from .spec import RowFailed, StatefulBoltCrashed, _Options, _short

_new_tuple = tuple.__new__  # a named tuple's fields in order, without its keyword __new__


#: the pid in a ComponentError's text: "component 'split' task 2 (pid 77): ..."
_PID = re.compile(r"\(pid (\d+)\)")


class _Multi:
    """An output anchored to several rows: released when all completed."""

    __slots__ = ("rec", "pending", "dead", "first")

    def __init__(self, rec: tuple[str, str, list[Any]], n: int, first: "_Row") -> None:
        self.rec = rec
        self.pending = n
        self.dead = False
        self.first = first  # keyed leases: the output carries the key of its first anchor's row


class _Row:
    __slots__ = ("source", "stream", "values", "attempt", "charged", "outputs", "sent_at", "done", "dead", "multi",
                 "key", "cause", "pending", "suspect")

    def __init__(self, source: str, stream: str, values: list[Any], key: Any = None) -> None:
        self.source = source
        self.stream = stream
        self.values = values
        self.attempt = 0  # its attempts so far, less one (the token of its current attempt)
        self.charged = 0  # its failed attempts that count against max_retries (_Lease.notice)
        self.outputs: list[Any] = []
        self.sent_at: float | None = None
        self.done = False
        self.dead: str | None = None
        self.multi = False  # some output is anchored to other rows too (a _Multi)
        self.key = key  # keyed leases: what the caller carries through (the keep columns)
        self.cause: str | None = None  # why the last attempt failed, as the runtime said
        #: the direct lane: tuples of this attempt's tree not yet acked (the row's own, and in a
        #: chain the ones its bolts emitted to the next bolt); the tree completes at 0
        self.pending = 1
        self.suspect = False  # in flight beside another row when its process died: waits to be tried alone


#: keyed leases: the mark before an output tied to no row (unanchored)
_NO_ROW = _Row("", "", [])


class _Dead(NamedTuple):
    source: str
    stream: str
    values: list[Any]
    error: str
    attempts: int
    key: Any = None


class _Lease:
    """One partition's session with an engine (the :class:`~._sync.Session`
    that :func:`~._sync.pump` drives).

    A *keyed* lease (``opts.keyed``) takes ``(values, key)`` items and puts
    the row of each output before it in the released list (a :class:`_Row`
    mark, whose ``key`` the caller reads; :data:`_NO_ROW` before an
    unanchored output); dead letters carry the key too."""

    _next_id = 0

    def __init__(self, engine: _Engine, opts: _Options) -> None:
        _Lease._next_id += 1
        self.id = _Lease._next_id
        self.engine = engine
        self.opts = opts
        self.rows: dict[int, _Row] = {}
        self.seq = 0
        self.release_next = 0
        self.ready: list[Any] = []
        self.error: BaseException | None = None
        self.lot = trio.lowlevel.ParkingLot()
        self.single = engine.spec.single_source
        self.counters = {"rows_in": 0, "tuples_out": 0, "acked": 0, "failed": 0, "retried": 0,
                         "dead_letter": 0, "unanchored": 0, "warm_reuse": 1 if engine.leases else 0}
        engine.leases += 1
        self.stats0 = engine.snapshot()
        self.restarts0 = self._restarts()
        # Each partition gets the restart budget afresh: a warm engine's earlier partitions' deaths (another
        # Spark task's poison rows, a minute ago) do not count against this one's (a trial: the third task
        # on a Python worker gave up on its one poison row).
        for name in {t.name for t in engine.bolt_tasks}:
            engine.runtime.restart_times(name).clear()
        self.timeout = engine.runtime.acker.timeout
        self.emptied_at: float | None = None  # when the last row was resolved
        self._last_root: int | None = None  # cache: root -> row of the last output
        self._last_row: _Row | None = None
        self._last_attempt = -1
        self.keyed = opts.keyed
        self.crash: str | None = None  # the first process death this lease saw, with its stderr tail
        #: rows in flight beside others when their process died, in the order they failed: each is tried
        #: alone (:meth:`_isolate`), so that a crash is charged to the row that caused it
        self.suspects: deque[int] = deque()
        self.alone: int | None = None  # the suspect being tried alone now (nothing else is in flight)
        self.isolating = True  # (off once a row tried alone timed out: :meth:`_stop_isolating`)
        self._crash_cause: tuple[str, str] | None = None  # cache: a crash cause -> it with the tail
        self.log = _worker_log()
        self.log.enter(self, engine)

    def _restarts(self) -> int:
        return sum(s.restarts for s in self.engine.runtime.stats.values())

    def wake(self) -> None:
        if len(self.lot):
            self.lot.unpark_all()

    async def _wait(self, timeout: float) -> None:
        with trio.move_on_after(timeout):
            await self.lot.park()

    def _check(self) -> None:
        if self.error is not None:
            raise self.error
        failure = self.engine.failure()
        if failure is not None:
            raise failure
        if self.opts.stateful and self._restarts() > self.restarts0:
            names = [n for n, s in self.engine.runtime.stats.items() if s.restarts > self.stats0.get(n, {}).get("restarts", 0)]
            self.error = StatefulBoltCrashed(
                f"a process of stateful component(s) {names} died mid-partition; its in-memory state is lost, so "
                "this Spark task fails and Spark reruns the whole partition with a fresh process "
                "(spark.task.maxFailures; locally use master local[N,F])" + (f"\n  {self.crash}" if self.crash else ""),
                component=names[0] if names else None,
                task=next((t.task_id for t in self.engine.bolt_tasks if names and t.name == names[0]), None),
            )
            raise self.error

    # -- fed from the partition (sync side, through pump) ------------------------------

    async def exchange(self, items: list[Any]) -> list[Any]:
        self._check()
        while len(self.rows) >= self.opts.max_in_flight or self.suspects or self.alone is not None:
            await self._wait(0.25)  # (no new row while suspects are tried alone)
            self._check()
        if self.engine.direct is not None:
            return self._feed(items)
        feeders = self.engine.feeders
        single = self.single
        rows = self.rows
        lid = self.id
        touched = set()
        keyed = self.keyed
        key = None
        for item in items:
            if keyed:
                item, key = item
            if single is not None:
                source, stream = single
                values = item
            else:
                source, stream, values = item
            seq = self.seq
            self.seq += 1
            rows[seq] = _Row(source, stream, values, key)
            f = feeders[source]
            f.queue.append(((lid, seq, 0), stream, values))
            touched.add(f)
        for f in touched:
            f.kick()
        self.counters["rows_in"] += len(items)
        return self._take()

    def _feed(self, items: list[Any]) -> list[Any]:
        """The direct lane (:class:`_LeaseSink`): each row straight into
        the inbox of the bolt task its grouping picks."""
        source, stream = self.single  # type: ignore[misc]
        grouping = self.engine.direct
        tasks = self.engine.runtime.tasks
        one = tasks[grouping.tasks[0]] if len(grouping.tasks) == 1 else None
        src_task = self.engine.feeders[source].task_id
        rows = self.rows
        lid = self.id
        now = trio.current_time()
        keyed = self.keyed
        key = None
        for values in items:
            if keyed:
                values, key = values
            seq = self.seq
            self.seq = seq + 1
            row = rows[seq] = _Row(source, stream, values, key)
            row.sent_at = now
            t = one if one is not None else tasks[grouping.choose(values)[0]]
            t.inbox.append(_new_tuple(Delivery, (values, source, stream, src_task, (lid, seq, 0), False)))
        for t in self.engine.bolt_tasks:
            t.kick()
        self.counters["rows_in"] += len(items)
        return self._take()

    def _resend(self, seq: int, row: _Row) -> None:
        """Replay a row (its attempt already counted up)."""
        eng = self.engine
        if eng.direct is None:
            f = eng.feeders[row.source]
            f.queue.append(((self.id, seq, row.attempt), row.stream, row.values))
            f.kick()
            return
        grouping = eng.direct
        t = eng.runtime.tasks[grouping.choose(row.values)[0]]
        row.sent_at = trio.current_time()
        t.deliver(_new_tuple(Delivery, (row.values, row.source, row.stream, eng.feeders[row.source].task_id,
                                        (self.id, seq, row.attempt), False)))

    async def drain(self) -> tuple[list[Any], bool]:
        while True:
            self._check()
            out = self._take()
            done = False
            if not self.rows:
                if self.emptied_at is None:
                    self.emptied_at = trio.current_time()
                done = self.engine.quiet(self.emptied_at)
            if out or done:
                return out, done
            await self._wait(0.25 if self.rows else 0.005)

    async def close(self, ok: bool) -> dict[str, Any]:
        eng = self.engine
        eng.runtime.errlog.flush(trio.current_time())  # the counts of this partition's errors not logged yet
        self.log.leave(self)
        eng.lease = None
        quiet = eng.quiet(self.emptied_at)
        for f in eng.feeders.values():
            f.queue.clear()
        if eng.direct is not None:  # rows of this lease not sent yet: nobody wants them now
            for t in eng.bolt_tasks:
                t.inbox.clear()
        after = eng.snapshot()
        comps = {name: {k: after[name][k] - self.stats0.get(name, {}).get(k, 0) for k in _STAT_KEYS} for name in after}
        counters: dict[str, Any] = dict(self.counters)
        counters["restarts"] = sum(c["restarts"] for c in comps.values())
        counters["components"] = comps
        reusable = (ok and self.error is None and self.opts.warm and not self.opts.stateful and not self.rows
                    and quiet and eng.healthy())
        eng.pool.give_back(eng, reusable)
        return counters

    def _take(self) -> list[Any]:
        # Always hand over a list the loop will never touch again: the caller
        # reads it in another thread while this loop keeps releasing outputs.
        out = self.ready
        self.ready = []
        return out

    # -- called by the runtime (inside route / settle) -----------------------------------

    def output(self, component: str, stream: str, values: list[Any], roots: list[int]) -> None:
        rec = (component, stream, values)
        if not roots:
            self._unanchored(rec)
            return
        if len(roots) == 1 and roots[0] == self._last_root:
            # The common case: more emits anchored to the same tree.
            row = self._last_row
            if row.attempt == self._last_attempt and self.engine.runtime.acker.roots.get(roots[0]) is not None:
                row.outputs.append(rec)
                return
        acker_roots = self.engine.runtime.acker.roots
        rows = []
        for r in roots:
            root = acker_roots.get(r)
            if root is None:
                return  # the tree already failed: this attempt's outputs are void
            lid, seq, attempt = root.msg_id
            row = self.rows.get(seq)
            if lid != self.id or row is None or row.attempt != attempt:
                return
            rows.append(row)
        self._hold(rec, rows)
        if len(rows) == 1:
            self._last_root, self._last_row, self._last_attempt = roots[0], rows[0], rows[0].attempt

    def _unanchored(self, rec: tuple[str, str, list[Any]]) -> None:
        """An output tied to no row: released at once."""
        self.counters["unanchored"] += 1
        self.counters["tuples_out"] += 1
        if self.keyed:
            self.ready.append(_NO_ROW)
        self.ready.append(rec)
        self.wake()

    def _hold(self, rec: tuple[str, str, list[Any]], rows: list[_Row]) -> None:
        """Keep an output until the trees of its rows complete (all of them:
        a :class:`_Multi`)."""
        if len(rows) == 1:
            rows[0].outputs.append(rec)
            return
        m = _Multi(rec, len(rows), rows[0])
        for row in rows:
            row.outputs.append(m)
            row.multi = True

    def current(self, tok: tuple[int, int, int]) -> _Row | None:
        """The direct lane: the row of a tuple's tree, if that attempt is
        still alive."""
        lid, seq, attempt = tok
        row = self.rows.get(seq)
        if lid != self.id or row is None or row.attempt != attempt or row.done:
            return None
        return row

    def direct_output(self, rec: tuple[str, str, list[Any]], toks: list[Any]) -> None:
        """The direct lane's :meth:`output`: an emit anchored to the trees
        ``toks`` (none: unanchored, released at once)."""
        toks = row_tokens(toks)  # a tick tuple belongs to no tree
        if not toks:
            self._unanchored(rec)
            return
        rows = []
        for tok in dict.fromkeys(toks):
            row = self.current(tok)
            if row is None:
                return  # a tree that already failed: this attempt's outputs are void
            rows.append(row)
        self._hold(rec, rows)

    def forward(self, toks: list[Any], n: int) -> Any:
        """The direct lane, a chain: a bolt emits, anchored to tuples with
        ``toks``, to ``n`` tuples for the next bolt; returns their token (the
        rows' trees grow by them), or None if a row's attempt is over (the
        emit is void, as :meth:`direct_output`'s)."""
        flat = row_tokens(toks)
        if not flat:
            return FREE
        if len(flat) == 1:
            row = self.current(flat[0])
            if row is None:
                return None
            row.pending += n
            return flat[0]
        flat = list(dict.fromkeys(flat))
        rows = [self.current(t) for t in flat]
        if None in rows:
            return None
        for row in rows:
            row.pending += n  # type: ignore[union-attr]
        return flat[0] if len(flat) == 1 else _Many(flat)

    def acked(self, toks: list[Any]) -> None:
        """The direct lane: :meth:`notice` of ``"ack"`` for a run of
        tuples, without a call per row when rows are released in any order.
        A row's tree completes when its last pending tuple is acked."""
        if self.opts.ordered:
            for tok in row_tokens(toks):  # not a tick's or FREE
                self.notice("ack", tok)
            return
        rows = self.rows
        lid = self.id
        ready = self.ready
        n = out = 0
        many: list[Any] | None = None  # the row tokens of tuples anchored to several rows
        for tok in toks:
            if type(tok) is not tuple:
                if type(tok) is _Many:
                    many = [*(many or ()), *tok]
                continue  # else a tick's, or FREE: no row
            l, seq, attempt = tok
            row = rows.get(seq)
            if l != lid or row is None or row.attempt != attempt or row.done:
                continue
            row.pending -= 1
            if row.pending:
                continue
            n += 1
            del rows[seq]
            if row.multi:
                self._release(row)
            elif row.outputs:
                if self.keyed:
                    ready.append(row)
                ready.extend(row.outputs)
                out += len(row.outputs)
        c = self.counters
        c["acked"] += n
        c["tuples_out"] += out
        if many:
            self.acked(many)
            return
        if self.suspects or self.alone is not None:
            if self.alone is not None and self.alone not in rows:
                self.alone = None  # (it completed)
            self._isolate()
        self.wake()

    def is_current(self, msg_id: Any) -> bool:
        """Whether the lease still waits for this attempt of its row."""
        lid, seq, attempt = msg_id
        row = self.rows.get(seq)
        return lid == self.id and row is not None and row.attempt == attempt and not row.done

    def notice(self, kind: str, msg_id: Any, cause: str | None = None, alone: bool = False) -> None:
        """A row's tree completed (``"ack"``) or failed (``"fail"``, with
        the runtime's word for why: the bolt's fail and the error it sent
        before it, the death of the process that held the tuple, a refused
        emit, the message timeout).

        A process's death fails every row it held, the one that killed it
        and those only in flight beside it. Such a failure is charged to
        the row (counted against ``max_retries``) only where it was the one
        row its process held (``alone``: the direct lane knows) or was tried
        alone; otherwise the row is a suspect, and the suspects are tried
        one at a time once nothing else is in flight (:meth:`_isolate`). A
        row that crashes its process every time then uses its retries
        alone, and the rows beside it come out once (a trial: one such row
        among 300 made 251 dead letters)."""
        lid, seq, attempt = msg_id
        row = self.rows.get(seq)
        if lid != self.id or row is None or row.attempt != attempt or row.done:
            return
        if kind == "ack":
            row.pending -= 1
            if row.pending:
                return
            self.counters["acked"] += 1
            row.done = True
            if seq == self.alone:
                self.alone = None
            self._resolve(seq, row)
        else:
            self.counters["failed"] += 1
            row.cause = self._with_tail(cause) if cause else None
            for o in row.outputs:
                if type(o) is _Multi:
                    o.dead = True
            row.outputs = []
            row.multi = False
            row.attempt += 1
            row.pending = 1  # the next attempt's tree: its one tuple
            lost = cause is not None and "process was lost" in cause
            if lost and not alone and seq != self.alone and self.isolating:
                row.suspect = True
                row.sent_at = None  # (the direct lane's timeout does not run for a row not sent)
                self.suspects.append(seq)
                self.counters["retried"] += 1
                self._isolate()
                self.wake()
                return
            row.charged += 1  # (not for the deaths it was a suspect of: a row that dies once, alone, is retried)
            if seq == self.alone and not lost:
                self.alone = None  # (failed for a cause of its own: retried as any row)
                if cause is not None and cause.startswith("timed out"):
                    self._stop_isolating()
            if row.charged <= self.opts.max_retries:
                self.counters["retried"] += 1
                self._resend(seq, row)
            else:
                if seq == self.alone:
                    self.alone = None
                row.done = True
                row.dead = self._cause(row)
                self.counters["dead_letter"] += 1
                if self.opts.dead_letter:
                    self._resolve(seq, row)
                else:
                    self.error = RowFailed(
                        f"input row {seq} of this partition ({_short(row.values)}) failed {row.charged} times "
                        f"(max_retries={self.opts.max_retries}): {row.dead}. Fix the bolt, raise max_retries or "
                        "topology.message.timeout.secs, or pass dead_letter to keep going and collect such rows"
                    )
        if self.suspects or self.alone is not None:
            self._isolate()
        self.wake()

    def _isolate(self) -> None:
        """Try the next suspect alone, once no other row is in flight (new
        rows wait meanwhile: :meth:`exchange`)."""
        if self.alone is not None:
            return
        suspects, rows = self.suspects, self.rows
        for row in rows.values():
            if not row.done and not row.suspect:
                return  # in flight: wait for it
        while suspects:
            seq = suspects.popleft()
            row = rows.get(seq)
            if row is None or not row.suspect:
                continue
            row.suspect = False
            self.alone = seq
            self._resend(seq, row)
            return

    def _stop_isolating(self) -> None:
        """A row tried alone timed out: this bolt may complete a row only
        with rows after it (one that batches its input), which wait while
        suspects are tried. From now on this lease sends the suspects and
        new rows together again, and charges a death to every row it
        failed."""
        self.isolating = False
        suspects, rows = self.suspects, self.rows
        while suspects:
            seq = suspects.popleft()
            row = rows.get(seq)
            if row is not None and row.suspect:
                row.suspect = False
                self._resend(seq, row)

    def _with_tail(self, cause: str) -> str:
        """A crash cause ("...'s process was lost: component 'x' task 1 (pid
        77): ...") with that process's last stderr lines; noted as the
        lease's crash (for :class:`StatefulBoltCrashed`)."""
        if "process was lost" not in cause:
            return cause
        cached = self._crash_cause
        if cached is not None and cached[0] == cause:
            return cached[1]
        full = cause
        m = _PID.search(cause)
        if m is not None:
            tail = self.log.stderr_tail(int(m.group(1)))
            if tail:
                full = f"{cause}; its stderr ended: " + " | ".join(tail)
        self._crash_cause = (cause, full)
        if self.crash is None:
            self.crash = full
        return full

    def _cause(self, row: _Row) -> str:
        """Why a row is given up on: what happened to its own last attempt,
        never another row's error."""
        cause = row.cause
        if cause is None:  # no word from the runtime: judge by the clock
            late = row.sent_at is not None and trio.current_time() - row.sent_at >= self.timeout - 0.05
        else:
            late = cause.startswith("timed out")
        if late:
            return f"timed out (its tree did not complete within topology.message.timeout.secs={self.timeout:g})"
        if cause is None:
            return "failed (a tuple of its tree was failed; no cause was given)"
        return f"failed: {cause}"

    def _resolve(self, seq: int, row: _Row) -> None:
        rows = self.rows
        if not self.opts.ordered:
            del rows[seq]
            self._release(row)
            return
        while True:
            head = rows.get(self.release_next)
            if head is None or not head.done:
                return
            del rows[self.release_next]
            self.release_next += 1
            self._release(head)

    def _release(self, row: _Row) -> None:
        if row.dead is not None:
            self.ready.append(_Dead(row.source, row.stream, row.values, row.dead, row.charged, row.key))
            return
        ready = self.ready
        keyed = self.keyed
        if not row.multi:
            if row.outputs:
                if keyed:
                    ready.append(row)
                ready.extend(row.outputs)
                self.counters["tuples_out"] += len(row.outputs)
            return
        n = 0
        for o in row.outputs:
            if type(o) is _Multi:
                o.pending -= 1
                if o.pending or o.dead:
                    continue
                if keyed:
                    ready.append(o.first)
                o = o.rec
            elif keyed:
                ready.append(row)
            ready.append(o)
            n += 1
        self.counters["tuples_out"] += n
