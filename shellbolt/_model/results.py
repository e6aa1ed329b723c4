"""What a run did: per-component counters, dead letters, the run's result,
and the cause a spout hears when a tree fails. Pure: no trio, no I/O."""

from __future__ import annotations

import reprlib
import time
from dataclasses import dataclass, field
from typing import Any

from multilang.errors import ComponentError

__all__ = ["latest_metrics", "COUNTERS", "ComponentStats", "TaskStats", "DeadLetter", "DEAD_LETTER_SAMPLE", "RunResult", "Cause", "brief", "short_repr", "first_line", "hashable", "sort_key", "id_key"]


class TaskStats:
    """Counters of one task. Plain attributes: the hot paths add to them."""

    emitted: int = 0  # tuples emitted by the task
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
    #: spouts, a resumed run: emits not delivered (acked at once) because an
    #: earlier run's committed state reflects them (§9.7)
    skipped: int = 0
    #: the last `error` frame, crash cause or emit error (shortened), and when (``time.monotonic()``: the
    #: system's clock, which the host workers share, where each trio run's clock has an offset of its own)
    last_error: str | None = None
    last_error_at: float = 0.0

    def __init__(self) -> None:
        #: the params of the last `metrics` frame, by metric name (STORM-200), and when it came (as last_error_at)
        self.metrics: dict[str, Any] = {}
        self.metrics_at: dict[str, float] = {}

    def metric(self, name: str, params: Any) -> None:
        self.metrics[name] = params
        self.metrics_at[name] = time.monotonic()

    def error(self, text: str) -> None:
        """Remember the latest error of the task (rare paths only)."""
        self.last_error = brief(text, 200)
        self.last_error_at = time.monotonic()


def latest_metrics(tasks: Any) -> dict[str, Any]:
    """Of the tasks' ``(metrics, metrics_at)``, each name's latest params."""
    out: dict[str, Any] = {}
    at: dict[str, float] = {}
    for metrics, when in tasks:
        for name, params in metrics.items():
            t = when.get(name, 0.0)
            if name not in out or t >= at[name]:
                out[name], at[name] = params, t
    return out


#: the counters of a task (TaskStats) that a component sums
COUNTERS = ("emitted", "executed", "acked", "failed", "restarts", "errors", "expired", "dead_letters", "skipped")


class ComponentStats:
    """Counters per component: the sums of its tasks' :class:`TaskStats`
    (``tasks``, by task id), read when asked; each task adds to its own."""

    def __init__(self) -> None:
        self.tasks: dict[int, TaskStats] = {}

    def task(self, task_id: int) -> TaskStats:
        """The counters of one task (made on first use; kept across restarts)."""
        s = self.tasks.get(task_id)
        if s is None:
            s = self.tasks[task_id] = TaskStats()
        return s

    @property
    def metrics(self) -> dict[str, Any]:
        """The last `metrics` frame params by name, over all tasks (the latest to come)."""
        return latest_metrics((s.metrics, s.metrics_at) for s in self.tasks.values())

    @property
    def last_error(self) -> str | None:
        latest = max(self.tasks.values(), key=lambda s: s.last_error_at, default=None)
        return None if latest is None else latest.last_error

    def __repr__(self) -> str:
        return "ComponentStats(" + ", ".join(f"{k}={getattr(self, k)}" for k in COUNTERS) + ")"


def _summed(name: str) -> property:
    return property(lambda self: sum(getattr(s, name) for s in self.tasks.values()),
                    doc=f"{name}: the sum over the component's tasks")


for _name in COUNTERS:
    setattr(ComponentStats, _name, _summed(_name))
del _name


#: the dead letters a run's result keeps (the summary names them; --dead-letter's file has them all)
DEAD_LETTER_SAMPLE = 10


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
    line: int | None = None  # multilang pipe: the input's stdin line

    def to_json(self) -> dict[str, Any]:
        out = {"component": self.component, "task": self.task, "input": self.input, "cause": self.cause,
               "attempts": self.attempts}
        if self.line is not None:
            out["line"] = self.line
        return out


@dataclass
class RunResult:
    """What a run did.

    ``ok`` is False if a component gave up or an input was given up on (a
    dead letter). Trees still in flight when a run is stopped (``duration``,
    a signal) are *abandoned at stop*: counted in ``pending``, neither acked
    nor failed, and not a failure (spec §5.4). ``stopped_by`` says why the
    run ended: ``"done"`` (every spout done, before ``max_tuples`` if one was
    given), ``"duration"``, ``"max_tuples"`` (reached), ``"gave_up"``,
    ``"signal"``, ``"request"`` or ``"replays"`` (a run to the end found only
    a shell spout replaying ids failed past ``multilang.max.replays``: not ok)."""

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
    #: shell spouts: ("component:task", msg_id, times failed, last cause) of the ids
    #: that failed most often, at most 5 per spout (Storm semantics: the
    #: spout decides about replays; the host only names them)
    repeated_failures: list[tuple[str, Any, int, str | None]] = field(default_factory=list)
    stopped_by: str = "done"
    #: stateful bolts (§9.7): their components, the last committed txid,
    #: checkpoints committed and rollbacks in this run, and where the state is
    #: kept (a file path; None: in memory or a temporary directory)
    stateful: list[str] = field(default_factory=list)
    state_txid: int | None = None
    checkpoints: int = 0
    rollbacks: int = 0
    state_path: str | None = None
    #: shell components: the protocol extensions their processes negotiated
    #: (§9.2), in the order first accepted; [] = standard mode; None = no
    #: process of it finished its handshake. In-process components speak no
    #: protocol and are not listed.
    extensions: dict[str, list[str] | None] = field(default_factory=dict)
    #: spout name -> emits delivered as new inputs though a checkpoint held their message id for other values
    reused_ids: dict[str, int] = field(default_factory=dict)
    #: the spout components (the summary shows no "executed" for them)
    spouts: list[str] = field(default_factory=list)
    #: a run to the end: (spout, message ids) of ids failed to a shell spout that never emitted them again
    #: (at most 5 shown): their input is lost (docs/STATE.md)
    not_replayed: list[tuple[str, int, list[Any]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.gave_up and not self.dead_letters and self.stopped_by != "replays"



def first_line(text: str) -> str:
    return text.split("\n", 1)[0]


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 8, 40, 40, 40
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 300, 300, 300


def short_repr(value: Any) -> str:
    """``repr`` for a log line, bounded in depth and length: an input nested
    a thousand levels deep is shown, not a RecursionError."""
    return _REPR.repr(value)


def brief(text: str, limit: int = 300) -> str:
    """One line for a log or a dead letter: a traceback's first and last lines."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return text.strip()
    out = lines[0] if len(lines) <= 1 else f"{lines[0]} ... {lines[-1].strip()}"
    return out if len(out) <= limit else out[:limit] + "..."


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


def id_key(msg_id: Any) -> Any:
    return hashable(msg_id)


def hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, hashable(x)) for k, x in v.items()))
    return v


def sort_key(v: Any) -> tuple[str, str]:
    return (type(v).__name__, repr(v)) if not isinstance(v, str) else ("str", v)
