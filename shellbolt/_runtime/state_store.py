"""Where stateful bolts' state is kept between checkpoints (spec/PROTOCOL.md §9.7).

Storm's ``topology.state.provider`` names the store: ``sqlite`` (the
default, one file per topology in ``--state-dir`` or a temporary directory),
``memory`` (Storm's default ``InMemoryKeyValueStateProvider``: state lives as
long as the run), or ``module:Class`` for another store. A store is small: it
loads a task's committed state, writes one checkpoint in one transaction, and
answers whether a spout's message id is already reflected in committed state.
A Redis store would be one more class with these methods.

Every value is kept as JSON text, so a store never holds a Python object.
"""

from __future__ import annotations

import importlib
import os
import sqlite3
import zlib
from dataclasses import dataclass, field
from typing import Any, Mapping

import orjson

from multilang.errors import TopologyError

from .._model.conf import unknown_key_message

__all__ = ["StateStore", "Checkpoint", "SqliteStore", "MemoryStore", "open_store", "provider_config", "msg_key",
           "values_hash", "PROVIDERS"]


@dataclass(slots=True)
class Checkpoint:
    """What one checkpoint writes, in one transaction.

    ``changes``: (component, task index) -> (put: key -> value, delete: keys);
    ``completed``: (spout component, task index, :func:`msg_key`) of every
    tree the checkpoint covers; ``outputs``: the topology output's keys
    (JSON text) -> record, changed since the last checkpoint."""

    txid: int
    changes: dict[tuple[str, int], tuple[dict[str, Any], list[str]]] = field(default_factory=dict)
    completed: list[tuple[str, int, str]] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    #: (spout, task index, msg_key) -> :func:`values_hash` of the input committed under that id: a spout
    #: that reuses the id for another input is told apart from one that emits the same input again
    values: dict[tuple[str, int, str], int] = field(default_factory=dict)


