"""The source state on the driver: the replay log, the supervised spout and
the bookkeeping of unacked message ids; pulls tuples into the log and acks
them to the spout once Spark committed their batch.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from multilang.messages import Ack, Emit, Error, Fail, Log, Message, Metrics, Next
from multilang.shellbolt.ratelog import RateLimitedLog

from ._spark_replay_log import _digest, _id_key, _ReplayLog
from ._spark_source_options import _json_text, _Options, _RowConverter
from ._spark_spout_host import _live_states, _SupervisedSpout

log = logging.getLogger("multilang.spark.source")
_rated = RateLimitedLog(log)

_PY_LEVEL = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


class _SourceState:
    """Replay log + supervised spout + bookkeeping of unacked message ids."""

    def __init__(self, opts: _Options, fields: list[str], convert: _RowConverter) -> None:
        self.opts = opts
        self.fields = fields
        self.convert = convert
        self.log = _ReplayLog(opts.replay_log, record_ids=opts.dedupe == "all", cache_mb=opts.dedupe_cache_mb)
        self.available_now = False
        self._drained = False  # availableNow: the spout had nothing for availableNowIdleMs
        self._idle_since: float | None = None
        # Reliable tuples taken and not yet acked: position-ordered (pos, id) for
        # logged ones; id key -> (pos or None while buffered, values digest).
        # Both hold only uncommitted tuples (at most maxPending, if set); the id
        # of every tuple ever logged is in the replay log's on-disk record (dedupe=all).
        self.unacked: deque[tuple[int, Any]] = deque()
        self.inflight: dict[str, tuple[int | None, bytes]] = {}
        self.buffer: list[tuple[Any, list[Any]]] = []  # taken, not yet logged
        self.buffer_ids: list[tuple[str, int, bytes]] = []  # (id key, index in buffer, digest) to record
        self.notices: deque[Message] = deque()  # acks/fails to deliver after the current command
        self.rejected = 0
        self.duplicates = 0
        pos = self.log.committed
        for rec in self.log.read(self.log.committed, self.log.end):
            if rec["id"] is not None:
                self.unacked.append((pos, rec["id"]))
                self.inflight[_id_key(rec["id"])] = (pos, _digest(rec["values"]))
            pos += 1
        self.spout = _SupervisedSpout(opts, fields, self._on_events)
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

    # spout events

    def _on_events(self, events: list[Message]) -> None:
        opts = self.opts
        for ev in events:
            t = type(ev)
            if t is Emit:
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
        return len(self.unacked) + sum(1 for i, _ in self.buffer if i is not None)

    def _deliver_notices(self) -> None:
        while self.notices:
            self.spout.command(self.notices[0])
            self.notices.popleft()

    # pulling

    def pull(self, start: int, max_rows: int | None) -> None:
        """Take tuples from the spout and log them (docs/SPARK.md, "Offsets, replay log, commit")."""
        opts = self.opts
        self.spout.ensure_started()
        self._deliver_notices()
        if self.available_now and self._drained:
            self._flush()
            return
        want = None if max_rows is None else start + max_rows - self.log.end
        deadline = time.monotonic() + opts.max_batch_duration
        backoff = 0.005
        while True:
            if want is not None and len(self.buffer) >= want:
                break
            if opts.max_pending is not None and self._pending() >= opts.max_pending:
                break
            have_data = bool(self.buffer) or self.log.end > start
            # availableNow must not return `start` (that ends the query) before the spout drained.
            if time.monotonic() >= deadline and (have_data or not self.available_now):
                break
            before = len(self.buffer) + self.duplicates + self.rejected
            self.spout.command(Next())
            self._deliver_notices()
            if len(self.buffer) + self.duplicates + self.rejected > before:
                self._idle_since = None
                backoff = 0.005
                continue
            # The spout had nothing.
            now = time.monotonic()
            if self._idle_since is None:
                self._idle_since = now
            if not self.available_now:
                break  # Spark polls again soon: that is the spout wait strategy (§4.6)
            if self.buffer or self.log.end > start:
                break  # return what we have; keep draining in the next call
            if now - self._idle_since >= opts.available_now_idle:
                self._drained = True
                log.info("multilang source: spout drained after %d tuples (availableNow)", self.log.end)
                break
            time.sleep(backoff)
            backoff = min(backoff * 2, 0.05)
        self._flush()

    def _flush(self) -> None:
        if not self.buffer:
            return
        recs, self.buffer = self.buffer, []
        ids, self.buffer_ids = self.buffer_ids, []
        a, _ = self.log.append(recs, ids)
        for off, (msg_id, values) in enumerate(recs):
            if msg_id is not None:
                pos = a + off
                self.unacked.append((pos, msg_id))
                key = _id_key(msg_id)
                entry = self.inflight.get(key)
                if entry is None or entry[0] is None:
                    self.inflight[key] = (pos, entry[1] if entry else _digest(values))

    # committing

    def commit(self, pos: int) -> None:
        """Spark committed everything below ``pos``: ack it to the spout."""
        if self.unacked and self.unacked[0][0] < pos:
            self.spout.ensure_started()
            self._deliver_notices()
            while self.unacked and self.unacked[0][0] < pos:
                p, msg_id = self.unacked[0]
                self.spout.command(Ack(id=msg_id))
                self.unacked.popleft()
                key = _id_key(msg_id)
                if self.inflight.get(key, (None,))[0] == p:
                    del self.inflight[key]
                self._deliver_notices()
        if pos > self.log.committed:
            self.log.mark_committed(pos)

    def close(self) -> None:
        _live_states.discard(self)
        _rated.flush(time.monotonic())  # the count of warnings held back
        try:
            self.spout.close()
        finally:
            self.log.close()

