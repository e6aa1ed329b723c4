"""The topology engine: ``multilang run --engine spark`` as one Structured
Streaming query (no RDD API, so it also runs under Spark Connect).

* Each spout task is a ``format("multilang")`` source (a spout with
  parallelism N is N sources, N processes, each told its task index), its
  replay log in the checkpoint location; the sources are unioned.
* Each micro-batch goes through ``foreachBatch``: a routing stage, then one
  ``mapInArrow`` stage per bolt in topological order (``stages.py``),
  fields / global / all groupings as a repartitioning on the task index
  computed with the embedded engine's key -> task mapping; then the rows of
  the output view, the stages' counters and the dead letters are written to
  ``<checkpoint>/batches/<batch id>`` (overwritten when Spark re-runs the
  batch: idempotent).
* Stateful bolts (§9.7) keep their state in a store versioned by batch id
  (``state.py``), so a re-run batch starts from the state before it.
* The checkpoint location is a path or a URI (``storage.Location``): the
  driver reads and writes it through pyarrow's file systems only.
* The driver follows the query's progress: one line per micro-batch, the
  stop at ``--duration`` / ``--max-tuples``, and at the end the output view
  over every batch Spark committed (an earlier, crashed run's included).

The model and its guarantees are written down in docs/SPARK.md, "Topologies
on Spark".
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import logging

import orjson

from multilang.errors import TopologyError
from multilang.messages import DEFAULT_STREAM
from multilang.shellbolt import (
    ANY_FIELDS, PythonBolt, ShellBolt, Topology, blank_row, child_pids, grouping_class, hashable, load_topology,
    scratch_folder, sort_key,
)

from .._engine.ship import ship
from .._engine.storage import Location
from .stages import DEAD, KEPT, OUT, ROW_SCHEMA, STATS, Plan, RouteFn, StageFn, stage_spec

log = logging.getLogger("multilang.spark")

__all__ = ["SparkRunResult", "run_topology"]

#: rows of a micro-batch a spout task reads at most (the source's maxBatchSize)
_BATCH_KEY = "multilang.spark.max.tuples.per.trigger"  # shellbolt/_model/conf.py
#: the longest a micro-batch's planning waits for a spout task to fill it (the source's maxBatchDurationMs)
_DELAY_KEY = "multilang.spark.max.trigger.delay.ms"  # shellbolt/_model/conf.py


@dataclass
class SparkRunResult:
    """What :func:`run_topology` did: the output records (as the embedded
    engine prints them), counters per component summed over the batches, the
    spout tuples read, the micro-batches run and the inputs given up on."""

    outputs: list[dict[str, Any]]
    counters: dict[str, dict[str, Any]]
    spout_tuples: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    stopped_by: str = "done"

    @property
    def ok(self) -> bool:
        return not self.dead_letters


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


def _check(topo: Topology) -> list[str]:
    """Refuse what the Spark engine cannot run, naming the component; returns the bolt order."""
    order = _bolt_order(topo)
    for c in topo.components.values():
        if c.kind == "spout":
            if not isinstance(c.impl, ShellBolt):
                raise TopologyError(f"spout {c.name!r}: the Spark engine runs shell spouts (a command), "
                                    f"not {type(c.impl).__name__}")
            if len(c.outputs) != 1:
                raise TopologyError(f"spout {c.name!r}: the Spark engine reads one stream per spout; it declares "
                                    f"{sorted(c.outputs)}")
        else:
            if not isinstance(c.impl, (ShellBolt, PythonBolt)):
                raise TopologyError(f"bolt {c.name!r}: {type(c.impl).__name__} does not run on Spark")
            for i in c.inputs:
                if grouping_class(i.grouping).direct:
                    raise TopologyError(f"bolt {c.name!r}: direct groupings are not supported by the Spark engine")
    return order


def _plan(topo: Topology, order: list[str], state_dir: str, max_retries: int) -> Plan:
    subs: dict[tuple[str, str], list[tuple[str, str, list[int], int]]] = {}
    keyed: dict[str, int] = {}
    for name in order:
        c = topo.components[name]
        for i in c.inputs:
            fields = topo.components[i.source].outputs[i.stream]
            idx = [fields.index(f) for f in i.fields] if grouping_class(i.grouping).takes_fields else []
            subs.setdefault((i.source, i.stream), []).append((name, i.grouping, idx, c.parallelism))
        if any(grouping_class(i.grouping).keyed for i in c.inputs):
            keyed[name] = c.parallelism
    out = topo.output
    outputs: dict[tuple[str, str], list[int] | None] = {}
    for c in topo.components.values():
        for stream, fields in c.outputs.items():
            if topo.subscribers(c.name, stream):
                continue
            if out.component is not None and (c.name != out.component or stream != (out.stream or DEFAULT_STREAM)):
                continue
            keyed_view = bool(out.key) and out.component is not None
            outputs[(c.name, stream)] = [fields.index(k) for k in out.key or []] if keyed_view else None
    plan = Plan(subs, outputs, keyed=keyed, state_dir=state_dir, max_retries=max_retries)
    for name in order:
        c = topo.components[name]
        ins = [(i.source, i.stream, topo.components[i.source].outputs[i.stream]) for i in c.inputs]
        plan.specs[name] = stage_spec(name, c.impl, ins, list(c.outputs), dict(topo.conf), dict(c.conf),
                                      str(topo.resource_dir), _in_flight(name in keyed))
    plan.task_ids = {name: list(topo.components[name].tasks) for name in order}
    return plan


def _in_flight(keyed: bool) -> int:
    """Rows of a stage partition in flight at once. A stateful task's acks
    wait for its checkpoint, and a full window forces one: 1,000 rows made
    a checkpoint (and an fsync) per 1,000 words of a batch; the partition
    holds its rows anyway (bounded by the per-trigger cap)."""
    return 20_000 if keyed else 1000


_LOCAL = re.compile(r"^local(?:\[(\*|\d+)\])?$")


def with_task_retries(master: str, spark_conf: dict[str, str] | None = None) -> str:
    """``local`` / ``local[N]`` / ``local[*]`` with Spark's task retries, as a
    cluster has them (:func:`task_attempts`); other masters as given
    (``local[N,F]`` says its own)."""
    retries = task_attempts(spark_conf)
    m = _LOCAL.match(master.strip())
    if m is None:
        return master
    return f"local[{m.group(1) or 1},{retries}]"


_MAX_FAILURES = "spark.task.maxFailures"


def task_attempts(spark_conf: dict[str, str] | None) -> int:
    """The attempts a task gets: ``spark.task.maxFailures`` of ``spark_conf``
    (-c), by default 4 as on a cluster. A local master reads no
    ``spark.task.maxFailures`` (its attempts are the F of ``local[N,F]``):
    given with -c, it was ignored (a trial's ``abc`` ran with 4 attempts, and
    so did an ``8``). TopologyError for a value Spark would not take."""
    given = (spark_conf or {}).get(_MAX_FAILURES)
    if given is None:
        return 4
    text = str(given).strip()
    if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:  # (Spark's Integer.parseInt, and at least one attempt)
        raise TopologyError(f"-c {_MAX_FAILURES}={given}: not a number of attempts; Spark takes a whole number "
                            "of at least 1 (the default is 4)")
    return int(text)


_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
# A failed task's and a failed query's errors, each with its Python and Java stacks (a failing stateful bolt:
# about 500 lines): the multilang.spark log says what the bolt did, and the CLI says why the run stopped.
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.query.name = org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution
logger.query.level = off
logger.query3.name = org.apache.spark.sql.execution.streaming.MicroBatchExecution
logger.query3.level = off
"""


