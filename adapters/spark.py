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

What ``spec`` may be
--------------------
* a command: ``["ruby", "split_bolt.rb"]`` or ``"ruby split_bolt.rb"`` (argv,
  no shell; a leading ``python`` is the worker's own ``sys.executable``);
* a :class:`~multilang.shellbolt.ShellBolt` or :class:`~multilang.shellbolt.PythonBolt`;
* a list of those (optionally ``(name, bolt)`` pairs): a **chain**, each bolt
  fed by the previous one;
* a :class:`~multilang.shellbolt.TopologyBuilder` with bolts only, whose first
  bolts subscribe to :data:`INPUT` (``"input"``): a **small DAG** with any
  grouping and parallelism, e.g.
  ``b.set_bolt("count", ShellBolt(...), 2).fields_grouping("split", ["word"])``.

The rows of a partition are the tuples of a spout named ``input`` (fields:
the DataFrame's columns, or ``input_fields``). Commands run in
``resource_dir`` (default: the driver's working directory), which must exist
at the same path on the executors (true in local and local-cluster mode; on a
cluster ship the scripts, e.g. with ``--files``/``SparkFiles``). The worker's
environment (``PATH``, ``LANG``, ...) reaches every subprocess, plus ``env``;
``LANG=C.UTF-8`` is added when the worker has no locale at all.

Reliability: every input row is a root tracked by the runtime's XOR acker
----------------------------------------------------------------------------
* A root's outputs (tuples emitted by the last bolts, on streams nobody in
  ``spec`` subscribes to) are held until the root's whole tree completes, and
  only then released downstream to Spark.
* A failed or timed-out root (a bolt failed a tuple, its process crashed or
  hung, ``topology.message.timeout.secs`` passed) drops what it had emitted
  and is replayed, at most ``max_retries`` times (default 3). Then it raises
  :class:`RowFailed` (default: the Spark task fails, naming the row and the
  cause) or, with ``dead_letter``, becomes a dead-letter record you can read:
  DataFrames (``dead_letter="column"``) get three extra columns
  ``_status`` (``"ok"`` or ``"dead_letter"``), ``_input`` (the row as JSON)
  and ``_error`` (why); the output columns of a dead-letter row are null.
  RDD functions (``dead_letter="record"``) yield :class:`DeadLetter` records
  among the output tuples.
* ``ordered=True`` releases outputs in input-row order (a slow row then
  holds back the rows after it, up to ``max_in_flight``).

**Exactly once, for deterministic bolts:** each input row of a successful
Spark task contributes the outputs of exactly one completed tree of that row:
the outputs of failed attempts are never released, and a bolt process killed
mid-partition only fails the trees it had in flight, which are replayed
through the restarted process. Spark's own task retry adds the usual
guarantee on top: a failed Spark task's output is discarded (shuffle and
result output are committed per successful task attempt), and the retry
reprocesses the partition. Streaming queries keep this per micro-batch with
the batch id and an idempotent or transactional sink.

Not guaranteed: side effects of a bolt (writes to a database, files, HTTP
calls) happen once per *attempt*, so they can happen several times
(at-least-once), exactly as in Storm. Unanchored emits cannot be tied to a
row: they are released at once and may repeat on replay. An output anchored
to several rows is released when all of them completed and dropped if any
failed. With ``topology.acker.executors = 0`` nothing is tracked: outputs are
released as they come and nothing is retried.

**Stateful bolts** (counters, windows) must see one task's whole input in
one process. Pass ``stateful=True``: every partition then gets a fresh
process (no pooling), and if that process dies mid-partition its state
cannot be rebuilt inside the partition, so the Spark task fails
(:class:`StatefulBoltCrashed`) and Spark reruns the whole partition with a
fresh process (cluster default: 4 attempts; locally use ``local[N,F]``).
``run_topology`` does this for every bolt whose inputs are fields, global or
all grouped.

Warm processes
--------------
Without ``stateful``, runtimes (processes included) are kept warm in each
Python worker between Spark tasks, in a pool keyed by the whole spec
(commands, fields, groupings, conf, env, cwd). A runtime is health-checked
before reuse (not stopped, no component gave up, no dead process) and
processes are heartbeated while idle (§5.1); idle runtimes stop after
``idle_timeout`` seconds (default 60); all stop at interpreter exit (atexit;
PySpark's forked workers exit with ``os._exit``, and their children then exit
on stdin EOF). Bolts that keep state across tuples should not rely on which
rows a warm process saw before.

The sync/trio seam and its memory bound
---------------------------------------
One trio loop per Python worker, in a daemon thread (:mod:`multilang.adapters._sync`).
The partition iterator runs in Spark's thread, reads rows in chunks of
``batch_size`` and hands each chunk to the loop in one call, which returns the
outputs released so far. The loop holds at most ``max_in_flight + batch_size``
unfinished rows of a partition (the call blocks while it holds more), plus the
outputs those rows produced, so memory is bounded by
``(max_in_flight + batch_size) x outputs per row``, whatever the partition size.

The rows in flight are held in the loop anyway, so a bolt process may have as
many of them unacked: ``topology.shellbolt.max.pending`` (Storm's default
100, §5.3 of spec/PROTOCOL.md) defaults to ``max_in_flight`` here (1000 in
``run_topology``), unless ``conf`` or the topology sets it. With 100, host
and bolt take turns every 50 tuples; with 1,000 a one-record-per-row bolt ran
about a quarter faster (docs/PERFORMANCE.md), and a bolt that acks in groups
larger than 100 does not stall. A bolt process that dies replays what it
held, as always.

Garbage collection
------------------
A partition keeps thousands of rows and outputs alive while their trees are
in flight, so CPython's cyclic collector runs often, and each of its full
collections walks everything the worker holds: PySpark, pyarrow, trio and the
warm runtime, some 60,000 objects. Once per Python worker, after the first
partition's runtime is up, the adapter runs one collection and then
:func:`gc.freeze`: the objects alive at that point are skipped by later
collections (they are still freed normally when their last reference goes;
only a reference cycle among them would never be collected). A ``split``
partition run in-process with PySpark, pyarrow and pandas imported used
about 15% less host CPU (docs/PERFORMANCE.md). Set
``MULTILANG_SPARK_GC_FREEZE=0`` in the workers' environment
(``spark.executorEnv.MULTILANG_SPARK_GC_FREEZE``) to leave the collector
alone.

The direct lane
---------------
The common spec, one shell bolt (any parallelism) reading the rows by a
grouping that picks one task per row, with acking on, skips the runtime's
routing and XOR acker: there a row's tree is the one tuple sent to the bolt,
so the partition puts each row straight into the bolt task's inbox and
takes its emits, acks and fails straight back (:class:`_DirectBolt`). The
process supervision is the same code, and so are the guarantees above: a
failed, crashed or timed-out row is replayed, its outputs held until its
ack. A ``split`` partition run in-process used about a quarter less host
CPU, a one-record-per-row partition about half (docs/PERFORMANCE.md).
Chains, DAGs, ``all`` groupings and acking off take the general path. Set
``MULTILANG_SPARK_DIRECT=0`` in the workers' environment to use the
general path always.

Counters (rows in, tuples out, acked, failed, retried, dead letters, restarts,
per-component executed/emitted/acked/failed/restarts) are added to a Spark
accumulator: ``fn.counters.value`` on the driver (a :class:`BoltCounters`).
Like every accumulator updated in a transformation they count again when
Spark recomputes a partition.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import re
import shlex
import sys
import time
from collections import deque
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import orjson
import trio

from multilang.errors import ComponentCrashed, MultilangError, TopologyError
from multilang.messages import DEFAULT_STREAM, Ack, Batch, Emit, Fail, TaskIds
from multilang.shellbolt.executor import (
    Delivery,
    PythonSpoutTask,
    Runtime,
    ShellBoltTask,
    Task,
    _hashable,
    _new_tuple,
    _plain_emit,
    _sort_key,
)
from multilang.shellbolt.grouping import fields_task_index
from multilang.shellbolt.topology import (
    ANY_FIELDS,
    ComponentDef,
    Input,
    OutputSpec,
    PythonBolt,
    PythonSpout,
    ShellBolt,
    Topology,
    TopologyBuilder,
)

from ._sync import TrioHost, pump

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

#: The source the bolts of a spec subscribe to: one tuple per input row.
INPUT = "input"
#: Columns added by ``dead_letter="column"``.
DEAD_LETTER_COLUMNS = ("_status", "_input", "_error")

log = logging.getLogger("multilang.spark")


# --- errors -----------------------------------------------------------------------------


class RowFailed(MultilangError):
    """An input row's tree failed more than ``max_retries`` times."""


class OutputSchemaError(MultilangError):
    """A bolt emitted a tuple that does not fit the declared output schema."""


class StatefulBoltCrashed(ComponentCrashed):
    """A process of a ``stateful`` spec died mid-partition: its state is lost,
    so the Spark task fails and Spark reruns the partition."""


class DeadLetter(NamedTuple):
    """A row given up on (``dead_letter="record"``): its values, why, how often tried."""

    input: list[Any]
    error: str
    attempts: int
    source: str = INPUT
    stream: str = DEFAULT_STREAM


# --- what runs in a partition -----------------------------------------------------------


@dataclass
class _Options:
    max_retries: int = 3
    dead_letter: str | None = None  # None | "column" | "record"
    ordered: bool = False
    warm: bool = True
    stateful: bool = False
    max_in_flight: int = 1000
    batch_size: int = 512
    idle_timeout: float = 60.0


@dataclass
class _Spec:
    """A picklable description of the mini topology run in each partition."""

    sources: dict[str, dict[str, list[str]]]  # spout name -> stream -> fields (fed by rows)
    bolts: list[tuple[str, Any, int, list[Input], dict[str, Any]]]
    conf: dict[str, Any]
    resource_dir: str
    outputs: list[tuple[str, str]]  # (component, stream) released as output
    key: str = ""

    @property
    def single_source(self) -> tuple[str, str] | None:
        if len(self.sources) == 1:
            (name, streams), = self.sources.items()
            if len(streams) == 1:
                return name, next(iter(streams))
        return None

    def topology(self, *, on_worker: bool = False) -> Topology:
        b = TopologyBuilder()
        for name, streams in self.sources.items():
            b.set_spout(name, PythonSpout([], streams=streams))
        for name, impl, par, inputs, conf in self.bolts:
            if on_worker and isinstance(impl, ShellBolt) and not _has_locale(impl.env):
                impl = replace(impl, env={**(impl.env or {}), "LANG": "C.UTF-8"})
            d = b.set_bolt(name, impl, par, conf)
            for i in inputs:
                d.grouping(i.source, i.grouping, i.stream, i.fields)
        return b.create_topology(self.conf, name="spark-partition", resource_dir=self.resource_dir)

    def fields_of(self, component: str, stream: str) -> list[str]:
        for name, impl, *_ in self.bolts:
            if name == component:
                return impl.outputs[stream]
        return self.sources[component][stream]


def _has_locale(extra: dict[str, str] | None) -> bool:
    keys = ("LANG", "LC_ALL", "LC_CTYPE")
    return any(os.environ.get(k) for k in keys) or any((extra or {}).get(k) for k in keys)


_INTERPRETERS = {"python", "python3", "ruby", "node", "nodejs", "perl", "bash", "sh", "php", "Rscript", "deno",
                 "bun", "java"}


def _stem(command: list[str]) -> str:
    """A component name from a command: the script after an interpreter
    (``ruby split_bolt.rb`` -> ``split_bolt``), else the program."""
    base = os.path.basename(command[0])
    if base in _INTERPRETERS or base.startswith("python"):
        for arg in command[1:]:
            if not arg.startswith("-"):
                base = os.path.splitext(os.path.basename(arg))[0]
                break
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", base).lstrip("_") or "bolt"
    return base


def _as_bolt(item: Any, fields: Sequence[str] | None, cwd: str | None, env: dict[str, str] | None) -> Any:
    if isinstance(item, (ShellBolt, PythonBolt)):
        if item.fields is None and not item.streams:
            return replace(item, fields=list(ANY_FIELDS))
        return item
    if isinstance(item, str):
        item = shlex.split(item)
    if isinstance(item, (list, tuple)) and item and all(isinstance(a, str) for a in item):
        return ShellBolt(list(item), fields=list(fields) if fields else list(ANY_FIELDS), cwd=cwd, env=env)
    raise TopologyError(
        f"cannot run {item!r} as a bolt: give a command (argv list or string), a ShellBolt or PythonBolt, "
        "a list of those (a chain), or a TopologyBuilder whose bolts subscribe to 'input'"
    )


def _is_single(spec: Any) -> bool:
    return isinstance(spec, (str, ShellBolt, PythonBolt)) or (
        isinstance(spec, (list, tuple)) and bool(spec) and all(isinstance(a, str) for a in spec)
    )


def _spec_key(spec: _Spec) -> str:
    def impl_doc(impl: Any) -> Any:
        if isinstance(impl, ShellBolt):
            return {"command": impl.command, "outputs": impl.outputs, "cwd": impl.cwd, "env": impl.env}
        from pyspark import cloudpickle

        return {"fn": hashlib.sha256(cloudpickle.dumps(impl.fn)).hexdigest(), "outputs": impl.outputs}

    doc = {
        "sources": spec.sources,
        "bolts": [[n, impl_doc(i), p, [[x.source, x.stream, x.grouping, x.fields] for x in ins], c]
                  for n, i, p, ins, c in spec.bolts],
        "conf": spec.conf,
        "dir": spec.resource_dir,
    }
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS, default=repr).decode()


