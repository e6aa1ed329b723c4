"""Multilang bolts inside Spark, and topologies compiled onto Spark.

Three entry points, all running the same trio runtime as ``multilang run``
(:mod:`multilang.shellbolt`) inside Spark's Python workers:

``shell_bolt_partition(spec, ...)``
    a function for ``rdd.mapPartitions(fn)`` (batch jobs, ``DStream.transform``).
``multilang_bolts(spec, input_cols=..., keep=..., fields=... or output_schema=..., ...)`` / ``apply_bolts(df, spec, ...)``
    a DataFrame transform over ``mapInArrow``, for batch and streaming DataFrames, classic or Spark Connect:
    ``df.transform(multilang_bolts(["ruby", "split_bolt.rb"], input_cols=["text"], keep=["id"], fields=["word"]))``.
``run_topology(topology, ...)``
    ``multilang run --engine spark TOPOLOGY.toml``: the whole topology file as a
    Structured Streaming query.

The manual (what ``spec`` may be, the reliability model and what is and is
not guaranteed, warm processes, the memory bound, garbage collection, the
direct lane, counters) is docs/SPARK.md.

This module is the public face; the work is done in private modules, one job each:

* ``_spark_spec``: the public names and errors, the options, and the ``_Spec`` of what runs in a partition;
* ``_spark_engine``: the in-partition engine, a warm runtime per spec (``_Engine``, ``_Feeder``, ``_LeaseSink``);
* ``_spark_lease``: a partition's session with an engine, which carries the exactly-once promise;
* ``_spark_pool``: the warm pool of engines per Python worker, and the sync side of a partition;
* ``_spark_counters``: ``BoltCounters`` (an accumulator, or observed metrics under Spark Connect);
* ``_spark_rdd``: ``shell_bolt_partition`` and ``group_by_fields`` for RDDs;
* ``_spark_arrow``: ``multilang_bolts``/``apply_bolts`` for DataFrames over ``mapInArrow``;
* ``_spark_topology``: ``run_topology``, a topology file as a Structured Streaming query (the driver);
* ``_spark_stages``: what that query runs in the workers, one ``mapInArrow`` stage per bolt;
* ``_spark_state``: stateful bolts' state on Spark, a store versioned by micro-batch id.
"""

from __future__ import annotations

import logging
import re

from ._spark_arrow import apply_bolts, multilang_bolts
from ._spark_counters import BoltCounters
from ._spark_engine import _Engine  # noqa: F401 - tests/spark reach it here
from ._spark_pool import _freeze_worker_heap  # noqa: F401 - tests/spark reach it here
from ._spark_rdd import group_by_fields, shell_bolt_partition
from ._spark_spec import (
    DEAD_LETTER_COLUMNS,
    INPUT,
    DeadLetter,
    OutputSchemaError,
    RowFailed,
    StatefulBoltCrashed,
    _make_spec,  # noqa: F401 - tests/spark reach it here
)
from ._spark_topology import SparkRunResult, run_topology

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
    "spark_error_text",
]


def spark_error_text(exc: BaseException) -> str:
    """The useful part of an error that crossed Spark (the Python exception
    raised in the worker, found in the Py4J text), else the error itself."""
    text = str(exc)
    hits = re.findall(r"^(?:[\w.]+\.)?((?:RowFailed|OutputSchemaError|StatefulBoltCrashed|ComponentCrashed|"
                      r"HeartbeatTimeout|TopologyError|MultilangError)\b.*)$", text, re.M)
    if hits:
        return hits[-1]
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
    if isinstance(_obj, type) or callable(_obj):
        _obj.__module__ = __name__
del _name, _obj
