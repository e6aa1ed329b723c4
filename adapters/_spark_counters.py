"""Counters: ``BoltCounters``, a Spark accumulator summing the counters of
every partition on the driver.
"""

from __future__ import annotations

from typing import Any


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


class BoltCounters:
    """Counters of every partition run with it, summed on the driver (a Spark
    accumulator): ``rows_in``, ``tuples_out``, ``acked``, ``failed``,
    ``retried``, ``dead_letter``, ``unanchored``, ``restarts``, ``warm_reuse``
    and ``components`` (per component: executed, emitted, acked, failed,
    restarts, errors)."""

    def __init__(self, sc: Any = None) -> None:
        if sc is None:
            from pyspark import SparkContext

            sc = SparkContext._active_spark_context
            if sc is None:
                raise RuntimeError("BoltCounters needs an active SparkContext (create the SparkSession first)")
        self._acc = sc.accumulator({}, _DictParam())

    def add(self, counters: dict[str, Any]) -> None:
        self._acc.add(counters)

    @property
    def value(self) -> dict[str, Any]:
        return self._acc.value

    def __repr__(self) -> str:
        try:
            return f"BoltCounters({self.value})"
        except Exception:  # noqa: BLE001 - on a worker the value is not readable
            return "BoltCounters(<on a worker>)"


def _default_counters(counters: BoltCounters | bool | None) -> BoltCounters | None:
    if isinstance(counters, BoltCounters):
        return counters
    if counters is False:
        return None
    try:
        from pyspark import SparkContext

        if SparkContext._active_spark_context is not None:
            return BoltCounters()
    except Exception:  # noqa: BLE001 - e.g. Spark Connect: no accumulators
        pass
    return None