def _partition_conf(conf: dict[str, Any] | None, max_in_flight: int) -> dict[str, Any]:
    """The conf of a partition's runtime: ``conf``, where a bolt process may
    hold as many tuples as the partition has rows in flight (module
    docstring: "The sync/trio seam"), not Storm's 100, unless it says else."""
    full = dict(conf or {})
    full.setdefault("topology.shellbolt.max.pending", max_in_flight)
    return full


def _make_spec(
    spec: Any, *, fields: Sequence[str] | None, input_fields: Sequence[str] | None, output: Any,
    conf: dict[str, Any] | None, resource_dir: str | os.PathLike[str] | None, cwd: str | None,
    env: dict[str, str] | None, max_in_flight: int,
) -> _Spec:
    in_fields = list(input_fields) if input_fields else list(ANY_FIELDS)
    bolts: list[tuple[str, Any, int, list[Input], dict[str, Any]]] = []
    if isinstance(spec, TopologyBuilder):
        for c in spec._components.values():  # noqa: SLF001 - same project
            if c.kind == "spout":
                raise TopologyError(
                    f"spout {c.name!r}: a Spark bolt spec has no spouts; its bolts subscribe to {INPUT!r}, "
                    "the rows of the partition"
                )
            for i in c.inputs:
                if i.source == INPUT and i.stream != DEFAULT_STREAM:
                    raise TopologyError(f"bolt {c.name!r}: the rows arrive on stream 'default' of {INPUT!r}")
            bolts.append((c.name, _as_bolt(c.impl, None, cwd, env), c.parallelism, list(c.inputs), dict(c.conf)))
        if not any(i.source == INPUT for _, _, _, ins, _ in bolts for i in ins):
            raise TopologyError(f"no bolt subscribes to {INPUT!r}, the rows of the partition; declare e.g. "
                                f".shuffle_grouping({INPUT!r}) on the first bolt")
    else:
        items = [spec] if _is_single(spec) else list(spec)
        if not items:
            raise TopologyError("no bolts given")
        taken: set[str] = {INPUT}
        prev = INPUT
        for n, item in enumerate(items):
            name = None
            if (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                    and not isinstance(item[1], str)):
                name, item = item
            last = n == len(items) - 1
            bolt = _as_bolt(item, fields if last else None, cwd, env)
            if name is None:
                base = _stem(bolt.command) if isinstance(bolt, ShellBolt) else getattr(bolt.fn, "__name__", "bolt")
                name, k = base, 2
                while name in taken:
                    name, k = f"{base}_{k}", k + 1
            taken.add(name)
            bolts.append((name, bolt, 1, [Input(prev, DEFAULT_STREAM, "local_or_shuffle")], {}))
            prev = name
    full_conf = _partition_conf(conf, max_in_flight)
    full_conf.setdefault("topology.max.spout.pending", max_in_flight)
    s = _Spec({INPUT: {DEFAULT_STREAM: in_fields}}, bolts, full_conf,
              str(os.fspath(resource_dir) if resource_dir is not None else os.getcwd()), [])
    topo = s.topology()  # validates (TopologyError names the component)
    s.outputs = _select_outputs(topo, output)
    s.key = _spec_key(s)
    return s


