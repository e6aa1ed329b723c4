"""The conf schema: every conf key multilang-bridge reads, its type and range.

    from multilang.shellbolt._model.conf import check_conf, suggest
    check_conf(conf, "topo.toml: bolt 'count'")       # TopologyError on a bad value

:class:`ProcessConf` is the parsed part a process host reads (timeouts,
grace, restart budget, frame size), built once per component from its conf.

One pass, used by :meth:`Topology.validate` for the topology conf and for the
conf of each component, so TOML files, Flux YAML and the Python
``TopologyBuilder`` get the same checks before any process starts
(docs/CONF.md lists the keys).

* A known key with a value of the wrong type or out of range is a
  :class:`~multilang.errors.TopologyError` naming the key, what it must be
  and what it got. Booleans are never numbers here (``True`` is an ``int``
  in Python, not in a conf file).
* An unknown key passes through to the components untouched, as in Storm
  (components read their own conf). When it is one edit away from a known
  key (Damerau-Levenshtein distance 1, or the same key with ``_``/``-`` for
  ``.`` or other letter case), a WARNING on logger ``multilang.shellbolt``
  says "did you mean".

No trio here: this module is pure and imports nothing of the runtime.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from multilang.errors import TopologyError

__all__ = ["ConfKey", "SCHEMA", "EXTENSIONS", "ProcessConf", "check_conf", "check_value", "near_miss", "suggest",
           "did_you_mean", "unknown_key_message", "java_consumer"]

log = logging.getLogger("multilang.shellbolt")

#: Extension names a host may offer (spec/PROTOCOL.md §9.4).
EXTENSIONS = ("batch", "msgpack", "state")


@dataclass(frozen=True)
class ConfKey:
    """One conf key: ``what`` it must be (said in errors), ``check`` (True if
    a value is acceptable), its default, and where it is read.

    ``scope``: ``"component"`` keys are read from each component's conf
    merged over the topology conf; ``"topology"`` keys from the topology conf
    only, so setting one in a component's conf has no effect (a warning).
    ``flux`` keys are read by the Flux YAML loader only."""

    name: str
    what: str
    check: Callable[[Any], bool]
    default: Any
    doc: str
    scope: str = "component"
    flux: bool = False


# --- value checks -----------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_number(v: Any) -> bool:
    if type(v) is int:
        try:
            return math.isfinite(float(v))
        except OverflowError:
            return False
    return type(v) is float and math.isfinite(v)


def _int(minimum: int, *, null: bool = False) -> Callable[[Any], bool]:
    return lambda v: (null and v is None) or (_is_int(v) and v >= minimum)


def _number(*, positive: bool, null: bool = False) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        if v is None:
            return null
        return _is_number(v) and (v > 0 if positive else v >= 0)

    return check


def _bool(v: Any) -> bool:
    return type(v) is bool


def _str(*, null: bool = False, ints: bool = False) -> Callable[[Any], bool]:
    return lambda v: (null and v is None) or isinstance(v, str) or (ints and _is_int(v))


def _str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _extensions(v: Any) -> bool:
    return _str_list(v) and all(x in EXTENSIONS for x in v) and len(set(v)) == len(v)


def _provider(v: Any) -> bool:
    return isinstance(v, str) and (v in ("sqlite", "memory") or v.count(":") == 1 and all(v.split(":")))


def _provider_config(v: Any) -> bool:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return False
    return v is None or isinstance(v, dict) and all(isinstance(k, str) for k in v)


def _seed(v: Any) -> bool:
    return v is None or isinstance(v, str) or _is_number(v)


def _host_port(arg: Any) -> tuple[str, int] | None:
    """A prometheus metrics consumer's argument, a port or "HOST:PORT", as (host, port)."""
    if _is_int(arg):
        return ("127.0.0.1", arg) if 0 <= arg <= 65535 else None
    if isinstance(arg, str):
        host, sep, port = arg.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [::1]:9464
        if sep and host and port.isdigit() and int(port) <= 65535:
            return host, int(port)
    return None


def _consumer_problem(entry: Any) -> str | None:
    """Why one entry of topology.metrics.consumer.register is unusable, or None (shellbolt/_observe/metrics.py)."""
    if not isinstance(entry, Mapping):
        return f"each consumer is a table {{class = ..., argument = ...}}, got {_show(entry)}"
    unknown = sorted(set(entry) - {"class", "argument", "parallelism.hint"}, key=str)
    if unknown:
        return f"a consumer has the keys class and argument, not {unknown}"
    kind, arg = entry.get("class"), entry.get("argument")
    if kind == "json":
        return None if isinstance(arg, str) and arg.strip() else \
            f"class 'json' takes a file path as its argument, got {_show(arg)}"
    if kind == "prometheus":
        return None if _host_port(arg) is not None else \
            f"class 'prometheus' takes a port (0-65535) or 'HOST:PORT' as its argument, got {_show(arg)}"
    if java_consumer(kind):
        return None  # a Storm (Java) consumer of a Flux file: skipped with a warning (shellbolt/_observe/metrics.py)
    return f"unknown consumer class {kind!r}; the classes are 'json' (a file of JSON lines) and 'prometheus'"


