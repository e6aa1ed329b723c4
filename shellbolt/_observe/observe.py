"""What a running topology is doing, Storm UI style: cheap instrumentation
the tasks feed, and :func:`snapshot`, a JSON-able picture of the run that
the live view (``multilang run``), metrics exporters and tests read.

Costs are paid per *batch*, not per tuple (DESIGN.md, performance habits):

* **Execute latency** of a shell bolt: the time from a tuple written to the
  process to its ack, as the host sees it. The writer takes one clock
  reading per batch it writes and keeps one tuple of the batch, chosen at
  random, as a *probe* (at most :data:`MAX_PROBES` at a time). When the
  reader has handled a run of acks it looks at its few probes (not at the
  acks): a probe no longer in flight was settled, and its latency counts
  for the whole batch it stood for. An in-process bolt records each burst's
  mean time per tuple.
* **Complete latency**: the acker remembers the root it completed last;
  each time the runtime hands completed trees to a spout, that root's age
  (now - (deadline - timeout)) counts for all of them.
* **Capacity**: Storm's "executed x average execute latency / window",
  the share of the window the task was busy. A shell bolt's process holds
  many tuples at once (the host pipelines them), where that product would
  count overlapping tuples several times (Little's law: it is the average
  number in flight), so the busy time is measured directly: the time during
  which the process held at least one unsettled tuple. For a task that takes
  one tuple at a time (Storm's executor) the two are the same number.

Latencies go to fixed log-bucket histograms (:class:`Histogram`, 4 buckets
per doubling, ~9% resolution, 1 µs to ~30 min: 124 ints). Each task keeps the
current and the previous window of :data:`WINDOW` seconds, so what is shown
covers the last 5 to 10 s: recent values, bounded memory.

Pure: no trio, no I/O; time is passed in (the run's trio clock)."""

from __future__ import annotations

import math
from typing import Any, Iterable

from .._model.results import latest_metrics
from .._model.rng import RNG

__all__ = ["Histogram", "TaskObs", "RunObs", "snapshot", "blank_row", "merge_extensions", "WINDOW", "MAX_PROBES", "STALL_KEY", "DEFAULT_STALL_SECS"]

#: seconds per latency / capacity window; two windows are kept (current, previous)
WINDOW = 5.0
#: probes (sampled tuples whose write time is known) a bolt task keeps at once
MAX_PROBES = 16
#: the conf key: seconds with trees in flight and none completed before the run is "stalled"
STALL_KEY = "multilang.progress.stall.secs"
DEFAULT_STALL_SECS = 5.0

_SUB = 4  # buckets per doubling
_LO = -20  # the first bucket starts at 2^-20 s (~1 µs)
_NB = 31 * _SUB  # up to 2^11 s (~34 min)
_log2 = math.log2


def _bucket(seconds: float) -> int:
    if seconds <= 0:
        return 0
    i = int((_log2(seconds) - _LO) * _SUB)
    return 0 if i < 0 else _NB - 1 if i >= _NB else i