def _select_outputs(topo: Topology, output: Any) -> list[tuple[str, str]]:
    """The (component, stream) pairs nobody subscribes to, filtered by ``output``
    (a component name or a (component, stream) pair)."""
    want_comp, want_stream = (output, None) if isinstance(output, str) or output is None else tuple(output)
    found = []
    for c in topo.components.values():
        if c.kind == "spout":
            continue
        for stream in c.outputs:
            if topo.subscribers(c.name, stream):
                continue
            if want_comp is not None and c.name != want_comp:
                continue
            if want_stream is not None and stream != want_stream:
                continue
            found.append((c.name, stream))
    if not found:
        raise TopologyError(f"no output stream selected (output={output!r}): every stream of every bolt is consumed "
                            "by another bolt, or the named component/stream does not exist")
    return found


# --- the trio side: a runtime per spec, fed by partitions ------------------------------------


class _RecentErrors(logging.Handler):
    """Keeps the runtime's last ERROR lines for error messages; still prints
    them to stderr where nothing else is configured (Spark's executor logs)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: deque[tuple[float, str]] = deque(maxlen=8)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append((time.monotonic(), record.getMessage()[:800]))
            if not logging.getLogger().handlers:
                logging.lastResort.handle(record)  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - logging must never raise
            pass

    def since(self, t: float) -> list[str]:
        return [m for ts, m in self.lines if ts >= t]


_RECENT: _RecentErrors | None = None


def _recent_errors() -> _RecentErrors:
    global _RECENT
    if _RECENT is None:
        _RECENT = _RecentErrors()
        logging.getLogger("multilang.shellbolt").addHandler(_RECENT)
    return _RECENT


class _Feeder(PythonSpoutTask):
    """The spout of a partition runtime: emits the rows the current lease
    queued, reliably (msg id = (lease, row, attempt)); acks and fails go
    straight to the lease (no replay here: the lease decides)."""

    def __init__(self, runtime: Runtime, comp: ComponentDef, task_id: int, engine: "_Engine") -> None:
        Task.__init__(self, runtime, comp, task_id)
        self.notices: deque[tuple[str, Any]] = deque()  # stays empty: notify() acts at once
        self.pending_roots = 0
        self.idle = True
        self.engine = engine
        self.queue: deque[tuple[tuple[int, int, int], str, list[Any]]] = deque()

    def notify(self, kind: str, msg_id: Any, cause: str | None = None) -> None:
        lease = self.engine.lease
        if lease is not None:
            lease.notice(kind, msg_id)
        if self.queue:
            self.kick()  # a finished tree frees room under max spout pending (kick wakes only a waiter)

    async def run(self) -> None:
        rt = self.runtime
        queue = self.queue
        while True:
            if not queue or rt.spouts_stopped or not rt.may_emit(self):
                self.idle = not queue and self.pending_roots == 0
                await self._work.park()
                continue
            self.idle = False
            touched: set[Task] = set()
            lease = self.engine.lease
            now = trio.current_time()
            for _ in range(256):
                if not queue or not rt.may_emit(self):
                    break
                msg_id, stream, values = queue.popleft()
                if lease is not None and msg_id[0] == lease.id:
                    row = lease.rows.get(msg_id[1])
                    if row is None or row.attempt != msg_id[2]:
                        continue
                    row.sent_at = now
                rt.route_plain(self, values, stream, None, touched, msg_id)
            rt.settle()
            for t in touched:
                await t.wait_for_space()
            await trio.lowlevel.checkpoint()


class _DirectBolt(ShellBoltTask):
    """The direct lane: a partition's only bolt, fed by the lease itself.

    The common shape, one shell bolt reading the rows and every stream of it
    an output, needs no routing and no XOR acker: a row's tree is the one
    tuple sent to the bolt, complete when the bolt acks it, failed when the
    bolt fails it, its process dies or the message timeout passes. So the
    lease puts each row into this task's inbox with its attempt as the
    tuple's tree (``(lease id, row, attempt)`` in place of acker edges), and
    the bolt's emits, acks and fails go straight to the lease. The process
    supervision (handshake, heartbeats, max pending, restarts, frame
    limits) is the inherited :class:`ShellBoltTask`'s; only what a tuple
    becomes on the way in and out is shorter. Same guarantees as the
    general path (module docstring); see :meth:`_Engine._direct_shape` for
    when it is used. ``multilang.hold.emits.until.ack`` needs nothing here:
    every output is held until its row's tuple is acked anyway."""

    def __init__(self, runtime: Runtime, comp: ComponentDef, task_id: int, engine: "_Engine") -> None:
        super().__init__(runtime, comp, task_id)
        self.engine = engine
        #: stream -> number of fields (-1: any) and whether the lease takes it, or None: undeclared
        self._out: dict[str, tuple[int, bool] | None] = {}

    def _out_plan(self, stream: str) -> tuple[int, bool] | None:
        fields = self.comp.outputs.get(stream)
        plan = None
        if fields is not None:
            eng = self.engine
            plan = (-1 if fields == ANY_FIELDS else len(fields),
                    eng.all_outputs or (self.name, stream) in eng.outputs)
        self._out[stream] = plan
        return plan

    def _fail_unsent(self, edges: Any, cause: str) -> None:
        self._tree_failed(edges)

    def _stale(self, tok: Any) -> bool:
        """A queued row whose attempt the lease no longer waits for (it
        timed out or failed, and its retry is queued): not written."""
        if type(tok) is not tuple:  # a tick's (TupleEdges)
            return False
        lease = self.engine.lease
        return lease is None or not lease.is_current(tok)

    def _tree_failed(self, tok: Any) -> None:
        lease = self.engine.lease
        if lease is not None and type(tok) is tuple:  # not a tick's (TupleEdges)
            lease.notice("fail", tok)

    def _on_session_lost(self, cause: str) -> None:
        """Fail what the dead process had in flight: the lease replays those rows."""
        if self.in_flight:
            toks = list(self.in_flight.values())
            self.in_flight.clear()
            self.stats.failed += len(toks)
            for tok in toks:
                self._tree_failed(tok)

    async def _handle(self, proc: Any, events: list[Any]) -> None:
        lease = self.engine.lease
        freed = False
        for ev in events:
            t = type(ev)
            if t is Batch:  # §9.5 or a take_outputs run: the emits, then the acks, then the fails
                if ev.emits:
                    self._outputs(ev.emits, lease)
                if ev.acks:
                    self._acked(ev.acks, lease)
                    freed = True
                for tid in ev.fails:
                    self._fail_one(tid)
                    freed = True
            elif t is Emit:
                self._emit(ev, proc, lease)
            elif t is Ack:
                self._acked((ev.id,), lease)
                freed = True
            elif t is Fail:
                self._fail_one(ev.id)
                freed = True
            else:
                self._common(ev, proc)
        if freed:
            self.kick()

    def _acked(self, tids: Any, lease: "_Lease | None") -> None:
        in_flight = self.in_flight
        toks = [in_flight.pop(tid) for tid in tids]
        self.stats.acked += len(toks)
        if lease is not None:
            lease.acked(toks)

    def _fail_one(self, tid: str) -> None:
        tok = self.in_flight.pop(tid)
        self.stats.failed += 1
        self._tree_failed(tok)

    def _outputs(self, emits: list[list[Any]], lease: "_Lease | None") -> None:
        """A run of plain emits, each ``[values, anchor ids or None, stream
        or None]`` (the connection checked the anchors are pending)."""
        in_flight = self.in_flight
        out = self._out
        name = self.name
        last_tok: Any = None
        last_row: _Row | None = None
        for e in emits:
            n = len(e)
            values = e[0]
            stream = e[2] if n > 2 and e[2] is not None else DEFAULT_STREAM
            ids = e[1] if n > 1 else None
            plan = out[stream] if stream in out else self._out_plan(stream)
            if plan is None or plan[0] >= 0 and len(values) != plan[0]:
                self._emit(_plain_emit(values, stream, tuple(ids) if ids else ()), None, lease)
                last_tok = None  # that may have failed the row: its next attempt must not get what follows
                continue
            self.stats.emitted += 1
            if lease is None or not plan[1]:
                continue  # between partitions, or a stream not selected as output
            if ids and len(ids) == 1:
                tok = in_flight[ids[0]]
                if tok is last_tok:
                    last_row.outputs.append((name, stream, values))  # type: ignore[union-attr]
                    continue
                if type(tok) is tuple:  # else a tick's: no tree, the emit goes out as unanchored
                    row = lease.current(tok)
                    if row is not None:
                        row.outputs.append((name, stream, values))
                        last_tok, last_row = tok, row
                    continue
            lease.direct_output((name, stream, values), [in_flight[a] for a in ids] if ids else [])

    def _emit(self, ev: Emit, proc: Any, lease: "_Lease | None") -> None:
        """An emit off the plain path: checked by the runtime (undeclared
        stream, wrong arity, a direct emit nobody can receive: reported, and
        the trees it was anchored to fail), else an output."""
        toks = [self.in_flight[a] for a in ev.anchors]
        targets = self.runtime.targets(self, ev)
        if targets is None:
            for tok in dict.fromkeys(toks):
                self._tree_failed(tok)
        else:
            self.stats.emitted += 1
            plan = self._out[ev.stream] if ev.stream in self._out else self._out_plan(ev.stream)
            if lease is not None and plan is not None and plan[1]:
                lease.direct_output((self.name, ev.stream, ev.values), toks)
        if proc is not None and ev.wants_task_ids:
            self._urgent.append(proc.conn.send(TaskIds(task_ids=targets or [])))
            self.kick()


