"""RDD functions: ``shell_bolt_partition`` for ``rdd.mapPartitions`` and
``group_by_fields``, which partitions an RDD as a fields grouping does.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any, Iterable, Iterator, Sequence

from multilang.shellbolt import fields_task_index

from .._engine.counters import BoltCounters, _default_counters
from .._engine.lease import _Dead
from .._engine.pool import _run_partition
from .._engine.spec import DeadLetter, _make_spec, _Options, _options, _Spec


def _row_values(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):  # pyspark Row is a tuple
        return list(x)
    return [x]


class _PartitionFn:
    """``rdd.mapPartitions(fn)``: rows in, output tuples out."""

    def __init__(self, spec: _Spec, opts: _Options, counters: BoltCounters | None, mode: str) -> None:
        self.spec = spec
        self.opts = opts
        self.counters = counters
        self.mode = mode  # "tuple" | "stream" | "record" (engine: (component, stream, values) / _Dead raise)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled on the driver when a job runs it: the moment to ship the
        # components to the executors of the SparkContext running it (ship.py).
        if self.opts.ship and self.spec.shipped is None:
            from pyspark import SparkContext

            sc = getattr(SparkContext, "_active_spark_context", None)
            if sc is not None:
                self.spec.ship(sc)
        return self.__dict__

    def _report(self, c: dict[str, Any]) -> None:
        if self.counters is not None:
            self.counters.add(c)

    def __call__(self, iterator: Iterable[Any]) -> Iterator[Any]:
        mode = self.mode
        if mode != "record":
            items: Iterable[Any] = map(_row_values, iterator)
        elif self.spec.single_source is not None:  # (source, stream, values) -> values
            items = map(_values_of, iterator)
        else:
            items = iterator
        dead_ok = self.opts.dead_letter == "record"
        for out in _run_partition(self.spec, self.opts, items, self._report):
            for rec in out:
                if type(rec) is _Dead:
                    if dead_ok:
                        yield DeadLetter(rec.values, rec.error, rec.attempts, rec.source, rec.stream)
                    continue
                if mode == "tuple":
                    yield tuple(rec[2])
                elif mode == "stream":
                    yield rec[1], tuple(rec[2])
                else:
                    yield rec


def shell_bolt_partition(
    spec: Any,
    *,
    fields: Sequence[str] | None = None,
    input_fields: Sequence[str] | None = None,
    output: str | tuple[str, str] | None = None,
    with_stream: bool = False,
    conf: dict[str, Any] | None = None,
    resource_dir: str | os.PathLike[str] | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    max_retries: int = 3,
    dead_letter: str | None = None,
    ordered: bool = False,
    warm: bool = True,
    stateful: bool = False,
    max_in_flight: int = 1000,
    batch_size: int = 512,
    idle_timeout: float = 60.0,
    counters: BoltCounters | bool | None = None,
    ship: bool = True,
) -> _PartitionFn:
    """A function for ``rdd.mapPartitions(fn)`` running ``spec``'s bolts on each partition.

    Each element is one input tuple (a Row, tuple or list gives its values;
    anything else is a 1-tuple); ``input_fields`` names them (needed only if
    a bolt fields-groups on the input). Yields each output tuple as a Python
    tuple, or ``(stream, tuple)`` with ``with_stream``; with
    ``dead_letter="record"`` also :class:`DeadLetter` records. ``fields``
    declares a single command's output fields. ``fn.counters`` is the
    :class:`BoltCounters` (created if a SparkContext is active; pass
    ``counters=False`` for none). Commands run in ``resource_dir`` (default:
    the working directory), shipped to the executors of the SparkContext
    that runs the function (``ship=False``: it is at the same path on
    every executor already; docs/DEPLOY.md). Other options: docs/SPARK.md.
    """
    opts = _options(max_retries, dead_letter, ordered, warm, stateful, max_in_flight, batch_size, idle_timeout,
                    ("record",), ship)
    s = _make_spec(spec, fields=fields, input_fields=input_fields, output=output, conf=conf,
                   resource_dir=resource_dir, cwd=cwd, env=env, max_in_flight=max_in_flight)
    return _PartitionFn(s, opts, _default_counters(counters), "stream" if with_stream else "tuple")


def _task_partition(k: int) -> int:
    return k


def _fields_key(idx: list[int], n: int, values: Any) -> tuple[int, Any]:
    return fields_task_index([values[i] for i in idx], n), values


def group_by_fields(rdd: Any, key: Sequence[int], n_tasks: int) -> Any:
    """Repartition an RDD of tuples as a fields grouping does: partition i holds
    exactly the tuples task i of ``n_tasks`` would get in the local engine
    (``fields_task_index`` of the values at positions ``key``)."""
    return rdd.map(partial(_fields_key, list(key), n_tasks)).partitionBy(n_tasks, _task_partition).values()


def _values_of(rec: tuple[str, str, Any]) -> Any:
    return rec[2]
