"""What the streaming topology engine runs in Spark's Python workers: one
``mapInArrow`` function per bolt (``_StageFn``), over rows that are
*deliveries*, as Storm's executors transfer tuples to tasks.

A delivery row (``ROW_SCHEMA``) is one tuple on its way to one task:

* ``_for``: the receiving bolt, or a marker: ``OUT`` (the topology output
  view), ``STATS`` (a stage's counters), ``DEAD`` (an input given up on);
* ``_p``: the receiving task's index (the grouping's choice, computed with
  the embedded engine's key -> task mapping), or for ``OUT``/``STATS`` the
  emitting task;
* ``_c``, ``_s``, ``_v``: the emitting component, its stream, and the
  values as a JSON array (exact JSON types between stages);
* ``_o``: order of an ``OUT`` row: ``batch id << 32 | sequence``;
* ``_key``: an ``OUT`` row's key (JSON), for a keyed output view.

The topology's bolts run one stage each, in topological order, over one
DataFrame: a stage takes the rows addressed to its bolt, runs them through
the bolt's processes (the same lease and runtime as ``multilang_bolts``), and
adds the deliveries of their emits; all other rows pass through untouched (in
Arrow, no Python per row). A stage whose bolt is fed by a fields, global or
all grouping is preceded by a repartitioning on ``_p``, so each task's rows
are in one partition, and runs each task with a fresh process whose §9.7
state comes from, and is checkpointed to, the task's
:class:`~._spark_state.BatchStore` for this micro-batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator

import orjson

from multilang.shellbolt import Grouping, Input, new_grouping

from .._engine.lease import _Dead
from .._engine.pool import _run_partition
from .._engine.spec import _Options, _Spec, _spec_key
from .state import PROVIDER

#: the columns of every row between stages
ROW_SCHEMA = "_for string, _p int, _c string, _s string, _v string, _o long, _key string"
COLUMNS = ("_for", "_p", "_c", "_s", "_v", "_o", "_key")
OUT = "\x00out"
STATS = "\x00stats"
DEAD = "\x00dead"
#: rows kept after the last stage: what a micro-batch writes to the checkpoint
KEPT = (OUT, STATS, DEAD)


@dataclass
class Plan:
    """The picklable routing of a topology: who subscribes to what, and what
    the output view keeps."""

    #: (component, stream) -> [(bolt, grouping, field positions, bolt's parallelism)]
    subs: dict[tuple[str, str], list[tuple[str, str, list[int], int]]]
    #: (component, stream) -> key positions (None: every tuple) of the output view
    outputs: dict[tuple[str, str], list[int] | None]
    #: bolt -> the spec of one task's runtime
    specs: dict[str, _Spec] = field(default_factory=dict)
    #: bolts whose tasks keep state (fed by fields / global / all) -> parallelism
    keyed: dict[str, int] = field(default_factory=dict)
    #: bolt -> its task ids in the topology (Storm's, as the embedded engine numbers them), by task index
    task_ids: dict[str, list[int]] = field(default_factory=dict)
    #: bolt -> per task, an int whose hash partitioning is the task (repartitioned bolts)
    spread: dict[str, list[int]] = field(default_factory=dict)
    state_dir: str = ""
    max_retries: int = 3


class _Rows:
    """Output rows of one stage partition, as Arrow columns built in bulk."""

    def __init__(self, plan: Plan, batch: int) -> None:
        self.plan = plan
        self.base = batch << 32
        self.cols: tuple[list[Any], ...] = tuple([] for _ in COLUMNS)
        self.seq = 0
        self.groupings: dict[tuple[str, str, str], Grouping] = {}  # (component, stream, bolt) -> its grouping
        self.last: dict[tuple[str, str, str], tuple[int, int, str]] = {}  # keyed view: (c, s, key) -> (o, task, v)

    def __len__(self) -> int:
        return len(self.cols[0])

    def add(self, for_: str, p: int, c: str, s: str, v: str, o: int = 0, key: str | None = None) -> None:
        f, pp, cc, ss, vv, oo, kk = self.cols
        f.append(for_)
        pp.append(p)
        cc.append(c)
        ss.append(s)
        vv.append(v)
        oo.append(o)
        kk.append(key)

    def route(self, component: str, stream: str, values: list[Any], task: int, text: str | None = None) -> None:
        """Deliver one emitted tuple to its subscribers' tasks, and to the output view."""
        plan = self.plan
        v = text if text is not None else orjson.dumps(values).decode()
        for bolt, kind, idx, n in plan.subs.get((component, stream), ()):
            grouping = self.groupings.get((component, stream, bolt))
            if grouping is None:  # over task indexes 0..n-1: the same choice as the embedded runtime's
                grouping = self.groupings[(component, stream, bolt)] = new_grouping(kind, bolt, range(n), idx)
            for t in grouping.choose(values):
                self.add(bolt, t, component, stream, v)
        key_idx = plan.outputs.get((component, stream), False)
        if key_idx is False:
            return
        self.seq += 1
        if key_idx is None:
            self.add(OUT, task, component, stream, v, self.base | self.seq)
        else:
            key = orjson.dumps([values[i] for i in key_idx]).decode()
            self.last[(component, stream, key)] = (self.base | self.seq, task, v)

    def batch(self, pa: Any, schema: Any, final: bool = False) -> Any:
        if final and self.last:
            for (c, s, key), (o, task, v) in self.last.items():
                self.add(OUT, task, c, s, v, o, key)
            self.last = {}
        arrays = [pa.array(col, type=schema.field(i).type) for i, col in enumerate(self.cols)]
        self.cols = tuple([] for _ in COLUMNS)
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _arrow_schema(pa: Any) -> Any:
    return pa.schema([("_for", pa.string()), ("_p", pa.int32()), ("_c", pa.string()), ("_s", pa.string()),
                      ("_v", pa.string()), ("_o", pa.int64()), ("_key", pa.string())])