_STAT_KEYS = ("executed", "emitted", "acked", "failed", "restarts", "errors")


class _Engine:
    """One warm runtime: the spec's bolts as supervised processes, fed by one
    partition (lease) at a time."""

    _ids = 0

    def __init__(self, spec: _Spec, pool: "_Pool") -> None:
        self.spec = spec
        self.pool = pool
        topo = spec.topology(on_worker=True)
        self.runtime = rt = Runtime(topo, on_tracked_output=self._on_output)
        self.feeders: dict[str, _Feeder] = {}
        for name in spec.sources:
            comp = topo.components[name]
            for t in comp.tasks:
                f = _Feeder(rt, comp, t, self)
                rt.tasks[t] = f
                self.feeders[name] = f
        self.outputs = set(spec.outputs)
        # The runtime calls _on_output only for streams nobody subscribes to.
        self.all_outputs = self.outputs == set(_select_outputs(topo, None))
        #: the direct lane (_DirectBolt): the bolt's grouping over its tasks, or None
        self.direct: Any = None
        comp = self._direct_shape(rt, spec)
        if comp is not None:
            for t in comp.tasks:
                rt.tasks[t] = _DirectBolt(rt, comp, t, self)
            self.direct = rt.router.subscribers(*spec.single_source)[0]  # type: ignore[misc]
        self.bolt_tasks = [t for t in rt.tasks.values() if not isinstance(t, PythonSpoutTask)]
        self.lease: _Lease | None = None
        self.finished = trio.Event()
        self.error: BaseException | None = None
        self.idle_since = 0.0
        self.leases = 0
        _recent_errors()

    @staticmethod
    def _direct_shape(rt: Runtime, spec: _Spec) -> ComponentDef | None:
        """The one shell bolt of a spec that the direct lane can run, or
        None: the rows are one spout stream, acking is on, and the spec is a
        single shell bolt subscribing to them by a grouping that picks one
        task per row (not ``all``, not ``direct``). Off with
        ``MULTILANG_SPARK_DIRECT=0`` in the workers' environment."""
        if os.environ.get("MULTILANG_SPARK_DIRECT", "1").strip() == "0":
            return None
        single = spec.single_source
        bolts = [c for c in rt.topology.components.values() if c.kind == "bolt"]
        if single is None or not rt.acking or len(bolts) != 1 or not bolts[0].is_shell:
            return None
        comp = bolts[0]
        subs = rt.router.subscribers(*single)
        if len(comp.inputs) != 1 or len(subs) != 1 or subs[0].kind in ("all", "direct"):
            return None
        return comp

    async def serve(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            if self.direct is None:
                await self.runtime.run()
            else:
                async with trio.open_nursery() as n:
                    n.start_soon(self._expire_rows)
                    await self.runtime.run()
                    n.cancel_scope.cancel()
        except Exception as exc:  # noqa: BLE001 - reported to the lease that waits
            self.error = exc
        finally:
            self.finished.set()
            if self.lease is not None:
                self.lease.wake()

    async def stop(self) -> None:
        self.runtime.request_stop()
        await self.finished.wait()

    def failure(self) -> BaseException | None:
        if not self.finished.is_set():
            return None
        if self.runtime.gave_up:
            return self.runtime.gave_up[0]
        return self.error or MultilangError("the bolt runtime stopped unexpectedly")

    def healthy(self) -> bool:
        rt = self.runtime
        if self.finished.is_set() or rt.gave_up or rt.stopping:
            return False
        for t in self.bolt_tasks:
            sp = getattr(t, "proc", None)
            p = getattr(sp, "proc", None)
            if p is not None and p.returncode is not None:
                return False
        return True

    async def _expire_rows(self) -> None:
        """The direct lane's message timeout (the acker's, §7.3): a row whose
        tuple is not acked within ``topology.message.timeout.secs`` of being
        queued fails, and is replayed or given up like any failed row."""
        timeout = self.runtime.acker.timeout
        while True:
            await trio.sleep(min(1.0, timeout / 4))
            lease = self.lease
            if lease is None:
                continue
            limit = trio.current_time() - timeout
            late = [(lease.id, seq, row.attempt) for seq, row in lease.rows.items()
                    if not row.done and row.sent_at is not None and row.sent_at <= limit]
            for tok in late:
                lease.notice("fail", tok)

    def quiet(self, since: float | None = None) -> bool:
        """Nothing left that could still produce output for the lease: no queued
        rows or tuples and no tuple in flight whose tree is alive. A tuple in
        flight whose tree already failed (a bolt that never acks it) does not
        count; unanchored tuples in flight (acking off) are waited for up to the
        message timeout after ``since``. In the direct lane every tuple is a
        row's, so a lease without rows left is quiet."""
        if self.direct is not None:
            return self.lease is None or not self.lease.rows
        if any(f.queue for f in self.feeders.values()) or self.runtime.acker.pending:
            return False
        roots = self.runtime.acker.roots
        patient = since is not None and trio.current_time() - since < self.runtime.acker.timeout
        for t in self.bolt_tasks:
            if t.inbox:
                return False
            for edges in t.in_flight.values():
                if not edges.ids:
                    if patient or since is None:
                        return False
                elif any(r in roots for r in edges.ids):
                    return False
        return True

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {name: {k: getattr(s, k) for k in _STAT_KEYS} for name, s in self.runtime.stats.items()
                if name not in self.spec.sources}

    def _on_output(self, component: str, stream: str, values: list[Any], roots: list[int]) -> None:
        lease = self.lease
        if lease is not None and (self.all_outputs or (component, stream) in self.outputs):
            lease.output(component, stream, values, roots)


class _Multi:
    """An output anchored to several rows: released when all completed."""

    __slots__ = ("rec", "pending", "dead")

    def __init__(self, rec: tuple[str, str, list[Any]], n: int) -> None:
        self.rec = rec
        self.pending = n
        self.dead = False


class _Row:
    __slots__ = ("source", "stream", "values", "attempt", "outputs", "sent_at", "done", "dead", "multi")

    def __init__(self, source: str, stream: str, values: list[Any]) -> None:
        self.source = source
        self.stream = stream
        self.values = values
        self.attempt = 0
        self.outputs: list[Any] = []
        self.sent_at: float | None = None
        self.done = False
        self.dead: str | None = None
        self.multi = False  # some output is anchored to other rows too (a _Multi)


class _Dead(NamedTuple):
    source: str
    stream: str
    values: list[Any]
    error: str
    attempts: int


class _Lease:
    """One partition's session with an engine (the :class:`~._sync.Session`
    that :func:`~._sync.pump` drives)."""

    _next_id = 0

    def __init__(self, engine: _Engine, opts: _Options) -> None:
        _Lease._next_id += 1
        self.id = _Lease._next_id
        self.engine = engine
        self.opts = opts
        self.rows: dict[int, _Row] = {}
        self.seq = 0
        self.release_next = 0
        self.ready: list[Any] = []
        self.error: BaseException | None = None
        self.lot = trio.lowlevel.ParkingLot()
        self.single = engine.spec.single_source
        self.counters = {"rows_in": 0, "tuples_out": 0, "acked": 0, "failed": 0, "retried": 0,
                         "dead_letter": 0, "unanchored": 0, "warm_reuse": 1 if engine.leases else 0}
        engine.leases += 1
        self.stats0 = engine.snapshot()
        self.restarts0 = self._restarts()
        self.t0 = time.monotonic()
        self.timeout = engine.runtime.acker.timeout
        self.emptied_at: float | None = None  # when the last row was resolved
        self._last_root: int | None = None  # cache: root -> row of the last output
        self._last_row: _Row | None = None
        self._last_attempt = -1

    def _restarts(self) -> int:
        return sum(s.restarts for s in self.engine.runtime.stats.values())

    def wake(self) -> None:
        if len(self.lot):
            self.lot.unpark_all()

    async def _wait(self, timeout: float) -> None:
        with trio.move_on_after(timeout):
            await self.lot.park()

    def _check(self) -> None:
        if self.error is not None:
            raise self.error
        failure = self.engine.failure()
        if failure is not None:
            raise failure
        if self.opts.stateful and self._restarts() > self.restarts0:
            names = [n for n, s in self.engine.runtime.stats.items() if s.restarts > self.stats0.get(n, {}).get("restarts", 0)]
            recent = "\n  ".join(_recent_errors().since(self.t0))
            self.error = StatefulBoltCrashed(
                f"a process of stateful component(s) {names} died mid-partition; its in-memory state is lost, so "
                "this Spark task fails and Spark reruns the whole partition with a fresh process "
                "(spark.task.maxFailures; locally use master local[N,F])" + (f"\n  {recent}" if recent else ""),
                component=names[0] if names else None,
                task=next((t.task_id for t in self.engine.bolt_tasks if names and t.name == names[0]), None),
            )
            raise self.error

    # -- fed from the partition (sync side, through pump) ------------------------------

    async def exchange(self, items: list[Any]) -> list[Any]:
        self._check()
        while len(self.rows) >= self.opts.max_in_flight:
            await self._wait(0.25)
            self._check()
        if self.engine.direct is not None:
            return self._feed(items)
        feeders = self.engine.feeders
        single = self.single
        rows = self.rows
        lid = self.id
        touched = set()
        for item in items:
            if single is not None:
                source, stream = single
                values = item
            else:
                source, stream, values = item
            seq = self.seq
            self.seq += 1
            rows[seq] = _Row(source, stream, values)
            f = feeders[source]
            f.queue.append(((lid, seq, 0), stream, values))
            touched.add(f)
        for f in touched:
            f.kick()
        self.counters["rows_in"] += len(items)
        return self._take()

    def _feed(self, items: list[Any]) -> list[Any]:
        """The direct lane (:class:`_DirectBolt`): each row straight into
        the inbox of the bolt task its grouping picks."""
        source, stream = self.single  # type: ignore[misc]
        grouping = self.engine.direct
        tasks = self.engine.runtime.tasks
        one = tasks[grouping.tasks[0]] if len(grouping.tasks) == 1 else None
        src_task = self.engine.feeders[source].task_id
        rows = self.rows
        lid = self.id
        now = trio.current_time()
        for values in items:
            seq = self.seq
            self.seq = seq + 1
            row = rows[seq] = _Row(source, stream, values)
            row.sent_at = now
            t = one if one is not None else tasks[grouping.choose(values)[0]]
            t.inbox.append(_new_tuple(Delivery, (values, source, stream, src_task, (lid, seq, 0), False)))
        for t in self.engine.bolt_tasks:
            t.kick()
        self.counters["rows_in"] += len(items)
        return self._take()

    def _resend(self, seq: int, row: _Row) -> None:
        """Replay a row (its attempt already counted up)."""
        eng = self.engine
        if eng.direct is None:
            f = eng.feeders[row.source]
            f.queue.append(((self.id, seq, row.attempt), row.stream, row.values))
            f.kick()
            return
        grouping = eng.direct
        t = eng.runtime.tasks[grouping.choose(row.values)[0]]
        row.sent_at = trio.current_time()
        t.deliver(_new_tuple(Delivery, (row.values, row.source, row.stream, eng.feeders[row.source].task_id,
                                        (self.id, seq, row.attempt), False)))

    async def drain(self) -> tuple[list[Any], bool]:
        while True:
            self._check()
            out = self._take()
            done = False
            if not self.rows:
                if self.emptied_at is None:
                    self.emptied_at = trio.current_time()
                done = self.engine.quiet(self.emptied_at)
            if out or done:
                return out, done
            await self._wait(0.25 if self.rows else 0.005)

    async def close(self, ok: bool) -> dict[str, Any]:
        eng = self.engine
        eng.lease = None
        quiet = eng.quiet(self.emptied_at)
        for f in eng.feeders.values():
            f.queue.clear()
        if eng.direct is not None:  # rows of this lease not sent yet: nobody wants them now
            for t in eng.bolt_tasks:
                t.inbox.clear()
        after = eng.snapshot()
        comps = {name: {k: after[name][k] - self.stats0.get(name, {}).get(k, 0) for k in _STAT_KEYS} for name in after}
        counters: dict[str, Any] = dict(self.counters)
        counters["restarts"] = sum(c["restarts"] for c in comps.values())
        counters["components"] = comps
        reusable = (ok and self.error is None and self.opts.warm and not self.opts.stateful and not self.rows
                    and quiet and eng.healthy())
        eng.pool.give_back(eng, reusable)
        return counters

    def _take(self) -> list[Any]:
        # Always hand over a list the loop will never touch again: the caller
        # reads it in another thread while this loop keeps releasing outputs.
        out = self.ready
        self.ready = []
        return out

    # -- called by the runtime (inside route / settle) -----------------------------------

    def output(self, component: str, stream: str, values: list[Any], roots: list[int]) -> None:
        rec = (component, stream, values)
        if not roots:
            self._unanchored(rec)
            return
        if len(roots) == 1 and roots[0] == self._last_root:
            # The common case: more emits anchored to the same tree.
            row = self._last_row
            if row.attempt == self._last_attempt and self.engine.runtime.acker.roots.get(roots[0]) is not None:
                row.outputs.append(rec)
                return
        acker_roots = self.engine.runtime.acker.roots
        rows = []
        for r in roots:
            root = acker_roots.get(r)
            if root is None:
                return  # the tree already failed: this attempt's outputs are void
            lid, seq, attempt = root.msg_id
            row = self.rows.get(seq)
            if lid != self.id or row is None or row.attempt != attempt:
                return
            rows.append(row)
        self._hold(rec, rows)
        if len(rows) == 1:
            self._last_root, self._last_row, self._last_attempt = roots[0], rows[0], rows[0].attempt

    def _unanchored(self, rec: tuple[str, str, list[Any]]) -> None:
        """An output tied to no row: released at once."""
        self.counters["unanchored"] += 1
        self.counters["tuples_out"] += 1
        self.ready.append(rec)
        self.wake()

    def _hold(self, rec: tuple[str, str, list[Any]], rows: list[_Row]) -> None:
        """Keep an output until the trees of its rows complete (all of them:
        a :class:`_Multi`)."""
        if len(rows) == 1:
            rows[0].outputs.append(rec)
            return
        m = _Multi(rec, len(rows))
        for row in rows:
            row.outputs.append(m)
            row.multi = True

    def current(self, tok: tuple[int, int, int]) -> _Row | None:
        """The direct lane: the row of a tuple's tree, if that attempt is
        still alive."""
        lid, seq, attempt = tok
        row = self.rows.get(seq)
        if lid != self.id or row is None or row.attempt != attempt or row.done:
            return None
        return row

    def direct_output(self, rec: tuple[str, str, list[Any]], toks: list[Any]) -> None:
        """The direct lane's :meth:`output`: an emit anchored to the trees
        ``toks`` (none: unanchored, released at once)."""
        toks = [t for t in toks if type(t) is tuple]  # a tick tuple belongs to no tree
        if not toks:
            self._unanchored(rec)
            return
        rows = []
        for tok in dict.fromkeys(toks):
            row = self.current(tok)
            if row is None:
                return  # a tree that already failed: this attempt's outputs are void
            rows.append(row)
        self._hold(rec, rows)

    def acked(self, toks: list[Any]) -> None:
        """The direct lane: :meth:`notice` of ``"ack"`` for a run of trees,
        without a call per row when rows are released in any order."""
        if self.opts.ordered:
            for tok in toks:
                if type(tok) is tuple:  # not a tick's
                    self.notice("ack", tok)
            return
        rows = self.rows
        lid = self.id
        ready = self.ready
        n = out = 0
        for tok in toks:
            if type(tok) is not tuple:
                continue
            l, seq, attempt = tok
            row = rows.get(seq)
            if l != lid or row is None or row.attempt != attempt or row.done:
                continue
            n += 1
            del rows[seq]
            if row.multi:
                self._release(row)
            else:
                ready.extend(row.outputs)
                out += len(row.outputs)
        c = self.counters
        c["acked"] += n
        c["tuples_out"] += out
        self.wake()

    def is_current(self, msg_id: Any) -> bool:
        """Whether the lease still waits for this attempt of its row."""
        lid, seq, attempt = msg_id
        row = self.rows.get(seq)
        return lid == self.id and row is not None and row.attempt == attempt and not row.done

    def notice(self, kind: str, msg_id: Any) -> None:
        lid, seq, attempt = msg_id
        row = self.rows.get(seq)
        if lid != self.id or row is None or row.attempt != attempt or row.done:
            return
        if kind == "ack":
            self.counters["acked"] += 1
            row.done = True
            self._resolve(seq, row)
        else:
            self.counters["failed"] += 1
            for o in row.outputs:
                if type(o) is _Multi:
                    o.dead = True
            row.outputs = []
            row.multi = False
            row.attempt += 1
            if row.attempt <= self.opts.max_retries:
                self.counters["retried"] += 1
                self._resend(seq, row)
            else:
                row.done = True
                row.dead = self._cause(row)
                self.counters["dead_letter"] += 1
                if self.opts.dead_letter:
                    self._resolve(seq, row)
                else:
                    self.error = RowFailed(
                        f"input row {seq} of this partition ({_short(row.values)}) failed {row.attempt} times "
                        f"(max_retries={self.opts.max_retries}): {row.dead}. Fix the bolt, raise max_retries or "
                        "topology.message.timeout.secs, or pass dead_letter to keep going and collect such rows"
                    )
        self.wake()

    def _cause(self, row: _Row) -> str:
        now = trio.current_time()
        if row.sent_at is not None and now - row.sent_at >= self.timeout - 0.05:
            cause = f"timed out (its tree did not complete within topology.message.timeout.secs={self.timeout:g})"
        else:
            cause = "failed (a bolt failed a tuple of its tree, or the process holding one crashed)"
        recent = _recent_errors().since(self.t0)
        if recent:
            cause += "; recent runtime errors: " + " | ".join(recent[-3:])
        return cause

    def _resolve(self, seq: int, row: _Row) -> None:
        rows = self.rows
        if not self.opts.ordered:
            del rows[seq]
            self._release(row)
            return
        while True:
            head = rows.get(self.release_next)
            if head is None or not head.done:
                return
            del rows[self.release_next]
            self.release_next += 1
            self._release(head)

    def _release(self, row: _Row) -> None:
        if row.dead is not None:
            self.ready.append(_Dead(row.source, row.stream, row.values, row.dead, row.attempt))
            return
        ready = self.ready
        if not row.multi:
            ready.extend(row.outputs)
            self.counters["tuples_out"] += len(row.outputs)
            return
        n = 0
        for o in row.outputs:
            if type(o) is _Multi:
                o.pending -= 1
                if o.pending or o.dead:
                    continue
                o = o.rec
            ready.append(o)
            n += 1
        self.counters["tuples_out"] += n


class _Pool:
    """Warm engines of this worker, keyed by spec."""

    def __init__(self, host: TrioHost) -> None:
        self.host = host
        self.idle: dict[str, list[_Engine]] = {}
        self.engines: set[_Engine] = set()
        self.max_idle = 4
        host.on_shutdown(self.shutdown)
        host.nursery.start_soon(self._reaper)

    @staticmethod
    def of(host: TrioHost) -> "_Pool":
        pool = getattr(host, "_multilang_pool", None)
        if pool is None:
            pool = _Pool(host)
            host._multilang_pool = pool  # type: ignore[attr-defined]
        return pool

    async def lease(self, spec: _Spec, opts: _Options) -> _Lease:
        engine = None
        if opts.warm and not opts.stateful:
            idle = self.idle.get(spec.key, [])
            while idle:
                e = idle.pop()
                if e.healthy():
                    engine = e
                    break
                self.host.nursery.start_soon(self._stop, e)
        if engine is None:
            engine = _Engine(spec, self)
            engine.idle_timeout = opts.idle_timeout  # type: ignore[attr-defined]
            self.engines.add(engine)
            await self.host.nursery.start(engine.serve)
        lease = _Lease(engine, opts)
        engine.lease = lease
        return lease

    def give_back(self, engine: _Engine, reusable: bool) -> None:
        idle = self.idle.setdefault(engine.spec.key, [])
        if reusable and len(idle) < self.max_idle:
            engine.idle_since = trio.current_time()
            idle.append(engine)
        else:
            self.host.nursery.start_soon(self._stop, engine)

    async def _stop(self, engine: _Engine) -> None:
        try:
            await engine.stop()
        finally:
            self.engines.discard(engine)

    async def _reaper(self) -> None:
        while True:
            await trio.sleep(2.0)
            now = trio.current_time()
            for key, idle in list(self.idle.items()):
                keep = []
                for e in idle:
                    if now - e.idle_since > getattr(e, "idle_timeout", 60.0) or not e.healthy():
                        self.host.nursery.start_soon(self._stop, e)
                    else:
                        keep.append(e)
                self.idle[key] = keep

    async def shutdown(self) -> None:
        self.idle.clear()
        with trio.move_on_after(20):
            async with trio.open_nursery() as n:
                for e in list(self.engines):
                    n.start_soon(self._stop, e)


async def _open_lease(host: TrioHost, spec: _Spec, opts: _Options) -> _Lease:
    return await _Pool.of(host).lease(spec, opts)


_heap_frozen = False


def _freeze_worker_heap() -> None:
    """Once per Python worker: collect, then move every object alive now
    (PySpark, pyarrow, trio, this module, the warm runtime) out of the
    collector's sight with :func:`gc.freeze` (module docstring, "Garbage
    collection"). Off with ``MULTILANG_SPARK_GC_FREEZE=0`` in the workers'
    environment."""
    global _heap_frozen
    if _heap_frozen:
        return
    _heap_frozen = True
    if os.environ.get("MULTILANG_SPARK_GC_FREEZE", "1").strip() != "0":
        gc.collect()
        gc.freeze()


def _run_partition(spec: _Spec, opts: _Options, items: Iterable[Any],
                   report: Callable[[dict[str, Any]], None] | None) -> Iterator[list[Any]]:
    """The sync side of one partition: yields lists of released records
    ((component, stream, values) tuples and ``_Dead`` records)."""
    host = TrioHost.get()
    lease = host.run(_open_lease, host, spec, opts)
    _freeze_worker_heap()
    yield from pump(host, lease, items, chunk=opts.batch_size, on_close=report)


def _short(values: Any, limit: int = 200) -> str:
    text = orjson.dumps(values, default=repr).decode()
    return text if len(text) <= limit else text[:limit] + "..."


# --- counters -------------------------------------------------------------------------------


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


def _options(max_retries: int, dead_letter: str | None, ordered: bool, warm: bool, stateful: bool,
             max_in_flight: int, batch_size: int, idle_timeout: float, allowed: tuple[str, ...]) -> _Options:
    if dead_letter in ("raise",):
        dead_letter = None
    if dead_letter is not None and dead_letter not in allowed:
        raise ValueError(f"dead_letter must be None (raise) or {' or '.join(map(repr, allowed))}, got {dead_letter!r}")
    if max_retries < 0 or max_in_flight < 1 or batch_size < 1:
        raise ValueError("max_retries must be >= 0, max_in_flight and batch_size >= 1")
    return _Options(max_retries, dead_letter, ordered, warm, stateful, max_in_flight, batch_size, idle_timeout)


# --- RDD: mapPartitions --------------------------------------------------------------------


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
) -> _PartitionFn:
    """A function for ``rdd.mapPartitions(fn)`` running ``spec``'s bolts on each partition.

    Each element is one input tuple (a Row, tuple or list gives its values;
    anything else is a 1-tuple); ``input_fields`` names them (needed only if
    a bolt fields-groups on the input). Yields each output tuple as a Python
    tuple, or ``(stream, tuple)`` with ``with_stream``; with
    ``dead_letter="record"`` also :class:`DeadLetter` records. ``fields``
    declares a single command's output fields. ``fn.counters`` is the
    :class:`BoltCounters` (created if a SparkContext is active; pass
    ``counters=False`` for none). Other options: module docstring.
    """
    opts = _options(max_retries, dead_letter, ordered, warm, stateful, max_in_flight, batch_size, idle_timeout,
                    ("record",))
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