def _local_session(SparkSession: Any, master: str, name: str, remote: str | None = None,
                   spark_conf: dict[str, str] | None = None) -> Any:
    """A session for the CLI: this interpreter for the Python workers, no UI,
    no progress bars, Spark's own logging at ERROR (stderr), then the
    user's ``spark_conf``. ``remote``: a Spark Connect URL (``sc://host:port``,
    or ``local[N]`` for a local server).

    Made in a thread of its own, which the main thread waits for: PySpark's
    SparkContext, made in the main thread, installs a SIGINT handler that
    calls into the JVM, and a Ctrl-C while the main thread was already in
    such a call (the rest of the start-up) made py4j log three tracebacks
    of a reentrant call (a trial). The caller's handler stays in place, and
    a signal finds the main thread waiting, not inside py4j. If it raises
    there (a KeyboardInterrupt), the JVM being started is killed: started a
    moment before, it outlived the run (minutes, in a test)."""
    if threading.current_thread() is not threading.main_thread():
        return _new_session(SparkSession, master, name, remote, spark_conf)
    made: dict[str, Any] = {}
    abandoned = threading.Event()

    def make() -> None:
        try:
            session = _new_session(SparkSession, master, name, remote, spark_conf)
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            made["error"] = exc
            return
        if abandoned.is_set():  # (up after all: stopped before the process ends, which waits for this thread)
            session.stop()
        made["session"] = session

    before = set(child_pids(os.getpid()))
    thread = threading.Thread(target=make, name="multilang-spark-session")
    thread.start()
    try:
        thread.join()
    except BaseException:
        abandoned.set()
        for pid in set(child_pids(os.getpid())) - before:  # the JVM PySpark launched (spark-submit, exec'ed into java)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        raise
    if "error" in made:
        raise made["error"]
    return made["session"]