_FLUSH = 4096


def _attempt() -> int:
    """Which attempt of its Spark task this is (0: the first): a stage run
    again after a process died mid-batch says so in its counters."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.attemptNumber() if ctx is not None else 0


class RouteFn:
    """The first stage: rows read from the spouts (``_for`` null, ``_p`` the
    spout task) become deliveries; one ``STATS`` row per spout task."""

    def __init__(self, plan: Plan, batch: int) -> None:
        self.plan = plan
        self.batch_id = batch

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        schema = _arrow_schema(pa)
        rows = _Rows(self.plan, self.batch_id)
        counts: dict[tuple[str, int], int] = {}
        loads = orjson.loads
        for b in batches:
            cols = b.to_pydict()
            for p, c, s, v in zip(cols["_p"], cols["_c"], cols["_s"], cols["_v"]):
                rows.route(c, s, loads(v), p, v)
                counts[(c, p)] = counts.get((c, p), 0) + 1
            if len(rows) >= _FLUSH:
                yield rows.batch(pa, schema)
        for (c, p), n in counts.items():
            rows.add(STATS, p, c, "", orjson.dumps({"emitted": n}).decode())
        yield rows.batch(pa, schema, final=True)


class StageFn:
    """One bolt's stage: its rows through its processes, everything else through."""

    def __init__(self, plan: Plan, bolt: str, batch: int) -> None:
        self.plan = plan
        self.bolt = bolt
        self.batch_id = batch

    def _spec(self, task: int) -> _Spec:
        plan, bolt = self.plan, self.bolt
        spec = plan.specs[bolt]
        n = plan.keyed.get(bolt)
        if n is None:
            return spec
        conf = {**spec.conf, "topology.state.provider": PROVIDER,
                "topology.state.provider.config": {"dir": plan.state_dir, "component": bolt, "task": task,
                                                   "tasks": n, "batch": self.batch_id}}
        s = replace(spec, conf=conf)
        s.key = _spec_key(s)
        return s

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        schema = _arrow_schema(pa)
        plan, bolt = self.plan, self.bolt
        keyed = bolt in plan.keyed
        rows = _Rows(plan, self.batch_id)
        mine: dict[int, list[tuple[str, str, str]]] = {}
        for b in batches:
            if b.schema != schema:
                b = b.cast(schema) if hasattr(b, "cast") else pa.RecordBatch.from_arrays(
                    [b.column(i).cast(schema.field(i).type) for i in range(len(COLUMNS))], schema=schema)
            mask = pc.equal(b.column(0), bolt).fill_null(False)
            other = b.filter(pc.invert(mask))
            if other.num_rows:
                yield other
            sel = b.filter(mask)
            if sel.num_rows:
                cols = sel.to_pydict()
                # (by task index for a bolt without state too: each of its tasks' rows have a partition of
                # their own, and a dead letter says whose it was)
                for p, c, s, v in zip(cols["_p"], cols["_c"], cols["_s"], cols["_v"]):
                    mine.setdefault(p, []).append((c, s, v))
        opts = _Options(max_retries=plan.max_retries, dead_letter="record", warm=not keyed, stateful=keyed,
                        max_in_flight=int(plan.specs[bolt].conf["topology.shellbolt.max.pending"]))
        retries = _attempt()  # counted once per Spark task, on its first task's counters
        for task in sorted(mine):
            spec = self._spec(task)
            single = spec.single_source
            loads = orjson.loads
            items: Any = ([loads(v) for _, _, v in mine[task]] if single is not None
                          else [(c, s, loads(v)) for c, s, v in mine[task]])
            report: dict[str, Any] = {}
            for out in _run_partition(spec, opts, items, report.update):
                for rec in out:
                    if type(rec) is _Dead:  # (--dead-letter's line, as the embedded engine's, and the input's stream)
                        rows.add(DEAD, task, bolt, rec.stream, orjson.dumps(
                            {"component": bolt, "task": plan.task_ids[bolt][task], "input": rec.values,
                             "cause": rec.error, "attempts": rec.attempts, "source": rec.source,
                             "stream": rec.stream}, default=repr).decode())
                    else:
                        rows.route(rec[0], rec[1], rec[2], task)
                if len(rows) >= _FLUSH:
                    yield rows.batch(pa, schema)
            del mine[task]
            comp = (report.get("components") or {}).get(bolt, {})
            rows.add(STATS, task, bolt, "", orjson.dumps(
                {"rows_in": report.get("rows_in", 0), "tuples_out": report.get("tuples_out", 0),
                 "acked": report.get("acked", 0), "failed": report.get("failed", 0),
                 "retried": report.get("retried", 0), "dead_letter": report.get("dead_letter", 0),
                 "restarts": report.get("restarts", 0), "emitted": comp.get("emitted", 0),
                 "task_retries": retries}).decode())
            retries = 0
        yield rows.batch(pa, schema, final=True)


def stage_spec(name: str, impl: Any, inputs: list[tuple[str, str, list[str]]], outputs: list[str],
               topo_conf: dict[str, Any], comp_conf: dict[str, Any], resource_dir: str,
               max_in_flight: int) -> _Spec:
    """The spec of one task of a bolt: its sources as feeders, the bolt as one task."""
    sources: dict[str, dict[str, list[str]]] = {}
    for src, stream, fields in inputs:
        sources.setdefault(src, {})[stream] = fields
    ins = [Input(s, st, "shuffle") for s, sts in sources.items() for st in sts]
    # a stage's rows are all in the partition anyway: a bolt process may hold as many as are in flight
    conf = {**topo_conf, "topology.shellbolt.max.pending": max_in_flight}
    spec = _Spec(sources, [(name, impl, 1, ins, dict(comp_conf))], conf,
                 os.path.abspath(resource_dir), [(name, st) for st in outputs])
    spec.key = _spec_key(spec)
    return spec
