"""Typed messages for every multilang command, both directions (spec §2-§4).

Frozen, keyword-only dataclasses, one per wire command (the h11 ``_events``
model). ``Ack`` and ``Fail`` have the same shape in both directions (a bolt acks
a tuple id to its host; a host acks a message id to its spout), so one class
serves both; the connection's role decides which direction is legal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

__all__ = [
    "Message",
    "Handshake",
    "TopologyContext",
    "Pid",
    "Tuple",
    "Tick",
    "anchor_ids",
    "Heartbeat",
    "TaskIds",
    "Emit",
    "Ack",
    "Fail",
    "StateInit",
    "StatePrepare",
    "StatePrepared",
    "StateCommit",
    "StateRollback",
    "STATE_MESSAGES",
    "Log",
    "Error",
    "Metrics",
    "Sync",
    "Next",
    "Activate",
    "Deactivate",
    "SpoutCommand",
    "UnknownCommand",
    "TupleBatch",
    "Batch",
    "ConnectionClosed",
    "DEFAULT_STREAM",
    "HEARTBEAT_STREAM",
    "TICK_STREAM",
    "SYSTEM_COMPONENT",
    "LOG_LEVELS",
]

DEFAULT_STREAM = "default"
HEARTBEAT_STREAM = "__heartbeat"
TICK_STREAM = "__tick"
SYSTEM_COMPONENT = "__system"
SYSTEM_TASK = -1

#: §3.7 log levels; anything else is INFO.
LOG_LEVELS = {0: "TRACE", 1: "DEBUG", 2: "INFO", 3: "WARN", 4: "ERROR"}

_FROZEN = dict(frozen=True, kw_only=True, slots=True)


class Message:
    """Base of every message."""

    __slots__ = ()


@dataclass(**_FROZEN)
class TopologyContext:
    """The handshake ``context`` object (spec §2.2): 8 keys, Storm's names."""

    task_id: int
    component_id: str
    task_to_component: dict[int, str] = field(default_factory=dict)
    streams: list[str] = field(default_factory=list)
    stream_to_output_fields: dict[str, list[str]] = field(default_factory=dict)
    stream_to_target_to_grouping: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    source_to_stream_to_grouping: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    source_to_stream_to_fields: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def component_tasks(self, component: str) -> list[int]:
        """Task ids of ``component``, ascending (Storm's ``getComponentTasks``)."""
        return sorted(t for t, c in self.task_to_component.items() if c == component)

    def to_json(self) -> dict[str, Any]:
        return {
            # JSON object keys are strings: Storm writes task ids as strings.
            "task->component": {str(t): c for t, c in self.task_to_component.items()},
            "taskid": self.task_id,
            "componentid": self.component_id,
            "streams": list(self.streams),
            "stream->outputfields": self.stream_to_output_fields,
            "stream->target->grouping": self.stream_to_target_to_grouping,
            "source->stream->grouping": self.source_to_stream_to_grouping,
            "source->stream->fields": self.source_to_stream_to_fields,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "TopologyContext":
        return cls(
            task_id=int(obj.get("taskid", 0)),
            component_id=obj.get("componentid", ""),
            task_to_component={int(t): c for t, c in (obj.get("task->component") or {}).items()},
            streams=list(obj.get("streams") or []),
            stream_to_output_fields=obj.get("stream->outputfields") or {},
            stream_to_target_to_grouping=obj.get("stream->target->grouping") or {},
            source_to_stream_to_grouping=obj.get("source->stream->grouping") or {},
            source_to_stream_to_fields=obj.get("source->stream->fields") or {},
        )


# --- host -> component -----------------------------------------------------


@dataclass(**_FROZEN)
class Handshake(Message):
    """First frame from the host (§2.2). ``context`` is kept as Storm's JSON.
    ``extensions``: the host's offer (§9.1), the frame's top-level
    ``extensions`` key, which Storm's host never writes; a conf key is no offer."""

    pid_dir: str
    conf: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    extensions: tuple[str, ...] = ()

    @property
    def topology_context(self) -> TopologyContext:
        return TopologyContext.from_json(self.context)


class Tuple(NamedTuple):
    """An input tuple for a bolt (§3.1). ``id`` is a string, echoed verbatim.

    Unlike the other messages this is an immutable named tuple rather than a
    frozen dataclass, on purpose: one is built per input tuple, and a frozen
    keyword-only dataclass costs about 1 µs to construct in CPython, a third
    of the whole per-tuple budget of the component loop (bench/). It is just
    as immutable and is built with keywords the same way.
    """

    id: str
    component: str | None
    stream: str
    task: int
    values: list[Any]


class Tick(Tuple):
    """A tick tuple (§3.3): an ordinary, ackable input on ``__system/__tick``."""

    __slots__ = ()


def anchor_ids(a: Any) -> list[str]:
    """Anchors as given to an emit (a Tuple, an id, a list of them, or None) as ids."""
    if a is None:
        return []
    if type(a) is str or isinstance(a, tuple):  # Tuple, Tick
        return [a if type(a) is str else a[0]]
    return [x if type(x) is str else x[0] for x in a]


class Tuples(Sequence):
    """The input tuples of one :meth:`multilang.Bolt.process_batch` call.

    A read-only sequence of :class:`Tuple` (built when indexed or iterated),
    plus the fields as columns: ``ids``, ``components``, ``streams``,
    ``tasks``, ``values`` (tuples, in order). A batch-level bolt that works on
    the columns never builds a per-tuple object::

        def process_batch(self, tuples):
            self.emit_many([[v[0].upper()] for v in tuples.values], anchors=tuples.ids)
            self.ack_many(tuples.ids)
    """

    __slots__ = ("_rows", "_cols")

    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows  # each [id, comp, stream, task, values]
        self._cols: list[tuple[Any, ...]] | None = None

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [tuple.__new__(Tuple, r) for r in self._rows[i]]
        return tuple.__new__(Tuple, self._rows[i])

    def __iter__(self) -> Any:
        return map(partial(tuple.__new__, Tuple), self._rows)

    def __repr__(self) -> str:
        return f"Tuples({list(self)!r})"

    def _col(self, i: int) -> tuple[Any, ...]:
        if self._cols is None:
            self._cols = list(zip(*self._rows)) or [()] * 5
        return self._cols[i]

    @property
    def ids(self) -> tuple[str, ...]:
        return self._col(0)

    @property
    def components(self) -> tuple[str | None, ...]:
        return self._col(1)

    @property
    def streams(self) -> tuple[str, ...]:
        return self._col(2)

    @property
    def tasks(self) -> tuple[int, ...]:
        return self._col(3)

    @property
    def values(self) -> tuple[list[Any], ...]:
        return self._col(4)


@dataclass(**_FROZEN)
class Heartbeat(Message):
    """A heartbeat tuple (§5.1). Answered with ``sync``; never acked."""

    id: str


@dataclass(**_FROZEN)
class TaskIds(Message):
    """The reply to a non-direct emit that wanted task ids (§3.4)."""

    task_ids: list[int]


@dataclass(**_FROZEN)
class SpoutCommand(Message):
    """Base of the host's commands to a spout (§4.1). Exactly one ``sync`` answers each."""

    @property
    def command(self) -> str:
        return _SPOUT_COMMAND_NAMES[type(self)]


@dataclass(**_FROZEN)
class Next(SpoutCommand):
    pass


@dataclass(**_FROZEN)
class Activate(SpoutCommand):
    pass


@dataclass(**_FROZEN)
class Deactivate(SpoutCommand):
    pass


# --- both directions -------------------------------------------------------


@dataclass(**_FROZEN)
class Ack(SpoutCommand):
    """Bolt -> host: ack tuple ``id`` (a string). Host -> spout: ack message
    ``id`` (any JSON, its type preserved)."""

    id: Any


@dataclass(**_FROZEN)
class Fail(SpoutCommand):
    """Like :class:`Ack`, for failure."""

    id: Any


# --- component -> host -----------------------------------------------------


@dataclass(**_FROZEN)
class Pid(Message):
    """The handshake reply (§2.3). ``extensions`` lists accepted extensions (§9)."""

    pid: int
    extensions: tuple[str, ...] = ()


_NO_ID = None


@dataclass(**_FROZEN)
class Emit(Message):
    """``emit`` from a bolt (``anchors``) or a spout (``id``) (§3.5, §4.3).

    ``task`` is ``None`` for a normal emit and the target task for a direct
    emit, which is never answered with task ids. A spout emit with ``id`` None
    is unreliable; any other JSON value (0 included) is a reliable message id.
    """

    values: list[Any]
    stream: str = DEFAULT_STREAM
    anchors: tuple[str, ...] = ()
    id: Any = _NO_ID
    task: int | None = None
    need_task_ids: bool = True

    @property
    def is_direct(self) -> bool:
        return self.task is not None

    @property
    def wants_task_ids(self) -> bool:
        return self.need_task_ids and self.task is None


@dataclass(**_FROZEN)
class Log(Message):
    msg: str
    level: int = 2


@dataclass(**_FROZEN)
class Error(Message):
    """The ``error`` command: reported, not fatal (§3.7)."""

    msg: str


@dataclass(**_FROZEN)
class Metrics(Message):
    name: str
    params: Any = None


@dataclass(**_FROZEN)
class Sync(Message):
    """Answers a heartbeat (bolt) or ends a command (spout)."""


@dataclass(**_FROZEN)
class TupleBatch(Message):
    """Host -> bolt, extension ``batch`` (§9.5): input tuples in one frame."""

    tuples: list[Tuple]


@dataclass(**_FROZEN)
class Batch(Message):
    """Component -> host, extension ``batch`` (§9.5): emits, then acks, then
    fails. Each emit is ``[tuple, anchors_or_msg_id, stream]``: the wire may
    leave the last two out, the decoder puts them in (null, "default"), so a
    reader always takes three."""

    emits: list[list[Any]] = field(default_factory=list)
    acks: list[str] = field(default_factory=list)
    fails: list[str] = field(default_factory=list)


# --- extension state (§9.7) ------------------------------------------------------


@dataclass(**_FROZEN)
class StateInit(Message):
    """Host -> bolt: the state committed under ``txid`` (None: nothing
    committed), the first frame after the pid reply. ``more``: another
    chunk follows."""

    txid: int | None
    state: dict[str, Any]
    more: bool = False


@dataclass(**_FROZEN)
class StatePrepare(Message):
    """Host -> bolt: send the changes since the last prepare, under ``txid``."""

    txid: int


@dataclass(**_FROZEN)
class StatePrepared(Message):
    """Bolt -> host: the answer to :class:`StatePrepare` (``put`` keys set
    since, ``delete`` keys deleted since). ``more``: another chunk follows."""

    txid: int
    put: dict[str, Any]
    delete: list[str]
    more: bool = False


@dataclass(**_FROZEN)
class StateCommit(Message):
    """Host -> bolt: the changes prepared under ``txid`` are durable."""

    txid: int


@dataclass(**_FROZEN)
class StateRollback(Message):
    """Host -> bolt: restore the state as of the last init or commit (``txid``)."""

    txid: int | None


#: every message of the state extension, by its wire ``action``
STATE_MESSAGES: dict[str, type] = {
    "init": StateInit, "prepare": StatePrepare, "prepared": StatePrepared,
    "commit": StateCommit, "rollback": StateRollback,
}


@dataclass(**_FROZEN)
class UnknownCommand(Message):
    """A frame with a ``command`` we do not know. Bolt hosts ignore it (Storm
    does); spout hosts treat it as a protocol error (§3.7, §4.5)."""

    command: str
    frame: dict[str, Any]


@dataclass(**_FROZEN)
class ConnectionClosed(Message):
    """The peer closed its output (EOF)."""


_SPOUT_COMMAND_NAMES: dict[type, str] = {
    Next: "next",
    Activate: "activate",
    Deactivate: "deactivate",
    Ack: "ack",
    Fail: "fail",
}