class Histogram:
    """Counts of latencies in log buckets (4 per doubling): add is a log2 and
    an index; a percentile is a scan of 124 ints; merge is a sum."""

    __slots__ = ("counts", "count")

    def __init__(self) -> None:
        self.counts = [0] * _NB
        self.count = 0

    def add(self, seconds: float, weight: int = 1) -> None:
        self.counts[_bucket(seconds)] += weight
        self.count += weight

    def merge(self, other: "Histogram") -> "Histogram":
        if other.count:
            self.counts = [a + b for a, b in zip(self.counts, other.counts)]
            self.count += other.count
        return self

    def clear(self) -> None:
        if self.count:
            self.counts = [0] * _NB
            self.count = 0

    def percentile(self, q: float) -> float | None:
        """The q-quantile (0 < q <= 1) in seconds (the bucket's geometric
        middle: within ~9% of the true value), or None when empty."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                return 2.0 ** ((i + 0.5) / _SUB + _LO)
        return 2.0 ** ((_NB - 0.5) / _SUB + _LO)  # not reached

    def summary(self) -> dict[str, Any]:
        """``{"p50", "p99"}`` in milliseconds (None when empty) and ``count``."""
        p50, p99 = self.percentile(0.5), self.percentile(0.99)
        return {"p50": None if p50 is None else round(p50 * 1e3, 3),
                "p99": None if p99 is None else round(p99 * 1e3, 3), "count": self.count}


class TaskObs:
    """One task's latencies (two windows) and busy time. The task calls
    :meth:`wrote` once per batch written and :meth:`settled` once per run
    of acks / fails read (shell bolts), :meth:`ran` once per burst
    (in-process bolts), :meth:`completed` with its spout's trees."""

    __slots__ = ("cur", "prev", "cur_start", "prev_start", "roll_at", "busy_total", "busy_since", "cur_busy",
                 "prev_busy", "probes", "extensions")

    def __init__(self) -> None:
        self.cur = Histogram()  # this window's latencies (execute; spouts: complete)
        self.prev = Histogram()  # the previous window's
        self.cur_start = self.prev_start = 0.0
        self.roll_at: float | None = None  # None: not begun
        self.busy_total = 0.0  # seconds busy before busy_since
        self.busy_since: float | None = None  # busy since then (a tuple unsettled in the process)
        self.cur_busy = self.prev_busy = 0.0  # busy_total marks at the window starts
        #: tuple id -> (write time, tuples of its batch)
        self.probes: dict[str, tuple[float, int]] = {}
        #: the extensions negotiated by the task's latest process (§9.1); None: no process finished its handshake
        self.extensions: tuple[str, ...] | None = None

    def begin(self, now: float) -> None:
        if self.roll_at is None:
            self.cur_start = self.prev_start = now
            self.roll_at = now + WINDOW

    def busy(self, now: float) -> float:
        """Seconds busy in all, up to ``now``."""
        since = self.busy_since
        return self.busy_total if since is None else self.busy_total + max(0.0, now - since)

    def roll(self, now: float) -> None:
        """Start a new window if the current one is over (called on each record and snapshot)."""
        if self.roll_at is None:
            self.begin(now)
            return
        if now < self.roll_at:
            return
        old = self.prev
        if now >= self.roll_at + WINDOW:  # a whole window without a look: what is kept is older than that
            self.cur.clear()
        self.prev, self.cur = self.cur, old
        self.cur.clear()
        self.prev_start, self.prev_busy = self.cur_start, self.cur_busy
        self.cur_start, self.cur_busy = now, self.busy(now)
        self.roll_at = now + WINDOW

    # -- feeds (once per batch) -----------------------------------------------------------------

    def wrote(self, now: float, tid: str, weight: int) -> None:
        """A batch of ``weight`` tuples was written at ``now``; ``tid`` is one of them."""
        if self.busy_since is None:
            self.busy_since = now
        probes = self.probes
        if len(probes) >= MAX_PROBES:
            # The oldest probe may belong to a tuple the bolt never acks: drop it after a window.
            oldest = next(iter(probes))
            if now - probes[oldest][0] < WINDOW:
                return
            del probes[oldest]
        probes[tid] = (now, weight)

    def settled(self, now: float, in_flight: dict[str, Any]) -> None:
        """The process acked or failed tuples; ``in_flight`` is what it still holds."""
        if self.roll_at is None or now >= self.roll_at:
            self.roll(now)
        probes = self.probes
        if probes:
            done = [tid for tid in probes if tid not in in_flight]
            for tid in done:
                t0, weight = probes.pop(tid)
                self.cur.add(now - t0, weight)
        if not in_flight and self.busy_since is not None:
            self.busy_total += max(0.0, now - self.busy_since)
            self.busy_since = None

    def lost(self, now: float) -> None:
        """The process died: its tuples will never be settled by it."""
        self.probes.clear()
        if self.busy_since is not None:
            self.busy_total += max(0.0, now - self.busy_since)
            self.busy_since = None

    def ran(self, t0: float, t1: float, n: int) -> None:
        """An in-process bolt executed ``n`` tuples from ``t0`` to ``t1``."""
        if self.roll_at is None or t1 >= self.roll_at:
            self.roll(t1)
        if n:
            self.cur.add((t1 - t0) / n, n)
        self.busy_total += max(0.0, t1 - t0)

    def completed(self, now: float, latency: float, n: int) -> None:
        """A spout's ``n`` trees completed; one of them took ``latency`` seconds."""
        if self.roll_at is None or now >= self.roll_at:
            self.roll(now)
        self.cur.add(latency, n)

    # -- reading -------------------------------------------------------------------------------

    def latency(self, now: float) -> Histogram:
        """The last one to two windows' latencies (a new histogram)."""
        self.roll(now)
        return Histogram().merge(self.cur).merge(self.prev)

    def capacity(self, now: float) -> float | None:
        """The share of the last one to two windows the task was busy, or
        None if that span is shorter than 10 ms (nothing to say yet)."""
        self.roll(now)
        span = now - self.prev_start
        if span < 0.01:
            return None
        return round(min(1.0, max(0.0, (self.busy(now) - self.prev_busy) / span)), 3)


