"""The replay log of the multilang streaming source: every tuple taken from
the spout gets a durable position, so a micro-batch Spark re-runs gets the
same rows in the same order (docs/SPARK.md, "Offsets, replay log, commit").
The log's files are read and written through a file system layer
(``storage.Location``): its directory may be a path or a URI (HDFS, an
object store); the record of message ids is SQLite on the driver's disk.
"""

from __future__ import annotations

import errno
import hashlib
import fcntl
import json
import logging
import os
import shutil
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

from multilang.codec import dumps, loads
from multilang.shellbolt import scratch_folder

from .._engine.storage import Location

log = logging.getLogger("multilang.spark.source")

#: 2: message ids recorded in msg-ids.sqlite (1: ids of dedupe=all in acked-ids.jsonl; migrated on open).
_LOG_VERSION = 2
#: The file of the message id record, in the replay log directory.
IDS_FILE = "msg-ids.sqlite"


def _id_key(msg_id: Any) -> str:
    """Canonical JSON of a message id: JSON types kept apart (1, 1.0, "1", true)."""
    return json.dumps(msg_id, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class _MsgIdIndex:
    """The record of every message id the replay log has logged: canonical id
    (``_id_key``) -> the position of its first copy and a digest of its
    values. On disk (SQLite, WAL, one synchronous transaction per logged
    batch); in memory only SQLite's page cache, bounded by ``cache_mb``.
    Ids are kept for the life of the log, never pruned.

    ``ids_missing_from`` (a row of ``meta``): the first position whose id may
    not be recorded (logged by a run with ``dedupe`` inflight or none, or by a
    version of the log that did not keep ids); absent when the record is whole.
    """

    def __init__(self, path: Path, cache_mb: int) -> None:
        self.path = path
        # Used from the driver's thread (recording a logged batch) and the trio
        # thread (looking up the ids the spout emits meanwhile): one at a time.
        self._mu = threading.Lock()
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")  # a commit is on disk when it returns
            self.db.execute(f"PRAGMA cache_size={-1024 * int(cache_mb)}")  # KiB
            self.db.execute("CREATE TABLE IF NOT EXISTS msg_ids "
                            "(id TEXT PRIMARY KEY, pos INTEGER NOT NULL, digest BLOB) WITHOUT ROWID")
            self.db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID")
        except sqlite3.DatabaseError as exc:
            self.db.close()
            raise RuntimeError(f"the message id record {path} is unreadable ({exc}): it was damaged or "
                               "is not ours; restore it, or start with a fresh checkpointLocation and replayLog") from None

    def lookup(self, key: str) -> tuple[int, bytes | None] | None:
        """(position of the first copy, values digest) of a logged id, or None."""
        with self._mu:
            return self.db.execute("SELECT pos, digest FROM msg_ids WHERE id = ?", (key,)).fetchone()

    def record(self, rows: Iterable[tuple[str, int, bytes | None]]) -> None:
        """Add (id key, position, digest) rows in one durable transaction; an id
        already recorded keeps its first position."""
        with self._transaction():
            self.db.executemany("INSERT OR IGNORE INTO msg_ids (id, pos, digest) VALUES (?, ?, ?)", rows)

    def forget_from(self, end: int) -> None:
        """Drop rows of positions >= end: their batch file never made it to disk."""
        with self._transaction():
            self.db.execute("DELETE FROM msg_ids WHERE pos >= ?", (end,))

    def count(self) -> int:
        with self._mu:
            return self.db.execute("SELECT count(*) FROM msg_ids").fetchone()[0]

    def get_meta(self, key: str) -> Any:
        with self._mu:
            row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: Any) -> None:
        with self._transaction():
            if value is None:
                self.db.execute("DELETE FROM meta WHERE key = ?", (key,))
            else:
                self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _transaction(self) -> "_Tx":
        return _Tx(self.db, self._mu)

    def close(self) -> None:
        with self._mu:
            self.db.close()


class _Tx:
    """One transaction, holding the record's lock from BEGIN to COMMIT."""

    def __init__(self, db: sqlite3.Connection, mu: threading.Lock) -> None:
        self.db = db
        self.mu = mu

    def __enter__(self) -> None:
        self.mu.acquire()
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.mu.release()
            raise

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        try:
            self.db.execute("ROLLBACK" if exc_type is not None else "COMMIT")
        finally:
            self.mu.release()


