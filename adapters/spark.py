"""Multilang bolts inside Spark, and topologies compiled onto Spark.

Three entry points, all running the same trio runtime as ``multilang run``
(:mod:`multilang.shellbolt`) inside Spark's Python workers:

``shell_bolt_partition(spec, ...)``
    a function for ``rdd.mapPartitions(fn)`` (batch jobs, ``DStream.transform``).
``multilang_bolts(spec, output_schema=..., ...)`` / ``apply_bolts(df, spec, ...)``
    a DataFrame transform over ``mapInArrow``, for batch and streaming
    DataFrames: ``df.transform(multilang_bolts(["ruby", "split_bolt.rb"], output_schema="word string"))``.
``run_topology(topology, ...)``
    ``multilang run --engine spark TOPOLOGY.toml``: the whole topology file on Spark.

The manual (what ``spec`` may be, the reliability model and what is and is
not guaranteed, warm processes, the memory bound, garbage collection, the
direct lane, counters) is docs/SPARK.md.

This module is the public face; the work is done in private modules, one job each:

* ``_spark_spec``: the public names and errors, the options, and the ``_Spec`` of what runs in a partition;
* ``_spark_engine``: the in-partition engine, a warm runtime per spec (``_Engine``, ``_Feeder``, ``_DirectBolt``);
* ``_spark_lease``: a partition's session with an engine, which carries the exactly-once promise;
* ``_spark_pool``: the warm pool of engines per Python worker, and the sync side of a partition;
* ``_spark_counters``: ``BoltCounters``, the Spark accumulator;
* ``_spark_rdd``: ``shell_bolt_partition`` and ``group_by_fields`` for RDDs;
* ``_spark_arrow``: ``multilang_bolts``/``apply_bolts`` for DataFrames over ``mapInArrow``;
* ``_spark_topology``: ``run_topology``, a topology file compiled onto Spark.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import orjson

from multilang.errors import TopologyError
from multilang.shellbolt.topology import Topology

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
]

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


def _spark_error_text(exc: BaseException) -> str:
    """The useful part of an error that crossed Spark (the Python exception
    raised in the worker), else the error itself."""
    text = str(exc)
    hits = re.findall(r"^(?:[\w.]+\.)?((?:RowFailed|OutputSchemaError|StatefulBoltCrashed|ComponentCrashed|"
                      r"HeartbeatTimeout|TopologyError|MultilangError)\b.*)$", text, re.M)
    if hits:
        return hits[-1]
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__


def run_cli(topology: Topology, *, master: str, output: Any) -> int:
    """``multilang run --engine spark``: print records as JSON lines on
    ``output`` and a summary on stderr; return the exit code."""
    import click

    def emit(rec: dict[str, Any]) -> None:
        output.write(orjson.dumps(rec).decode() + "\n")

    start = time.monotonic()
    try:
        result = run_topology(topology, master=master, on_record=emit)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except TopologyError as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    except Exception as exc:  # noqa: BLE001 - Spark job failures arrive as Py4J/Python exceptions
        click.echo(f"error: the Spark job failed: {_spark_error_text(exc)}", err=True)
        return 1
    output.flush()
    click.echo(f"[summary] spark ({master}) {time.monotonic() - start:.1f}s; spout tuples "
               + ", ".join(f"{k}: {v}" for k, v in result.spout_tuples.items()), err=True)
    for name, c in result.counters.items():
        click.echo(f"[summary]   {name}: rows in {c.get('rows_in', 0)}, tuples out {c.get('tuples_out', 0)}, "
                   f"acked {c.get('acked', 0)}, failed {c.get('failed', 0)}, retried {c.get('retried', 0)}, "
                   f"restarts {c.get('restarts', 0)}", err=True)
    return 0 if result.ok else 1
