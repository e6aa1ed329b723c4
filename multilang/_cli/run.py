"""``multilang run``: a topology on the embedded engine or on Spark."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import signal
import sys
import time
import urllib.parse
from typing import IO, Any, Iterator, NoReturn

import click
import orjson

from multilang.shellbolt import setup_logging

from ..errors import MultilangError, TopologyError
from . import signals as _signals
from .common import (
    EXIT_FAILED, EXIT_OK, EXIT_OUTPUT_CLOSED, EXIT_SIGINT, EXIT_USAGE, FloatRange, IntRange, dead_letter_writer,
    distinct_files, embedded_runtime, exit_code, finite, interrupted, live_view, owning_signals, parse_conf,
    run_trio, stopped_before_start,
)
from .output import NoOutput, Output, flush_every, output_file
from .summary import emitted_nothing_line, print_summary


@click.command(short_help="Run a topology (TOML or Storm Flux YAML), embedded or on Spark.")
@click.argument("topology_file", type=click.Path(dir_okay=False))
@click.option("--engine", type=click.Choice(["local", "spark"]), default="local", show_default=True,
              help="local: the embedded trio runtime. spark: compile onto Spark.")
@click.option("--duration", type=FloatRange(min=0, min_open=True), callback=lambda ctx, param, v: finite(v),
              help="Stop after this many seconds.")
@click.option("--max-tuples", type=IntRange(min=1),
              help="Stop after the spouts emitted this many tuples and their trees finished (waiting at most "
                   "topology.message.timeout.secs x (1 + multilang.max.replays) for those).")
@click.option("--until-done/--no-until-done", default=None,
              help="Stop when every spout is exhausted and all trees finished (the default without --duration).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, allow_dash=True), default="-", show_default=True,
              help="Where output tuples go, as JSON lines. FILE is replaced when the run ends (a refused run "
                   "leaves it as it was).")
@click.option("--conf", "-c", multiple=True, metavar="KEY=VALUE", help="Conf override (VALUE parsed as JSON if it can be).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="warning", show_default=True)
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="The live view on stderr: rows updated in place on a terminal, plain [progress] lines elsewhere "
                   "(docs/OBSERVE.md).")
@click.option("--progress-tasks", is_flag=True,
              help="The live view shows a row per task too (Storm UI's executors).")
@click.option("--dead-letter", "dead_letter", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write inputs given up on (after multilang.max.replays) here, as JSON lines.")
@click.option("--record", "record_dir", metavar="DIR", type=click.Path(file_okay=False),
              help="Record every frame each shell task reads and writes in DIR (a new or empty directory; bounded "
                   "by multilang.record.*), for multilang replay (docs/OBSERVE.md).")
@click.option("--workers", type=IntRange(min=1), metavar="N",
              help="Host worker processes (Storm's topology.workers; default: the conf key, else 1): the tasks are "
                   "dealt round-robin to N processes, so the host uses N cores (docs/WORKERS.md).")
@click.option("--state-dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Keep stateful bolts' state in DIR (one SQLite file per topology); run again with the same DIR "
                   "to resume after a crash. Default: a temporary directory, gone after the run.")
@click.option("--master", help="Spark master URL (--engine spark; default local[*]); local masters get task retries "
              "(local[N] runs as local[N,4]).")
@click.option("--remote", metavar="URL", help="Spark Connect: sc://host:port, or local[N] for a local Connect server "
              "(--engine spark).")
@click.option("--archives", metavar="ARCHIVES",
              help="--engine spark: archives unpacked into each executor's working directory, comma-separated, as "
                   "spark-submit's --archives (spark.archives), e.g. a packed Python environment: "
                   "env.tar.gz#environment (docs/DEPLOY.md). Spark conf keys go with -c spark.KEY=VALUE.")
@click.option("--checkpoint", type=click.Path(file_okay=False), metavar="DIR|URI",
              help="--engine spark: keep the query's checkpoint, the spouts' replay logs, the stateful bolts' state "
                   "and every micro-batch's output in DIR, or at a URI Spark's checkpoints take (file://, hdfs://, "
                   "s3a://, ...; docs/DEPLOY.md); the same command after a crash resumes. Default: a temporary "
                   "directory, gone after the run.")
@click.option("--filter", "filter_file", type=click.Path(dir_okay=False), metavar="PROPERTIES_FILE",
              help="Flux YAML: substitute ${name} with the values of this .properties file (like flux --filter).")
@click.option("--env-filter", "-e", is_flag=True,
              help="Flux YAML: substitute ${ENV-NAME} with environment variables (like flux -e).")
@click.option("--metrics-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Append the run's metrics to FILE as a JSON line every topology.builtin.metrics.bucket.size.secs "
                   "(10) and when the run ends (docs/OBSERVE.md).")
@click.option("--metrics-port", type=IntRange(0, 65535), metavar="PORT",
              help="Serve the metrics at http://127.0.0.1:PORT/metrics (Prometheus text format) while the topology "
                   "runs; 0: a free port, printed on stderr.")
@click.option("--metrics-host", metavar="HOST",
              help="The address --metrics-port listens on (default 127.0.0.1, this machine only; 0.0.0.0: every "
                   "interface, for a Prometheus on another host or outside a container).")
@owning_signals
def run(topology_file: str, engine: str, duration: float | None, max_tuples: int | None, until_done: bool | None,
        output: str, conf: tuple[str, ...], log_level: str, progress: bool, dead_letter: str | None,
        state_dir: str | None, master: str | None, remote: str | None, checkpoint: str | None, filter_file: str | None,
        env_filter: bool, metrics_file: str | None = None, metrics_port: int | None = None,
        metrics_host: str | None = None, record_dir: str | None = None, progress_tasks: bool = False,
        archives: str | None = None, workers: int | None = None) -> None:
    """Run the topology in TOPOLOGY_FILE (TOML, or Storm Flux YAML: .yaml/.yml)."""
    from multilang.shellbolt import load_topology

    setup_logging(log_level)
    overrides = parse_conf(conf)
    # Spark's own keys (-c spark.executor.memory=2g, as spark-submit's --conf) configure the Spark session.
    spark_conf = {k: _spark_value(overrides.pop(k)) for k in [k for k in overrides if k.startswith("spark.")]}
    if archives is not None:
        if not archives.strip():
            raise click.BadParameter("an empty list (an unset shell variable?)", param_hint="--archives")
        spark_conf["spark.archives"] = ",".join(filter(None, [spark_conf.get("spark.archives"), archives]))
    if state_dir is not None and not state_dir.strip():
        raise click.BadParameter("an empty path (an unset shell variable?)", param_hint="--state-dir")
    distinct_files(("TOPOLOGY_FILE", topology_file), ("-o", output), ("--dead-letter", dead_letter),
                    ("--metrics-file", metrics_file), ("--filter", filter_file))
    try:
        if topology_file.endswith((".yaml", ".yml")):
            from multilang.shellbolt import load_flux

            topology = load_flux(topology_file, filter_file, os.environ if env_filter else None, overrides=overrides)
        elif filter_file is not None or env_filter:
            raise TopologyError("--filter and -e/--env-filter apply to Flux YAML files (.yaml/.yml) only")
        elif topology_file.endswith(".py"):
            raise TopologyError(f"{topology_file}: a Python file; multilang run takes a TOML or Flux YAML "
                                "(.yaml/.yml) topology file. A topology built in Python runs as its own script "
                                "(README, \"Topologies from Python\")")
        else:
            topology = load_topology(topology_file, overrides)
        if engine == "spark":
            kept = (["--state-dir"] if state_dir is not None else []) + [
                k for k in ("topology.state.provider", "topology.state.provider.config")
                if topology.conf.get(k) not in (None, "sqlite")]
            if kept:
                raise TopologyError(f"{' and '.join(kept)}: on --engine spark the state of stateful bolts is kept "
                                    "in the --checkpoint directory, versioned by micro-batch (docs/SPARK.md)")
            if master is not None and not _SPARK_MASTER.match(master):
                raise TopologyError(f"--master {master!r}: a Spark master URL is local, local[N], local[*], "
                                    "local[N,F], local-cluster[N,C,M], spark://HOST:PORT, yarn or k8s://HOST:PORT "
                                    "(N, C, M at least 1)")
            if master is not None and remote is not None:
                raise TopologyError(f"--master {master} and --remote {remote}: give one (--remote runs the query "
                                    "through Spark Connect, where the server's own master applies)")
            if remote is not None and remote.startswith("sc://") and spark_conf:
                raise TopologyError(f"{', '.join(sorted(spark_conf))}: with --remote {remote} the Connect server's "
                                    "Spark conf applies; set it where the server starts (docs/DEPLOY.md)")
            if archives is not None:
                _local_archives_exist(archives)
            _sizes_spark_takes(spark_conf)
            from multilang.adapters.spark import task_attempts

            task_attempts(spark_conf)  # (a local master would ignore spark.task.maxFailures: it sets local[N,F])
            if workers is not None:
                raise TopologyError(f"--workers {workers} applies to the embedded engine; on --engine spark the "
                                    "executors run the tasks (--master local[N], or the cluster's)")
            if master == "yarn" and not (os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR")):
                raise TopologyError("--master yarn: set HADOOP_CONF_DIR or YARN_CONF_DIR to the directory of the "
                                    "cluster's configuration files (Spark finds the ResourceManager there)")
        else:
            if spark_conf:
                given = "--archives" if archives is not None else f"-c {min(spark_conf)}"
                raise TopologyError(f"{given} applies to --engine spark (Spark conf); the embedded engine has none")
            for flag, value in (("--checkpoint", checkpoint), ("--remote", remote), ("--master", master)):
                if value is not None:
                    why = "" if flag == "--master" else "; the embedded engine keeps stateful bolts' state in --state-dir"
                    raise TopologyError(f"{flag} applies to --engine spark{why}")
        if state_dir is not None:  # over the topology's own provider settings, not instead of them
            from multilang.shellbolt import provider_config

            topology.conf["topology.state.provider.config"] = {**provider_config(topology.conf), "dir": state_dir}
    except TopologyError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from None
    n_workers = workers or int(topology.conf.get("topology.workers") or 1)
    if engine != "spark" and n_workers > 1:
        from multilang.shellbolt import workers_for

        used = workers_for(topology, n_workers)
        if used < n_workers:  # (1: the embedded engine, in this process)
            asked = f"--workers {workers}" if workers else f"topology.workers {n_workers}"
            click.echo(f"warning: {asked}: the topology has {used} task(s); {used} host worker(s) run, one per task",
                       err=True)
            n_workers = used
    elif engine == "spark" and n_workers > 1:  # (a Flux file from Storm often sets it: not refused, not silently lost)
        click.echo(f"warning: topology.workers {n_workers} applies to the embedded engine; on --engine spark the "
                   "executors run the tasks", err=True)
    if until_done is None:  # (the default without --duration, on any number of workers)
        until_done = duration is None and max_tuples is None
    metrics = _metrics_reporter(topology, engine, metrics_file, metrics_port, metrics_host)
    recorder = _recorder(record_dir, engine, topology)
    stopped_before_start()
    with output_file(output, refused=EXIT_USAGE, failed=EXIT_FAILED) as stream:
        if engine == "spark":
            raise SystemExit(_run_on_spark(topology, master=master or "local[*]", remote=remote, checkpoint=checkpoint,
                                           duration=duration, max_tuples=max_tuples, output=stream,
                                           progress=progress, dead_letter=dead_letter, spark_conf=spark_conf))
        if n_workers > 1:
            _run_workers(topology, stream, n_workers, duration=duration, until_done=until_done,
                         progress=live_view(progress_tasks) if progress else None, metrics=metrics,
                         dead_letter=dead_letter, recorder=recorder, max_tuples=max_tuples, log_level=log_level)
        _run_local(topology, stream, duration=duration, max_tuples=max_tuples, until_done=until_done,
                   progress=progress, progress_tasks=progress_tasks, metrics=metrics, recorder=recorder,
                   dead_letter=dead_letter)

def _run_local(topology: Any, output: IO[str], *, duration: float | None, max_tuples: int | None,
               until_done: bool, progress: bool, progress_tasks: bool, metrics: Any, recorder: Any,
               dead_letter: str | None) -> None:
    """``multilang run`` on the embedded engine; ends in SystemExit with the exit code."""

    out = Output(output)

    def emit(record: dict[str, Any]) -> None:
        out.line(orjson.dumps(record))

    runtime, dead_file = embedded_runtime(topology, out, dead_letter, on_output=emit)
    runtime.recorder = recorder
    start = time.monotonic()

    async def go(nursery: Any) -> Any:
        nursery.start_soon(flush_every, out)
        return await runtime.run(duration=duration, max_tuples=max_tuples, until_done=until_done,
                                 progress=live_view(progress_tasks) if progress else None, metrics=metrics)

    with _run_ending(dead_file, recorder):
        result, signum = run_trio(go, runtime)
    if result is None:  # stopped at once by a second signal: what it had
        result = runtime.result()
    signum = signum or _signals.first  # one that came as the run ended: it ends as interrupted too
    _ended(topology, out, result, signum, start, dead_letter)


@contextlib.contextmanager
def _run_ending(dead_file: IO[str] | None, recorder: Any) -> Iterator[None]:
    """Around a run's event loop, on either engine: Ctrl-C that reached
    Python (exit 130) and a run's error (exit 1) told in one line, never a
    traceback; the dead-letter file closed and the recording's line written
    however it ended."""
    try:
        yield
    except KeyboardInterrupt:
        click.echo("interrupted; all component processes were stopped", err=True)
        raise SystemExit(EXIT_SIGINT) from None
    except (TopologyError, MultilangError) as exc:
        _failed(exc)
    finally:
        if dead_file is not None:
            dead_file.close()
        if recorder is not None:
            _recorded(recorder)


def _failed(exc: MultilangError) -> NoReturn:
    """The run could not go on: one line, exit 2 for a topology error, else 1."""
    click.echo(f"error: {exc}", err=True)
    raise SystemExit(EXIT_USAGE if isinstance(exc, TopologyError) else EXIT_FAILED) from None


def _ended(topology: Any, out: Output, result: Any, signum: int | None, start: float,
           dead_letter: str | None) -> None:
    """A run ended: its output view, the summary, an interrupt named; SystemExit with the exit code."""
    for record in result.outputs:
        out.line(orjson.dumps(record))
    out.flush()
    print_summary(result, time.monotonic() - start, dead_letter, topology)
    signum = signum or _signals.first  # (one that came while the output and the summary were written)
    if signum is not None:
        interrupted(signum, bool(topology.output.key))
    raise SystemExit(EXIT_OUTPUT_CLOSED if out.closed and signum is None else exit_code(result, signum))

def _run_workers(topology: Any, output: IO[str], workers: int, *, duration: float | None, until_done: bool,
                 progress: Any, metrics: Any, dead_letter: str | None, recorder: Any, max_tuples: int | None,
                 log_level: str) -> None:
    """``multilang run --workers N`` (N > 1); ends in SystemExit with the exit code."""
    from multilang.shellbolt import WorkersControl, run_workers

    out = Output(output)
    on_dead_letter, dead_file = dead_letter_writer(dead_letter)
    control = WorkersControl()
    out.runtime = control  # (the output's reader gone: the run stops, as on one worker)
    start = time.monotonic()
    latest: list[dict[str, Any]] = []  # the run's last snapshot, merged from the workers' (the view, the metrics)
    lines = metrics is not None and metrics.writes_lines
    # A snapshot is asked of the workers at the pace of the live view or of the metrics file, the
    # quicker; each takes the first snapshot at or past each of its intervals (seconds into the run).
    every = {"frame": progress.interval if progress is not None else 0.0, "line": metrics.interval if lines else 0.0}
    due = {what: interval for what, interval in every.items() if interval}

    def taken(what: str, elapsed: float) -> bool:
        if elapsed < due[what]:
            return False
        while due[what] <= elapsed:
            due[what] += every[what]
        return True

    def on_snapshot(snap: dict[str, Any], last: bool) -> None:
        # As the embedded engine's view: a frame every interval and, on a terminal, the final one
        # (LiveView.finish); the first, before the workers start, seeds the metrics only. The metrics
        # file: a line every interval, and the final one when the run ends (metrics.close).
        seed = not latest
        latest[:] = [snap]
        if seed:
            return
        elapsed = float(snap.get("elapsed_s") or 0.0)
        if progress is not None and (progress.tty if last else taken("frame", elapsed)):
            progress.show(snap)
        if lines and not last and taken("line", elapsed):
            metrics.write_line(control)

    if metrics is not None:
        metrics.snapshot = lambda _runtime: latest[0]

    async def go(nursery: Any) -> Any:
        nursery.start_soon(flush_every, out)
        if metrics is not None:
            nursery.start_soon(functools.partial(metrics.run, control, lines=False))
        return await run_workers(topology, workers, on_output=lambda r: out.line(orjson.dumps(r)), duration=duration,
                                 until_done=until_done, control=control,
                                 on_snapshot=on_snapshot if progress is not None or metrics is not None else None,
                                 snapshot_every=min(due.values(), default=2.0),
                                 on_dead_letter=on_dead_letter, recorder=recorder, max_tuples=max_tuples,
                                 log_level=log_level, fork_server=server)

    server = _fork_server()
    try:
        with _run_ending(dead_file, recorder):
            result, signum = run_trio(go, control)
    finally:
        if progress is not None:
            progress.close()
        if metrics is not None:
            metrics.close(control if latest else None)  # the last line: the run's final counts
        if server is not None:
            server.close()
    signum = signum or _signals.first
    if result is None:  # (cancelled: no signal does that to a run on workers, but nothing is left to say then)
        out.flush()
        interrupted(signum or signal.SIGINT, bool(topology.output.key))
        raise SystemExit(exit_code(None, signum or signal.SIGINT))
    _ended(topology, out, result, signum, start, dead_letter)


def _fork_server() -> Any:
    """The workers' fork server (docs/WORKERS.md), started before the run's
    event loop; None where this process cannot fork one (no ``os.fork``, or
    the fork failed): each worker is then a new interpreter."""
    from multilang.shellbolt import ForkServer

    try:
        return ForkServer.start()
    except (RuntimeError, OSError, AttributeError) as exc:  # (AttributeError: a system without os.fork)
        logging.getLogger("multilang.shellbolt").debug("no fork server (%s): each host worker starts as a new "
                                                       "interpreter", exc)
        return None


def _metrics_reporter(topology: Any, engine: str, file: str | None, port: int | None, host: str | None) -> Any:
    """The run's metrics consumers (docs/OBSERVE.md): --metrics-file,
    --metrics-port and the topology's topology.metrics.consumer.register,
    opened and bound now, before any process starts; None if there are none.
    One that cannot be (a port in use, a file that cannot be written) is a
    usage error (exit 2) naming the option or the conf entry."""
    from multilang.shellbolt import CONSUMER_KEY, MetricsReporter

    if host is not None and port is None:
        raise click.UsageError("--metrics-host applies with --metrics-port")
    if engine == "spark":
        if file is not None or port is not None:
            click.echo("error: --metrics-file and --metrics-port apply to the embedded engine, not --engine spark",
                       err=True)
            raise SystemExit(EXIT_USAGE)
        if topology.conf.get(CONSUMER_KEY):
            click.echo(f"warning: {CONSUMER_KEY} applies to the embedded engine; ignored on --engine spark", err=True)
        return None
    try:
        reporter = MetricsReporter.from_conf(topology.conf, file=file, port=port, host=host)
    except TopologyError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from None
    for h, p in reporter.endpoints:
        click.echo(f"[metrics] serving http://{f'[{h}]' if ':' in h else h}:{p}/metrics", err=True)
    return reporter or None

#: the master URLs Spark's submitter accepts (anything else: a Java stack trace from spark-submit)
_SPARK_MASTER = re.compile(r"^(local(\[([1-9]\d*|\*)(,[1-9]\d*)?\])?|local-cluster\[[1-9]\d*,[1-9]\d*,[1-9]\d*\]"
                           r"|spark://\S+|yarn|k8s://\S+)$")

def _unreachable(remote: str, timeout: float = 5.0) -> str | None:
    """Why a Spark Connect server cannot be reached at ``remote``
    (sc://host[:port]...; port 15002 by default), or None: a TCP connection
    is tried first, because PySpark's client retries a refused connection
    for minutes before it gives up."""
    from urllib.parse import urlparse

    try:
        url = urlparse(remote)
        host, port = url.hostname, url.port or 15002
    except ValueError as exc:
        return f"not a Spark Connect URL ({exc})"
    if not host:
        return "no host in the URL (sc://host[:port])"
    why = _no_connection(host, port, timeout)
    return None if why is None else f"cannot reach a Spark Connect server at {host}:{port} ({why}); is it running?"


def _unreachable_master(master: str, timeout: float = 5.0) -> str | None:
    """Why no standalone master of ``master`` (spark://HOST:PORT[,HOST:PORT...],
    each with its port, as Spark wants them) can be reached, or None: Spark's
    client tries to register for a minute (3 tries, 20 s apart) before it
    says so. The same for the Kubernetes API server of k8s://[https://]HOST:PORT
    (the port required, as Spark requires it), where Spark printed a Java
    stack trace of 267 frames."""
    k8s = master.startswith("k8s://")
    parts = [re.sub(r"^https?://", "", master.removeprefix("k8s://")).split("/", 1)[0]] if k8s else \
        master.removeprefix("spark://").split(",")  # (an API server's URL may have a path: a proxy's)
    whys = []
    for part in parts:
        host, _, port = part.rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            hint = "Spark wants the API server's port, 443 or 6443 as a rule" if k8s else \
                "a standalone master listens on port 7077 unless told otherwise"
            return f"{part!r} is not HOST:PORT ({hint})"
        why = _no_connection(host, int(port), timeout)
        if why is None:
            return None
        whys.append(f"{f'[{host}]' if ':' in host else host}:{port} ({why})")
    what = "the Kubernetes API server" if k8s else "a Spark master"
    return f"cannot reach {what} at {', '.join(whys)}; is it running?"


def _no_connection(host: str, port: int, timeout: float) -> str | None:
    """Why a TCP connection to host:port fails, or None."""
    import socket

    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__
    return None


# Spark's conf entries that are sizes (bytesConf: Spark's JavaUtils.byteStringAs reads them): a whole
# number and a unit of b, k(b), m(b), g(b), t(b) or p(b), any case.
_SPARK_SIZES = ("spark.driver.memory", "spark.executor.memory", "spark.driver.memoryOverhead",
                "spark.executor.memoryOverhead", "spark.driver.maxResultSize", "spark.executor.pyspark.memory")
_SPARK_SIZE = re.compile(r"[0-9]+(b|[kmgtp]b?)?")


def _sizes_spark_takes(spark_conf: dict[str, str]) -> None:
    """TopologyError for a -c size that Spark would refuse: a trial's
    spark.driver.memory=xyz stopped the JVM as it started (exit 1, in the
    JVM's words: "Invalid maximum heap size"), and a bad
    spark.driver.maxResultSize failed the SparkContext with a stack trace."""
    for key in _SPARK_SIZES:
        value = spark_conf.get(key)
        if value is not None:
            if not _SPARK_SIZE.fullmatch(value.strip().lower()):
                raise TopologyError(f"-c {key}={value}: not a size; Spark takes a whole number, with a unit of b, "
                                    "k, m, g, t or p (512m, 2g)")
            spark_conf[key] = value.strip()  # (as Spark reads it: the JVM's -Xmx would refuse " 2g")


def _spark_value(value: Any) -> str:
    """A -c value (read as JSON) as Spark conf text: true, 4, 2g."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _local_archives_exist(archives: str) -> None:
    """TopologyError unless each archive of ``--archives`` that is a file
    here (a path, or a file: URI; a URI of another scheme is the cluster's
    to find) exists: else Spark started, then failed with a Java
    NoSuchFileException (exit 1, a trial). ``#name`` after one is the
    folder it unpacks into."""
    for entry in filter(None, (e.strip() for e in archives.split(","))):
        path = entry.split("#", 1)[0]
        if path.startswith("file:"):
            path = urllib.parse.urlparse(path).path
        elif re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path):
            continue
        if not os.path.isfile(path):
            what = "is not a file" if os.path.exists(path) else "does not exist"
            raise TopologyError(f"--archives {entry}: {path} {what} (a local archive is read here and shipped to "
                                "the executors)")


def _run_on_spark(topology: Any, *, master: str, remote: str | None, checkpoint: str | None,
                  duration: float | None, max_tuples: int | None, output: Any, progress: bool,
                  dead_letter: str | None, spark_conf: dict[str, str] | None = None) -> int:
    """``multilang run --engine spark``: a Structured Streaming query
    (docs/SPARK.md); a line per micro-batch and a summary on stderr, the
    output view as JSON lines on ``output``; returns the exit code."""
    if remote is not None and not re.match(r"^(sc://\S+|local(\[([1-9]\d*|\*)\])?)$", remote):
        click.echo(f"error: --remote {remote!r}: a Spark Connect URL is sc://host[:port][/;params], or local[N] "
                   "for a local Connect server", err=True)
        return EXIT_USAGE
    if remote is not None and remote.startswith("sc://"):
        unreachable = _unreachable(remote)
        if unreachable:
            click.echo(f"error: --remote {remote}: {unreachable}", err=True)
            return EXIT_USAGE
    if master.startswith(("spark://", "k8s://")):
        unreachable = _unreachable_master(master)
        if unreachable:
            click.echo(f"error: --master {master}: {unreachable}", err=True)
            return EXIT_USAGE

    letters = None
    if dead_letter:  # (opened now, as the embedded engine opens it: a run without dead letters leaves it empty)
        try:
            letters = open(dead_letter, "wb")  # noqa: SIM115 - closed below, after the run
        except OSError as exc:
            click.echo(f"error: --dead-letter {dead_letter}: {exc.strerror or exc}", err=True)
            return EXIT_USAGE
    try:
        return _spark_run(topology, master=master, remote=remote, checkpoint=checkpoint, duration=duration,
                          max_tuples=max_tuples, output=output, progress=progress, dead_letter=dead_letter,
                          letters=letters, spark_conf=spark_conf)
    finally:
        if letters is not None:
            letters.close()


def _spark_run(topology: Any, *, master: str, remote: str | None, checkpoint: str | None, duration: float | None,
               max_tuples: int | None, output: Any, progress: bool, dead_letter: str | None, letters: Any,
               spark_conf: dict[str, str] | None) -> int:
    """The query, its signals and its summary, once the options are checked
    (``letters``: --dead-letter's file, open)."""
    from multilang.adapters.spark import kill_spark_jvm, run_topology, spark_error_text

    def emit(rec: dict[str, Any]) -> None:
        output.write(orjson.dumps(rec).decode() + "\n")

    def echo(line: str) -> None:
        click.echo(line, err=True)

    start = time.monotonic()
    stop: dict[str, Any] = {"signal": None, "running": False, "at_once": False, "said": False}

    def on_signal(signum: int, frame: Any) -> None:
        _signals.release_terminal(signum)
        first = stop["signal"] is None
        stop["signal"] = signum
        if not first or not stop["running"]:
            stop["at_once"] = True
            raise KeyboardInterrupt  # a second signal, or no query to stop yet: at once

    def should_stop() -> bool:
        stop["running"] = True  # the query runs: a signal now stops it between batches
        if stop["signal"] is not None and not stop["said"]:  # (said here: a handler's write to stderr could be
            stop["said"] = True                              # inside the main thread's own)
            click.echo(f"{signal.Signals(stop['signal']).name}: stopping after the batch running now (the summary "
                       "and the output so far follow; signal again to stop at once)", err=True)
        return stop["signal"] is not None

    view = None
    if progress and sys.stderr.isatty():  # the live view, from the committed micro-batches (docs/OBSERVE.md)
        from .live import LiveView

        view = LiveView(sys.stderr, tty=True)

    def not_after_a_signal(record: logging.LogRecord) -> bool:
        # py4j logs a KeyboardInterrupt raised inside a call into the JVM (a signal during the start-up,
        # or a second one) on the root logger, with its traceback: the stop was asked for, "interrupted" says so.
        # It logs an exception our foreachBatch raised too ("... executing the Python Proxy ..."), with 70
        # lines of traceback: the query fails with it, and the one-line error below says it.
        if record.name.startswith("py4j") and "Python Proxy" in record.getMessage():
            return False
        return stop["signal"] is None or f"{os.sep}py4j{os.sep}" not in record.pathname

    old = {s: signal.signal(s, on_signal) for s in _signals.handled()}
    printing = list(logging.getLogger().handlers)
    for h in printing:
        h.addFilter(not_after_a_signal)
    try:
        result = run_topology(topology, master=master, remote=remote, spark_conf=spark_conf, checkpoint=checkpoint,
                              duration=duration,
                              max_tuples=max_tuples, on_record=emit,
                              on_progress=echo if progress and view is None else None,
                              on_snapshot=view.show if view is not None else None, should_stop=should_stop)
    # (The output view is written at the end: none of these wrote any, and -o FILE is left as it was.)
    except KeyboardInterrupt:
        signum = stop["signal"] or signal.SIGINT
        kill_spark_jvm()  # (at once: nothing it says as it dies follows the last line)
        if not stop["running"]:  # (as the embedded engine says it: a signal before the query ran)
            click.echo(f"[summary] interrupted by {signal.Signals(signum).name} before the topology started: "
                       "nothing ran", err=True)
        else:
            click.echo("interrupted", err=True)
        raise NoOutput(_signals.exit_status(signum)) from None
    except TopologyError as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - Spark job failures arrive as Py4J/Python exceptions
        if stop["at_once"]:  # cut short inside a call into the JVM, whose connection the next call found broken
            kill_spark_jvm()
            click.echo("interrupted", err=True)
            raise NoOutput(_signals.exit_status(stop["signal"])) from None
        if stop["signal"] is not None:  # (the JVM died of its own signal: SIGKILL, or the OOM killer's)
            cause = (spark_error_text(exc).splitlines() or [type(exc).__name__])[0]
            click.echo(f"interrupted: Spark stopped with the run ({cause})", err=True)
            raise NoOutput(_signals.exit_status(stop["signal"])) from None
        text = spark_error_text(exc)
        bad_conf = re.search(r"\[INVALID_CONF_VALUE[^\n]*", f"{text}\n{exc}")  # (a -c spark.KEY=VALUE refused)
        if bad_conf:
            click.echo(f"error: a Spark conf value (-c spark.KEY=VALUE) is invalid: {bad_conf.group(0)}", err=True)
            raise NoOutput(EXIT_USAGE) from None
        if not stop["running"] and spark_conf:  # (Spark's word may not name the key: "For input string: "x"")
            given = ", ".join(f"{k}={v}" for k, v in spark_conf.items())
            text = f"{text} (before the query ran; the Spark conf given: {given})"
        if "JAVA_GATEWAY_EXITED" in text:  # (no job ran: the JVM said why, above)
            click.echo(f"error: Spark's JVM did not start (its own words are above): {text}", err=True)
            raise NoOutput(EXIT_FAILED) from None
        click.echo(f"error: the Spark job failed: {text}", err=True)
        raise NoOutput(EXIT_FAILED) from None
    finally:
        if stop["signal"] is None:  # (after one, py4j's connections log their ends as the process exits too)
            for h in printing:
                h.removeFilter(not_after_a_signal)
        for s, h in old.items():
            signal.signal(s, h)
        if view is not None:
            view.close()
    output.flush()
    where = f"remote {remote}" if remote else master
    click.echo(f"[summary] spark ({where}) {time.monotonic() - start:.1f}s, {result.batches} micro-batches, "
               f"stopped by {result.stopped_by}; spout tuples "
               + (", ".join(f"{k}: {v}" for k, v in sorted(result.spout_tuples.items())) or "0"), err=True)
    for name, c in result.counters.items():
        click.echo(f"[summary]   {name}: rows in {c.get('rows_in', 0)}, emitted {c.get('emitted', 0)}, "
                   f"acked {c.get('acked', 0)}, failed {c.get('failed', 0)}, retried {c.get('retried', 0)}, "
                   f"restarts {c.get('restarts', 0)}"
                   + (f", Spark task retries {c['task_retries']}" if c.get("task_retries") else ""), err=True)
    if result.stopped_by == "done":
        for name in sorted(n for n, c in topology.components.items() if c.kind == "spout"):
            if not result.spout_tuples.get(name):
                click.echo(emitted_nothing_line(name, topology), err=True)
    if result.dead_letters:
        click.echo(f"[summary] {len(result.dead_letters)} input(s) given up on after their retries"
                   + (f", written to {dead_letter}" if dead_letter else "; --dead-letter FILE keeps them"), err=True)
        if letters is not None:
            for d in result.dead_letters:
                letters.write(orjson.dumps(d, default=repr) + b"\n")
    if checkpoint:
        where = checkpoint if "://" in checkpoint else os.path.abspath(checkpoint)
        click.echo(f"[summary] checkpoint {where} (run the same command to continue)", err=True)
    if stop["signal"] is not None:  # (what the committed batches gave, as the embedded engine says it)
        interrupted(stop["signal"], bool(topology.output.key))
        return _signals.exit_status(stop["signal"])
    return EXIT_OK if result.ok else EXIT_FAILED

def _recorder(path: str | None, engine: str, topology: Any) -> Any:
    """``--record DIR``'s recorder (``shellbolt/_replay/record.py``), or None. Exit 2
    on --engine spark and on a directory that exists and is not empty or
    cannot be written: recordings are never mixed."""
    if path is None:
        return None
    if engine == "spark":
        click.echo("error: --record applies to the embedded engine: the Spark engine's processes run in Spark "
                   "tasks; record the topology with --engine local", err=True)
        raise SystemExit(EXIT_USAGE)
    if not path.strip():
        raise click.BadParameter("an empty path (an unset shell variable?)", param_hint="--record")
    from multilang.shellbolt import Recorder, RecordingError

    try:
        return Recorder(path, topology)
    except (RecordingError, TopologyError) as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from None
    except OSError as exc:
        click.echo(f"error: --record {path}: {exc.strerror or exc}", err=True)
        raise SystemExit(EXIT_USAGE) from None

def _recorded(recorder: Any) -> None:
    """Close the recording and say where it is and how to replay it."""
    recorder.close()
    tasks = recorder.task_ids()
    comps = [name for name, c in recorder.meta["components"].items() if set(c["tasks"]) & set(tasks)]
    click.echo(f"[record] frames of {len(tasks)} task(s) ({', '.join(comps) or 'none'}) recorded in "
               f"{recorder.path}; replay one with: multilang replay {recorder.path} --component C [--task N] -- CMD",
               err=True)
