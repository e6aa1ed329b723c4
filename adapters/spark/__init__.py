"""Multilang bolts inside Spark, spouts as a streaming source, and topologies compiled onto Spark.

Four entry points, all running the same trio runtime as ``multilang run``
(:mod:`multilang.shellbolt`) inside Spark's Python workers:

``shell_bolt_partition(spec, ...)``
    a function for ``rdd.mapPartitions(fn)`` (batch jobs, ``DStream.transform``).
``multilang_bolts(spec, input_cols=..., keep=..., fields=... or output_schema=..., ...)`` / ``apply_bolts(df, spec, ...)``
    a DataFrame transform over ``mapInArrow``, for batch and streaming DataFrames, classic or Spark Connect:
    ``df.transform(multilang_bolts(["ruby", "split_bolt.rb"], input_cols=["text"], keep=["id"], fields=["word"]))``.
``register_source(spark)``
    a multilang spout as a Structured Streaming source:
    ``spark.readStream.format("multilang").option("command", ...).load()``.
``run_topology(topology, ...)``
    ``multilang run --engine spark TOPOLOGY.toml``: the whole topology file as a
    Structured Streaming query.

The manual (what ``spec`` may be, the reliability model and what is and is
not guaranteed, warm processes, the memory bound, garbage collection, the
direct lane, counters) is docs/SPARK.md.

This module is the public face; the work is done in private subpackages,
one product each, with modules of one job each:

* ``_engine``: what every entry point runs in a partition. ``spec``: the
  public names and errors, the options, the ``_Spec`` of what runs;
  ``engine``: the in-partition engine, a warm runtime per spec; ``lease``: a
  partition's session with an engine, which carries the exactly-once
  promise; ``pool``: the warm pool of engines per Python worker;
  ``counters``: ``BoltCounters``.
* ``_partitions``: bolts in batch and streaming jobs. ``rdd``:
  ``shell_bolt_partition`` and ``group_by_fields``; ``arrow``:
  ``multilang_bolts``/``apply_bolts`` over ``mapInArrow``.
* ``_source``: spouts as a streaming source. ``source``: the data source and
  its reader; ``options``, ``state``, ``spout_host`` (the supervised spout
  process), ``replay_log``.
* ``_streaming``: topologies as Structured Streaming queries. ``topology``:
  the driver; ``stages``: one ``mapInArrow`` stage per bolt; ``state``:
  stateful bolts' state, versioned by micro-batch id.
"""

from __future__ import annotations

import logging
import re

from ._engine.counters import BoltCounters
from ._engine.engine import _Engine
from ._engine.pool import _freeze_worker_heap
from ._engine.spec import (
    DEAD_LETTER_COLUMNS, INPUT, DeadLetter, OutputSchemaError, RowFailed, StatefulBoltCrashed, _make_spec,
)
from ._partitions.arrow import apply_bolts, multilang_bolts
from ._partitions.rdd import group_by_fields, shell_bolt_partition
from ._source.source import FORMAT as SOURCE_FORMAT
from ._source.source import MSG_ID_COLUMN, VALUES_COLUMN, MultilangDataSource, MultilangStreamReader
from ._source.source import register as register_source
from ._streaming.topology import SparkRunResult, kill_spark_jvm, run_topology, task_attempts

__all__ = [
    "INPUT",
    "DEAD_LETTER_COLUMNS",
    "shell_bolt_partition",
    "multilang_bolts",
    "apply_bolts",
    "group_by_fields",
    "run_topology",
    "BoltCounters",
    "DeadLetter",
    "RowFailed",
    "OutputSchemaError",
    "StatefulBoltCrashed",
    "SparkRunResult",
    "task_attempts",
    "spark_error_text",
    "kill_spark_jvm",
    "register_source",
    "SOURCE_FORMAT",
    "MSG_ID_COLUMN",
    "VALUES_COLUMN",
    "MultilangDataSource",
    "MultilangStreamReader",
]


def spark_error_text(exc: BaseException) -> str:
    """The useful part of an error that crossed Spark (the Python exception
    raised in the worker, found in the Py4J text), else the error itself;
    for a JVM exception PySpark captured, what its innermost cause says (a
    bad conf value: "Error while instantiating 'org.apache...'", caused by
    "[INVALID_CONF_VALUE.TYPE_MISMATCH] The value 'abc' in the config ...")."""
    text = str(exc)
    hits = re.findall(r"^(?:[\w.]+\.)?((?:RowFailed|OutputSchemaError|StatefulBoltCrashed|ComponentCrashed|"
                      r"HeartbeatTimeout|TopologyError|MultilangError)\b.*)$", text, re.M)
    if hits:
        return hits[-1]
    cause = getattr(exc, "_cause", None)  # (a CapturedException's cause, captured too)
    if isinstance(cause, BaseException):
        while isinstance(getattr(cause, "_cause", None), BaseException):
            cause = cause._cause
        desc = getattr(cause, "_desc", None)
        if isinstance(desc, str) and desc.strip() and "Traceback" not in desc:
            return desc.strip()
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    # A Java exception: its message (the innermost "Caused by:"), never a stack frame ("at ...").
    java = [ln for ln in lines if re.match(r"^(?:Caused by: )?[\w.$]+(?:Exception|Error)\b(?::|$)", ln)]
    if java:
        return java[-1].removeprefix("Caused by: ")
    lines = [ln for ln in lines if not re.match(r"^(at |\.\.\. \d+ more)", ln)]
    return lines[-1] if lines else type(exc).__name__


log = logging.getLogger("multilang.spark")

# The public classes and functions are defined in the private modules above;
# they are documented, shown in tracebacks and pickled as this module's (trio
# does the same), so a worker's "multilang.adapters.spark.RowFailed: ..." reads
# as before the split.
for _name in __all__:
    _obj = globals()[_name]
    if (isinstance(_obj, type) or callable(_obj)) and getattr(_obj, "__name__", None) == _name:
        _obj.__module__ = __name__
del _name, _obj