def java_consumer(kind: Any) -> bool:
    """Whether a metrics consumer class is a Java class name (Storm's
    ``org.apache.storm.metric.LoggingMetricsConsumer`` in a Flux file): it
    cannot run here, and a Storm topology file must still run unchanged."""
    return isinstance(kind, str) and "." in kind and all(part.isidentifier() for part in kind.split("."))


def _consumers(v: Any) -> bool:
    return v is None or isinstance(v, list) and all(_consumer_problem(e) is None for e in v)


_POS_INT_NULL = "a positive integer or null"
_POS_SECS = "a positive number (seconds)"

SCHEMA: dict[str, ConfKey] = {k.name: k for k in [
    # Storm's keys this runtime honours.
    ConfKey("topology.message.timeout.secs", _POS_SECS, _number(positive=True), 30,
            "A tuple tree not completed in this time fails (and its spout replays it).", scope="component"),
    ConfKey("topology.max.spout.pending", _POS_INT_NULL, _int(1, null=True), None,
            "Tuple trees in flight per spout task; null: unbounded (as in Storm).", scope="topology"),
    ConfKey("topology.workers", "a positive integer", _int(1), 1,
            "Host worker processes the tasks are dealt to (multilang run --workers; docs/WORKERS.md).",
            scope="topology"),
    ConfKey("topology.acker.executors", "an integer >= 0 or null", _int(0, null=True), None,
            "0 turns reliability off (every emit is acked at once); null or more: acking on.", scope="topology"),
    ConfKey("topology.shellbolt.max.pending", "a positive integer", _int(1), 100,
            "Tuples sent to one bolt process and not yet acked or failed."),
    ConfKey("topology.producer.batch.size", "a positive integer", _int(1), 100,
            "The most tuples the runtime moves as one batch: nexts pipelined to a spout process that took "
            "batch (§9.5) in one write, tuples written to a bolt process in one write (also within "
            "topology.shellbolt.max.pending), emits routed to their tasks in one step. 1: one at a time, as "
            "Storm's default; what is delivered, acked and checkpointed is the same at any size."),
    ConfKey("topology.subprocess.timeout.secs", "a positive number (seconds) or null", _number(positive=True, null=True),
            None, "A process silent this long is dead (heartbeats); null: supervisor.worker.timeout.secs."),
    ConfKey("supervisor.worker.timeout.secs", _POS_SECS, _number(positive=True), 30,
            "The heartbeat timeout when topology.subprocess.timeout.secs is null; and how long a host worker "
            "may say nothing to the main process before it is killed and started again (docs/WORKERS.md)."),
    ConfKey("topology.tick.tuple.freq.secs", "a positive number (seconds) or null",
            _number(positive=True, null=True), None, "Send a tick tuple to each bolt task this often; null: no ticks."),
    ConfKey("topology.name", "a string", _str(), None, "The topology's name, as components see it in their conf."),
    # Ours.
    ConfKey("multilang.max.frame.bytes", "a positive integer (bytes)", _int(1), 64 * 1024 * 1024,
            "The largest frame a component may send; a larger one is a protocol error."),
    ConfKey("multilang.handshake.timeout.secs", _POS_SECS, _number(positive=True), 30,
            "Time a component has to answer the handshake with its pid."),
    ConfKey("multilang.heartbeat.interval.secs", _POS_SECS, _number(positive=True), 1.0,
            "How often a bolt process is sent a heartbeat."),
    ConfKey("multilang.restart.budget", "an integer >= 0", _int(0), 5,
            "Restarts a task may use within multilang.restart.window.secs before its component gives up; "
            "also the restarts in a row a task may use whose processes did no work (settled no tuple, "
            "answered no next, ack or fail), however slowly they died."),
    ConfKey("multilang.restart.window.secs", _POS_SECS, _number(positive=True), 60,
            "The window of multilang.restart.budget."),
    ConfKey("multilang.shutdown.grace.secs", "a number >= 0 (seconds)", _number(positive=False), 5,
            "At the end of a run, time in-flight trees get to complete.", scope="topology"),
    ConfKey("multilang.kill.grace.secs", "a number >= 0 (seconds)", _number(positive=False), 2,
            "Between SIGTERM and SIGKILL when a process is stopped."),
    ConfKey("multilang.progress.stall.secs", _POS_SECS, _number(positive=True), 5,
            "The live view of multilang run marks the run STALLED when trees are in flight and none has completed "
            "for this long (docs/OBSERVE.md).", scope="topology"),
    ConfKey("multilang.spout.start.secs", "a number >= 0 (seconds)", _number(positive=False), 5,
            "How long a run that ends with its spouts (no --duration) waits for a shell spout task's first "
            "emit while its nexts bring nothing (a spout still connecting to its source); after it, two empty "
            "nexts in a row with its trees done are its end (a process restarted after it is not waited for). "
            "--engine spark: each spout task's source."),
    ConfKey("multilang.sched.batch", "true or false", _bool, False,
            "Linux: start the component's processes under the SCHED_BATCH policy, so that one handed tuples does "
            "not preempt the host on its core: for components that only compute, with host workers on a busy "
            "machine (docs/PERFORMANCE.md). Not for one that sleeps or waits on I/O: it is woken late."),
    ConfKey("multilang.hold.emits.until.ack", "true or false", _bool, False,
            "Hold a bolt's emits until it acks their anchor (a restart then never leaves half an output)."),
    ConfKey("multilang.extensions", f"a list of distinct extension names from {list(EXTENSIONS)}", _extensions,
            ["batch", "state"], "Extensions offered at the handshake (spec §9; state to bolts only); [] = standard protocol only."),
    ConfKey("topology.state.checkpoint.interval.ms", "an integer from 1 to 86400000 (milliseconds)",
            lambda v: _is_int(v) and 1 <= v <= 86_400_000, 1000,
            "How often stateful bolts' state is checkpointed (spec §9.7); their acks wait for it.", scope="topology"),
    ConfKey("topology.state.provider", "'sqlite', 'memory' or a Python 'module:Class'", _provider, "sqlite",
            "Where stateful bolts' state is kept: sqlite (one file per topology), memory (lost with the run).",
            scope="topology"),
    ConfKey("topology.state.provider.config", 'a table or JSON object such as {"dir": "state"}', _provider_config,
            None, "The state provider's settings; sqlite: dir, the directory of its file (--state-dir).",
            scope="topology"),
    ConfKey("multilang.max.replays", "an integer >= 0", _int(0), 3,
            "Times the host's own spouts replay a failing tuple (and a shell spout an emit the host refuses) before dead-lettering it."),
    ConfKey("multilang.record.segment.bytes", "an integer >= 4096 (bytes)", lambda v: _is_int(v) and v >= 4096,
            16 << 20, "--record: the largest segment file of a task's recording; a new segment starts past it."),
    ConfKey("multilang.record.segments", "a positive integer", _int(1), 4,
            "--record: segments kept per task; the oldest is deleted when a new one starts (docs/OBSERVE.md)."),
    ConfKey("multilang.spark.max.tuples.per.trigger", "an integer >= 1", _int(1), 5000,
            "--engine spark: the most tuples one spout task adds to a micro-batch (like Kafka's "
            "maxOffsetsPerTrigger); the memory of a stage is bounded by it.", scope="topology"),
    ConfKey("multilang.spark.max.trigger.delay.ms", "an integer >= 1 (milliseconds)", _int(1), 2000,
            "--engine spark: the longest a micro-batch waits for a spout task to fill it (like Kafka's "
            "maxTriggerDelay): larger batches cost less per tuple, smaller ones reach the sink sooner.",
            scope="topology"),
    ConfKey("topology.metrics.consumer.register",
            "a list of tables {class = 'json', argument = FILE} or {class = 'prometheus', argument = PORT or "
            "'HOST:PORT'}, or null", _consumers, None,
            "Metrics consumers of multilang run (docs/OBSERVE.md): JSON lines appended to FILE, or GET /metrics "
            "served on PORT (127.0.0.1 unless HOST), like --metrics-file / --metrics-port.", scope="topology"),
    ConfKey("topology.builtin.metrics.bucket.size.secs", _POS_SECS, _number(positive=True), 10,
            "How often a metrics file gets a line (Storm's default is 60); a last line when the run ends.",
            scope="topology"),
    # Read by the Flux YAML loader only (the TOML format has tables for these).
    ConfKey("multilang.resource.dir", "a string (a directory) or null", _str(null=True), None,
            "Flux: where commands run, relative to the YAML file.", scope="topology", flux=True),
    ConfKey("multilang.output.component", "a component id (a string)", _str(ints=True), None,
            "Flux: print this component's output (TOML: [output] component).", scope="topology", flux=True),
    ConfKey("multilang.output.stream", "a stream id (a string)", _str(ints=True), None,
            "Flux: the stream of multilang.output.component (TOML: [output] stream).", scope="topology", flux=True),
    ConfKey("multilang.output.key", "a list of field names (strings)", _str_list, None,
            "Flux: keep the last tuple per key (TOML: [output] key).", scope="topology", flux=True),
    ConfKey("multilang.testwordspout.count", "an integer >= 0", _int(0), 1000,
            "Flux: words each TestWordSpout task emits.", flux=True),
    ConfKey("multilang.testwordspout.seed", "a string, a number or null", _seed, None,
            "Flux: seed of TestWordSpout's words (repeatable runs).", flux=True),
]}

