"""Stateful bolts' state on Spark: a store versioned by micro-batch id.

The streaming topology engine (``_spark_topology``) runs task *t* of a
stateful bolt for micro-batch *b* as one Spark task (a fresh process, §9.7
``init`` from this store, checkpoints into it). A Spark task may run more
than once for the same batch (a task retry, or the batch re-run after a
driver restart), so what it writes must not count twice. Each task of each
stateful component has one SQLite file, ``<dir>/<component>/task-<t>.sqlite``:

* ``kv``: the state as of the last batch known to be committed (``base``);
* ``pending``: the changes of the one batch written since (``pending``),
  ``NULL`` for a deleted key.

Opened for batch *b*: a pending batch *p* < *b* was committed by Spark (the
engine runs batch *b* only after batch *p*'s ``foreachBatch`` returned and
Spark recorded it), so it is folded into ``kv``; a pending batch *p* >= *b*
belongs to an attempt that did not finish (its batch is being re-run), so it
is dropped. The task then reads ``kv`` and writes its checkpoints into
``pending`` for *b*: a retried attempt starts again from the same state, and
the state after batch *b* is the effect of exactly one attempt.

This relies on what Structured Streaming promises ``foreachBatch``: batches
run one at a time, in order, and a batch is re-run (with the same rows) until
it succeeds. Speculative execution (``spark.speculation``) would run two
attempts of one task at once; the engine's stages do not support it, and the
file's lock refuses a second writer (the Spark task then fails and retries).

The file lives in the run's ``--checkpoint`` directory, which must be on a
file system every executor sees (a local disk for local masters), as Spark's
own checkpoint location must be.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any, Mapping

import orjson

from multilang.errors import TopologyError
from multilang.shellbolt import Checkpoint, StateStore

__all__ = ["BatchStore", "PROVIDER", "store_path", "read_state"]

#: ``topology.state.provider`` of the engine's stateful stages
PROVIDER = "multilang.adapters.spark._streaming.state:BatchStore"

#: ``PRAGMA application_id`` ("MLSB")
_APPLICATION_ID = 0x4D4C5342

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pending (key TEXT PRIMARY KEY, value TEXT) WITHOUT ROWID;
"""


def store_path(directory: str, component: str, task: int) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in component) or "component"
    return os.path.join(directory, safe, f"task-{task}.sqlite")


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
        self.path = store_path(str(config["dir"]), self.component, self.task)
        self.txid = None
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=5)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
            db.execute(f"PRAGMA application_id = {_APPLICATION_ID}")
            db.execute("BEGIN IMMEDIATE")
            try:
                meta = dict(db.execute("SELECT key, value FROM meta"))
                stored = int(meta.get("tasks", self.tasks))
                if stored != self.tasks:
                    raise TopologyError(
                        f"state of bolt {self.component!r} in {os.path.dirname(self.path)}: written with "
                        f"{stored} task(s), but this topology runs {self.tasks}; a key's task depends on the "
                        "parallelism: keep it, or use another --checkpoint")
                pending = meta.get("pending")
                if pending is not None and int(pending) < self.batch:
                    db.execute("INSERT OR REPLACE INTO kv SELECT key, value FROM pending WHERE value IS NOT NULL")
                    db.execute("DELETE FROM kv WHERE key IN (SELECT key FROM pending WHERE value IS NULL)")
                    db.execute("INSERT OR REPLACE INTO meta VALUES ('base', ?)", (pending,))
                db.execute("DELETE FROM pending")
                db.execute("DELETE FROM meta WHERE key = 'pending'")
                db.execute("INSERT OR REPLACE INTO meta VALUES ('tasks', ?)", (str(self.tasks),))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise TopologyError(f"state store {self.path}: {exc}") from None
        except OSError as exc:
            raise TopologyError(f"state directory {os.path.dirname(self.path)}: {exc.strerror or exc}") from None
        self._db = db

    def check(self, topology: str, parallelism: Mapping[str, int]) -> None:
        pass  # the parallelism was checked at open; the partition's own topology has one task

    def load(self, component: str, index: int) -> dict[str, Any]:
        rows = self._db.execute(
            "SELECT key, value FROM kv WHERE key NOT IN (SELECT key FROM pending) "
            "UNION ALL SELECT key, value FROM pending WHERE value IS NOT NULL")
        try:
            return {k: orjson.loads(v) for k, v in rows}
        except orjson.JSONDecodeError as exc:
            raise TopologyError(f"state store {self.path} is damaged ({exc})") from None

    def commit(self, cp: Checkpoint, parallelism: Mapping[str, int]) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for (_comp, _index), (put, delete) in cp.changes.items():
                if put:
                    db.executemany("INSERT OR REPLACE INTO pending VALUES (?, ?)",
                                   [(k, orjson.dumps(v).decode()) for k, v in put.items()])
                if delete:
                    db.executemany("INSERT OR REPLACE INTO pending VALUES (?, NULL)", [(k,) for k in delete])
            db.execute("INSERT OR REPLACE INTO meta VALUES ('pending', ?)", (str(self.batch),))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.txid = cp.txid

    def completed(self, spout: str, index: int, key: str) -> bool:
        return False  # batches are replayed by Spark, not skipped by message id

    def has_completed(self, spout: str) -> bool:
        return False

    def outputs(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self._db.close()


def read_state(directory: str, component: str, task: int, upto_batch: int | None = None) -> dict[str, Any]:
    """A task's state after the last committed batch (``upto_batch``: the
    last batch Spark committed; a pending batch above it is not counted)."""
    path = store_path(directory, component, task)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        meta = dict(db.execute("SELECT key, value FROM meta"))
        state = {k: orjson.loads(v) for k, v in db.execute("SELECT key, value FROM kv")}
        pending = meta.get("pending")
        if pending is not None and (upto_batch is None or int(pending) <= upto_batch):
            for k, v in db.execute("SELECT key, value FROM pending"):
                if v is None:
                    state.pop(k, None)
                else:
                    state[k] = orjson.loads(v)
        return state
    finally:
        db.close()