class _ReplayLog:
    """Positions -> records, one JSON-lines file per appended chunk, and the
    record of the message ids logged (``ids``, a :class:`_MsgIdIndex`).

    Layout of the directory (a path, or a URI: every file is written whole,
    ``Location.write``)::

        meta.json          {"version": 2, "log": <uuid>}
        committed.json     {"pos": n}: every position < n is committed (acked)
        batch-<a>-<b>.jsonl  positions a..b-1, one {"id", "values"} per line
        msg-ids.sqlite     (+ -wal, -shm) every message id logged, with dedupe=all
        lock               flock'ed by the one reader using the log

    The last two are local files: in the directory when it is a path; for a
    URI (``file://`` too) in the driver's cache (``$XDG_CACHE_HOME/multilang/replay-ids/``,
    named by the URI), and no lock (one query per log, as Spark's own
    checkpoints). A record that is missing while the log has committed
    positions (the driver moved) is known to be missing: dedupe=all refuses it.

    Version 1 (before msg-ids.sqlite) is migrated on open: its
    ``acked-ids.jsonl`` (the ids dedupe=all had acked) goes into the record.
    """

    def __init__(self, directory: str | None, record_ids: bool, cache_mb: int = 16) -> None:
        self.temporary = directory is None
        if directory is None:
            directory = scratch_folder("multilang-replay-")
            log.warning(
                "multilang source: no replayLog option; using the temporary %s. A restarted query "
                "cannot replay its uncommitted batches from it: set replayLog to a durable directory "
                "next to the query's checkpoint.", directory,
            )
        self.dir = str(directory)
        self.loc = Location(self.dir)
        if not self.loc.is_uri:
            self.local = Path(self.loc.root)
        else:
            cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
            digest = hashlib.sha256(self.loc.uri.encode()).hexdigest()[:16]
            self.local = Path(cache, "multilang", "replay-ids", digest)
        self.local.mkdir(parents=True, exist_ok=True)
        self.record_ids = record_ids
        self.ids: _MsgIdIndex | None = None
        self._lock_fd: int | None = None if self.loc.is_uri else self._lock()
        try:
            self._load(cache_mb)
        except BaseException:
            self.close()
            raise

    def _load(self, cache_mb: int) -> None:
        raw = self.loc.read("meta.json")
        if raw is not None:
            try:
                meta = json.loads(raw)
            except ValueError as exc:
                raise RuntimeError(f"replay log {self.dir}: meta.json is damaged ({exc})") from None
            version = meta.get("version")
            if version not in (1, _LOG_VERSION):
                raise RuntimeError(
                    f"replay log {self.dir} has version {version!r}; this multilang reads versions 1 and "
                    f"{_LOG_VERSION}: it was written by a newer multilang"
                )
        else:
            version = _LOG_VERSION
            meta = {"version": _LOG_VERSION, "log": str(uuid.uuid4())}
            self.loc.write(json.dumps(meta).encode(), "meta.json")
        self.id: str = meta["log"]
        committed = self.loc.read("committed.json")
        self.committed = int(json.loads(committed)["pos"]) if committed is not None else 0
        self.chunks: list[tuple[int, int, str]] = []
        for name in self.loc.list():
            if name.startswith("batch-") and name.endswith(".jsonl"):
                a, b = name[:-len(".jsonl")].split("-")[1:3]
                self.chunks.append((int(a), int(b), name))
        self.chunks.sort()
        self.end = self.committed
        live = []
        for a, b, p in self.chunks:
            if b <= self.committed:  # committed, left behind by a crash before its deletion
                self.loc.delete(p)
                continue
            if a > self.end:
                raise RuntimeError(f"replay log {self.dir} has a gap: positions {self.end}..{a} are missing")
            live.append((a, b, p))
            self.end = b
        self.chunks = live
        fresh = not (self.local / IDS_FILE).exists()
        self.ids = _MsgIdIndex(self.local / IDS_FILE, cache_mb)
        if fresh and self.committed > 0 and version != 1:  # the record of the committed ids is not here
            self.ids.set_meta("ids_missing_from", 0)
        if version == 1:
            self._migrate_v1(meta)
        self._reconcile_ids()

    def _migrate_v1(self, meta: dict[str, Any]) -> None:
        """Version 1 kept ids only with dedupe=all, as acked-ids.jsonl (one
        JSON array of ids per commit); without it no id was kept."""
        assert self.ids is not None
        old = self.loc.read("acked-ids.jsonl")
        if old is None and self.record_ids and self.committed > 0:
            raise _IdsMissing(self.dir, 0, self.committed)  # refused before anything is changed
        if old is not None:
            keys = set()
            lines = old.splitlines()
            for n, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    keys.update(_id_key(i) for i in loads(line))
                except Exception as exc:
                    if n == len(lines):
                        break  # a torn last line: that commit was not recorded as done either
                    raise RuntimeError(f"replay log {self.dir}: acked-ids.jsonl line {n} is damaged ({exc})") from None
            # Acked, so committed; position unknown (-1 sorts below every commit).
            self.ids.record((k, -1, None) for k in keys)
            log.info("multilang source: replay log %s migrated to version %d: %d acked ids from acked-ids.jsonl",
                     self.dir, _LOG_VERSION, len(keys))
        else:
            self.ids.set_meta("ids_missing_from", 0)
        self.loc.write(json.dumps({**meta, "version": _LOG_VERSION}).encode(), "meta.json")
        self.loc.delete("acked-ids.jsonl")

    def _reconcile_ids(self) -> None:
        """Make the record agree with the log files, whatever a crash cut short:
        rows past the end go, and (dedupe=all) every live record's id is in."""
        assert self.ids is not None
        self.ids.forget_from(self.end)
        missing_from = self.ids.get_meta("ids_missing_from")
        if not self.record_ids:
            # This run logs without recording: the record is whole only below `end`.
            if missing_from is None or missing_from > self.end:
                self.ids.set_meta("ids_missing_from", self.end)
            return
        if missing_from is not None and missing_from < self.committed:
            raise _IdsMissing(self.dir, missing_from, self.committed)
        pos, rows = self.committed, []
        for rec in self.read(self.committed, self.end):
            if rec["id"] is not None:
                rows.append((_id_key(rec["id"]), pos, _digest(rec["values"])))
            pos += 1
        self.ids.record(rows)
        if missing_from is not None:
            self.ids.set_meta("ids_missing_from", None)

    def _lock(self) -> int:
        fd = os.open(self.local / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + 30
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:  # the previous run's worker had 30s to exit
                    os.close(fd)
                    raise RuntimeError(
                        f"replay log {self.dir} is in use by another running query; "
                        "give each query its own replayLog directory"
                    ) from None
                time.sleep(0.1)

    def append(self, records: list[tuple[Any, list[Any]]], ids: list[tuple[str, int, bytes]] | None = None) -> tuple[int, int]:
        """Durably append records (msg id, values); returns their positions.
        With ``record_ids``, ``ids`` (id key, offset in ``records``, values
        digest) go into the id record first, in one transaction: a logged
        tuple always has its id recorded (rows of a batch file that never made
        it are dropped on the next open)."""
        a, b = self.end, self.end + len(records)
        if self.record_ids and ids:
            assert self.ids is not None
            self.ids.record((key, a + off, digest) for key, off, digest in ids)
        body = b"".join(dumps({"id": i, "values": v}) + b"\n" for i, v in records)
        name = f"batch-{a:012d}-{b:012d}.jsonl"
        self.loc.write(body, name)
        self.chunks.append((a, b, name))
        self.end = b
        return a, b

    def read(self, lo: int, hi: int) -> list[dict[str, Any]]:
        """The records at positions lo..hi-1, exactly as logged."""
        if lo < self.committed or hi > self.end:
            raise RuntimeError(
                f"replay log {self.dir} holds positions {self.committed}..{self.end}, but Spark asks "
                f"for {lo}..{hi}: the log was deleted or belongs to another query"
            )
        out: list[dict[str, Any]] = []
        for a, b, p in self.chunks:
            if b <= lo or a >= hi:
                continue
            lines = (self.loc.read(p) or b"").splitlines()
            if len(lines) != b - a:
                raise RuntimeError(f"replay log file {self.loc.path(p)} is damaged: {len(lines)} records, "
                                   f"expected {b - a}")
            out.extend(loads(line) for line in lines[max(lo - a, 0) : min(hi, b) - a])
        if len(out) != hi - lo:
            raise RuntimeError(f"replay log {self.dir} is missing records in {lo}..{hi}")
        return out

    def mark_committed(self, pos: int) -> None:
        self.loc.write(json.dumps({"pos": pos}).encode(), "committed.json")
        self.committed = pos
        keep = []
        for a, b, p in self.chunks:
            if b <= pos:
                self.loc.delete(p)
            else:
                keep.append((a, b, p))
        self.chunks = keep

    def close(self) -> None:
        if self.ids is not None:
            self.ids.close()
            self.ids = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
        if self.temporary:
            shutil.rmtree(self.dir, ignore_errors=True)


class _IdsMissing(RuntimeError):
    def __init__(self, directory: Any, missing_from: int, committed: int) -> None:
        super().__init__(
            f'replay log {directory}: option "dedupe" is all (the default), but the message ids of committed '
            f"positions {missing_from}..{committed} were not recorded: they were logged with dedupe=inflight "
            "or none, or by an older multilang, which kept no ids with dedupe=inflight (then the default). "
            "Their replays by a restarted spout could not be dropped. Set option \"dedupe\" to \"inflight\" "
            "to go on as before (at-least-once across spout restarts), or start with a fresh "
            "checkpointLocation and replayLog for exactly-once."
        )


def _digest(values: list[Any]) -> bytes:
    """8 bytes identifying a tuple's values (to warn when an id comes back with other values)."""
    return hashlib.blake2b(dumps(values), digest_size=8).digest()