#: Storm keys that components or Storm itself read, which we pass on without a
#: near-miss warning even when they are one edit from one of ours.
_STORM_PASSTHROUGH = frozenset({
    "topology.debug", "topology.max.task.parallelism", "topology.tasks",
    "topology.worker.childopts", "topology.environment", "topology.enable.message.timeouts",
    "topology.eventlogger.executors", "topology.multilang.serializer", "topology.stats.sample.rate",
    "topology.fall.back.on.java.serialization", "topology.skip.missing.kryo.registrations",
})
#: the dotted beginnings of the keys above ("topology", "topology.max", ...): a conf key that is one
#: of them and holds a table was meant as a dotted key (_nested)
_PREFIXES = frozenset(k.rsplit(".", i)[0] for k in (*SCHEMA, *_STORM_PASSTHROUGH) for i in range(1, k.count(".") + 1))


# --- messages -----------------------------------------------------------------------------------


def _json(v: Any) -> str:
    try:
        return json.dumps(v)[:80]
    except (TypeError, ValueError):
        return repr(v)[:80]


def _show(v: Any) -> str:
    """A value as the user wrote it (TOML, YAML, JSON: true, null), clipped."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"{str(v).lower()} (a boolean)"
    text = repr(v)
    if len(text) > 80:
        text = text[:77] + "..."
    if isinstance(v, (dict, list)):
        return f"{text} (a {'table' if isinstance(v, dict) else 'list'})"
    return text


def check_value(key: str, value: Any) -> str | None:
    """None if ``value`` is acceptable for ``key`` (or ``key`` is unknown),
    else the cause: ``conf key 'k' must be ..., got ...``."""
    spec = SCHEMA.get(key)
    if spec is None or spec.check(value):
        return None
    return f"conf key {key!r} must be {spec.what}, got {_show(value)}"


def _normal(s: str) -> str:
    return s.lower().replace("_", ".").replace("-", ".")


def _distance(a: str, b: str, limit: int = 2) -> int:
    """Damerau-Levenshtein distance (optimal string alignment), capped at
    ``limit + 1``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
        if min(prev) > limit:
            return limit + 1
    return prev[-1]