# --- DataFrame: mapInArrow -------------------------------------------------------------------


class _ArrowFn:
    """The ``mapInArrow`` function: record batches in, record batches out."""

    def __init__(self, spec: _Spec, opts: _Options, counters: BoltCounters | None, schema_json: str,
                 n_out: int, input_fields: list[str], decimal_cols: list[int]) -> None:
        self.spec = spec
        self.opts = opts
        self.counters = counters
        self.schema_json = schema_json
        self.n_out = n_out
        self.input_fields = input_fields
        self.decimal_cols = decimal_cols

    def _report(self, c: dict[str, Any]) -> None:
        if self.counters is not None:
            self.counters.add(c)

    def _rows(self, batches: Iterable[Any]) -> Iterator[list[Any]]:
        dec = self.decimal_cols
        for b in batches:
            cols = [c.to_pylist() for c in b.columns]
            for j in dec:
                cols[j] = [None if v is None else float(v) for v in cols[j]]
            yield from map(list, zip(*cols))

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        schema = to_arrow_schema(StructType.fromJson(orjson.loads(self.schema_json)), timezone="UTC")
        builder = _BatchBuilder(pa, schema, self.n_out, self.opts.dead_letter == "column", self.input_fields)
        limit = max(self.opts.batch_size, 1024)
        for out in _run_partition(self.spec, self.opts, self._rows(batches), self._report):
            for rec in out:
                builder.add(rec)
            if builder.size >= limit:
                yield builder.flush()
        if builder.size:
            yield builder.flush()


