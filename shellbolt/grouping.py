"""Stream groupings (pure): which tasks of a subscriber receive a tuple.

The key-to-task mapping of the fields grouping is deterministic and
documented (CRC-32 of the JSON of the key fields, modulo the number of
tasks, over the tasks sorted ascending) so that the Spark engine partitions
exactly as the embedded one does.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from typing import Any, Sequence

import orjson

__all__ = ["Grouping", "GROUPINGS", "fields_task_index", "Router"]

#: grouping name -> the type Storm writes in the handshake context (§2.2).
GROUPINGS = {
    "shuffle": "SHUFFLE",
    "fields": "FIELDS",
    "all": "ALL",
    "global": "FIELDS",  # Storm writes global as FIELDS with no fields
    "none": "NONE",
    "direct": "DIRECT",
    "local_or_shuffle": "LOCAL_OR_SHUFFLE",
}


def fields_task_index(key: Sequence[Any], n_tasks: int) -> int:
    """Index (into the ascending task list) that a fields-grouping key goes to."""
    return zlib.crc32(orjson.dumps(list(key))) % n_tasks


@dataclass(slots=True)
class Grouping:
    """One subscription: ``target`` receives ``source``'s ``stream`` by ``kind``."""

    kind: str
    target: str
    tasks: list[int]  # the target's task ids, ascending
    field_index: list[int] = field(default_factory=list)  # fields grouping: positions in the tuple
    _next: int = 0

    def __post_init__(self) -> None:
        if self.tasks:
            self._next = random.randrange(len(self.tasks))

    def choose(self, values: list[Any]) -> list[int]:
        """Target tasks for a non-direct emit."""
        kind = self.kind
        tasks = self.tasks
        if kind == "shuffle" or kind == "local_or_shuffle" or kind == "none":
            # Storm's shuffle is round-robin over the tasks: even load.
            i = self._next
            self._next = (i + 1) % len(tasks)
            return [tasks[i]]
        if kind == "fields":
            key = [values[i] for i in self.field_index]
            return [tasks[fields_task_index(key, len(tasks))]]
        if kind == "all":
            return list(tasks)
        if kind == "global":
            return [tasks[0]]
        if kind == "direct":
            return []  # direct streams receive only direct emits
        raise ValueError(f"unknown grouping {kind!r}")


    def choose_each(self, values_list: list[list[Any]]) -> list[int]:
        """The one target task of each of a run of emits, for a kind that
        picks one task per tuple (shuffle, local_or_shuffle, none, fields,
        global): what :meth:`choose` picks for each, in one call."""
        kind = self.kind
        tasks = self.tasks
        n, m = len(tasks), len(values_list)
        if kind == "shuffle" or kind == "local_or_shuffle" or kind == "none":
            i = self._next
            self._next = (i + m) % n
            if n == 1:
                return tasks * m
            return [tasks[(i + k) % n] for k in range(m)]
        if kind == "global":
            return [tasks[0]] * m
        if kind == "fields":
            fi = self.field_index
            return [tasks[fields_task_index([v[i] for i in fi], n)] for v in values_list]
        raise ValueError(f"the {kind} grouping does not pick one task per tuple")


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
        return {t for g in self.subscribers(source, stream) if g.kind == "direct" for t in g.tasks}
