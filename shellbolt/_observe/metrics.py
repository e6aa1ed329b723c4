"""Metrics out (issue 23): a run's stats and its components' ``metrics``
frames (Storm's STORM-200) for a user to read, after Storm's
``topology.metrics.consumer.register``: JSON lines appended to a file, and a
Prometheus text endpoint (exposition format 0.0.4). docs/OBSERVE.md
"Metrics" lists every series, its labels and the JSON line's fields.

Two layers:

* pure functions from a stats snapshot (``multilang.shellbolt._observe.observe.snapshot``,
  a dict) to text: :func:`json_line` and :func:`prometheus_text`; and
  :func:`consumers_from_conf` for the conf key. No trio, no I/O.
* :class:`MetricsReporter`, the consumers of one run: the file is opened and
  the port bound when it is built (so a bad option is an error before any
  process starts), and :meth:`MetricsReporter.run` (in the runtime's
  nursery) writes a line every ``topology.builtin.metrics.bucket.size.secs``
  and answers ``GET /metrics``; :meth:`MetricsReporter.close` writes the
  last line when the run ends.

    reporter = MetricsReporter.from_conf(topology.conf, port=9464)
    result = await Runtime(topology).run(until_done=True, metrics=reporter)
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import orjson

from multilang.errors import TopologyError

from .._model.conf import _consumer_problem, _host_port, java_consumer

__all__ = ["json_line", "prometheus_text", "CONTENT_TYPE", "ConsumerSpec", "consumers_from_conf", "MetricsReporter",
           "CONSUMER_KEY", "INTERVAL_KEY", "DEFAULT_HOST"]

log = logging.getLogger("multilang.shellbolt")

#: the conf key of the consumers, and of the file consumer's interval (Storm's names)
CONSUMER_KEY = "topology.metrics.consumer.register"
INTERVAL_KEY = "topology.builtin.metrics.bucket.size.secs"
#: where the endpoint listens unless told otherwise: this machine only
DEFAULT_HOST = "127.0.0.1"
#: the Content-Type of the Prometheus text format this module writes
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# --- the JSON line ----------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """orjson's fallback for what a frame may carry and JSON may not (msgpack bytes)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "backslashreplace")
    return repr(value)


def json_line(snapshot: Mapping[str, Any], ts: float) -> str:
    """One JSON line (without its newline) for a snapshot taken at wall-clock
    time ``ts`` (seconds since the epoch): ``ts``, ``elapsed_s``,
    ``topology``, ``components``, ``tasks``, ``trees``. NaN and infinities
    become null, bytes a string, other values JSON cannot hold their repr."""
    doc = {"ts": round(ts, 3), "elapsed_s": snapshot.get("elapsed_s"), "topology": snapshot.get("topology"),
           "components": snapshot.get("components", {}), "tasks": snapshot.get("tasks", {}),
           "trees": snapshot.get("trees", {})}
    return orjson.dumps(doc, default=_jsonable, option=orjson.OPT_NON_STR_KEYS).decode()


# --- the Prometheus text format (0.0.4) ---------------------------------------------------------------


def _number(value: Any) -> str | None:
    """A sample value as the format writes it, or None for a value that is
    not a number (None, a string, a bool: not exported)."""
    if type(value) is int:
        return str(value)
    if type(value) is float:
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        return repr(value)
    return None


def _escape_label(value: Any) -> str:
    # Label values: backslash, double quote and line feed are escaped (format 0.0.4).
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    # HELP text: backslash and line feed only.
    return text.replace("\\", "\\\\").replace("\n", "\\n")


class _Family:
    """One metric family: its HELP and TYPE once, then its samples."""

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name, self.kind, self.help = name, kind, help_text
        self.samples: list[str] = []

    def add(self, labels: Iterable[tuple[str, Any]], value: Any) -> None:
        text = _number(value)
        if text is None:
            return
        body = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
        self.samples.append(f"{self.name}{{{body}}} {text}" if body else f"{self.name} {text}")

    def lines(self) -> list[str]:
        return [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}", *self.samples]