class _BatchBuilder:
    def __init__(self, pa: Any, schema: Any, n_out: int, dead: bool, input_fields: list[str]) -> None:
        self.pa = pa
        self.schema = schema
        self.n_out = n_out
        self.dead = dead
        self.input_fields = input_fields
        self.recs: list[Any] = []

    @property
    def size(self) -> int:
        return len(self.recs)

    def add(self, rec: Any) -> None:
        if type(rec) is _Dead:
            if self.dead:
                self.recs.append(rec)
            return
        if len(rec[2]) != self.n_out:
            names = [f.name for f in self.schema][: self.n_out]
            raise OutputSchemaError(
                f"component {rec[0]!r} emitted a tuple of {len(rec[2])} values on stream {rec[1]!r}, but the output "
                f"schema has {self.n_out} fields {names}: {_short(rec[2])}. Emit exactly the schema's fields, in "
                "order, or change output_schema"
            )
        self.recs.append(rec)

    def flush(self) -> Any:
        pa = self.pa
        recs, self.recs = self.recs, []
        arrays = []
        for j in range(self.n_out):
            f = self.schema.field(j)
            col = [None if type(r) is _Dead else r[2][j] for r in recs]
            try:
                arrays.append(pa.array(col, type=f.type))
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                self._explain(recs, j, f)
                raise
        if self.dead:
            status = ["dead_letter" if type(r) is _Dead else "ok" for r in recs]
            inputs = [orjson.dumps(dict(zip(self.input_fields, r.values)) if len(self.input_fields) == len(r.values)
                                   else r.values, default=str).decode() if type(r) is _Dead else None for r in recs]
            errors = [r.error if type(r) is _Dead else None for r in recs]
            arrays += [pa.array(status, pa.string()), pa.array(inputs, pa.string()), pa.array(errors, pa.string())]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _explain(self, recs: list[Any], j: int, f: Any) -> None:
        pa = self.pa
        for r in recs:
            if type(r) is _Dead:
                continue
            v = r[2][j]
            try:
                pa.array([v], type=f.type)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                raise OutputSchemaError(
                    f"component {r[0]!r} emitted {_short(r[2])} on stream {r[1]!r}: value {v!r} "
                    f"({type(v).__name__}) does not fit field {f.name!r} of type {f.type} in the output schema "
                    f"({exc}). Emit that type or change output_schema"
                ) from None