class RunObs:
    """Run-wide observations: when the run started and ended, when a tree
    last completed (and when one first failed since), and the spouts' emit
    count over time (for the ETA)."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.ended: float | None = None
        self.last_completion: float | None = None
        #: when the first tree failed since the last completion: trees that time out and are replayed
        #: before they are as old as the stall time still make a stall
        self.failing_since: float | None = None
        self._marks: list[tuple[float, int]] = []  # (time, spout emits) of recent snapshots

    def begin(self, now: float, tasks: Iterable[Any]) -> None:
        self.started = now
        self.ended = None
        for t in tasks:
            t.obs.begin(now)

    def finish(self, now: float) -> None:
        self.ended = now

    def spout_rate(self, now: float, emitted: int) -> float | None:
        """Spout emits per second over the last window or so (from snapshots)."""
        marks = self._marks
        marks.append((now, emitted))
        while len(marks) > 2 and now - marks[1][0] >= WINDOW:
            del marks[0]
        t0, e0 = marks[0]
        if now - t0 < 0.2:
            return None
        return (emitted - e0) / (now - t0)


# -- the snapshot ------------------------------------------------------------------------------


def _now(runtime: Any) -> float:
    obs: RunObs = runtime.observer
    if obs.ended is not None:
        return obs.ended
    try:
        import trio

        return trio.current_time()
    except (ImportError, RuntimeError):  # outside the run: its last moment
        return obs.started or 0.0


def _task_row(runtime: Any, task: Any, now: float) -> dict[str, Any]:
    s = task.stats
    kind = task.comp.kind
    proc = getattr(task, "proc", None)
    spout = kind == "spout"
    lat = task.obs.latency(now)
    pid = getattr(proc, "pid", None)
    if proc is None and runtime.observer.ended is not None:  # the run is over: the task's last process
        pid = getattr(task, "last_pid", None)
    return {
        "component": task.name, "task": task.task_id, "kind": kind,
        "pid": pid,
        "emitted": s.emitted, "executed": s.executed, "acked": s.acked, "failed": s.failed,
        "restarts": s.restarts, "errors": s.errors,
        # spouts: trees in flight; bolts: tuples written to the process and not yet acked
        "in_flight": getattr(task, "pending_roots", 0) if spout else len(task.in_flight),
        "queued": len(task.inbox),  # waiting in the task's inbox: a sign of backpressure
        "execute_latency_ms": Histogram().summary() if spout else lat.summary(),
        "complete_latency_ms": lat.summary() if spout else None,
        "capacity": None if spout else task.obs.capacity(now),
        "last_error": s.last_error,
        "extensions": None if task.obs.extensions is None else list(task.obs.extensions),
        "metrics": dict(s.metrics),
        "_lat": lat, "_err_at": s.last_error_at, "_metrics_at": s.metrics_at,
    }


#: the counters a component row sums over its tasks (also over host workers: _workers/view.py)
SUMMED = ("emitted", "executed", "acked", "failed", "restarts", "errors", "in_flight", "queued")


def blank_row(kind: str, task_ids: Iterable[int]) -> dict[str, Any]:
    """A component row of :func:`snapshot` with nothing in it: zero counts,
    empty latencies, and None where a value is not known. An engine that
    can tell less than the runtime (the Spark engine's live view) fills in
    what it knows."""
    empty = Histogram().summary()
    return {"kind": kind, "tasks": list(task_ids), "emitted": 0, "executed": 0, "acked": 0, "failed": 0,
            "restarts": 0, "errors": 0, "in_flight": None, "queued": None, "execute_latency_ms": empty,
            "complete_latency_ms": empty if kind == "spout" else None, "capacity": None, "last_error": None,
            "extensions": [], "metrics": {}}


def merge_extensions(into: list[str] | None, exts: list[str] | None) -> list[str] | None:
    """What a component's processes negotiated (§9.2), in the order first
    accepted, adding ``exts`` (one task's, or one worker's) to ``into``;
    None where no process of either finished its handshake ([] is standard
    mode)."""
    if exts is None:
        return into
    out = list(into or ())
    out.extend(e for e in exts if e not in out)
    return out


def _component_row(kind: str, task_ids: list[int], rows: list[dict[str, Any]]) -> dict[str, Any]:
    row = blank_row(kind, task_ids)
    for k in SUMMED:
        row[k] = sum(r[k] for r in rows)
    lat = Histogram()
    for r in rows:
        lat.merge(r["_lat"])
    spout = kind == "spout"
    row["execute_latency_ms"] = Histogram().summary() if spout else lat.summary()
    row["complete_latency_ms"] = lat.summary() if spout else None
    caps = [r["capacity"] for r in rows if r["capacity"] is not None]
    row["capacity"] = max(caps) if caps else None  # Storm UI: a component's capacity is its busiest task's
    latest = max(rows, key=lambda r: r["_err_at"], default=None)
    row["last_error"] = None if latest is None else latest["last_error"]
    exts: list[str] | None = None
    for r in rows:
        exts = merge_extensions(exts, r["extensions"])
    row["extensions"] = exts
    row["metrics"] = latest_metrics((r["metrics"], r["_metrics_at"]) for r in rows)
    row["_lat"] = lat
    return row


def _remaining(runtime: Any) -> int | None:
    """Spout tuples still to emit, when that can be known: ``max_tuples``,
    or every spout an in-process one over a sized source (a list)."""
    if runtime.max_tuples is not None:
        return max(0, runtime.max_tuples - runtime.fresh_by_spouts)
    total = 0
    for t in runtime.tasks.values():
        if t.comp.kind != "spout":
            continue
        left = getattr(t, "remaining", None)
        n = left() if callable(left) else None
        if n is None:
            return None
        total += n
    return total


def snapshot(runtime: Any, now: float | None = None) -> dict[str, Any]:
    """A JSON-able picture of ``runtime`` (a :class:`~multilang.shellbolt._runtime.runtime.Runtime`) at ``now``
    (its trio clock; default: the current time in the run, or the run's end).

    Keys (more may be added, none renamed): ``topology``, ``elapsed_s``,
    ``stalled`` (trees in flight and none completed for ``stall_secs``),
    ``stall_secs``, ``eta_s`` (None unless knowable), ``remaining``,
    ``trees`` (``in_flight``, ``completed``, ``failed``, ``timed_out``,
    ``complete_latency_ms`` {p50, p99, count}, ``stalled_s``),
    ``components`` by name and ``tasks`` by ``"component:task"``, each with
    ``kind``, ``emitted``, ``executed``, ``acked``, ``failed``, ``restarts``,
    ``errors``, ``in_flight``, ``queued``, ``execute_latency_ms``,
    ``complete_latency_ms`` (spouts; None for bolts), ``capacity``,
    ``last_error``, ``extensions`` (None where no process finished its
    handshake, in-process ones included), ``metrics``; components add ``tasks``
    (ids), tasks add ``component``, ``task`` and ``pid``. Latencies are
    milliseconds over the last 5 to 10 s; counters are since the run began."""
    obs: RunObs = runtime.observer
    if now is None:
        now = _now(runtime)
    acker = runtime.acker
    tasks_out: dict[str, dict[str, Any]] = {}
    components: dict[str, dict[str, Any]] = {}
    complete = Histogram()
    by_comp: dict[str, list[dict[str, Any]]] = {}
    for t in runtime.tasks.values():
        by_comp.setdefault(t.name, []).append(_task_row(runtime, t, now))
    for name, comp in runtime.topology.components.items():
        rows = by_comp.get(name, [])
        crow = _component_row(comp.kind, list(comp.tasks), rows)
        if comp.kind == "spout":
            complete.merge(crow["_lat"])
        del crow["_lat"]
        components[name] = crow
        for r in rows:
            del r["_lat"], r["_err_at"], r["_metrics_at"]
            tasks_out[f"{name}:{r['task']}"] = r
    pending = acker.pending
    stalled_s = 0.0
    if pending:
        roots = acker.roots
        oldest = next(iter(roots.values()), None)  # dicts keep order: the longest-registered root still in flight
        since = oldest.deadline - acker.timeout if oldest is not None else now
        if obs.failing_since is not None:
            since = min(since, obs.failing_since)
        if obs.last_completion is not None:
            since = max(since, obs.last_completion)
        stalled_s = max(0.0, now - since)
    stall = float(runtime.topology.conf.get(STALL_KEY) or DEFAULT_STALL_SECS)
    remaining = _remaining(runtime)
    eta = None
    if remaining is not None and obs.ended is None:
        rate = obs.spout_rate(now, runtime.emitted_by_spouts)
        if remaining == 0:
            eta = 0.0
        elif rate:
            eta = round(remaining / rate, 1)
    return {
        "topology": runtime.topology.name,
        "elapsed_s": round(now - obs.started, 3) if obs.started is not None else 0.0,
        "stalled": bool(pending and stalled_s >= stall),
        "stall_secs": stall,
        "remaining": remaining,
        "eta_s": eta,
        "trees": {
            "in_flight": pending,
            "completed": acker.stats["completed"],
            "failed": acker.stats["failed"],
            "timed_out": acker.stats["timed_out"],
            "complete_latency_ms": complete.summary(),
            "stalled_s": round(stalled_s, 3),
        },
        "components": components,
        "tasks": tasks_out,
    }


def pick_probe(batch: list[Any]) -> Any:
    """The tuple of a batch that stands for it (at random: no position bias)."""
    return batch[int(RNG.random() * len(batch))]