#: per task (labels topology, component, task): (family, type, snapshot key, help)
_TASK_SERIES = [
    ("multilang_tuples_emitted_total", "counter", "emitted", "Tuples emitted by the task, any stream."),
    ("multilang_tuples_executed_total", "counter", "executed", "Tuples delivered to the task (bolts)."),
    ("multilang_tuples_acked_total", "counter", "acked", "Bolts: input tuples acked; spouts: tuple trees completed."),
    ("multilang_tuples_failed_total", "counter", "failed",
     "Bolts: input tuples failed (also by a crash); spouts: tuple trees failed or timed out."),
    ("multilang_process_restarts_total", "counter", "restarts", "Restarts of the task's process."),
    ("multilang_component_errors_total", "counter", "errors", "error commands of the component, and invalid emits."),
    ("multilang_tuples_in_flight", "gauge", "in_flight",
     "Bolts: tuples sent to the process and not yet acked or failed; spouts: tuple trees not yet completed."),
    ("multilang_tuples_queued", "gauge", "queued",
     "Tuples waiting in the task's inbox (a sign of backpressure when it stays high)."),
    ("multilang_capacity", "gauge", "capacity",
     "Share of the recent time the task was busy executing (Storm UI's capacity); 1 is saturated."),
]
_QUANTILES = (("0.5", "p50"), ("0.99", "p99"))


def _rows(snapshot: Mapping[str, Any]) -> list[tuple[list[tuple[str, Any]], Mapping[str, Any]]]:
    """(labels, stats) of each task; a component without task rows in the
    snapshot gets one row of its own, without a task label."""
    topo = snapshot.get("topology") or ""
    comps: Mapping[str, Any] = snapshot.get("components") or {}
    by_comp: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    for key, row in (snapshot.get("tasks") or {}).items():
        comp = row.get("component")
        task = row.get("task")
        if comp is None or task is None:  # "<component>:<task>" keys when a row does not say
            comp, _, t = str(key).rpartition(":")
            task = int(t) if t.isdigit() else t
        by_comp.setdefault(str(comp), []).append((task, row))
    out: list[tuple[list[tuple[str, Any]], Mapping[str, Any]]] = []
    for comp in sorted(set(comps) | set(by_comp)):
        rows = by_comp.get(comp)
        if rows:
            for task, row in sorted(rows, key=lambda r: (str(type(r[0])), r[0])):
                out.append(([("topology", topo), ("component", comp), ("task", task)], row))
        else:
            out.append(([("topology", topo), ("component", comp)], comps[comp]))
    return out