def msg_key(msg_id: Any) -> str | None:
    """A message id as the store keeps it (canonical JSON), or None for an id
    with no JSON form (it is then never skipped on resume: at least once)."""
    try:
        return orjson.dumps(msg_id, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return None


def values_hash(values: Any) -> int | None:
    """A checksum of a spout tuple's values (canonical JSON), or None for
    values with no JSON form (never compared, then)."""
    try:
        return zlib.crc32(orjson.dumps(values, option=orjson.OPT_SORT_KEYS))
    except TypeError:
        return None


class StateStore:
    """The provider interface. ``parallelism`` (component -> tasks) is the
    running topology's, for the stateful components: a store whose state was
    written with another parallelism, or by another topology, refuses it (a
    key's task depends on the parallelism)."""

    #: the txid of the last committed checkpoint, None if there is none
    txid: int | None = None

    def check(self, topology: str, parallelism: Mapping[str, int]) -> None:
        """Refuse (:class:`TopologyError`) state written by another topology or shape."""
        raise NotImplementedError

    def load(self, component: str, index: int) -> dict[str, Any]:
        """The committed state of one task."""
        raise NotImplementedError

    def commit(self, cp: Checkpoint, parallelism: Mapping[str, int]) -> None:
        """Write a checkpoint, all or nothing; then ``txid`` is ``cp.txid``."""
        raise NotImplementedError

    def completed(self, spout: str, index: int, key: str) -> bool:
        """Whether a spout task's message id is reflected in committed state."""
        raise NotImplementedError

    def completed_entry(self, spout: str, index: int, key: str) -> tuple[bool, int | None]:
        """:meth:`completed`, and the :func:`values_hash` committed with that
        message id (None: not known; a store without hashes compares message
        ids only), in one lookup: a resume asks this for every emit."""
        return self.completed(spout, index, key), None

    def has_completed(self, spout: str) -> bool:
        """Whether any message id of a spout is recorded (a resumed run)."""
        raise NotImplementedError

    def outputs(self) -> dict[str, Any]:
        """The committed topology output view: key (JSON text) -> record."""
        raise NotImplementedError

    def close(self) -> None:
        pass


def _check_parallelism(stored: Mapping[str, int], running: Mapping[str, int], where: str) -> None:
    for comp, n in sorted(stored.items()):
        if comp not in running:
            raise TopologyError(f"{where}: it holds the state of component {comp!r}, which this topology does not "
                                f"have (components: {sorted(running)}); a renamed component would start empty, so "
                                "the state is not reused: keep the name, or use another --state-dir")
        if comp in running and running[comp] != n:
            raise TopologyError(f"{where}: component {comp!r} has state for {n} task(s), but this topology runs "
                                f"{running[comp]}; a key's task depends on the parallelism, so the state cannot be "
                                "reused: keep the parallelism, or use another --state-dir")


class MemoryStore(StateStore):
    """Storm's default provider: committed state lives as long as the run.
    (``config`` and ``topology`` as any ``module:Class`` provider gets them.)"""

    def __init__(self, config: Mapping[str, Any] | None = None, topology: str = "") -> None:
        self.txid = None
        self._kv: dict[tuple[str, int], dict[str, Any]] = {}
        self._done: dict[str, set[tuple[int, str]]] = {}
        self._hashes: dict[tuple[str, int, str], int] = {}
        self._outputs: dict[str, Any] = {}
        self._parallelism: dict[str, int] = {}

    def check(self, topology: str, parallelism: Mapping[str, int]) -> None:
        _check_parallelism(self._parallelism, parallelism, "state in memory")

    def load(self, component: str, index: int) -> dict[str, Any]:
        return {k: orjson.loads(v) for k, v in self._kv.get((component, index), {}).items()}

    def commit(self, cp: Checkpoint, parallelism: Mapping[str, int]) -> None:
        # encoded before anything changes: all or nothing
        encoded = [(key, {k: orjson.dumps(v) for k, v in put.items()}, delete)
                   for key, (put, delete) in cp.changes.items()]
        for (comp, index), put_json, delete in encoded:
            kv = self._kv.setdefault((comp, index), {})
            kv.update(put_json)
            for k in delete:
                kv.pop(k, None)
            self._parallelism[comp] = parallelism[comp]
        for spout, index, key in cp.completed:
            self._done.setdefault(spout, set()).add((index, key))
        self._hashes.update(cp.values)
        self._outputs.update(cp.outputs)
        self.txid = cp.txid

    def completed(self, spout: str, index: int, key: str) -> bool:
        return (index, key) in self._done.get(spout, ())

    def completed_entry(self, spout: str, index: int, key: str) -> tuple[bool, int | None]:
        return self.completed(spout, index, key), self._hashes.get((spout, index, key))

    def has_completed(self, spout: str) -> bool:
        return bool(self._done.get(spout))

    def outputs(self) -> dict[str, Any]:
        return dict(self._outputs)


#: ``PRAGMA application_id`` of our state files ("MLST")
_APPLICATION_ID = 0x4D4C5354

# Every row of kv, completed and outputs carries a CRC-32 of its other
# columns (_crc): a value changed on disk (a flipped bit, a hand edit) is
# refused when the store is opened, not resumed from. Stores written before
# the column existed get it added, empty: their rows are checked for JSON only.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS kv (component TEXT NOT NULL, task INTEGER NOT NULL, key TEXT NOT NULL,
    value TEXT NOT NULL, crc INTEGER, PRIMARY KEY (component, task, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS completed (spout TEXT NOT NULL, task INTEGER NOT NULL, msg_id TEXT NOT NULL,
    crc INTEGER, vh INTEGER, PRIMARY KEY (spout, task, msg_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outputs (key TEXT PRIMARY KEY, record TEXT NOT NULL, crc INTEGER) WITHOUT ROWID;
"""


def _crc(*columns: Any) -> int:
    return zlib.crc32("\0".join(map(str, columns)).encode("utf-8", "surrogatepass"))


#: seconds a run waits for the store's lock before it says another run has it: a reader (a
#: backup, the sqlite3 shell, a script watching the checkpoints) holds it for a moment, another
#: run for its whole life; without the wait, a reader at the instant a run opens the store
#: made the run refuse it
_READER_PATIENCE = 2.0


class SqliteStore(StateStore):
    """One SQLite file per topology (``DIR/<topology name>.sqlite``), WAL,
    one transaction per checkpoint, held exclusively by one run, marked as
    ours (``PRAGMA application_id``) so that another program's file is
    refused, not altered."""

    def __init__(self, directory: str, topology: str, *, shared: bool = False, readonly: bool = False) -> None:
        """``shared``: the one writer of a run whose host workers read the
        store (shellbolt/_workers): held by a lock file instead of SQLite's
        exclusive locking, which would shut the readers out. ``readonly``: such
        a reader (a worker: a restarted process's init, the skip of committed
        ids)."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in topology) or "topology"
        self.path = os.path.join(directory, f"{safe}.sqlite")
        self.topology = topology
        self._lock_fd: int | None = None
        self.reader = readonly
        if readonly:
            self._open_reader()
            return
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            if shared:
                import fcntl

                self._lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(self._lock_fd)
                    raise sqlite3.OperationalError("database is locked") from None
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=_READER_PATIENCE)
            if not shared:
                db.execute("PRAGMA locking_mode=EXCLUSIVE")
            app = db.execute("PRAGMA application_id").fetchone()[0]
            if app != _APPLICATION_ID and db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                db.close()
                raise TopologyError(f"state store {self.path} is an SQLite file of another program (it has tables "
                                    "but is not a multilang-bridge state store); use another --state-dir")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
            for table, column in (("kv", "crc"), ("completed", "crc"), ("outputs", "crc"), ("completed", "vh")):
                if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} INTEGER")
            db.execute(f"PRAGMA application_id = {_APPLICATION_ID}")
            db.execute("BEGIN IMMEDIATE")  # takes the exclusive lock now: a second run fails here, not later
            db.execute("COMMIT")
            if shared:  # (opened: its commits may wait longer for the workers' reads than its open for another run)
                db.execute("PRAGMA busy_timeout = 5000")
        except sqlite3.OperationalError as exc:
            why = ("another run is using it" if "locked" in str(exc) else
                   f"{exc}: SQLite cannot create or open a file there (a read-only or special file system, "
                   "like /proc, or no permission); give --state-dir a writable directory"
                   if "unable to open" in str(exc) else str(exc))
            raise TopologyError(f"state store {self.path}: {why}") from None
        except OSError as exc:
            raise TopologyError(f"state directory {directory}: {exc.strerror or exc}") from None
        except sqlite3.DatabaseError as exc:
            raise TopologyError(f"state store {self.path} is not a usable SQLite file: {exc}") from None
        self._db = db
        try:
            meta = dict(db.execute("SELECT key, value FROM meta"))
            self.txid = int(meta["txid"]) if "txid" in meta else None
            self._stored_topology = meta.get("topology")
            self._parallelism = {k[len("tasks:"):]: int(v) for k, v in meta.items() if k.startswith("tasks:")}
            self._with_completed = {r[0] for r in db.execute("SELECT DISTINCT spout FROM completed")}
            damage = self._damage()
        except (sqlite3.Error, ValueError) as exc:
            damage = str(exc)
        if damage is not None:
            db.close()
            raise TopologyError(f"state store {self.path} is damaged ({damage}); it is not resumed from: use "
                                "another --state-dir") from None

    def _open_reader(self) -> None:
        try:
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False,
                                 timeout=5)
            meta = dict(db.execute("SELECT key, value FROM meta"))
        except sqlite3.Error as exc:
            raise TopologyError(f"state store {self.path}: {exc}") from None
        self._db = db
        self.txid = int(meta["txid"]) if "txid" in meta else None
        self._stored_topology = meta.get("topology")
        self._parallelism = {}
        self._with_completed = {r[0] for r in db.execute("SELECT DISTINCT spout FROM completed")}

    def _damage(self) -> str | None:
        """What is wrong with the stored rows (a checksum that does not
        match, a value that is not JSON), or None: checked when the store is
        opened, before any process starts."""
        db = self._db
        for comp, task, key, value, crc in db.execute("SELECT component, task, key, value, crc FROM kv"):
            where = f"bolt {comp!r} task {task} key {key!r}"
            if crc is not None and crc != _crc(comp, task, key, value):
                return f"the value of {where} does not match its checksum"
            try:
                orjson.loads(value)
            except orjson.JSONDecodeError as exc:
                return f"the value of {where} is not JSON: {exc}"
        for spout, task, msg_id, crc, vh in db.execute("SELECT spout, task, msg_id, crc, vh FROM completed"):
            if crc is not None and crc != (_crc(spout, task, msg_id) if vh is None else _crc(spout, task, msg_id, vh)):
                return f"a message id of spout {spout!r} task {task} does not match its checksum"
        for key, record, crc in db.execute("SELECT key, record, crc FROM outputs"):
            if crc is not None and crc != _crc(key, record):
                return f"the output of key {key} does not match its checksum"
            try:
                orjson.loads(record)
            except orjson.JSONDecodeError as exc:
                return f"the output of key {key} is not JSON: {exc}"
        return None

    def check(self, topology: str, parallelism: Mapping[str, int]) -> None:
        if self._stored_topology is not None and self._stored_topology != topology:
            raise TopologyError(f"state store {self.path} holds the state of topology {self._stored_topology!r}, "
                                f"not {topology!r}; use another --state-dir")
        _check_parallelism(self._parallelism, parallelism, f"state store {self.path}")

    def load(self, component: str, index: int) -> dict[str, Any]:
        rows = self._db.execute("SELECT key, value FROM kv WHERE component = ? AND task = ?", (component, index))
        return self._decoded(rows)

    def _decoded(self, rows: Any) -> dict[str, Any]:
        try:
            return {k: orjson.loads(v) for k, v in rows}
        except (orjson.JSONDecodeError, sqlite3.Error) as exc:
            raise TopologyError(f"state store {self.path} is damaged ({exc}); use another --state-dir") from None

    def commit(self, cp: Checkpoint, parallelism: Mapping[str, int]) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for (comp, index), (put, delete) in cp.changes.items():
                if put:
                    rows = [(comp, index, k, orjson.dumps(v).decode()) for k, v in put.items()]
                    db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?, ?, ?, ?)",
                                   [(*row, _crc(*row)) for row in rows])
                if delete:
                    db.executemany("DELETE FROM kv WHERE component = ? AND task = ? AND key = ?",
                                   [(comp, index, k) for k in delete])
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (f"tasks:{comp}", str(parallelism[comp])))
            if cp.completed:
                # The latest input committed under an id is the one a replay is compared with.
                hashes = cp.values
                rows = [(*row, hashes.get(row)) for row in cp.completed]
                db.executemany("INSERT OR REPLACE INTO completed (spout, task, msg_id, crc, vh) VALUES (?, ?, ?, ?, ?)",
                               [(s, t, m, _crc(s, t, m) if vh is None else _crc(s, t, m, vh), vh)
                                for s, t, m, vh in rows])
            if cp.outputs:
                rows = [(k, orjson.dumps(r).decode()) for k, r in cp.outputs.items()]
                db.executemany("INSERT OR REPLACE INTO outputs VALUES (?, ?, ?)", [(*row, _crc(*row)) for row in rows])
            db.execute("INSERT OR REPLACE INTO meta VALUES ('txid', ?)", (str(cp.txid),))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('topology', ?)", (self.topology,))
            db.execute("COMMIT")
        except BaseException:
            # SQLite may have rolled back already (a full disk does): a
            # second ROLLBACK would raise and hide the cause.
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            raise
        self.txid = cp.txid
        self._with_completed.update(s for s, _, _ in cp.completed)

    def completed(self, spout: str, index: int, key: str) -> bool:
        return self._db.execute("SELECT 1 FROM completed WHERE spout = ? AND task = ? AND msg_id = ?",
                                (spout, index, key)).fetchone() is not None

    def completed_entry(self, spout: str, index: int, key: str) -> tuple[bool, int | None]:
        row = self._db.execute("SELECT vh FROM completed WHERE spout = ? AND task = ? AND msg_id = ?",
                               (spout, index, key)).fetchone()
        return (False, None) if row is None else (True, row[0])

    def has_completed(self, spout: str) -> bool:
        if spout not in self._with_completed and self.reader:
            # a reader: the writer may have committed ids of it since
            if self._db.execute("SELECT 1 FROM completed WHERE spout = ? LIMIT 1", (spout,)).fetchone():
                self._with_completed.add(spout)
        return spout in self._with_completed

    def outputs(self) -> dict[str, Any]:
        return self._decoded(self._db.execute("SELECT key, record FROM outputs"))

    def close(self) -> None:
        self._db.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


