"""Counters: ``BoltCounters``, the counters of every partition summed on the
driver: a Spark accumulator in a classic session, and under Spark Connect
(which has no accumulators) a metric the DataFrame reports with
``DataFrame.observe`` (docs/SPARK.md, "Counters").
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

#: the column of a partition's counters row (Spark Connect only): one row per
#: partition, observed and then filtered out before the user sees the DataFrame
COUNTERS_COLUMN = "_multilang_counters"
#: the name of the observed metric: the counters of each partition, as JSON
_METRIC = "partitions"


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    for k, v in b.items():
        if isinstance(v, dict):
            _merge(a.setdefault(k, {}), v)
        else:
            a[k] = a.get(k, 0) + v
    return a


try:  # the accumulator type needs pyspark only when counters are used
    from pyspark.accumulators import AccumulatorParam as _AccumulatorParam
except ImportError:  # pragma: no cover
    _AccumulatorParam = object  # type: ignore[assignment,misc]


class _DictParam(_AccumulatorParam):  # type: ignore[misc,valid-type]
    def zero(self, value: dict[str, Any]) -> dict[str, Any]:
        return {}

    def addInPlace(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return _merge(a, b)


def _active_context() -> Any:
    try:
        from pyspark import SparkContext

        return SparkContext._active_spark_context
    except Exception:  # noqa: BLE001 - no pyspark
        return None


def is_connect(df: Any) -> bool:
    """Whether ``df`` is a Spark Connect DataFrame (no SparkContext, no accumulators)."""
    return type(df).__module__.startswith("pyspark.sql.connect")


class BoltCounters:
    """Counters of every partition run with it, summed on the driver:
    ``rows_in``, ``tuples_out``, ``acked``, ``failed``, ``retried``,
    ``dead_letter``, ``unanchored``, ``restarts``, ``warm_reuse`` and
    ``components`` (per component: executed, emitted, acked, failed,
    restarts, errors).

    In a classic session they are a Spark accumulator (made from the active
    SparkContext, or from the session of the first DataFrame the transform
    is applied to): they add up over every job, and count again when Spark
    recomputes a partition. Under Spark Connect a DataFrame transform
    reports them with ``DataFrame.observe``: :attr:`value` holds the
    counters of the latest action on each DataFrame it made; for a
    streaming DataFrame they are in each micro-batch's progress, read them
    with :meth:`from_progress`."""

    def __init__(self, sc: Any = None) -> None:
        self._acc: Any = None
        self._observations: list[Any] = []  # Connect, batch: an Observation per DataFrame made
        self.stream_metrics: list[str] = []  # Connect, streaming: the names of the observed metrics
        self._observing = False  # applied to a Spark Connect DataFrame: the counters are observed
        sc = sc if sc is not None else _active_context()
        if sc is not None:
            self._acc = sc.accumulator({}, _DictParam())

    # -- used by the transforms -----------------------------------------------------------

    def add(self, counters: dict[str, Any]) -> None:
        """On a worker: add a partition's counters (to the accumulator)."""
        if self._acc is not None:
            self._acc.add(counters)

    def _bind(self, df: Any) -> bool:
        """Before a transform of ``df``: True if the partitions report to the
        accumulator (made now from ``df``'s session if there was none),
        False if they must report through :meth:`_observe` (Spark Connect)."""
        if is_connect(df):
            # (a local Connect server runs a SparkContext in this process: its
            # accumulator would stay empty, the partitions report by observe)
            self._observing = True
            return False
        if self._acc is None:
            self._acc = df.sparkSession.sparkContext.accumulator({}, _DictParam())
        return True

    def _observe(self, out: Any) -> Any:
        """Spark Connect: ``out`` (with a :data:`COUNTERS_COLUMN` row per
        partition) observed, then without those rows and that column."""
        from pyspark.sql import Observation, functions as F

        name = f"multilang_bolts_{uuid.uuid4().hex[:12]}"
        metric = F.collect_list(F.col(COUNTERS_COLUMN)).alias(_METRIC)
        if out.isStreaming:  # Observation is for batch queries; a streaming one reports in its progress
            self.stream_metrics.append(name)
            observed = out.observe(name, metric)
        else:
            obs = Observation(name)
            self._observations.append(obs)
            observed = out.observe(obs, metric)
        return observed.where(F.col(COUNTERS_COLUMN).isNull()).drop(COUNTERS_COLUMN)

    # -- read on the driver -------------------------------------------------------------------

    @property
    def value(self) -> dict[str, Any]:
        if self._acc is not None and not self._observing:
            return self._acc.value
        if not self._observations and not self.stream_metrics:
            raise RuntimeError(
                "these counters are tied to no Spark job yet: a DataFrame transform ties them when it is applied "
                "to a DataFrame; a partition function (shell_bolt_partition) made before the SparkContext existed "
                "has none, so create the SparkSession first or pass counters=BoltCounters(spark.sparkContext)")
        total: dict[str, Any] = {}
        for obs in self._observations:
            try:
                got = obs.get
            except Exception:  # noqa: BLE001 - no action ran on that DataFrame yet
                continue
            _merge_metric(total, got)
        if not self._observations and self.stream_metrics:
            raise RuntimeError(
                "these counters belong to a streaming DataFrame under Spark Connect, which reports them per "
                f"micro-batch: counters.from_progress(query.lastProgress) sums the metric {self.stream_metrics[-1]!r} "
                "of a progress (or read progress.observedMetrics in a StreamingQueryListener)")
        return total

    def from_progress(self, progress: Any) -> dict[str, Any]:
        """Spark Connect, streaming: the counters of one micro-batch, from
        its progress (``query.lastProgress``, a ``StreamingQueryProgress``
        or its dict, or a listener's ``event.progress``); empty when the
        batch reported none."""
        if progress is None:
            return {}
        metrics = progress.get("observedMetrics") if isinstance(progress, dict) else progress.observedMetrics
        total: dict[str, Any] = {}
        for name in self.stream_metrics:
            got = (metrics or {}).get(name)
            if got is not None:
                _merge_metric(total, got)
        return total

    def __repr__(self) -> str:
        try:
            return f"BoltCounters({self.value})"
        except Exception:  # noqa: BLE001 - on a worker the value is not readable
            return "BoltCounters(<on a worker>)"


def _merge_metric(total: dict[str, Any], got: Any) -> None:
    """Add an observed metric (a Row or dict holding the partitions' JSON counters)."""
    if hasattr(got, "asDict"):
        got = got.asDict()
    got = got or {}
    if _METRIC not in got and "values" in got and isinstance(got.get("schema"), dict):
        # a Connect streaming progress holds the metric's row as {values, schema}
        names = [f.get("name") for f in got["schema"].get("fields", ())]
        got = dict(zip(names, got["values"] or ()))
    for text in got.get(_METRIC) or ():
        if text:
            _merge(total, orjson.loads(text))


def _default_counters(counters: BoltCounters | bool | None) -> BoltCounters | None:
    """The transform's counters: the ones given, none with ``False``, else
    new ones (an accumulator if a SparkContext is active now, else made when
    the transform first meets a DataFrame)."""
    if isinstance(counters, BoltCounters):
        return counters
    if counters is False:
        return None
    return BoltCounters()