def _new_session(SparkSession: Any, master: str, name: str, remote: str | None,
                 spark_conf: dict[str, str] | None) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local") or (remote or "").startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no slow hostname lookups
    conf_dir = scratch_folder("multilang-spark-")  # (a killed driver's: swept by the next run)
    atexit.register(shutil.rmtree, conf_dir, True)
    log_conf = os.path.join(conf_dir, "log4j2.properties")
    with open(log_conf, "w") as f:
        f.write(_LOG4J)
    conf = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.sql.streaming.stopTimeout": "30s",
            "spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile=file:{log_conf}", **(spark_conf or {})}
    if remote is not None and remote.startswith("local"):
        return _local_connect(with_task_retries(remote, spark_conf), name, conf)
    if remote is not None:  # the server's own settings are not ours to change
        return SparkSession.builder.appName(name).remote(remote).getOrCreate()
    _jvm_alone({"spark.master": master, "spark.app.name": name, **conf})
    spark = SparkSession.builder.appName(name).master(master).config(map=conf).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _jvm_alone(conf: dict[str, str], redact: bool = False) -> None:
    """Start this process's Spark JVM (PySpark's gateway, with ``conf`` as
    spark-submit takes it) in a session of its own, as the component
    processes run: a signal sent to the CLI's process group (a terminal's
    Ctrl-C, ``timeout``, systemd's stop, ``kill -- -PGID``) reaches the
    CLI, which stops the query after its batch and writes the output, and
    not the JVM and its Python workers too (a trial: a SIGTERM to the group
    ended the JVM at once; an empty output file, and a traceback of
    PySpark's accumulator server). The SparkContext made next takes it up.
    The JVM still ends with this process: it exits when its stdin, a pipe
    from here, closes. Nothing if this process has a JVM already (PySpark
    keeps it for good). ``redact``: the JVM's stderr (its Python workers'
    too) comes through :func:`_redacted`."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if getattr(SparkContext, "_gateway", None) is not None:
        return
    popen: dict[str, Any] = {"start_new_session": True}
    if redact:  # (copied from the start: what a JVM that fails to start says is shown too)
        read, write = os.pipe()
        popen["stderr"] = write
        threading.Thread(target=_redacted, args=(read,), name="multilang-jvm-stderr", daemon=True).start()
    try:
        gateway = launch_gateway(SparkConf().setAll(list(conf.items())), popen_kwargs=popen)
    finally:
        if redact:
            os.close(write)  # (the JVM holds its own: the copy ends when it exits)
    SparkContext._ensure_initialized(gateway=gateway)  # (what SparkContext(gateway=...) does with it first)


def kill_spark_jvm() -> None:
    """End this process's Spark JVM now (SIGKILL to its process group: its
    Python workers too), if it started one (:func:`_jvm_alone`): what a
    second signal to ``multilang run --engine spark`` does before it says
    "interrupted". Left to end when this process's exit closes its stdin,
    the JVM printed a stack trace of its stream thread (its RPC env stopped
    under it) after that last line (a CI run). The components see the end of
    their input and exit, as at a kill of the driver (docs/SPARK.md)."""
    from pyspark import SparkContext

    proc = getattr(getattr(SparkContext, "_gateway", None), "proc", None)
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # (it leads its own session: _jvm_alone)
    except OSError:
        return
    proc.wait()


_TOKEN = re.compile(rb"(token=)[^;\s]+")


def _redacted(fd: int) -> None:
    """Copy the Spark Connect JVM's stderr to ours, line by line, without
    the server's token: PySpark's foreachBatch worker prints its URL with
    it ("... starting with url sc://localhost:PORT/;user_id=;token=...")."""
    with open(fd, "rb") as pipe:  # (buffered: a read per chunk, not per byte)
        for line in pipe:
            try:
                os.write(2, _TOKEN.sub(rb"\1<redacted>", line))
            except OSError:
                return


def _local_connect(master: str, name: str, conf: dict[str, str]) -> Any:
    """``--remote local[N]``: a Spark Connect server in this process for
    this run, as pyspark's ``remote("local[N]")`` starts one, but bound to
    127.0.0.1 on a free port (pyspark's binds every interface on 15002, so a
    second run, or anything else holding that port, made it fail), and with
    the CLI's quiet logging. It stops with the session (SPARK_LOCAL_REMOTE)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    with socket.socket() as probe:  # a free loopback port (the server binds it a moment later)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    opts = {**conf, "spark.app.name": name, "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port)}
    os.environ["SPARK_LOCAL_REMOTE"] = "1"
    # (the server's token, as _start_connect_server makes it when unset: its JVM, started now, reads it)
    os.environ.setdefault("SPARK_CONNECT_AUTHENTICATE_TOKEN", str(uuid.uuid4()))
    _jvm_alone({**opts, "spark.master": master}, redact=True)
    ConnectSession._start_connect_server(master, opts)  # what remote("local[N]") calls; keeps the runtime confs
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    # "localhost", as pyspark's own local URL: a local channel with the token, not TLS (ChannelBuilder)
    stop_timeout = "spark.sql.streaming.stopTimeout"  # the one runtime conf of ours; the rest are the server's
    return (ConnectSession.builder.remote(f"sc://localhost:{port}").appName(name)
            .config(stop_timeout, conf[stop_timeout]).getOrCreate())