def _flatten(value: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """(key, number) of a metric's value: a number (key ""), or a dict of
    numbers, nested dicts with dotted keys. Anything else is skipped."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif _number(value) is not None:
        yield prefix, value


def prometheus_text(snapshot: Mapping[str, Any]) -> str:
    """The snapshot in the Prometheus text exposition format 0.0.4: every
    family's HELP and TYPE once (also while it has no sample), then its
    samples. Per-task series carry ``topology``, ``component`` and ``task``
    labels (sum over ``task`` for a component). A value that is None (a
    latency before any sample, a capacity not known yet) is left out."""
    topo = snapshot.get("topology") or ""
    top = [("topology", topo)]
    trees: Mapping[str, Any] = snapshot.get("trees") or {}
    fams: list[_Family] = []

    def family(name: str, kind: str, help_text: str) -> _Family:
        f = _Family(name, kind, help_text)
        fams.append(f)
        return f

    family("multilang_uptime_seconds", "gauge", "Seconds since the run started.").add(top, snapshot.get("elapsed_s"))
    stalled = snapshot.get("stalled")
    family("multilang_stalled", "gauge", "1 while trees are in flight and none completed for "
           "multilang.progress.stall.secs (the live view's stalled mark), else 0.").add(
        top, None if stalled is None else int(bool(stalled)))
    family("multilang_trees_in_flight", "gauge", "Tuple trees emitted by spouts and not yet completed, failed or "
           "timed out.").add(top, trees.get("in_flight"))
    for key, what in (("completed", "completed (every tuple acked)"), ("failed", "failed (a tuple failed)"),
                      ("timed_out", "timed out (topology.message.timeout.secs); also counted as failed")):
        family(f"multilang_trees_{key}_total", "counter", f"Tuple trees {what}.").add(top, trees.get(key))
    lat = family("multilang_complete_latency_ms", "gauge", "Tuple tree complete latency (spout emit to the last "
                 "ack) in milliseconds, at a quantile; absent before the first tree completes.")
    for q, k in _QUANTILES:
        lat.add([*top, ("quantile", q)], (trees.get("complete_latency_ms") or {}).get(k))

    rows = _rows(snapshot)
    info = family("multilang_component_info", "gauge", "1 per component; its kind (spout or bolt) and the protocol "
                  "extensions its processes accepted, comma-separated.")
    for comp, c in sorted((snapshot.get("components") or {}).items()):
        info.add([*top, ("component", comp), ("kind", c.get("kind") or ""),
                  ("extensions", ",".join(c.get("extensions") or ()))], 1)
    for name, kind, key, help_text in _TASK_SERIES:
        f = family(name, kind, help_text)
        for labels, row in rows:
            f.add(labels, row.get(key))
    ex = family("multilang_execute_latency_ms", "gauge", "Bolt execute latency (tuple sent to its ack or fail) in "
                "milliseconds, at a quantile; absent before the first sample.")
    for labels, row in rows:
        for q, k in _QUANTILES:
            ex.add([*labels, ("quantile", q)], (row.get("execute_latency_ms") or {}).get(k))
    cm = family("multilang_component_metric", "gauge", "The latest value of a component's metrics command "
                "(name): a number (key empty) or each number of a dict (key, dotted when nested).")
    # Per task where the snapshot has them per task; a component whose task
    # rows hold none (metrics kept per component) once, without a task label.
    comps = snapshot.get("components") or {}
    per_task = {labels[1][1] for labels, row in rows if len(labels) == 3 and row.get("metrics")}
    done: set[str] = set()
    for labels, row in rows:
        comp = labels[1][1]
        if comp in per_task:
            metrics = row.get("metrics") or {}
        elif comp not in done:
            done.add(comp)
            metrics, labels = (comps.get(comp) or {}).get("metrics") or {}, labels[:2]
        else:
            continue
        for mname in sorted(metrics, key=str):
            for key, value in _flatten(metrics[mname]):
                cm.add([*labels, ("name", mname), ("key", key)], value)
    return "\n".join(line for f in fams for line in f.lines()) + "\n"


# --- consumers from the conf ------------------------------------------------------------------------


@dataclass(frozen=True)
class ConsumerSpec:
    """One consumer: ``kind`` "json" (``path``) or "prometheus" (``host``,
    ``port``); ``source`` names where it was asked for, for messages."""

    kind: str
    source: str
    path: str | None = None
    host: str = DEFAULT_HOST
    port: int | None = None


def consumers_from_conf(value: Any) -> list[ConsumerSpec]:
    """The consumers a ``topology.metrics.consumer.register`` value asks for
    (null or absent: none). TopologyError naming the key if one is unusable."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise TopologyError(f"{CONSUMER_KEY} must be a list of consumers, got {value!r}")
    out = []
    for i, entry in enumerate(value):
        where = f"{CONSUMER_KEY}[{i}]"
        problem = _consumer_problem(entry)
        if problem is not None:
            raise TopologyError(f"{where}: {problem}")
        if java_consumer(entry["class"]):
            log.warning("%s: the Storm (Java) metrics consumer %s cannot run here and is skipped; use class = "
                        "'json' or 'prometheus' (docs/OBSERVE.md)", where, entry["class"])
            continue
        if entry["class"] == "json":
            out.append(ConsumerSpec("json", where, path=entry["argument"]))
        else:
            host, port = _host_port(entry["argument"])  # type: ignore[misc]
            out.append(ConsumerSpec("prometheus", where, host=host, port=port))
    return out


# --- the consumers of a run -------------------------------------------------------------------------

#: the longest request head a scrape may send, and how long it has to send it
_MAX_HEAD = 8192
_HEAD_TIMEOUT = 10.0


def _default_snapshot(runtime: Any) -> dict[str, Any]:
    from .observe import snapshot

    return snapshot(runtime)


class MetricsReporter:
    """The metrics consumers of one run: JSON-lines files and Prometheus
    endpoints, opened and bound at once (TopologyError naming the option or
    the conf entry if not possible), served while :meth:`run` runs."""

    def __init__(self, *, interval: float = 10.0,
                 snapshot: Callable[[Any], Mapping[str, Any]] | None = None) -> None:
        self.interval = interval
        self.snapshot = snapshot or _default_snapshot
        self._files: list[tuple[str, Any]] = []  # (path, open file)
        self._sockets: list[socket.socket] = []
        #: (host, port) each endpoint listens on (the port chosen when 0 was asked for)
        self.endpoints: list[tuple[str, int]] = []
        self._closed = False

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any], *, file: str | None = None, port: int | None = None,
                  host: str | None = None) -> "MetricsReporter":
        """The consumers of ``topology.metrics.consumer.register`` in
        ``conf``, plus ``--metrics-file``/``--metrics-port``/``--metrics-host``."""
        interval = conf.get(INTERVAL_KEY)
        specs = consumers_from_conf(conf.get(CONSUMER_KEY))
        if file is not None:
            specs.append(ConsumerSpec("json", "--metrics-file", path=file))
        if port is not None:
            specs.append(ConsumerSpec("prometheus", "--metrics-port", host=host or DEFAULT_HOST, port=port))
        reporter = cls(interval=float(interval) if interval else 10.0)
        try:
            for spec in specs:
                reporter.add(spec)
        except BaseException:
            reporter._release()
            raise
        return reporter

    def __bool__(self) -> bool:
        return bool(self._files or self._sockets)

    @property
    def writes_lines(self) -> bool:
        """It has a file to write a line to every :attr:`interval`."""
        return bool(self._files)

    def add(self, spec: ConsumerSpec) -> None:
        if spec.kind == "json":
            self.add_file(spec.path or "", spec.source)
        else:
            self.add_endpoint(spec.host, spec.port or 0, spec.source)

    def add_file(self, path: str, source: str = "--metrics-file") -> None:
        """Append JSON lines to ``path`` (created if absent)."""
        if not path.strip():
            raise TopologyError(f"{source}: an empty path (an unset shell variable?)")
        try:
            f = open(path, "a", encoding="utf-8")
        except OSError as exc:
            raise TopologyError(f"{source} {path}: {exc.strerror or exc}") from None
        self._files.append((path, f))

    def add_endpoint(self, host: str, port: int, source: str = "--metrics-port") -> None:
        """Serve ``GET /metrics`` on ``host``:``port`` (0: a free port, see
        :attr:`endpoints`). Bound now, so a port in use is an error before
        the run starts."""
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except OSError as exc:  # socket.gaierror: a host name that does not resolve
            raise TopologyError(f"{source}: host {host!r}: {exc.strerror or exc}") from None
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if os.name == "posix":
                # Not SO_REUSEPORT: a second run on the same port must fail, not share it.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(64)
        except OSError as exc:
            sock.close()
            raise TopologyError(f"{source} {port}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self._sockets.append(sock)
        self.endpoints.append((host, sock.getsockname()[1]))

    # -- while the run runs ---------------------------------------------------------------------

    def write_line(self, runtime: Any) -> None:
        """Append one snapshot line to every file."""
        if not self._files:
            return
        try:
            line = json_line(self.snapshot(runtime), time.time()) + "\n"
        except Exception:  # noqa: BLE001 - logged; the run goes on (and its end is not masked)
            log.exception("metrics file: the snapshot failed; no line written")
            return
        for path, f in self._files:
            try:
                f.write(line)
                f.flush()
            except OSError as exc:  # a full disk: said once per file, the run goes on
                log.error("metrics file %s: %s; no more lines are written to it", path, exc.strerror or exc)
                self._files = [(p, g) for p, g in self._files if g is not f]

    async def run(self, runtime: Any, *, lines: bool = True) -> None:
        """Serve the endpoints and write a line every interval, until
        cancelled. ``lines=False``: the caller calls :meth:`write_line` as
        its snapshots come (host workers: a snapshot is asked of them)."""
        import trio

        async with trio.open_nursery() as nursery:
            if self._sockets:
                listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(s)) for s in self._sockets]
                self._sockets = []  # the listeners own them now
                nursery.start_soon(self._serve, listeners, runtime)
            if self._files and lines:
                while True:
                    await trio.sleep(self.interval)
                    self.write_line(runtime)

    async def _serve(self, listeners: list[Any], runtime: Any) -> None:
        import trio

        async def handler(stream: Any) -> None:
            await self._answer(stream, runtime)

        try:
            await trio.serve_listeners(handler, listeners)
        finally:
            for listener in listeners:
                await listener.aclose()

    async def _answer(self, stream: Any, runtime: Any) -> None:
        """One HTTP/1.1 exchange: read the request head (at most 8 KiB, 10 s),
        answer, close. Never raises: a bad scrape must not stop the run."""
        import trio

        try:
            head = b""
            with trio.move_on_after(_HEAD_TIMEOUT):
                while b"\r\n\r\n" not in head and b"\n\n" not in head and len(head) <= _MAX_HEAD:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    head += chunk
            status, body, ctype = self._response(head, runtime)
            data = body if status != "200 OK" or not head.startswith(b"HEAD ") else b""
            await stream.send_all(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n".encode("latin-1") + data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the scraper went away
        except Exception:  # noqa: BLE001 - logged; the run goes on
            log.exception("metrics endpoint: answering a request failed")
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()

    def _response(self, head: bytes, runtime: Any) -> tuple[str, bytes, str]:
        plain = "text/plain; charset=utf-8"
        if len(head) > _MAX_HEAD and b"\r\n\r\n" not in head[:_MAX_HEAD] and b"\n\n" not in head[:_MAX_HEAD]:
            return "431 Request Header Fields Too Large", b"request head over 8 KiB\n", plain
        end = head.find(b"\n")
        if end < 0:
            return "400 Bad Request", b"no request line\n", plain
        parts = head[:end].decode("latin-1").strip().split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return "400 Bad Request", b"bad request line\n", plain
        method, target = parts[0], parts[1].split("?", 1)[0]
        if target != "/metrics":
            return "404 Not Found", b"not found; the metrics are at /metrics\n", plain
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", b"GET /metrics\n", plain
        try:
            text = prometheus_text(self.snapshot(runtime))
        except Exception as exc:  # noqa: BLE001 - said to the scraper and logged; the run goes on
            log.exception("metrics endpoint: the snapshot failed")
            return "500 Internal Server Error", f"snapshot failed: {exc}\n".encode(), plain
        return "200 OK", text.encode(), CONTENT_TYPE

    # -- at the end ---------------------------------------------------------------------------------

    def close(self, runtime: Any = None) -> None:
        """The last line (the run's final counts) to every file, then close
        files and any socket :meth:`run` did not take. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if runtime is not None:
                self.write_line(runtime)
        finally:
            self._release()

    def _release(self) -> None:
        for _, f in self._files:
            try:
                f.close()
            except OSError:
                pass
        self._files = []
        for s in self._sockets:
            s.close()
        self._sockets = []
