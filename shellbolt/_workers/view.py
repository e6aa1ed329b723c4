"""The run's snapshot on host workers (the live view, --metrics-port,
--metrics-file): each worker sends the rows of its own tasks and its trees
(``part``); the main process merges them into the shape of
:func:`multilang.shellbolt._observe.observe.snapshot`.

Counters are exact sums. Latencies are merged from the workers' summaries:
the sample counts added, p99 the largest of theirs (at or above the
whole's), p50 the count-weighted mean of their p50s (a task's latencies are
all in one worker, so a task row is exact; a component's p50 and p99
spanning workers are approximations)."""

from __future__ import annotations

from typing import Any

from .._model.results import COUNTERS, latest_metrics
from .._model.topology import Topology
from .._observe.observe import SUMMED, blank_row, merge_extensions, snapshot

__all__ = ["part", "gone", "merge", "next_due"]


def next_due(due: float, every: float, now: float) -> float:
    """When the snapshot after one due at ``due`` and taken at ``now`` is
    due: the first point after ``now`` of the grid of ``every`` seconds that
    ``due`` is on (the run's start, then one interval apart). A snapshot is
    asked at the first status poll past its time and answered later still;
    counted from then, each came later than the last (about 30 ms a second),
    and once the lag added up to an interval the metrics file had no line
    for it (a trial's 0.5 s bucket: 27 lines in 15 s where one worker wrote
    30). A snapshot later than a whole interval (a worker busy for that
    long) still skips the points it passed."""
    due += every
    while due <= now:
        due += every
    return due


def part(runtime: Any, worker: int, where: dict[int, int]) -> dict[str, Any]:
    """What this worker knows: its tasks' rows, its trees (the roots it owns)."""
    snap = snapshot(runtime)
    return {"tasks": {k: r for k, r in snap["tasks"].items() if where.get(r["task"]) == worker},
            "trees": snap["trees"], "stalled": snap["stalled"], "stall_secs": snap["stall_secs"],
            # when each task's last error and metrics came (the system's clock, which every worker reads
            # alike): a component's are its latest over the workers
            "errors_at": {t: s.last_error_at for stats in runtime.stats.values() for t, s in stats.tasks.items()
                          if where.get(t) == worker and s.last_error is not None},
            "metrics_at": {t: dict(s.metrics_at) for stats in runtime.stats.values() for t, s in stats.tasks.items()
                           if where.get(t) == worker and s.metrics_at}}


def gone(last: dict[str, Any]) -> dict[str, Any]:
    """The part of a worker that died as the run stopped (not started
    again), from its ``last`` one: its rows without their counters, which
    the run carries as of its last status (``merge``'s ``carried``), and no
    trees (those of its spouts are counted before, ``trees_before``)."""
    tasks = {k: {**r, **{c: 0 for c in COUNTERS if c in r}} for k, r in last["tasks"].items()}
    return {**last, "tasks": tasks, "trees": {**last["trees"], "in_flight": 0, "completed": 0, "failed": 0,
                                             "timed_out": 0}}


def _latency(summaries: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    known = [s for s in summaries if s is not None]
    if not known:
        return None
    count = sum(s["count"] for s in known)
    p50s = [(s["p50"], s["count"]) for s in known if s["p50"] is not None and s["count"]]
    p99s = [s["p99"] for s in known if s["p99"] is not None]
    p50 = round(sum(p * c for p, c in p50s) / sum(c for _, c in p50s), 3) if p50s else None
    return {"p50": p50, "p99": max(p99s) if p99s else None, "count": count}


def merge(topology: Topology, parts: list[dict[str, Any]], elapsed: float,
          carried: dict[int, list[int]] | None = None, trees_before: dict[str, int] | None = None) -> dict[str, Any]:
    """The run's snapshot from the workers' parts. ``carried``: task id ->
    the COUNTERS of its dead processes (a worker killed), added to its row;
    ``trees_before``: the trees their spouts completed and failed."""
    before = trees_before or {}
    tasks: dict[str, dict[str, Any]] = {}
    errors_at: dict[int, float] = {}
    metrics_at: dict[int, dict[str, float]] = {}
    for p in parts:
        tasks.update(p["tasks"])
        errors_at.update(p.get("errors_at", {}))
        metrics_at.update(p.get("metrics_at", {}))
    for key, r in tasks.items():
        kept = (carried or {}).get(r["task"])
        if kept is not None:
            tasks[key] = r = dict(r)
            for k, n in zip(COUNTERS, kept):
                if k in r:
                    r[k] = (r[k] or 0) + n
    components: dict[str, dict[str, Any]] = {}
    for name, comp in topology.components.items():
        rows = [r for r in tasks.values() if r["component"] == name]
        row = blank_row(comp.kind, list(comp.tasks))
        for k in SUMMED:
            row[k] = sum(r[k] or 0 for r in rows)
        row["execute_latency_ms"] = _latency([r["execute_latency_ms"] for r in rows]) or row["execute_latency_ms"]
        if comp.kind == "spout":
            row["complete_latency_ms"] = _latency([r["complete_latency_ms"] for r in rows]) or row["complete_latency_ms"]
        caps = [r["capacity"] for r in rows if r["capacity"] is not None]
        row["capacity"] = max(caps) if caps else None
        erred = [r for r in rows if r["last_error"]]
        row["last_error"] = max(erred, key=lambda r: errors_at.get(r["task"], 0.0))["last_error"] if erred else None
        row["extensions"] = None
        for r in rows:
            row["extensions"] = merge_extensions(row["extensions"], r["extensions"])
        row["metrics"] = latest_metrics((r["metrics"], metrics_at.get(r["task"], {})) for r in rows)
        components[name] = row
    trees = [p["trees"] for p in parts]
    spouts = [c for c in components.values() if c["kind"] == "spout"]
    return {
        "topology": topology.name,
        "elapsed_s": round(elapsed, 3),
        "stalled": any(p["stalled"] for p in parts),
        "stall_secs": parts[0]["stall_secs"] if parts else None,
        "remaining": None,
        "eta_s": None,
        "trees": {
            "in_flight": sum(t["in_flight"] for t in trees),
            "completed": sum(t["completed"] for t in trees) + before.get("completed", 0),
            "failed": sum(t["failed"] for t in trees) + before.get("failed", 0),
            "timed_out": sum(t["timed_out"] for t in trees),
            "complete_latency_ms": _latency([c["complete_latency_ms"] for c in spouts]) or blank_row("spout", [])[
                "complete_latency_ms"],
            "stalled_s": max((t["stalled_s"] for t in trees), default=0.0),
        },
        "components": components,
        "tasks": tasks,
    }
