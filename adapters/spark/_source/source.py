"""A multilang spout as a Structured Streaming source (PySpark Python Data Source API).

Usage::

    import json
    from multilang.adapters.spark._source.source import register

    register(spark)                       # registers the format "multilang"
    df = (spark.readStream.format("multilang")
          .option("command", json.dumps(["python", "sentence_spout.py", "/data/lines.txt"]))
          .option("fields", "sentence")
          .option("replayLog", "/chk/my-query/multilang")    # durable
          .load())

The manual (options, schema, how it runs, offsets and the replay log, what
the spout is told and what is guaranteed, message ids) is docs/SPARK.md,
"Spouts as a streaming source".

This module is the data source and its stream reader; the rest, one job each:

* ``_spark_source_options``: the options, and how a spout tuple becomes a row of the schema;
* ``_spark_replay_log``: the durable log that fixes each micro-batch's rows;
* ``_spark_source_state``: the driver-side state: a background task (the pump) prefetches from the
  spout and acks committed batches; planning calls log what it took;
* ``_spark_spout_host``: the spout process, supervised, over the sans-IO connection.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StringType, StructField, StructType

from .options import FORMAT, MSG_ID_COLUMN, VALUES_COLUMN, _OptionError, _Options, _RowConverter
from .state import _SourceState

__all__ = ["MultilangDataSource", "MultilangStreamReader", "register", "FORMAT", "MSG_ID_COLUMN", "VALUES_COLUMN"]


def register(spark: Any) -> str:
    """Register the ``multilang`` streaming source with ``spark``; returns the format name."""
    spark.dataSource.register(MultilangDataSource)
    return FORMAT


class MultilangDataSource(DataSource):
    """``spark.readStream.format("multilang")``: a multilang spout as a stream.

    See docs/SPARK.md for options and guarantees."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        # Parsed here, so a bad option fails at .load(), with a user schema too.
        self._opts = _Options.parse(options)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        opts = self._opts
        if opts.values_format == "json":
            return opts.json_schema()
        if opts.fields is None:
            raise _OptionError('option "fields" is required (comma-separated field names) unless you give a schema')
        cols = [StructField(f, StringType(), True) for f in opts.fields]
        if opts.include_msg_id:
            if MSG_ID_COLUMN in opts.fields:
                raise _OptionError(f"field {MSG_ID_COLUMN!r} clashes with the message id column; rename it")
            cols.append(StructField(MSG_ID_COLUMN, StringType(), True))
        return StructType(cols)

    def streamReader(self, schema: StructType) -> "MultilangStreamReader":
        return MultilangStreamReader(self._opts, schema)


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
        self._convert = _RowConverter(schema, self._fields, opts.values_format, opts.include_msg_id)
        self._state: _SourceState | None = None
        self._run_start: int | None = None  # the offset this run of the query read from first (maxTuples)

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
        # is in its commit log (it runs one batch at a time): ack them (in the background).
        st.commit(pos)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if self._opts.max_tuples is not None:  # this run's last rows: then no more data (availableNow ends)
            if self._run_start is None:
                self._run_start = pos
            left = max(0, self._run_start + self._opts.max_tuples - pos)
            max_rows = left if max_rows is None else min(max_rows, left)
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