def _as_struct(schema: Any) -> Any:
    from pyspark.sql.types import DataType, StructType

    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        parsed = DataType.fromDDL(schema)
        if isinstance(parsed, StructType):
            return parsed
    raise TypeError(f"output_schema must be a StructType or a DDL string like 'word string, count bigint', got {schema!r}")


class _DataFrameTransform:
    """``df.transform(t)``: runs the bolts over ``df`` with ``mapInArrow``."""

    def __init__(self, spec: Any, output_schema: Any, kw: dict[str, Any], opts: _Options,
                 counters: BoltCounters | None) -> None:
        self.spec = spec
        self.output_schema = output_schema
        self.kw = kw
        self.opts = opts
        self.counters = counters

    def __call__(self, df: Any) -> Any:
        from pyspark.sql.types import BinaryType, DecimalType, StringType, StructField, StructType

        schema = _as_struct(self.output_schema)
        n_out = len(schema.fields)
        cols = list(df.columns)
        if len(set(cols)) != len(cols):
            raise TopologyError(f"the input DataFrame has duplicate column names {cols}; rename them first")
        decimal_cols = []
        for j, f in enumerate(df.schema.fields):
            if isinstance(f.dataType, BinaryType):
                raise TopologyError(f"column {f.name!r} is binary, which has no JSON form; cast it (e.g. base64) first")
            if isinstance(f.dataType, DecimalType):
                decimal_cols.append(j)
        s = _make_spec(self.spec, input_fields=cols, **self.kw)
        for comp, stream in s.outputs:
            declared = s.fields_of(comp, stream)
            if declared != ANY_FIELDS and len(declared) != n_out:
                raise TopologyError(
                    f"component {comp!r} declares {len(declared)} fields {declared} on stream {stream!r}, but the "
                    f"output schema has {n_out} fields {schema.fieldNames()}"
                )
        if self.opts.dead_letter == "column":
            clash = [c for c in DEAD_LETTER_COLUMNS if c in schema.fieldNames()]
            if clash:
                raise TopologyError(f"output_schema already has dead-letter column(s) {clash}")
            schema = StructType([StructField(f.name, f.dataType, True) for f in schema.fields]
                                + [StructField(c, StringType(), c != "_status") for c in DEAD_LETTER_COLUMNS])
        fn = _ArrowFn(s, self.opts, self.counters, schema.json(), n_out, cols, decimal_cols)
        return df.mapInArrow(fn, schema)


