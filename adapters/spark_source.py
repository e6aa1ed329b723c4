"""A multilang spout as a Structured Streaming source (PySpark Python Data Source API).

Usage::

    import json
    from multilang.adapters.spark_source import register

    register(spark)                       # registers the format "multilang"
    df = (spark.readStream.format("multilang")
          .option("command", json.dumps(["python", "sentence_spout.py", "/data/lines.txt"]))
          .option("fields", "sentence")
          .option("replayLog", "/chk/my-query/multilang")    # durable; see below
          .load())
    q = (df.writeStream.format("parquet").option("path", "/out")
         .option("checkpointLocation", "/chk/my-query").start())

Options (names are case-insensitive, values are strings):

============  ==================================================================
command       required. JSON array: the spout's argv (no shell). A leading
              ``python``/``python3`` means the driver worker's interpreter.
fields        comma-separated output field names of the spout's stream.
              Required unless a schema is given with ``.schema(...)``.
cwd           working directory of the spout (default: the driver-side Python
              worker's working directory, normally the driver's). Use absolute
              paths.
env           JSON object of environment variables added to the inherited ones.
conf          JSON object merged into the handshake ``conf`` (spec §2.2); also
              read for our keys (timeouts, restart budget, ...).
maxBatchSize  most rows per micro-batch (default 1000); Spark's default read
              limit (``ReadMaxRows``).
maxPending    like ``topology.max.spout.pending``: most reliable tuples taken
              from the spout and not yet acked; ``next`` is withheld at the
              bound (default: unbounded, as in Storm).
maxBatchDurationMs  most time one planning call spends pulling from the spout
              (default 500).
replayLog     directory of the replay log (see below). Default: a temporary
              directory, which cannot survive a query restart.
dedupe        ``inflight`` (default), ``all`` or ``none``; see "Message ids".
includeMsgId  ``true`` adds a string column ``_msg_id``: the message id as JSON
              text (``1`` and ``"1"`` stay distinct), null for unreliable emits.
stream        the spout stream to read (default ``default``).
component     component id shown to the spout in its context (default ``spout``).
availableNowIdleMs  with ``trigger(availableNow=True)``: how long the spout must
              answer ``next`` with nothing before its data counts as drained
              (default 200).
============  ==================================================================

Schema: the declared fields as strings (a non-string value becomes its JSON
text), plus ``_msg_id`` when asked. With a user schema (``.schema(...)``) each
column is filled by name from the declared fields (or ``_msg_id``) and values
are passed as decoded from JSON (a string column still gets JSON text for a
non-string value). A tuple that does not fit (wrong arity, wrong type, another
stream, a direct emit) is rejected: logged, and *failed* back to the spout.

How it runs
-----------
The spout runs on the **driver**, inside the Python worker Spark keeps for the
stream reader (one process per query run), as a supervised subprocess driven
by a blocking host over the sans-IO ``Connection(Role.SPOUT, Side.HOST)``:
handshake (§2), ``activate`` first, then one command at a time with exactly one
``sync`` each (§4.2), task ids ``[2]`` answered at once for emits that want
them (the context names the consumer ``spark`` as task 2; the spout is task 1),
``next`` withheld at ``maxPending`` (§4.6, §7.6). A crash, a protocol error or
a timeout (§5.2) kills and reaps the process and starts a new one after a
backoff, within ``multilang.restart.budget`` restarts per
``multilang.restart.window.secs`` (§8.2); beyond that the query fails with a
``ComponentCrashed`` naming pid, exit status, last frames and stderr tail.
Tuples the dead process had emitted are not lost: their acks go to the process
that replaces it (§8.2), as Storm addresses them to the task. Executors never
talk to the spout: a batch's rows travel inside its input partition.

Offsets, replay log, commit
---------------------------
Every tuple taken from the spout gets a position 0, 1, 2, ... in the replay
log; an offset is ``{"log": <log uuid>, "pos": n}``. ``latestOffset(start,
limit)`` pulls from the spout (``next`` until the batch is full, the spout has
nothing, ``maxPending`` is reached or ``maxBatchDurationMs`` passed), appends
what it got to the log as one file of JSON lines (``batch-<from>-<to>.jsonl``,
one ``{"id": ..., "values": [...]}`` per line, written to a temporary name,
fsynced, renamed) and only then returns the new end offset. A micro-batch is
the positions between two offsets, so ``partitions(start, end)`` reads it back
from the log: a batch Spark re-runs (task retry, or a restarted query whose
offset log holds a batch its commit log does not) gets the same rows in the
same order. After a restart the reader continues the same log, so positions
logged but never planned (Spark died between our write and its offset log) go
into the next batch. The log is exclusive to one running query (``flock``);
the offsets carry its uuid, so a checkpoint used with another log is refused
with a clear error instead of reading wrong data.

``commit(end)`` acks to the spout, in position order, the message id of every
reliable tuple below ``end`` (``ack`` commands with the id's original JSON
type, one ``sync`` each), records ``end`` in ``committed.json`` and deletes
log files wholly below it. ``latestOffset(start)`` does the same for
``start`` first: Spark asks for data after ``start`` only when every batch up
to ``start`` is in its commit log, and Spark 4 calls ``commit`` for a batch
only when it plans the *next* non-empty one, so without this the last batch
would never be acked and ``maxPending`` could stall the stream.

What the spout is told, and what is guaranteed
----------------------------------------------
* **ack** -- only after Spark has committed the batch that holds the tuple:
  its sink has the rows and its checkpoint says so. Exactly one ack per logged
  reliable tuple per reader; after a restart an ack may reach a process that
  never emitted that id, which §8.2 requires spouts to tolerate.
* **fail** -- only for tuples the source *rejects* (wrong stream, a direct
  emit, wrong arity, a value that does not fit the schema), right after the
  command they arrived in. A batch never fails from the spout's point of view
  once logged: if Spark's batch fails, the query stops (after Spark's task
  retries) and the batch stays in the log; restarted from the same checkpoint
  and ``replayLog``, Spark re-runs it from the log, and the spout gets the ack
  when it commits. Failing it would make the spout re-emit data Spark is
  already going to deliver. If the query is never restarted (or ``replayLog``
  was temporary), the tuples of uncommitted batches are *abandoned*: never
  acked or failed, as Storm abandons trees at shutdown (§5.4). Their spout
  process is gone by then anyway (it exits on EOF when the driver worker ends).
* **At-least-once, from the spout's point of view**: every reliable tuple the
  source took is either in the sink or (query stopped) in the replay log
  waiting for a restart; an ack means it reached the sink.
* **Exactly-once into the sink**, per batch: with a checkpoint, a durable
  ``replayLog`` and an idempotent sink (the file sinks, or ``foreachBatch``
  keyed by batch id), every logged tuple lands exactly once, because a batch's
  content is fixed by the log before Spark records its offsets.
* Across spout *processes*: a new spout process (crash restart, or a restarted
  query) may emit again what its predecessor emitted. Storm would deliver the
  duplicates; here ``dedupe`` decides (see "Message ids"). With a spout whose
  message ids are record identities (a line number, a queue offset) and
  ``dedupe=all`` the sink gets every record exactly once even across restarts.
* **Spouts with side effects**: ``next``/``ack``/``fail`` run at least once and
  possibly in a new process; a spout that, say, deletes a message on ``ack``
  sees that ack only after the commit, but a restarted query may call
  ``next`` again for data whose ack was lost with the old process, and an ack
  can arrive in a process that did not emit the id. Make such effects
  idempotent and keyed by message id.
* Not supported: ``asyncProgressTrackingEnabled`` (Spark may then ask for new
  data before a batch is durably committed) and a ``replayLog`` shared by two
  running queries (refused).

Message ids (``dedupe``)
------------------------
``inflight`` (default): a reliable emit whose id is already logged and not yet
acked is dropped; it is a replay by a replacement process of a tuple Spark
will deliver anyway, and the ack of the logged copy covers it. Storm requires
ids to be unique among pending tuples, so this never drops a legitimate tuple.
``all``: ids are record identities for the life of the replay log; an id seen
before is dropped, and acked at once if its first copy is already committed.
Costs one id per tuple in memory and in ``acked-ids.jsonl``; wrong for spouts
that reuse an id for new data after its ack. ``none``: every emit is a new row.
Unreliable emits (no id) are never deduplicated and never acked.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StringType, StructField, StructType

from multilang.codec import dumps, loads
from multilang.messages import (
    Ack,
    Emit,
    Error,
    Fail,
    Log,
    Message,
    Metrics,
    Next,
)

from ._spark_spout_host import _CONSUMER_TASK, _SPOUT_TASK, _live_states, _SupervisedSpout

__all__ = ["MultilangDataSource", "MultilangStreamReader", "register", "FORMAT", "MSG_ID_COLUMN"]

#: The format name: ``spark.readStream.format(FORMAT)``.
FORMAT = "multilang"
#: The optional column holding the message id as JSON text.
MSG_ID_COLUMN = "_msg_id"

log = logging.getLogger("multilang.spark.source")

_LOG_VERSION = 1
_PY_LEVEL = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


def register(spark: Any) -> str:
    """Register the ``multilang`` streaming source with ``spark``; returns the format name."""
    spark.dataSource.register(MultilangDataSource)
    return FORMAT


# --- options -------------------------------------------------------------------


class _OptionError(ValueError):
    pass


def _json_option(options: Any, key: str, kind: type, default: Any) -> Any:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise _OptionError(f"option {key!r} must be JSON ({kind.__name__}): {exc}; got {raw!r}") from None
    if not isinstance(value, kind):
        raise _OptionError(f"option {key!r} must be a JSON {kind.__name__}, got {raw!r}")
    return value


def _int_option(options: Any, key: str, default: int | None, minimum: int = 1) -> int | None:
    raw = options.get(key)
    if raw is None or str(raw).strip().lower() in ("", "none", "null"):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _OptionError(f"option {key!r} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise _OptionError(f"option {key!r} must be >= {minimum}, got {value}")
    return value


def _bool_option(options: Any, key: str, default: bool) -> bool:
    raw = options.get(key)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise _OptionError(f"option {key!r} must be true or false, got {raw!r}")


@dataclass(frozen=True)
class _Options:
    argv: list[str]
    fields: list[str] | None
    cwd: str | None
    env: dict[str, str]
    conf: dict[str, Any]
    max_batch_size: int
    max_pending: int | None
    max_batch_duration: float
    replay_log: str | None
    dedupe: str
    include_msg_id: bool
    stream: str
    component: str
    available_now_idle: float

    @classmethod
    def parse(cls, options: Any) -> "_Options":
        if options.get("command") is None:
            raise _OptionError('option "command" is required: a JSON array of argv, e.g. \'["python", "spout.py"]\'')
        argv = _json_option(options, "command", list, None)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise _OptionError(f'option "command" must be a non-empty JSON array of strings, got {options.get("command")!r}')
        raw_fields = options.get("fields")
        fields = [f.strip() for f in raw_fields.split(",") if f.strip()] if raw_fields is not None else None
        if fields is not None and (not fields or len(set(fields)) != len(fields)):
            raise _OptionError(f'option "fields" must name distinct fields, comma-separated; got {raw_fields!r}')
        env = _json_option(options, "env", dict, {})
        dedupe = (options.get("dedupe") or "inflight").strip().lower()
        if dedupe not in ("inflight", "all", "none"):
            raise _OptionError(f'option "dedupe" must be inflight, all or none; got {options.get("dedupe")!r}')
        return cls(
            argv=argv,
            fields=fields,
            cwd=options.get("cwd"),
            env={str(k): str(v) for k, v in env.items()},
            conf=_json_option(options, "conf", dict, {}),
            max_batch_size=_int_option(options, "maxBatchSize", 1000) or 1000,
            max_pending=_int_option(options, "maxPending", None),
            max_batch_duration=(_int_option(options, "maxBatchDurationMs", 500) or 500) / 1000.0,
            replay_log=options.get("replayLog"),
            dedupe=dedupe,
            include_msg_id=_bool_option(options, "includeMsgId", False),
            stream=options.get("stream") or "default",
            component=options.get("component") or "spout",
            available_now_idle=(_int_option(options, "availableNowIdleMs", 200, minimum=0) or 0) / 1000.0,
        )


# --- the data source ---------------------------------------------------------------


class MultilangDataSource(DataSource):
    """``spark.readStream.format("multilang")``: a multilang spout as a stream.

    See the module docstring for options and guarantees."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        opts = _Options.parse(self.options)
        if opts.fields is None:
            raise _OptionError('option "fields" is required (comma-separated field names) unless you give a schema')
        cols = [StructField(f, StringType(), True) for f in opts.fields]
        if opts.include_msg_id:
            if MSG_ID_COLUMN in opts.fields:
                raise _OptionError(f"field {MSG_ID_COLUMN!r} clashes with the message id column; rename it")
            cols.append(StructField(MSG_ID_COLUMN, StringType(), True))
        return StructType(cols)

    def streamReader(self, schema: StructType) -> "MultilangStreamReader":
        return MultilangStreamReader(_Options.parse(self.options), schema)


