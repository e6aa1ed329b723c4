"""Stream groupings (pure): which tasks of a subscriber receive a tuple.

One class per kind, registered by name (:func:`register_grouping`): the
topology loaders, the handshake context, the embedded runtime, the Spark
direct lane and the Spark stages all look a kind up here, so adding a
grouping is writing one class. An unknown kind is a ``TopologyError``
wherever it is named.

The key-to-task mapping of the fields grouping is deterministic and
documented (CRC-32 of the JSON of the key fields, modulo the number of
tasks, over the tasks sorted ascending) so that the Spark engine partitions
exactly as the embedded one does.
"""

from __future__ import annotations

import zlib
from typing import Any, ClassVar, Sequence

import orjson

from multilang.errors import TopologyError

from .conf import one_of
from .rng import RNG

__all__ = ["Grouping", "GROUPINGS", "register_grouping", "grouping_class", "new_grouping", "fields_task_index",
           "Router"]


def fields_task_index(key: Sequence[Any], n_tasks: int) -> int:
    """Index (into the ascending task list) that a fields-grouping key goes to."""
    return zlib.crc32(orjson.dumps(list(key))) % n_tasks


class Grouping:
    """One subscription: ``target`` receives a stream by this grouping.

    A kind is a subclass that sets :attr:`kind` and :attr:`storm_type` and
    overrides :meth:`choose` (and, if it picks one task per tuple,
    :meth:`choose_each` where it can do better than one call per tuple).
    ``tasks`` are the target's task ids, ascending (the Spark stages pass
    ``range(n)``: a choice is then a task index); ``field_index`` are the
    positions of the grouping's fields in the tuple."""

    #: the name in topologies (TOML ``grouping = ...``, ``BoltDeclarer.grouping``)
    kind: ClassVar[str] = ""
    #: the type Storm writes in the handshake context (§2.2) and Flux's ``type:``
    storm_type: ClassVar[str] = ""
    #: Flux's ``type:`` for this kind, if Flux has one
    flux_type: ClassVar[str | None] = None
    #: every emit goes to exactly one task (what :meth:`choose_each` serves)
    one_task: ClassVar[bool] = True
    #: the subscriber receives only direct emits (``emit_direct``)
    direct: ClassVar[bool] = False
    #: the grouping takes fields (``fields = [...]``); all others refuse them
    takes_fields: ClassVar[bool] = False
    #: which task gets a tuple depends on the tuple or must stay one task
    #: (fields, global, all): the Spark stages put each task's rows in one
    #: partition before the bolt runs
    keyed: ClassVar[bool] = False
    #: only the target's tasks in the emitting task's process, if it has any
    #: (host workers: the runtime of each worker builds it with its own tasks)
    prefers_local: ClassVar[bool] = False

    __slots__ = ("target", "tasks", "field_index", "_next")

    def __init__(self, target: str, tasks: Sequence[int], field_index: Sequence[int] = ()) -> None:
        self.target = target
        self.tasks = list(tasks)
        self.field_index = list(field_index)
        self._next = RNG.randrange(len(self.tasks)) if self.tasks else 0

    def choose(self, values: list[Any]) -> list[int]:
        """Target tasks for a non-direct emit."""
        raise NotImplementedError

    def choose_each(self, values_list: list[list[Any]]) -> list[int]:
        """The one target task of each of a run of emits (``one_task`` kinds):
        what :meth:`choose` picks for each, in one call."""
        if not self.one_task:
            raise ValueError(f"the {self.kind} grouping does not pick one task per tuple")
        choose = self.choose
        return [choose(v)[0] for v in values_list]

    @classmethod
    def context_json(cls, fields: Sequence[str]) -> dict[str, Any]:
        """This grouping in the handshake context (§2.2), as Storm writes it."""
        if cls.storm_type == "FIELDS":
            return {"type": "FIELDS", "fields": list(fields)}
        return {"type": cls.storm_type}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(target={self.target!r}, tasks={self.tasks!r})"


#: kind -> its class (what :func:`register_grouping` registered)
GROUPINGS: dict[str, type[Grouping]] = {}


def register_grouping(cls: type[Grouping]) -> type[Grouping]:
    """Make ``cls`` the grouping of kind ``cls.kind`` (usable as a class
    decorator). A kind registered twice is a ``ValueError``."""
    if not (isinstance(cls, type) and issubclass(cls, Grouping)) or not cls.kind or not cls.storm_type:
        raise ValueError(f"{cls!r}: a grouping is a Grouping subclass with a kind and a storm_type")
    if cls.kind in GROUPINGS and GROUPINGS[cls.kind] is not cls:
        raise ValueError(f"grouping {cls.kind!r} is registered already ({GROUPINGS[cls.kind].__name__})")
    GROUPINGS[cls.kind] = cls
    return cls