def _shape(topo: Topology) -> dict[str, Any]:
    return {"topology": topo.name, "components": {n: [c.kind, c.parallelism] for n, c in sorted(topo.components.items())}}


def _claim(ck: Location, topo: Topology) -> None:
    """A checkpoint location serves one topology of one shape: refuse another
    (its offsets, replay logs and state would not fit)."""
    shape = _shape(topo)
    try:
        raw = ck.read("topology.json")
    except OSError as exc:
        raise TopologyError(f"--checkpoint {ck}: {exc}") from None
    if raw is not None:
        try:
            stored = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise TopologyError(f"--checkpoint {ck}: topology.json is unreadable ({exc}); use another "
                                "location") from None
        if stored != shape:
            if not isinstance(stored, dict):
                stored = {"topology": "?", "components": stored}
            raise TopologyError(
                f"--checkpoint {ck} holds a run of another topology or shape ({stored.get('topology')!r}: "
                f"{stored.get('components')}); this one is {shape['topology']!r}: {shape['components']}. Its offsets, "
                "replay logs and state would not fit: use another location")
        return
    try:
        ck.write(orjson.dumps(shape), "topology.json")
    except OSError as exc:
        raise TopologyError(f"--checkpoint {ck}: {exc.strerror or exc}") from None


def _shares(max_tuples: int | None, tasks: int) -> list[int | None]:
    """Each spout task's share of ``max_tuples`` (its source's ``maxTuples``),
    in the order of the sources: as even as integers allow, adding up to
    ``max_tuples``, so that the sources read at most that many in all, as
    host workers' spouts start (docs/WORKERS.md). Each source reading up to
    all of it, two spout tasks read 102 sentences for ``--max-tuples 51``."""
    if max_tuples is None:
        return [None] * tasks
    return [max_tuples // tasks + (i < max_tuples % tasks) for i in range(tasks)]


def _source(spark: Any, topo: Topology, name: str, task: int, ck: Location, batch: int,
            delay_ms: int, shipped: str, max_tuples: int | None) -> Any:
    from pyspark.sql import functions as F

    c = topo.components[name]
    impl = c.impl
    stream, fields = next(iter(c.outputs.items()))
    # the spout's handshake conf: the keys set (the source offers the spout batch alone, per multilang.extensions)
    conf = {k: v for k, v in {**topo.conf, **c.conf}.items() if v is not None}
    reader = (spark.readStream.format("multilang")
              .option("command", orjson.dumps(list(impl.command)).decode())
              .option("fields", ",".join(fields if fields != ANY_FIELDS else []))
              .option("archive", shipped)
              .option("cwd", str(impl.cwd or ""))
              .option("conf", orjson.dumps(conf, default=str).decode())
              .option("component", name)
              .option("stream", stream)
              .option("taskIndex", str(task))
              .option("parallelism", str(c.parallelism))
              .option("valuesFormat", "json")
              .option("maxBatchSize", str(batch))
              .option("maxTuples", "" if max_tuples is None else str(max_tuples))
              .option("maxBatchDurationMs", str(delay_ms))
              .option("replayLog", ck.spark_path("spouts", name, f"task-{task}")))
    if impl.env:
        reader = reader.option("env", orjson.dumps(impl.env).decode())
    return reader.load().select(
        F.lit(None).cast("string").alias("_for"), F.lit(task).cast("int").alias("_p"), F.lit(name).alias("_c"),
        F.lit(stream).alias("_s"), F.col("_values").alias("_v"), F.lit(0).cast("long").alias("_o"),
        F.lit(None).cast("string").alias("_key"))


class _BatchWriter:
    """``foreachBatch``: a micro-batch through every stage, its kept rows to
    ``<checkpoint>/batches/<id>`` (overwritten on a re-run)."""

    def __init__(self, plan: Plan, order: list[str], ck: Location) -> None:
        self.plan = plan
        self.order = order
        self.ck = ck

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        _end_with_the_server()
        df = df.mapInArrow(RouteFn(self.plan, batch_id), ROW_SCHEMA)
        for name in self.order:
            keys = self.plan.spread.get(name)
            if keys is not None:  # task t's rows in partition t: N tasks, N partitions
                df = (df.withColumn("_h", F.element_at(F.array(*map(F.lit, keys)), F.pmod("_p", F.lit(len(keys))) + 1))
                      .repartition(len(keys), "_h").drop("_h"))
            df = df.mapInArrow(StageFn(self.plan, name, batch_id), ROW_SCHEMA)
        (df.where(F.col("_for").isin(*KEPT)).repartition(1)  # a shuffle: coalesce(1) would run the last stage as one task
         .write.mode("overwrite").parquet(self.ck.spark_path(*batch_dir(batch_id))))


_watching = False


def _end_with_the_server() -> None:
    """In the Python process Spark Connect runs ``foreachBatch`` in (a
    child of the server's JVM): end it when the JVM ends. A trial killed
    the CLI (kill -9) under ``--remote local[N]``: the JVM exited, and this
    process went on (its Connect client retries an unreachable server for
    minutes). Nothing in a classic driver, where ``foreachBatch`` runs in
    the CLI's own process."""
    global _watching
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if _watching or spec is None or not spec.name.endswith(".foreach_batch_worker"):
        return
    _watching = True
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent != 1:
            time.sleep(0.5)
        os._exit(1)  # (its server is gone: nothing it does from now on can be committed)

    threading.Thread(target=watch, name="multilang-end-with-the-server", daemon=True).start()


def _spread(spark: Any, n: int) -> list[int]:
    """For N tasks, N ints whose Spark hash partitioning (``repartition(N,
    col)``: pmod(murmur3(v), N)) is 0, 1, ..., N-1: repartitioning on task
    t's int puts task t's rows alone in partition t. (Repartitioning on the
    task index itself may put two tasks in one partition: for N = 2 both
    land in partition 1, and one core does all the work.)"""
    from pyspark.sql import functions as F

    rows = spark.range(0, 64 * n).select(
        F.col("id").cast("int").alias("v"), F.pmod(F.hash(F.col("id").cast("int")), F.lit(n)).alias("p")).collect()
    first: dict[int, int] = {}
    for v, p in rows:
        first.setdefault(p, v)
    if len(first) != n:  # cannot be for a hash function worth the name
        raise RuntimeError(f"no int hashes to every one of {n} partitions among {64 * n}")
    return [first[t] for t in range(n)]


def batch_dir(batch_id: int) -> tuple[str, str]:
    """Where a micro-batch's kept rows are, below the checkpoint location."""
    return "batches", f"{batch_id:012d}"


def _committed(ck: Location) -> int:
    """The last batch id in Spark's commit log of the query (-1: none)."""
    return max((int(n) for n in ck.list("query", "commits") if n.isdigit()), default=-1)


class _Progress:
    """The driver's view of the run: each committed micro-batch's counters,
    read back from its batch directory, one line each."""

    def __init__(self, ck: Location, echo: Callable[[str], None] | None) -> None:
        self.ck = ck
        self.echo = echo
        self.seen = -1
        self.latencies: deque[float] = deque(maxlen=20)  # ms, the last batches' (Spark's triggerExecution)
        self.spouts: dict[str, int] = {}
        self.counters: dict[str, dict[str, int]] = {}
        self.batches = 0
        self.dead = 0
        self.t0 = time.monotonic()
        self.run_tuples = 0

    def poll(self, progress: list[dict[str, Any]]) -> None:
        upto = _committed(self.ck)
        by_id = {p.get("batchId"): p for p in progress}
        for b in range(self.seen + 1, upto + 1):
            self._batch(b, by_id.get(b))
        self.seen = max(self.seen, upto)

    def _batch(self, b: int, p: dict[str, Any] | None) -> None:
        t = _read(self.ck, b, [STATS, DEAD])
        if t is None:
            return
        stats = [(c, v) for f, c, v in zip(t["_for"], t["_c"], t["_v"]) if f == STATS]
        dead = len(t["_for"]) - len(stats)
        spouts: dict[str, int] = {}
        bolts: dict[str, dict[str, int]] = {}
        for c, v in stats:
            d = orjson.loads(v)
            if "rows_in" in d:
                acc = bolts.setdefault(c, {})
                for k, x in d.items():
                    acc[k] = acc.get(k, 0) + x
            else:
                spouts[c] = spouts.get(c, 0) + d.get("emitted", 0)
        for c, n in spouts.items():
            self.spouts[c] = self.spouts.get(c, 0) + n
        for c, d in bolts.items():
            acc = self.counters.setdefault(c, {})
            for k, x in d.items():
                acc[k] = acc.get(k, 0) + x
        self.batches += 1
        self.dead += dead
        n_in = sum(spouts.values())
        self.run_tuples += n_in
        secs = (p or {}).get("durationMs", {}).get("triggerExecution", 0) / 1000
        if secs > 0:
            self.latencies.append(secs * 1000)
        if self.echo is None:
            return
        took = f" in {secs:.1f}s ({n_in / secs:,.0f}/s)" if secs > 0 else ""  # Spark's progress of the batch, if kept
        parts = [f"{c}: emitted {n:,}" for c, n in sorted(spouts.items())]
        parts += [f"{c}: in {d.get('rows_in', 0):,}, emitted {d.get('emitted', 0):,}, acked {d.get('acked', 0):,}, "
                  f"failed {d.get('failed', 0):,}"
                  + (f", retried {d['retried']:,}" if d.get("retried") else "")
                  + (f", restarts {d['restarts']}" if d.get("restarts") else "")
                  + (f", Spark task retries {d['task_retries']}" if d.get("task_retries") else "")
                  for c, d in sorted(bolts.items())]
        self.echo(f"[progress] batch {b}: {n_in:,} spout tuples{took} | " + " | ".join(parts)
                  + (f" | dead letters {dead}" if dead else "") + f" | elapsed {time.monotonic() - self.t0:.0f}s")


    def snapshot(self, topology: Topology) -> dict[str, Any]:
        """The run so far in the shape of :func:`multilang.shellbolt._observe.observe.snapshot`,
        for the live view (docs/OBSERVE.md): committed micro-batches only. A
        spout tuple's tree completes with its batch, so the complete latency
        is the batches' duration; what is in flight in the running batch, the
        bolts' execute latency, capacity and a stall are not known here."""
        lats = sorted(self.latencies)
        lat = {"p50": lats[len(lats) // 2], "p99": lats[-1], "count": len(lats)} if lats else \
            {"p50": None, "p99": None, "count": 0}
        comps: dict[str, Any] = {}
        for name, c in topology.components.items():
            row = comps[name] = blank_row(c.kind, c.tasks)
            if c.kind == "spout":
                n = self.spouts.get(name, 0)
                row.update(emitted=n, acked=n, complete_latency_ms=lat)
            else:
                d = self.counters.get(name, {})
                row.update(emitted=d.get("emitted", 0), executed=d.get("rows_in", 0), acked=d.get("acked", 0),
                           failed=d.get("failed", 0), restarts=d.get("restarts", 0))
        return {"topology": topology.name or "topology", "elapsed_s": time.monotonic() - self.t0,
                "trees": {"in_flight": None, "completed": sum(self.spouts.values()), "failed": self.dead,
                          "timed_out": 0, "complete_latency_ms": lat, "stalled_s": 0.0},
                "components": comps, "tasks": {}, "stalled": False, "stall_secs": 0.0, "remaining": None,
                "eta_s": None}


def _read(ck: Location, batch_id: int, kinds: list[str]) -> dict[str, list[Any]] | None:
    """The rows of some kinds from a batch's folder, as columns (Arrow, in
    the driver: the batch folders are small), through the location's file
    system; None if the batch has no folder."""
    import pyarrow.parquet as pq

    if not ck.exists(*batch_dir(batch_id)):
        return None
    return pq.read_table(ck.path(*batch_dir(batch_id)), filesystem=ck.fs,
                         columns=["_for", "_p", "_c", "_s", "_v", "_o", "_key"],
                         filters=[("_for", "in", kinds)]).to_pydict()


def _view(topo: Topology, ck: Location, upto: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The output view over every committed batch, and the dead letters."""
    out = topo.output
    fields_of = {(c.name, s): f for c in topo.components.values() for s, f in c.outputs.items()}

    def record(c: str, s: str, v: str) -> dict[str, Any]:
        values = orjson.loads(v)
        fields = fields_of[(c, s)]
        rec: dict[str, Any] = {} if out.component is not None else {"component": c, "stream": s}
        if fields == ANY_FIELDS:
            rec["values"] = values
        else:
            rec.update(zip(fields, values))
        return rec

    keyed_view = bool(out.key) and out.component is not None
    keyed: dict[Any, tuple[int, dict[str, Any]]] = {}
    records: list[dict[str, Any]] = []
    dead: list[dict[str, Any]] = []
    for b in range(upto + 1):
        t = _read(ck, b, [OUT, DEAD])
        if t is None:
            continue
        rows = sorted(zip(t["_o"], t["_for"], t["_c"], t["_s"], t["_v"]), key=lambda r: r[0])
        for o, f, c, s, v in rows:
            if f == DEAD:
                dead.append(orjson.loads(v))
                continue
            rec = record(c, s, v)
            if keyed_view:
                k = tuple(hashable(rec.get(k)) for k in out.key or [])
                if k not in keyed or keyed[k][0] < o:
                    keyed[k] = (o, rec)
            else:
                records.append(rec)
    if keyed_view:
        records = sorted((r for _, r in keyed.values()), key=lambda r: [sort_key(r[k]) for k in out.key or []])
    return records, dead


def run_topology(
    topology: Topology | str | os.PathLike[str], *, spark: Any = None, master: str = "local[*]",
    remote: str | None = None, spark_conf: dict[str, str] | None = None, checkpoint: str | None = None,
    duration: float | None = None, max_tuples: int | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    on_progress: Callable[[str], None] | None = None, max_retries: int = 3,
    should_stop: Callable[[], bool] | None = None, on_snapshot: Callable[[dict[str, Any]], None] | None = None,
) -> SparkRunResult:
    """Run a topology (from ``load_topology``, or its file's path) as a Structured Streaming query.

    Without ``duration`` the spouts run until drained
    (``trigger(availableNow=True)``), the spout tasks reading at most
    ``max_tuples`` in all, each its share (as even as integers allow; one
    that runs dry leaves the rest of its share unread); with ``duration`` the query runs micro-batch
    after micro-batch and stops after that many seconds. ``checkpoint``: a directory
    that makes the run resumable (the same call after a crash continues from
    the last committed micro-batch; the output view covers every committed
    batch); default a temporary one, removed at the end. ``master`` /
    ``remote`` (Spark Connect) and ``spark_conf`` (Spark conf keys) are
    used when ``spark`` is not given; local masters get task retries. The
    topology's folder is shipped to the executors (docs/DEPLOY.md).
    ``on_progress`` gets one line per micro-batch; ``on_snapshot`` the run
    so far (:meth:`_Progress.snapshot`) twice a second.
    """
    from pyspark.sql import SparkSession

    if not isinstance(topology, Topology):
        topology = load_topology(topology)
    order = _check(topology)
    if spark is None and remote is None and master.startswith("local"):
        # One machine: its executors run each command here, in a copy of the topology's folder. A command
        # that cannot run is said now, as the embedded engine says it, not after Spark's start-up and four
        # attempts of a task, each with the executor's traceback (a trial: half a minute, 500 lines).
        topology.check_commands()
    temp = checkpoint is None
    ck = Location(checkpoint or scratch_folder("multilang-spark-"))
    _claim(ck, topology)
    plan = _plan(topology, order, ck.child("state").uri, max_retries)
    batch = int(topology.conf.get(_BATCH_KEY) or 5000)
    delay_ms = int(topology.conf.get(_DELAY_KEY) or 2000)
    own = spark is None
    if own:
        spark = _local_session(SparkSession, with_task_retries(master, spark_conf), f"multilang:{topology.name}",
                               remote, spark_conf)
    try:
        from .._source.source import register

        register(spark)
        # The topology's folder goes to the executors, where every spout and bolt runs (ship.py); a
        # checkpoint directory inside it stays behind.
        shipped = ship(spark, topology.resource_dir, exclude=[ck.root] if ck.local else [])
        for spec in plan.specs.values():
            spec.use_archive(shipped)
        plan.spread = {name: _spread(spark, len(ids)) for name, ids in plan.task_ids.items()
                       if name in plan.keyed or len(ids) > 1}
        tasks = [(n, t) for n, c in sorted(topology.components.items()) if c.kind == "spout"
                 for t in range(c.parallelism)]
        sources = [_source(spark, topology, n, t, ck, batch, delay_ms, shipped, share)
                   for (n, t), share in zip(tasks, _shares(max_tuples, len(tasks)))]
        df = sources[0]
        for s in sources[1:]:
            df = df.unionByName(s)
        writer = (df.writeStream.foreachBatch(_BatchWriter(plan, order, ck))
                  .option("checkpointLocation", ck.spark_path("query"))
                  .queryName(f"multilang_{re.sub(r'[^A-Za-z0-9_]', '_', topology.name or 'topology')}"))
        # Without --duration the query ends when every spout has drained, as one engine's run ends when its
        # spouts are done, --max-tuples or not (a trial's finite spout with a larger --max-tuples ran for
        # ever); each source reads at most its share of max_tuples in this run, the driver stops at
        # max_tuples in all.
        bounded = duration is None
        writer = writer.trigger(availableNow=True) if bounded else writer.trigger(processingTime="0 seconds")
        progress = _Progress(ck, on_progress)
        progress.poll([])  # batches an earlier run committed
        progress.run_tuples = 0
        start = time.monotonic()
        q = _start(writer)
        stopped_by = "done"
        try:
            while True:
                # (first as soon as the query runs: the caller's signals stop it between batches from then on;
                # a trial's Ctrl-C during the first batch, before this was asked, tore the query down mid-batch)
                if should_stop is not None and should_stop():
                    stopped_by = "signal"
                    break
                ended = q.awaitTermination(0.5)
                progress.poll(q.recentProgress)
                if on_snapshot is not None:
                    on_snapshot(progress.snapshot(topology))
                if ended:
                    if max_tuples is not None and progress.run_tuples >= max_tuples:
                        stopped_by = "max_tuples"  # (its sources read no more: the query ended)
                    break
                if duration is not None and time.monotonic() - start >= duration:
                    stopped_by = "duration"
                    break
                if max_tuples is not None and progress.run_tuples >= max_tuples:
                    stopped_by = "max_tuples"
                    break
        finally:
            if q.isActive:
                _stop_between_batches(q, ck)
        exc = q.exception()
        if exc is not None:
            raise exc
        progress.poll(q.recentProgress)
        if on_snapshot is not None:
            on_snapshot(progress.snapshot(topology))
        records, dead = _view(topology, ck, _committed(ck))
        if on_record is not None:
            for rec in records:
                on_record(rec)
        counters = {n: progress.counters.get(n, {}) for n in order}
        return SparkRunResult(records, counters, dict(progress.spouts), progress.batches, dead, stopped_by)
    finally:
        if own:
            if isinstance(sys.exc_info()[1], KeyboardInterrupt):
                # Stopped at once (a second signal): what Spark logs of the batch torn down, its tasks'
                # Python workers gone, is noise (a trial: 60 to 100 lines of Java errors after "interrupted").
                try:
                    spark.sparkContext.setLogLevel("OFF")
                except Exception:  # noqa: BLE001 - a Connect session has no SparkContext here; said or not
                    pass
            spark.stop()
        if temp:
            ck.delete_all()


# Spark Connect runs ``foreachBatch`` in a Python process it starts, and gives that process a fixed
# 10 s (PythonWorkerFactory.createSimpleWorker, not configurable) to import pyspark's Connect client
# and connect back. That takes about 1 s of CPU; on a busy driver machine it can take more than 10 s
# of wall time, and the query's start fails with this message before anything has run.
_SLOW_WORKER = "waiting for the Python worker to connect back"
START_TRIES = 6  # (a busy machine stays busy for a while: 4 were not enough on CI)


def _start(writer: Any) -> Any:
    """``writer.start()``, tried again (up to START_TRIES in all) when the start failed only because
    Spark's foreachBatch worker was slow to connect back: nothing had started, so a retry is safe."""
    for attempt in range(1, START_TRIES):
        try:
            return writer.start()
        except Exception as e:
            if _SLOW_WORKER not in str(e):
                raise
            log.warning("the query did not start: Spark's foreachBatch Python worker took more than Spark's "
                        "fixed 10 s to connect back (a busy machine); starting it again (%d of %d)",
                        attempt + 1, START_TRIES)
    return writer.start()


def _stop_between_batches(q: Any, ck: Location, patience: float = 60.0) -> None:
    """Stop the query once the micro-batch running now has committed (at most
    ``patience`` seconds), so its work counts; the batch Spark starts right
    after is cut off before its commit: it is not in the output, and a run
    resumed from the checkpoint runs it again."""
    if q.status.get("isTriggerActive", False):
        last = _committed(ck)
        deadline = time.monotonic() + patience
        while q.isActive and time.monotonic() < deadline and _committed(ck) == last:
            q.awaitTermination(0.05)
    q.stop()