class _Batch(InputPartition):
    """One micro-batch's rows, in log order (built on the driver from the replay log)."""

    def __init__(self, start: int, end: int, rows: list[tuple]) -> None:
        super().__init__((start, end))
        self.rows = rows


class MultilangStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The stream reader. Spark creates one on the driver per query run (its
    spout, replay log and acks live there) and more on executors, which only
    call :meth:`read`; so nothing is started before the first driver call."""

    def __init__(self, opts: _Options, schema: StructType) -> None:
        self._opts = opts
        self._schema = schema
        self._fields = opts.fields if opts.fields is not None else [f.name for f in schema.fields if f.name != MSG_ID_COLUMN]
        self._convert = _RowConverter(schema, self._fields)
        self._state: _SourceState | None = None

    # -- driver side --------------------------------------------------------------

    def _st(self) -> "_SourceState":
        if self._state is None:
            self._state = _SourceState(self._opts, self._fields, self._convert)
        return self._state

    def initialOffset(self) -> dict:
        st = self._st()
        return st.offset(st.log.committed)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self._opts.max_batch_size)

    def prepareForTriggerAvailableNow(self) -> None:
        self._st().available_now = True

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        st = self._st()
        pos = st.check_offset(start)
        # Spark asks for data after `start` only once every batch up to `start`
        # is in its commit log (it runs one batch at a time): ack them now.
        st.commit(pos)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        st.pull(pos, max_rows)
        end = st.log.end if max_rows is None else min(st.log.end, pos + max_rows)
        return st.offset(end)

    def reportLatestOffset(self) -> dict | None:
        st = self._state
        return st.offset(st.log.end) if st is not None else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        st = self._st()
        lo, hi = st.check_offset(start), st.check_offset(end)
        if hi <= lo:
            return []
        rows = [self._convert.row(rec["id"], rec["values"]) for rec in st.log.read(lo, hi)]
        return [_Batch(lo, hi, rows)]

    def commit(self, end: dict) -> None:
        st = self._st()
        st.commit(st.check_offset(end))

    def stop(self) -> None:
        if self._state is not None:
            self._state.close()
            self._state = None

    # -- executor side ---------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        return iter(partition.rows)  # type: ignore[attr-defined]


# --- rows --------------------------------------------------------------------------


def _json_text(value: Any) -> str:
    return dumps(value).decode("utf-8")


class _RowConverter:
    """Spout values -> a row of the output schema; and a fit check done on the
    driver when a tuple arrives, so a bad tuple is failed to the spout instead
    of poisoning a logged batch."""

    def __init__(self, schema: StructType, fields: list[str]) -> None:
        index = {f: i for i, f in enumerate(fields)}
        self._plan: list[tuple[int, bool]] = []  # (-1 = msg id | field index, as string?)
        for col in schema.fields:
            if col.name == MSG_ID_COLUMN and col.name not in index:
                if not isinstance(col.dataType, StringType):
                    raise _OptionError(f"column {MSG_ID_COLUMN!r} holds the message id as JSON text: make it a string")
                self._plan.append((-1, True))
            elif col.name in index:
                self._plan.append((index[col.name], isinstance(col.dataType, StringType)))
            else:
                raise _OptionError(
                    f"schema column {col.name!r} is neither a declared field {fields} nor {MSG_ID_COLUMN!r}"
                )
        self.arity = len(fields)
        try:  # a private helper of pyspark; without it, bad values surface in Spark instead
            from pyspark.sql.types import _make_type_verifier

            self._verify = _make_type_verifier(schema)
        except Exception:  # pragma: no cover
            self._verify = None

    def row(self, msg_id: Any, values: list[Any]) -> tuple:
        out = []
        for i, as_string in self._plan:
            if i < 0:
                out.append(None if msg_id is None else _json_text(msg_id))
            else:
                v = values[i]
                out.append(_json_text(v) if as_string and v is not None and not isinstance(v, str) else v)
        return tuple(out)

    def problem(self, msg_id: Any, values: list[Any]) -> str | None:
        """Why a tuple cannot become a row, or None."""
        if len(values) != self.arity:
            return f"tuple has {len(values)} values, the declared fields have {self.arity}"
        if self._verify is not None:
            try:
                self._verify(self.row(msg_id, values))
            except (TypeError, ValueError) as exc:
                return f"tuple does not fit the schema: {exc}"
        return None


# --- the replay log ----------------------------------------------------------------------


def _id_key(msg_id: Any) -> str:
    """Canonical JSON of a message id: JSON types kept apart (1, 1.0, "1", true)."""
    return json.dumps(msg_id, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class _ReplayLog:
    """Positions -> records, one JSON-lines file per appended chunk.

    Layout of the directory::

        meta.json          {"version": 1, "log": <uuid>}
        committed.json     {"pos": n}: every position < n is committed (acked)
        batch-<a>-<b>.jsonl  positions a..b-1, one {"id", "values"} per line
        acked-ids.jsonl    (dedupe=all) one JSON array of ids per commit
        lock               flock'ed by the one reader using the log
    """

    def __init__(self, directory: str | None, keep_ids: bool) -> None:
        self.temporary = directory is None
        if directory is None:
            directory = tempfile.mkdtemp(prefix="multilang-replay-")
            log.warning(
                "multilang source: no replayLog option; using the temporary %s. A restarted query "
                "cannot replay its uncommitted batches from it: set replayLog to a durable directory "
                "next to the query's checkpoint.", directory,
            )
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = self._lock()
        try:
            self._load(keep_ids)
        except BaseException:
            self.close()
            raise

    def _load(self, keep_ids: bool) -> None:
        meta_path = self.dir / "meta.json"
        if meta_path.exists():
            meta = json.loads(meta_path.read_text())
            if meta.get("version") != _LOG_VERSION:
                raise RuntimeError(f"replay log {self.dir}: unknown version {meta.get('version')!r}")
        else:
            meta = {"version": _LOG_VERSION, "log": str(uuid.uuid4())}
            self._write_atomic(meta_path, json.dumps(meta).encode())
        self.id: str = meta["log"]
        committed = self.dir / "committed.json"
        self.committed = int(json.loads(committed.read_text())["pos"]) if committed.exists() else 0
        self.chunks: list[tuple[int, int, Path]] = []
        for p in self.dir.glob("batch-*.jsonl"):
            a, b = p.stem.split("-")[1:3]
            self.chunks.append((int(a), int(b), p))
        self.chunks.sort()
        self.end = self.committed
        live = []
        for a, b, p in self.chunks:
            if b <= self.committed:  # committed, left behind by a crash before its deletion
                p.unlink(missing_ok=True)
                continue
            if a > self.end:
                raise RuntimeError(f"replay log {self.dir} has a gap: positions {self.end}..{a} are missing")
            live.append((a, b, p))
            self.end = b
        self.chunks = live
        self.acked_ids: set[str] = set()
        self._keep_ids = keep_ids
        ids_path = self.dir / "acked-ids.jsonl"
        if keep_ids and ids_path.exists():
            for line in ids_path.read_text().splitlines():
                if line.strip():
                    self.acked_ids.update(_id_key(i) for i in loads(line.encode()))

    def _lock(self) -> int:
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
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

    def _write_atomic(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def append(self, records: list[tuple[Any, list[Any]]]) -> tuple[int, int]:
        """Durably append records (msg id, values); returns their positions."""
        a, b = self.end, self.end + len(records)
        body = b"".join(dumps({"id": i, "values": v}) + b"\n" for i, v in records)
        path = self.dir / f"batch-{a:012d}-{b:012d}.jsonl"
        self._write_atomic(path, body)
        self.chunks.append((a, b, path))
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
            lines = p.read_bytes().splitlines()
            if len(lines) != b - a:
                raise RuntimeError(f"replay log file {p} is damaged: {len(lines)} records, expected {b - a}")
            out.extend(loads(line) for line in lines[max(lo - a, 0) : min(hi, b) - a])
        if len(out) != hi - lo:
            raise RuntimeError(f"replay log {self.dir} is missing records in {lo}..{hi}")
        return out

    def mark_committed(self, pos: int, acked: list[Any]) -> None:
        if self._keep_ids and acked:
            with open(self.dir / "acked-ids.jsonl", "ab") as f:
                f.write(dumps(acked) + b"\n")
                f.flush()
                os.fsync(f.fileno())
            self.acked_ids.update(_id_key(i) for i in acked)
        self._write_atomic(self.dir / "committed.json", json.dumps({"pos": pos}).encode())
        self.committed = pos
        keep = []
        for a, b, p in self.chunks:
            if b <= pos:
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass
            else:
                keep.append((a, b, p))
        self.chunks = keep

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
        if self.temporary:
            shutil.rmtree(self.dir, ignore_errors=True)


# --- the source state on the driver --------------------------------------------------------


class _SourceState:
    """Replay log + supervised spout + bookkeeping of unacked message ids."""

    def __init__(self, opts: _Options, fields: list[str], convert: _RowConverter) -> None:
        self.opts = opts
        self.fields = fields
        self.convert = convert
        self.log = _ReplayLog(opts.replay_log, keep_ids=opts.dedupe == "all")
        self.available_now = False
        self._drained = False  # availableNow: the spout had nothing for availableNowIdleMs
        self._idle_since: float | None = None
        # Reliable tuples taken and not yet acked: position-ordered (pos, id) for
        # logged ones; id key -> (pos or None while buffered, values digest).
        self.unacked: deque[tuple[int, Any]] = deque()
        self.inflight: dict[str, tuple[int | None, str]] = {}
        self.buffer: list[tuple[Any, list[Any]]] = []  # taken, not yet logged
        self.notices: deque[Message] = deque()  # acks/fails to deliver after the current command
        self.rejected = 0
        self.duplicates = 0
        pos = self.log.committed
        for rec in self.log.read(self.log.committed, self.log.end):
            if rec["id"] is not None:
                self.unacked.append((pos, rec["id"]))
                self.inflight[_id_key(rec["id"])] = (pos, _digest(rec["values"]))
            pos += 1
        self.spout = _SupervisedSpout(opts, fields, self._on_events)
        _live_states.add(self)

    # offsets

    def offset(self, pos: int) -> dict:
        return {"log": self.log.id, "pos": pos}

    def check_offset(self, off: dict) -> int:
        if not isinstance(off, dict) or off.get("log") != self.log.id or not isinstance(off.get("pos"), int):
            raise RuntimeError(
                f"offset {off!r} does not belong to replay log {self.log.dir} (id {self.log.id}): "
                "restart the query with the replayLog directory it used before (or a fresh checkpoint)"
            )
        pos = off["pos"]
        if pos > self.log.end:
            raise RuntimeError(f"offset {off!r} is past the end ({self.log.end}) of replay log {self.log.dir}")
        return pos

    # spout events

    def _on_events(self, events: list[Message]) -> None:
        opts = self.opts
        for ev in events:
            t = type(ev)
            if t is Emit:
                self._on_emit(ev)
            elif t is Log:
                log.log(_PY_LEVEL.get(ev.level, logging.INFO), "[%s pid %s] %s", opts.component, self.spout.pid, ev.msg)
            elif t is Error:
                log.error("component %r task %d (pid %s) reported an error: %s",
                          opts.component, _SPOUT_TASK, self.spout.pid, ev.msg)
            elif t is Metrics:
                pass

    def _on_emit(self, ev: Emit) -> None:
        msg_id = ev.id
        why = None
        if ev.task is not None:
            why = f"direct emit to task {ev.task}; the Spark consumer (task {_CONSUMER_TASK}) does not read directly"
        elif ev.stream != self.opts.stream:
            why = f"emit on stream {ev.stream!r}; this source reads stream {self.opts.stream!r}"
        else:
            why = self.convert.problem(msg_id, ev.values)
        if why is not None:
            self.rejected += 1
            log.error("component %r task %d (pid %s): tuple rejected and %s: %s (tuple %s)",
                      self.opts.component, _SPOUT_TASK, self.spout.pid,
                      "failed" if msg_id is not None else "dropped", why, _json_text(ev.values)[:200])
            if msg_id is not None:
                self.notices.append(Fail(id=msg_id))  # after this command's sync (§4.7 style)
            return
        if msg_id is not None and self.opts.dedupe != "none":
            key = _id_key(msg_id)
            seen = self.inflight.get(key)
            if seen is not None:
                self.duplicates += 1
                if seen[1] != _digest(ev.values):
                    log.warning("component %r emitted id %s again with different values; dropped "
                                "(dedupe=%s keeps the first copy)", self.opts.component, key, self.opts.dedupe)
                return  # the ack of the first copy will answer it
            if key in self.log.acked_ids:
                self.duplicates += 1
                self.notices.append(Ack(id=msg_id))  # already in the sink
                return
            self.inflight[key] = (None, _digest(ev.values))
        elif msg_id is not None:
            self.inflight.setdefault(_id_key(msg_id), (None, _digest(ev.values)))
        self.buffer.append((msg_id, ev.values))

    def _pending(self) -> int:
        return len(self.unacked) + sum(1 for i, _ in self.buffer if i is not None)

    def _deliver_notices(self) -> None:
        while self.notices:
            self.spout.command(self.notices[0])
            self.notices.popleft()

    # pulling

    def pull(self, start: int, max_rows: int | None) -> None:
        """Take tuples from the spout and log them (see the module docstring)."""
        opts = self.opts
        self.spout.ensure_started()
        self._deliver_notices()
        if self.available_now and self._drained:
            self._flush()
            return
        want = None if max_rows is None else start + max_rows - self.log.end
        deadline = time.monotonic() + opts.max_batch_duration
        backoff = 0.005
        while True:
            if want is not None and len(self.buffer) >= want:
                break
            if opts.max_pending is not None and self._pending() >= opts.max_pending:
                break
            have_data = bool(self.buffer) or self.log.end > start
            # availableNow must not return `start` (that ends the query) before the spout drained.
            if time.monotonic() >= deadline and (have_data or not self.available_now):
                break
            before = len(self.buffer) + self.duplicates + self.rejected
            self.spout.command(Next())
            self._deliver_notices()
            if len(self.buffer) + self.duplicates + self.rejected > before:
                self._idle_since = None
                backoff = 0.005
                continue
            # The spout had nothing.
            now = time.monotonic()
            if self._idle_since is None:
                self._idle_since = now
            if not self.available_now:
                break  # Spark polls again soon: that is the spout wait strategy (§4.6)
            if self.buffer or self.log.end > start:
                break  # return what we have; keep draining in the next call
            if now - self._idle_since >= opts.available_now_idle:
                self._drained = True
                log.info("multilang source: spout drained after %d tuples (availableNow)", self.log.end)
                break
            time.sleep(backoff)
            backoff = min(backoff * 2, 0.05)
        self._flush()

    def _flush(self) -> None:
        if not self.buffer:
            return
        recs, self.buffer = self.buffer, []
        a, _ = self.log.append(recs)
        for off, (msg_id, values) in enumerate(recs):
            if msg_id is not None:
                pos = a + off
                self.unacked.append((pos, msg_id))
                key = _id_key(msg_id)
                entry = self.inflight.get(key)
                if entry is None or entry[0] is None:
                    self.inflight[key] = (pos, entry[1] if entry else _digest(values))

    # committing

    def commit(self, pos: int) -> None:
        """Spark committed everything below ``pos``: ack it to the spout."""
        acked: list[Any] = []
        if self.unacked and self.unacked[0][0] < pos:
            self.spout.ensure_started()
            self._deliver_notices()
            while self.unacked and self.unacked[0][0] < pos:
                p, msg_id = self.unacked[0]
                self.spout.command(Ack(id=msg_id))
                self.unacked.popleft()
                key = _id_key(msg_id)
                if self.inflight.get(key, (None,))[0] == p:
                    del self.inflight[key]
                acked.append(msg_id)
                self._deliver_notices()
        if pos > self.log.committed:
            self.log.mark_committed(pos, acked)

    def close(self) -> None:
        _live_states.discard(self)
        try:
            self.spout.close()
        finally:
            self.log.close()


def _digest(values: list[Any]) -> str:
    return hashlib.blake2b(dumps(values), digest_size=8).hexdigest()
