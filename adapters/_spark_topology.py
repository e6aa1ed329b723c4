"""The topology compiler: ``run_topology`` runs a whole topology file on
Spark, spouts on the driver, each bolt one ``mapPartitions`` stage, groupings
as repartitioning, and gathers the output records.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable, Iterable, Iterator

import trio

from multilang.errors import TopologyError
from multilang.messages import DEFAULT_STREAM
from multilang.shellbolt.results import hashable, sort_key
from multilang.shellbolt.runtime import Runtime
from multilang.shellbolt.grouping import fields_task_index
from multilang.shellbolt.topology import ANY_FIELDS, ComponentDef, Input, OutputSpec, Topology

from ._spark_counters import BoltCounters
from ._spark_rdd import _PartitionFn, _task_partition, _values_of
from ._spark_spec import _Options, _partition_conf, _Spec, _spec_key


@dataclass
class SparkRunResult:
    """What :func:`run_topology` did: output records (as the local engine
    prints them) and the counters of each bolt stage."""

    outputs: list[dict[str, Any]]
    counters: dict[str, dict[str, Any]]
    spout_tuples: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(not c.get("dead_letter") for c in self.counters.values())


def _bolt_order(topo: Topology) -> list[str]:
    bolts = {n for n, c in topo.components.items() if c.kind == "bolt"}
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            raise TopologyError(f"the Spark engine needs an acyclic topology; cycle through {path + [n]}")
        state[n] = 1
        for i in topo.components[n].inputs:
            if i.source in bolts:
                visit(i.source, path + [n])
        state[n] = 2
        order.append(n)

    for n in sorted(bolts):
        visit(n, [])
    return order


def _collect_spouts(topo: Topology) -> dict[tuple[str, str], list[list[Any]]]:
    """Run the spouts on the driver until they are exhausted; return their tuples.

    Each reliable emit's tree completes when the tuple is read here (it has no
    subscriber in this runtime), so the spout is acked once its tuple is in
    the driver's hands; replay after a failed Spark job is a rerun."""
    from multilang.shellbolt.topology import Topology as _Topology

    comps = {n: replace(c, inputs=[], tasks=[]) for n, c in topo.components.items() if c.kind == "spout"}
    sub = _Topology(topo.name, comps, dict(topo.conf), OutputSpec(), topo.resource_dir)
    sub.validate()
    got: dict[tuple[str, str], list[list[Any]]] = {}

    def collect(component: str, stream: str, values: list[Any], roots: list[int]) -> None:
        got.setdefault((component, stream), []).append(values)

    rt = Runtime(sub, on_tracked_output=collect, checkpointing=False)
    res = trio.run(lambda: rt.run(until_done=True))
    if res.gave_up:
        raise res.gave_up[0]
    return got


def _tag(source: str, stream: str, values: Any) -> tuple[str, str, Any]:
    return source, stream, values


def _keyed(mode: str, idx: list[int], n: int, triple: tuple[str, str, Any]) -> list[tuple[int, Any]]:
    if mode == "fields":
        return [(fields_task_index([triple[2][i] for i in idx], n), triple)]
    if mode == "global":
        return [(0, triple)]
    return [(i, triple) for i in range(n)]  # all


def _round_robin(n: int, split: int, it: Iterable[Any]) -> Iterator[tuple[int, Any]]:
    for k, triple in enumerate(it):
        yield (split + k) % n, triple


def _stream_is(stream: str, rec: tuple[str, str, Any]) -> bool:
    return rec[1] == stream