def near_miss(word: str, known: str) -> bool:
    """``word`` is an obvious misspelling of ``known``: one edit away
    (insert, delete, substitute, swap two neighbours), or equal but for
    letter case and ``_``/``-``/``.`` separators, or ``known`` without its
    first dotted part (``max.spout.pending``)."""
    if word == known:
        return False
    a, b = _normal(word), _normal(known)
    if a == b or _distance(a, b, 1) <= 1:
        return True
    return "." in known and a == b.split(".", 1)[1] and a.count(".") >= 1


def suggest(word: str, known: Iterable[str]) -> str | None:
    """The known name ``word`` is a near miss of (the closest), if any."""
    hits = [k for k in known if near_miss(word, k)]
    if not hits:
        return None
    return min(hits, key=lambda k: (_distance(_normal(word), _normal(k), 3), k))


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` or ``""``."""
    hit = suggest(word, known)
    return f"; did you mean {hit!r}?" if hit else ""


def one_of(word: str, known: Iterable[str], shown: str | None = None) -> str:
    """What follows "unknown X 'word'": ``"; did you mean 'x'? (one of a, b)"``
    when one is close, else ``"; use one of a, b"``. ``shown``: the list as
    the message shows it (default: ``known``, sorted)."""
    shown = ", ".join(sorted(known)) if shown is None else shown
    hit = suggest(word, known)
    return f"; did you mean {hit!r}? (one of {shown})" if hit else f"; use one of {shown}"


def unknown_key_message(keys: Iterable[Any], known: Iterable[str], what: str = "key") -> str:
    """``unknown key 'groupping'; did you mean 'grouping'?`` (or the list of
    allowed keys when nothing is close)."""
    keys = sorted(keys, key=str)
    known = sorted(known)
    parts = []
    for k in keys:
        hint = did_you_mean(k, known) if isinstance(k, str) else ""
        parts.append(f"unknown {what} {k!r}{hint}")
    msg = "; ".join(parts)
    if not any("did you mean" in p for p in parts):
        msg += f"; allowed: {known}"
    return msg


# --- the pass -----------------------------------------------------------------------------------


def _nested(key: str, table: Mapping[Any, Any]) -> str:
    """What is wrong with conf key ``key`` holding a table: the dotted keys it
    meant, and how to write them."""
    name, value = key, table
    while isinstance(value, Mapping) and value and name in _PREFIXES:  # down to its first dotted key
        k, value = next(iter(value.items()))
        name = f"{name}.{k}"
    v = _json(value)
    return (f"conf key {key!r} is a table, not the dotted key {name!r}: an unquoted dotted key in TOML, or a "
            f"nested mapping in YAML, makes tables; write the dotted name as one key (\"{name}\" = {v} in TOML, "
            f"{name}: {v} in YAML)")


def check_conf(conf: Any, where: str, *, component: bool = False, warn: bool = True) -> None:
    """Check a conf mapping. ``where`` prefixes every message (file and
    component). Raises TopologyError on the first bad value; logs a warning
    for each unknown key that is a near miss of a known one, and, with
    ``component=True``, for topology-only keys (they have no effect there).
    ``warn=False``: the values only (a part of a conf whose whole is checked
    again, so that a warning is given once)."""
    if not isinstance(conf, Mapping):
        raise TopologyError(f"{where}: conf must be a table of key = value, got {_show(conf)}")
    for key, value in conf.items():
        if not isinstance(key, str):
            raise TopologyError(f"{where}: conf keys must be strings, got {_show(key)}")
        if isinstance(value, Mapping) and key in _PREFIXES:
            raise TopologyError(f"{where}: {_nested(key, value)}")
        cause = check_value(key, value)
        if cause is not None:
            raise TopologyError(f"{where}: {cause}")
        spec = SCHEMA.get(key)
        if not warn:
            continue
        if spec is None:
            if key not in _STORM_PASSTHROUGH:
                hit = suggest(key, SCHEMA)
                if hit is not None:
                    log.warning("%s: conf key %r is not one multilang-bridge reads; did you mean %r? "
                                "(passed on to the components as is)", where, key, hit)
        elif component and spec.scope == "topology":
            log.warning("%s: conf key %r is read from the topology conf only and has no effect in a "
                        "component's conf; set it in the topology conf", where, key)


# --- what a process host reads ------------------------------------------------------------------


def _value(conf: Mapping[str, Any], key: str) -> Any:
    """``conf[key]``, or the schema's default when it is absent or null."""
    value = conf.get(key)
    return SCHEMA[key].default if value is None else value


@dataclass(frozen=True, kw_only=True)
class ProcessConf:
    """The conf keys one process host reads, parsed once (defaults from :data:`SCHEMA`).

    Shared by the runtime's shell tasks and the Spark streaming source, so both
    read the same keys the same way. Build it with :meth:`from_conf` from a
    conf that :func:`check_conf` accepted."""

    #: silence that kills a process (§5.2): topology.subprocess.timeout.secs,
    #: else supervisor.worker.timeout.secs
    subprocess_timeout: float
    #: the pid reply's deadline after the start (§2.4)
    handshake_timeout: float
    #: between closing stdin, SIGTERM and SIGKILL (§5.4); 0 is valid
    kill_grace: float
    #: restarts of one component allowed within ``restart_window`` (§8.2)
    restart_budget: int
    restart_window: float
    #: the largest frame a component may send (§1.3)
    max_frame_bytes: int
    #: multilang.sched.batch: the process runs under SCHED_BATCH (Linux)
    sched_batch: bool = False

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> "ProcessConf":
        timeout = conf.get("topology.subprocess.timeout.secs")
        if timeout is None:  # null means "use the supervisor's" (§5.2)
            timeout = _value(conf, "supervisor.worker.timeout.secs")
        return cls(
            subprocess_timeout=float(timeout),
            handshake_timeout=float(_value(conf, "multilang.handshake.timeout.secs")),
            kill_grace=float(_value(conf, "multilang.kill.grace.secs")),
            restart_budget=int(_value(conf, "multilang.restart.budget")),
            restart_window=float(_value(conf, "multilang.restart.window.secs")),
            max_frame_bytes=int(_value(conf, "multilang.max.frame.bytes")),
            sched_batch=bool(_value(conf, "multilang.sched.batch")),
        )