def multilang_bolts(
    spec: Any,
    *,
    output_schema: Any,
    fields: Sequence[str] | None = None,
    output: str | tuple[str, str] | None = None,
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
) -> _DataFrameTransform:
    """A DataFrame transform running ``spec``'s bolts over ``mapInArrow``:
    ``df.transform(multilang_bolts(spec, output_schema="word string"))``.

    Each row is one input tuple (its columns, in order, are the tuple's values
    and fields). Each released output tuple becomes one row of
    ``output_schema`` (a StructType or DDL string), by position; a tuple of
    the wrong length or with a value of the wrong type fails the task with
    :class:`OutputSchemaError` naming the component, the stream and the tuple.
    ``dead_letter="column"`` adds :data:`DEAD_LETTER_COLUMNS`. Works on batch
    and streaming DataFrames. ``t.counters`` is the :class:`BoltCounters`.
    """
    opts = _options(max_retries, dead_letter, ordered, warm, stateful, max_in_flight, batch_size, idle_timeout,
                    ("column",))
    kw = dict(fields=fields, output=output, conf=conf, resource_dir=resource_dir, cwd=cwd, env=env,
              max_in_flight=max_in_flight)
    return _DataFrameTransform(spec, output_schema, kw, opts, _default_counters(counters))


def apply_bolts(df: Any, spec: Any, *, output_schema: Any, **options: Any) -> Any:
    """``multilang_bolts(spec, output_schema=..., **options)(df)``."""
    return multilang_bolts(spec, output_schema=output_schema, **options)(df)


# --- the engine: a topology file on Spark ---------------------------------------------------


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

    rt = Runtime(sub, on_tracked_output=collect)
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


def _values_of(rec: tuple[str, str, Any]) -> Any:
    return rec[2]


def _last_by_key(idx: list[int], it: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    last: dict[Any, Any] = {}
    for values in it:
        last[tuple(_hashable(values[i]) for i in idx)] = values
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
        records = sorted(keyed.values(), key=lambda r: [_sort_key(r[k]) for k in out.key or []])
        if on_record is not None:
            for rec in records:
                on_record(rec)
    return records


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
