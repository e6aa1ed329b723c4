"""Stateful bolts' state on Spark: a store versioned by micro-batch id, in
the run's checkpoint location (any file system Spark's checkpoints may be
on: ``storage.Location``), as Spark's own state stores keep theirs.

The streaming topology engine (``_streaming/topology.py``) runs task *t* of a
stateful bolt for micro-batch *b* as one Spark task (a fresh process, §9.7
``init`` from this store, checkpoints into it). A Spark task may run more
than once for the same batch (a task retry, or the batch re-run after a
driver restart), so what it writes must not count twice. Each task of each
stateful component has a folder, ``<state>/<component>/task-<t>/``, of files
named by batch id, each written whole (``Location.write``):

* ``<b>.delta``: the changes of batch *b* (``{"put": {...}, "delete": [...]}``),
  rewritten whole at each checkpoint of the attempt;
* ``<b>.snapshot``: the whole state after batch *b*, written when the
  task would otherwise read :data:`SNAPSHOT_EVERY` deltas (every 10 batches
  that have rows for it); files older than the snapshot before the last one
  are removed.

Opened for batch *b*, the state is the latest snapshot below *b* and the
deltas after it below *b*: every batch below *b* was committed by Spark (the
engine runs batch *b* only after batch *b-1*'s ``foreachBatch`` returned and
Spark recorded it), and the files of *b* and above belong to attempts that
did not finish (their batch is being re-run): they are not read, and the
attempt rewrites them. So a retried attempt starts again from the same
state, and the state after batch *b* is the effect of exactly one attempt.

This relies on what Structured Streaming promises ``foreachBatch``: batches
run one at a time, in order, and a batch is re-run (with the same rows) until
it succeeds. Speculative execution (``spark.speculation``) would run two
attempts of one task at once; the engine's stages do not support it.
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from multilang.errors import TopologyError
from multilang.shellbolt import Checkpoint, StateStore

from .._engine.storage import Location

__all__ = ["BatchStore", "PROVIDER", "SNAPSHOT_EVERY", "read_state"]

#: ``topology.state.provider`` of the engine's stateful stages
PROVIDER = "multilang.adapters.spark._streaming.state:BatchStore"
#: a task writes its whole state every this many of its batches (and so reads fewer deltas than this)
SNAPSHOT_EVERY = 10


def _component(state: Location, component: str) -> Location:
    return state.child("".join(c if c.isalnum() or c in "-_." else "_" for c in component) or "component")


def _folder(state: Location, component: str, task: int) -> Location:
    return _component(state, component).child(f"task-{task}")


def _files(folder: Location) -> tuple[list[int], list[int]]:
    """The batch ids of the folder's snapshots and deltas, sorted."""
    snaps, deltas = [], []
    for name in folder.list():
        stem, _, kind = name.partition(".")
        if stem.isdigit() and kind in ("snapshot", "delta"):
            (snaps if kind == "snapshot" else deltas).append(int(stem))
    return sorted(snaps), sorted(deltas)


def _load(folder: Location, below: int | None) -> tuple[dict[str, Any], int]:
    """The state after every batch below ``below`` (None: every batch), and
    how many deltas were read after the last snapshot."""
    snaps, deltas = _files(folder)
    if below is not None:
        snaps, deltas = [b for b in snaps if b < below], [b for b in deltas if b < below]
    state: dict[str, Any] = {}
    base, read = -1, 0
    try:
        if snaps:
            base = snaps[-1]
            state = orjson.loads(folder.read(f"{base:012d}.snapshot") or b"{}")
        for b in deltas:
            if b > base:
                read += 1
                d = orjson.loads(folder.read(f"{b:012d}.delta") or b"{}")
                for k in d.get("delete", ()):
                    state.pop(k, None)
                state.update(d.get("put", {}))
    except orjson.JSONDecodeError as exc:
        raise TopologyError(f"state store {folder}: a file is damaged ({exc})") from None
    return state, read


class BatchStore(StateStore):
    """The state of one task of one stateful bolt for one micro-batch.

    ``config`` (``topology.state.provider.config``): ``dir``, ``component``,
    ``task`` (index), ``tasks`` (the component's parallelism) and ``batch``
    (the micro-batch id). The partition's runtime runs the component as a
    single task, index 0, which this store maps to ``task``."""

    def __init__(self, config: Mapping[str, Any], topology: str = "") -> None:
        self.component = str(config["component"])
        self.task = int(config["task"])
        self.tasks = int(config["tasks"])
        self.batch = int(config["batch"])
        state = config["dir"] if isinstance(config["dir"], Location) else Location(str(config["dir"]))
        comp = _component(state, self.component)
        self.folder = comp.child(f"task-{self.task}")
        self.txid = None
        try:
            raw = comp.read("meta.json")
            stored = int(orjson.loads(raw)["tasks"]) if raw else None
            if stored is None:
                comp.write(orjson.dumps({"tasks": self.tasks}), "meta.json")
            elif stored != self.tasks:
                raise TopologyError(
                    f"state of bolt {self.component!r} in {comp}: written with {stored} task(s), but this topology "
                    f"runs {self.tasks}; a key's task depends on the parallelism: keep it, or use another --checkpoint")
            self._base, deltas = _load(self.folder, self.batch)
            #: this batch writes the whole state too: the next one would read SNAPSHOT_EVERY deltas
            self._snapshot = deltas + 1 >= SNAPSHOT_EVERY
        except (OSError, ValueError, KeyError) as exc:
            raise TopologyError(f"state store {self.folder}: {exc}") from None
        self._put: dict[str, Any] = {}
        self._delete: set[str] = set()

    def check(self, topology: str, parallelism: Mapping[str, int]) -> None:
        pass  # the parallelism was checked at open; the partition's own topology has one task

    def load(self, component: str, index: int) -> dict[str, Any]:
        state = {k: v for k, v in self._base.items() if k not in self._delete}
        state.update(self._put)
        return state

    def commit(self, cp: Checkpoint, parallelism: Mapping[str, int]) -> None:
        for (_comp, _index), (put, delete) in cp.changes.items():
            for k in delete:
                self._put.pop(k, None)
                self._delete.add(k)
            for k, v in put.items():
                self._delete.discard(k)
                self._put[k] = v
        name = f"{self.batch:012d}"
        self.folder.write(orjson.dumps({"put": self._put, "delete": sorted(self._delete)}), f"{name}.delta")
        if self._snapshot:
            self.folder.write(orjson.dumps(self.load(self.component, 0)), f"{name}.snapshot")
            snaps, deltas = _files(self.folder)
            older = [b for b in snaps if b < self.batch]
            if older:  # what only the snapshot before the last one needed
                keep = older[-1]
                for b in snaps:
                    if b < keep:
                        self.folder.delete(f"{b:012d}.snapshot")
                for b in deltas:
                    if b <= keep:
                        self.folder.delete(f"{b:012d}.delta")
        self.txid = cp.txid

    def completed(self, spout: str, index: int, key: str) -> bool:
        return False  # batches are replayed by Spark, not skipped by message id

    def has_completed(self, spout: str) -> bool:
        return False

    def outputs(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass  # every checkpoint is written whole when it commits


def read_state(directory: str | Location, component: str, task: int, upto_batch: int | None = None) -> dict[str, Any]:
    """A task's state after the last committed batch (``upto_batch``: the
    last batch Spark committed; the files of a batch above it are not counted)."""
    state = directory if isinstance(directory, Location) else Location(str(directory))
    return _load(_folder(state, component, task), None if upto_batch is None else upto_batch + 1)[0]