def _last_by_key(idx: list[int], it: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    last: dict[Any, Any] = {}
    for values in it:
        last[tuple(hashable(values[i]) for i in idx)] = values
    return iter(last.items())


def run_topology(
    topology: Topology, *, spark: Any = None, master: str = "local[*]",
    on_record: Callable[[dict[str, Any]], None] | None = None, max_retries: int = 3,
) -> SparkRunResult:
    """Run a topology (e.g. from ``load_topology``) on Spark.

    * Spouts run on the driver until exhausted; their tuples become RDDs.
    * Each bolt is one ``mapPartitions`` stage of :class:`_PartitionFn` over
      the union of its inputs. Shuffle, local-or-shuffle and none groupings
      keep the upstream partitioning (the stage is pipelined with the one
      before it); fields, global and all groupings repartition into the
      bolt's ``parallelism`` partitions with the local engine's key->task
      mapping (partition index = task index, ``fields_task_index``).
      Direct groupings are not supported.
    * Output: the tuples no bolt subscribes to, filtered by ``[output]``; with
      ``key``, the last tuple per key, sorted as the local engine sorts them.

    Stateful bolts (e.g. a word count fed by a fields grouping): a
    repartitioned stage's partition i is exactly task i's whole input, and it
    is processed by a fresh process (``stateful=True``), once per successful
    Spark task: if that process dies mid-partition the task fails and Spark
    reruns the whole partition with a fresh process, so the state is rebuilt
    from the complete input and the counts are exact. A failed task's
    outputs are discarded by Spark. Shuffle-grouped bolts reuse warm
    processes and retry single rows inside the partition instead.
    """
    from pyspark import StorageLevel
    from pyspark.sql import SparkSession

    order = _bolt_order(topology)
    for name in order:
        for i in topology.components[name].inputs:
            if i.grouping == "direct":
                raise TopologyError(f"bolt {name!r}: direct groupings are not supported by the Spark engine")
    spout_out = _collect_spouts(topology)
    own = spark is None
    if own:
        spark = _local_session(SparkSession, master, f"multilang:{topology.name}")
    sc = spark.sparkContext
    try:
        rdds: dict[tuple[str, str], Any] = {}
        default_par = sc.defaultParallelism
        for (comp, stream), rows in spout_out.items():
            consumers = topology.subscribers(comp, stream)
            n = max([c.parallelism for c, _ in consumers] + [1]) if consumers else default_par
            rdds[(comp, stream)] = sc.parallelize(rows, max(1, min(n, len(rows) or 1)))
        for comp in topology.components.values():
            if comp.kind == "spout":
                for stream in comp.outputs:
                    rdds.setdefault((comp.name, stream), sc.emptyRDD())
        counters: dict[str, BoltCounters] = {}
        persisted: list[Any] = []
        for name in order:
            comp = topology.components[name]
            n = comp.parallelism
            keyed = any(i.grouping in ("fields", "global", "all") for i in comp.inputs)
            parts = []
            sources: dict[str, dict[str, list[str]]] = {}
            for i in comp.inputs:
                src_fields = topology.components[i.source].outputs[i.stream]
                sources.setdefault(i.source, {})[i.stream] = src_fields
                tagged = rdds[(i.source, i.stream)].map(partial(_tag, i.source, i.stream))
                if keyed:
                    if i.grouping in ("fields", "global", "all"):
                        idx = [src_fields.index(f) for f in i.fields] if i.grouping == "fields" else []
                        tagged = tagged.flatMap(partial(_keyed, i.grouping, idx, n))
                    else:
                        tagged = tagged.mapPartitionsWithIndex(partial(_round_robin, n))
                parts.append(tagged)
            rdd = parts[0] if len(parts) == 1 else sc.union(parts)
            if keyed:
                rdd = rdd.partitionBy(n, _task_partition).values()
            opts = _Options(max_retries=max_retries, warm=not keyed, stateful=keyed)
            spec = _Spec(sources, [(name, comp.impl, 1, [Input(s, st, "shuffle") for s, sts in sources.items()
                                                          for st in sts], dict(comp.conf))],
                         _partition_conf(topology.conf, opts.max_in_flight), str(topology.resource_dir),
                         [(name, st) for st in comp.outputs])
            spec.key = _spec_key(spec)
            counters[name] = BoltCounters(sc)
            out = rdd.mapPartitions(_PartitionFn(spec, opts, counters[name], "record"))
            uses = sum(len(topology.subscribers(name, st)) or 1 for st in comp.outputs)
            if uses > 1:  # computed once for all its readers
                out = out.persist(StorageLevel.MEMORY_AND_DISK)
                persisted.append(out)
            for st in comp.outputs:
                rdds[(name, st)] = out.filter(partial(_stream_is, st)).map(_values_of)
        result = _gather(topology, rdds, on_record)
        for r in persisted:
            r.unpersist()
        return SparkRunResult(result, {n: c.value for n, c in counters.items()},
                              {f"{c}/{s}": len(v) for (c, s), v in spout_out.items()})
    finally:
        if own:
            spark.stop()


_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def _local_session(SparkSession: Any, master: str, name: str) -> Any:
    """A session for the CLI: this interpreter for the Python workers, no UI,
    no progress bars, Spark's own logging at ERROR (stderr)."""
    import tempfile

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no slow hostname lookups
    conf_dir = tempfile.mkdtemp(prefix="multilang-spark-")
    log_conf = os.path.join(conf_dir, "log4j2.properties")
    with open(log_conf, "w") as f:
        f.write(_LOG4J)
    spark = (SparkSession.builder.master(master).appName(name)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.extraJavaOptions", f"-Dlog4j.configurationFile=file:{log_conf}")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _gather(topology: Topology, rdds: dict[tuple[str, str], Any],
            on_record: Callable[[dict[str, Any]], None] | None) -> list[dict[str, Any]]:
    out = topology.output
    records: list[dict[str, Any]] = []
    keyed: dict[Any, dict[str, Any]] = {}
    for c in sorted(topology.components.values(), key=lambda c: c.name):
        for stream, fields in c.outputs.items():
            if topology.subscribers(c.name, stream):
                continue
            if out.component is not None and (c.name != out.component or stream != (out.stream or DEFAULT_STREAM)):
                continue

            def record(values: list[Any], c: ComponentDef = c, stream: str = stream,
                       fields: list[str] = fields) -> dict[str, Any]:
                rec: dict[str, Any] = {} if out.component is not None else {"component": c.name, "stream": stream}
                if fields == ANY_FIELDS:
                    rec["values"] = values
                else:
                    rec.update(zip(fields, values))
                return rec

            rdd = rdds[(c.name, stream)]
            if out.key and out.component is not None:
                idx = [fields.index(k) for k in out.key]
                for key, values in rdd.mapPartitions(partial(_last_by_key, idx)).collect():
                    keyed[key] = record(values)
            else:
                for values in rdd.toLocalIterator():
                    rec = record(values)
                    records.append(rec)
                    if on_record is not None:
                        on_record(rec)
    if out.key and out.component is not None:
        records = sorted(keyed.values(), key=lambda r: [sort_key(r[k]) for k in out.key or []])
        if on_record is not None:
            for rec in records:
                on_record(rec)
    return records