#: ``topology.state.provider`` values built in
PROVIDERS = ("sqlite", "memory")


def provider_config(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``topology.state.provider.config`` of a conf as a dict: a table, or
    its JSON text as Storm writes it (the conf check has vetted either)."""
    value = conf.get("topology.state.provider.config")
    return dict((orjson.loads(value) if isinstance(value, str) else value) or {})


def open_store(provider: str, config: Mapping[str, Any], topology: str, default_dir: str) -> StateStore:
    """The store ``topology.state.provider`` names, with its
    ``topology.state.provider.config`` (``dir`` for sqlite; default
    ``default_dir``). ``module:Class`` is called with (config, topology)."""
    if provider in _CONFIG_KEYS:
        unknown = sorted(set(config) - _CONFIG_KEYS[provider])
        if provider == "memory" and unknown == ["dir"]:
            raise TopologyError("a state dir (--state-dir, or dir in topology.state.provider.config) needs "
                                "topology.state.provider = 'sqlite'; the memory provider keeps nothing after the run")
        if unknown:
            raise TopologyError(f"topology.state.provider.config: {unknown_key_message(unknown, _CONFIG_KEYS[provider])} "
                                f"for provider {provider!r}")
    if provider == "sqlite":
        d = config.get("dir")
        if d is not None and (not isinstance(d, str) or not d):
            raise TopologyError(f"topology.state.provider.config: dir must be a non-empty string (a directory), got {d!r}")
        return SqliteStore(d or default_dir, topology)
    if provider == "memory":
        return MemoryStore()
    module, _, name = provider.partition(":")
    if not name:
        raise TopologyError(f"topology.state.provider {provider!r}: use one of {list(PROVIDERS)} or a Python "
                            "'module:Class' (Storm's Java providers do not run here)")
    try:
        store = getattr(importlib.import_module(module), name)(dict(config), topology)
    except TopologyError:
        raise
    except Exception as exc:  # the user's code: any failure is theirs to read, without our traceback
        raise TopologyError(f"topology.state.provider {provider!r}: {type(exc).__name__}: {exc}") from None
    missing = [m for m in _INTERFACE if not callable(getattr(store, m, None))]
    if missing:
        raise TopologyError(f"topology.state.provider {provider!r}: {type(store).__name__} lacks {missing} "
                            "(see multilang.shellbolt._runtime.state_store.StateStore)")
    return store


#: the settings each built-in provider reads from topology.state.provider.config
_CONFIG_KEYS = {"sqlite": {"dir"}, "memory": set()}
_INTERFACE = ("check", "load", "commit", "completed", "has_completed", "outputs", "close")