def grouping_class(kind: str) -> type[Grouping]:
    """The class of grouping ``kind``; ``TopologyError`` naming the kinds
    there are if there is none."""
    cls = GROUPINGS.get(kind)
    if cls is None:
        raise TopologyError(f"unknown grouping {kind!r}{one_of(kind, GROUPINGS, str(sorted(GROUPINGS)))}")
    return cls


def new_grouping(kind: str, target: str, tasks: Sequence[int], field_index: Sequence[int] = ()) -> Grouping:
    """A subscription of ``target`` by grouping ``kind`` (see :func:`grouping_class`)."""
    return grouping_class(kind)(target, tasks, field_index)


@register_grouping
class ShuffleGrouping(Grouping):
    """Storm's shuffle: round-robin over the tasks, an even load."""

    kind, storm_type, flux_type = "shuffle", "SHUFFLE", "SHUFFLE"
    __slots__ = ()

    def choose(self, values: list[Any]) -> list[int]:
        i = self._next
        self._next = (i + 1) % len(self.tasks)
        return [self.tasks[i]]

    def choose_each(self, values_list: list[list[Any]]) -> list[int]:
        tasks = self.tasks
        n, m = len(tasks), len(values_list)
        i = self._next
        self._next = (i + m) % n
        if n == 1:
            return tasks * m
        return [tasks[(i + k) % n] for k in range(m)]


@register_grouping
class LocalOrShuffleGrouping(ShuffleGrouping):
    """Storm's local-or-shuffle: a shuffle over the target's tasks in the
    emitting task's worker, or over all of them where it has none. On one
    worker (the embedded engine, a Spark stage) every task is local: a
    shuffle."""

    kind, storm_type, flux_type = "local_or_shuffle", "LOCAL_OR_SHUFFLE", "LOCAL_OR_SHUFFLE"
    prefers_local = True
    __slots__ = ()


@register_grouping
class NoneGrouping(ShuffleGrouping):
    """Storm's none grouping: "don't care", a shuffle (as Storm does it)."""

    kind, storm_type, flux_type = "none", "NONE", "NONE"
    __slots__ = ()


@register_grouping
class FieldsGrouping(Grouping):
    """The tuples with equal values in the grouping's fields go to one task
    (:func:`fields_task_index`)."""

    kind, storm_type, flux_type = "fields", "FIELDS", "FIELDS"
    takes_fields = keyed = True
    __slots__ = ()

    def choose(self, values: list[Any]) -> list[int]:
        return [self.tasks[fields_task_index([values[i] for i in self.field_index], len(self.tasks))]]

    def choose_each(self, values_list: list[list[Any]]) -> list[int]:
        tasks, fi = self.tasks, self.field_index
        n = len(tasks)
        return [tasks[fields_task_index([v[i] for i in fi], n)] for v in values_list]


@register_grouping
class GlobalGrouping(Grouping):
    """Every tuple to the lowest task (Storm writes it as FIELDS with no fields)."""

    kind, storm_type, flux_type = "global", "FIELDS", "GLOBAL"
    keyed = True
    __slots__ = ()

    def choose(self, values: list[Any]) -> list[int]:
        return [self.tasks[0]]

    def choose_each(self, values_list: list[list[Any]]) -> list[int]:
        return [self.tasks[0]] * len(values_list)

    @classmethod
    def context_json(cls, fields: Sequence[str]) -> dict[str, Any]:
        return {"type": "FIELDS", "fields": []}


@register_grouping
class AllGrouping(Grouping):
    """Every tuple to every task."""

    kind, storm_type, flux_type = "all", "ALL", "ALL"
    one_task = False
    keyed = True
    __slots__ = ()

    def choose(self, values: list[Any]) -> list[int]:
        return list(self.tasks)


@register_grouping
class DirectGrouping(Grouping):
    """The emitter names the task (``emit_direct``); a plain emit is an error."""

    kind, storm_type, flux_type = "direct", "DIRECT", "DIRECT"
    one_task = False
    direct = True
    __slots__ = ()

    def choose(self, values: list[Any]) -> list[int]:
        return []  # direct streams receive only direct emits


class Router:
    """Routes (source component, stream) to subscribers' tasks."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], list[Grouping]] = {}

    def add(self, source: str, stream: str, grouping: Grouping) -> None:
        self.routes.setdefault((source, stream), []).append(grouping)

    def subscribers(self, source: str, stream: str) -> list[Grouping]:
        return self.routes.get((source, stream), [])

    def direct_targets(self, source: str, stream: str) -> set[int]:
        """Tasks that may receive a direct emit on this stream."""
        return {t for g in self.subscribers(source, stream) if g.direct for t in g.tasks}
