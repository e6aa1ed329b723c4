"""The ``multilang`` command line (click). Thin: parsing, output, exit codes.

Exit codes of ``multilang run`` and ``multilang pipe``:

====  =========================================================
0     the run finished; no input was given up on (trees still in
      flight at a timed stop are "abandoned at stop", not failures)
1     an input failed for good (a dead letter after
      multilang.max.replays) or a component gave up after its
      restart budget
2     usage error or invalid topology (nothing was started)
130   interrupted (Ctrl-C / SIGINT): summary and partial output printed
143   terminated (SIGTERM): summary and partial output printed
141   the reader of the output went away (``| head``): stopped quietly
====  =========================================================

Human output (progress, summary, logs) goes to stderr; data to stdout.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import pathlib
import re
import signal
import sys
import time
from typing import IO, Any

import click
import orjson

from . import signals as _signals
from .._component import release_stdout
from ..errors import MultilangError, TopologyError
from .pipe_input import StdinFeed
from .output import Output, flush_every, output_file
from .pipe_output import HeldOutputs

release_stdout()  # a host: its stdout is its own

__all__ = ["main", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_SIGINT", "EXIT_SIGTERM", "EXIT_OUTPUT_CLOSED"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 2, 130, 143
EXIT_OUTPUT_CLOSED = 141  # 128 + SIGPIPE, as a shell reports `yes | head`


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="multilang-bridge")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Run Apache Storm multilang spouts and bolts, in any language."""
    if ctx.invoked_subcommand not in ("run", "pipe"):
        _signals.default()  # only run and pipe finish their output after a signal


def _owning_signals(fn: Any) -> Any:
    """run and pipe: a signal at any moment is noted, never a traceback or
    a raw death (_signals); while the topology runs, _run_trio receives them."""
    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        with _signals.owned():
            return fn(*args, **kwargs)

    return command


def _parse_conf(pairs: tuple[str, ...]) -> dict[str, Any]:
    from multilang.shellbolt import check_value

    conf: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--conf")
        try:
            conf[key] = json.loads(raw)
        except ValueError:
            conf[key] = raw  # a bare string
        wrong = check_value(key, conf[key])
        if wrong is not None and not isinstance(conf[key], str) and check_value(key, raw) is None:
            # a string key given digits, true or null: read as JSON, so not a string
            raise click.BadParameter(f"{wrong}: a value is read as JSON; for the string, quote it: "
                                     f"-c '{key}=\"{raw}\"'", param_hint="--conf")
    return conf


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number of seconds")
    return value


def _setup_logging(level: str) -> None:
    """``--log-level`` is the host's own level. What components say (their
    ``log`` frames below WARN and their stderr lines, multilang.component.*,
    within a line budget per process) shows at info unless it is ``error``,
    as Storm's worker log shows a ShellBolt's logs."""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)-5s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    components = {"debug": logging.DEBUG, "error": logging.ERROR}.get(level, logging.INFO)
    logging.getLogger("multilang.component").setLevel(components)


def _live_view(tasks: bool) -> Any:
    """The live view on stderr (multilang/_cli/live.py): rows updated in place on
    a terminal, plain ``[progress]`` lines elsewhere; ``tasks``
    (``--progress-tasks``): a row per task too."""
    from .live import LiveView

    return LiveView(sys.stderr, tasks=tasks)


def _summary(result: Any, elapsed: float, dead_letter_file: str | None = None) -> None:
    line = (f"[summary] {elapsed:.1f}s; trees completed {result.completed}, failed {result.failed} "
            f"(timed out {result.timed_out})")
    if result.pending:
        line += f", abandoned at stop {result.pending}"
    click.echo(line, err=True)
    spouts = set(getattr(result, "spouts", ()))
    for name, s in result.stats.items():
        skipped = "skipped (already committed, or in flight from a process that died)"
        extra = "".join(f", {label} {n}" for label, n in (("dropped stale", s.expired),
                                                            ("dead letters", s.dead_letters),
                                                            (skipped, s.skipped)) if n)
        executed = "" if name in spouts else f"executed {s.executed}, "  # a spout executes nothing
        click.echo(f"[summary]   {name}: emitted {s.emitted}, {executed}acked {s.acked}, "
                   f"failed {s.failed}, restarts {s.restarts}, errors {s.errors}{extra}", err=True)
        if s.metrics:  # the last `metrics` frame of each name (§3.7)
            shown = ", ".join(f"{k}={orjson.dumps(v, default=repr).decode()}" for k, v in sorted(s.metrics.items()))
            click.echo(f"[summary]     {name} metrics: {_clip(shown)}", err=True)
    exts = getattr(result, "extensions", {})
    if exts:  # the shell components: what their processes negotiated (§9.2), one line for all
        click.echo("[summary] protocol: " + "; ".join(f"{n} {'+'.join(e) if e else 'standard'}"
                                                    for n, e in exts.items()), err=True)
    if result.dead_letters:
        where = f" (written to {dead_letter_file})" if dead_letter_file else " (keep them with --dead-letter FILE)"
        click.echo(f"[summary] {result.dead_letters} input(s) failed for good and were given up on: after "
                   f"multilang.max.replays, or refused before they were sent (0 attempts){where}:", err=True)
        for d in result.dead_letter_sample:
            where = f"stdin line {d.line}" if getattr(d, "line", None) is not None else d.component
            click.echo(f"[summary]   {where}: {_clip(_json_text(d.input))} "
                       f"({d.attempts} attempts): {d.cause}", err=True)
        if result.dead_letters > len(result.dead_letter_sample):
            click.echo(f"[summary]   ... and {result.dead_letters - len(result.dead_letter_sample)} more", err=True)
    if result.stopped_by == "replays":
        click.echo("[summary] stopped: trees kept failing and none completed while a shell spout replayed message "
                   "ids failed past multilang.max.replays; it would have replayed them for ever", err=True)
    for name, n in getattr(result, "reused_ids", {}).items():
        click.echo(f"[summary] spout {name!r} reused {n} message id(s) for inputs other than those a checkpoint "
                   "holds under them: delivered as new inputs (at least once); a spout must give each input one id "
                   "for exactly-once state (docs/STATE.md)", err=True)
    for where, n, sample in getattr(result, "not_replayed", ()):
        click.echo(f"[summary] spout {where} never emitted again {n} message id(s) that failed (e.g. "
                   f"{_clip(', '.join(map(repr, sample)), 100)}): that input is lost. A spout must replay what fails "
                   "for at-least-once results, and for exactly-once state (docs/STATE.md)", err=True)
    for name, msg_id, times, cause in result.repeated_failures:
        click.echo(f"[summary] spout {name!r} saw message id {_clip(repr(msg_id))} fail {times} times"
                   + (f"; last cause: {cause}" if cause else ""), err=True)
    if getattr(result, "state_path", None) and not result.stateful:
        click.echo(f"[summary] state: no bolt of this topology accepted the state extension (§9.7), so "
                   f"{result.state_path} holds nothing from this run", err=True)
    if getattr(result, "stateful", None):
        where = (f"kept in {result.state_path}" if result.state_path else
                 "kept for this run only (resume a run with --state-dir DIR)")
        last = "no checkpoint" if result.state_txid is None else f"checkpoint {result.state_txid}"
        click.echo(f"[summary] state of {', '.join(result.stateful)}: {last} committed "
                   f"({result.checkpoints} in this run, {result.rollbacks} rolled back); {where}", err=True)
    for err in result.gave_up:
        click.echo(f"[summary] gave up: {err}", err=True)
    if result.gave_up:  # the one line that says why the run failed, last (its cause in the component's own words)
        lines = [ln.strip() for ln in str(result.gave_up[0]).splitlines() if ln.strip()]
        said = f"; its stderr ended: {_clip(lines[-1])}" if len(lines) > 1 else ""
        click.echo(f"error: the run gave up: {lines[0] if lines else result.gave_up[0]}{said}", err=True)


def _json_text(obj: Any) -> str:
    """JSON text for the summary and --dead-letter: integers beyond 64 bits
    exact (orjson refuses them); a value JSON cannot hold at all (a lone
    surrogate, nesting deeper than the encoders go) as the string of its
    bounded repr, rather than an error that loses the letter."""
    from ..codec import dumps
    from multilang.shellbolt import short_repr

    try:
        return dumps(obj).decode()
    except MultilangError:
        return json.dumps(short_repr(obj))


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _dead_letter_writer(path: str | None, line_of: Any = None) -> tuple[Any, Any]:
    """(on_dead_letter callback, file) for --dead-letter: JSON lines with the
    input, the cause, the component and the attempts, flushed per letter;
    ``line_of`` (``multilang pipe``'s stdin feed) adds the input's line."""
    f = None
    if path is not None:
        try:
            f = open(path, "w", encoding="utf-8")
        except OSError as exc:
            click.echo(f"error: --dead-letter {path}: {exc.strerror}", err=True)
            raise SystemExit(EXIT_USAGE) from None
    if f is None and line_of is None:
        return None, None

    def write(letter: Any) -> None:
        if line_of is not None and letter.msg_id is not None:
            letter.line = line_of.line_of(letter.msg_id)
            line_of.forget(letter.msg_id)
        if f is not None:
            f.write(_json_text(letter.to_json()) + "\n")
            f.flush()

    return write, f


def _runtime(topology: Any, out: "Output", dead_letter: str | None, line_of: Any = None,
             **outputs: Any) -> tuple[Any, Any]:
    """The embedded runtime for ``topology`` writing to ``out``, with
    --dead-letter's writer: (runtime, dead-letter file or None). A topology
    the runtime refuses is a usage error (exit 2)."""
    from multilang.shellbolt import Runtime

    try:
        runtime = Runtime(topology, **outputs)
    except TopologyError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from None
    runtime.on_dead_letter, dead_file = _dead_letter_writer(dead_letter, line_of)
    out.runtime = runtime
    return runtime, dead_file


def _leaves(eg: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for e in eg.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


def _run_trio(fn: Any, runtime: Any) -> tuple[Any, int | None]:
    """Run ``fn(nursery)`` under trio; return ``(its result, signal number or None)``.

    The first SIGINT (Ctrl-C) or SIGTERM asks ``runtime`` to stop: spouts
    are deactivated, the trees in flight get the shutdown grace, and the run
    returns its result. A second signal stops at once: the run is cancelled
    and every process is closed without its grace periods (still reaped);
    the result is then None and the caller asks the runtime for what it
    has. Signals are received here rather than left to trio's
    KeyboardInterrupt delivery, which could be lost while the run idled."""
    import trio

    first: int | None = None

    async def wrapper() -> Any:
        out = None
        async with trio.open_nursery() as nursery:
            async def watch() -> None:
                def handle(signum: int) -> bool:
                    """True: stop at once (a second signal)."""
                    nonlocal first
                    name = signal.Signals(signum).name
                    if first is None:
                        first = signum
                        click.echo(f"{name}: stopping (the summary and the output so far follow; signal "
                                   "again to stop at once)", err=True)
                        runtime.request_stop("signal")
                        return False
                    click.echo(f"{name}: stopping at once", err=True)
                    runtime.abort()
                    nursery.cancel_scope.cancel()
                    return True

                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    if _signals.first is not None and handle(_signals.first):  # one that came during start-up
                        return
                    async for signum in signals:
                        if handle(signum):
                            return

            nursery.start_soon(watch)
            out = await fn(nursery)
            nursery.cancel_scope.cancel()
        return out

    try:
        result = trio.run(wrapper)
    except BaseExceptionGroup as eg:
        # trio wraps a Ctrl-C, or one error, in exception groups: unwrap.
        if eg.subgroup(KeyboardInterrupt) is not None:
            raise KeyboardInterrupt from None
        leaves = _leaves(eg)
        if len(leaves) == 1 and isinstance(leaves[0], Exception):
            raise leaves[0] from None
        raise
    return result, first


def _stopped_before_start() -> None:
    """A signal during start-up: nothing has run yet, so nothing is printed
    but a line saying so (FILE of -o is left as it was)."""
    if _signals.first is not None:
        click.echo(f"[summary] interrupted by {signal.Signals(_signals.first).name} before the topology started: "
                   "nothing ran", err=True)
        raise SystemExit(EXIT_SIGINT if _signals.first == signal.SIGINT else EXIT_SIGTERM)


def _interrupted(signum: int, keyed: bool) -> None:
    view = "the last tuple per key so far" if keyed else "what the run emitted before it stopped"
    click.echo(f"[summary] interrupted by {signal.Signals(signum).name}: the output is partial ({view}); "
               "all component processes were stopped", err=True)


def _exit_code(result: Any, signum: int | None) -> int:
    if signum is not None:
        return EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM
    return EXIT_OK if result.ok else EXIT_FAILED


@main.command(short_help="Run a topology (TOML or Storm Flux YAML), embedded or on Spark.")
@click.argument("topology_file", type=click.Path(dir_okay=False))
@click.option("--engine", type=click.Choice(["local", "spark"]), default="local", show_default=True,
              help="local: the embedded trio runtime. spark: compile onto Spark.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), callback=lambda ctx, param, v: _finite(v),
              help="Stop after this many seconds.")
@click.option("--max-tuples", type=click.IntRange(min=1),
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
@click.option("--state-dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Keep stateful bolts' state in DIR (one SQLite file per topology); run again with the same DIR "
                   "to resume after a crash. Default: a temporary directory, gone after the run.")
@click.option("--master", help="Spark master URL (--engine spark; default local[*]); local masters get task retries "
              "(local[N] runs as local[N,4]).")
@click.option("--remote", metavar="URL", help="Spark Connect: sc://host:port, or local[N] for a local Connect server "
              "(--engine spark).")
@click.option("--checkpoint", type=click.Path(file_okay=False), metavar="DIR",
              help="--engine spark: keep the query's checkpoint, the spouts' replay logs, the stateful bolts' state "
                   "and every micro-batch's output in DIR; the same command after a crash resumes. Default: a "
                   "temporary directory, gone after the run.")
@click.option("--filter", "filter_file", type=click.Path(dir_okay=False), metavar="PROPERTIES_FILE",
              help="Flux YAML: substitute ${name} with the values of this .properties file (like flux --filter).")
@click.option("--env-filter", "-e", is_flag=True,
              help="Flux YAML: substitute ${ENV-NAME} with environment variables (like flux -e).")
@click.option("--metrics-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Append the run's metrics to FILE as a JSON line every topology.builtin.metrics.bucket.size.secs "
                   "(10) and when the run ends (docs/OBSERVE.md).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), metavar="PORT",
              help="Serve the metrics at http://127.0.0.1:PORT/metrics (Prometheus text format) while the topology "
                   "runs; 0: a free port, printed on stderr.")
@click.option("--metrics-host", metavar="HOST",
              help="The address --metrics-port listens on (default 127.0.0.1, this machine only; 0.0.0.0: every "
                   "interface, for a Prometheus on another host or outside a container).")
@_owning_signals
def run(topology_file: str, engine: str, duration: float | None, max_tuples: int | None, until_done: bool | None,
        output: str, conf: tuple[str, ...], log_level: str, progress: bool, dead_letter: str | None,
        state_dir: str | None, master: str | None, remote: str | None, checkpoint: str | None, filter_file: str | None,
        env_filter: bool, metrics_file: str | None = None, metrics_port: int | None = None,
        metrics_host: str | None = None, record_dir: str | None = None, progress_tasks: bool = False) -> None:
    """Run the topology in TOPOLOGY_FILE (TOML, or Storm Flux YAML: .yaml/.yml)."""
    from multilang.shellbolt import load_topology

    _setup_logging(log_level)
    overrides = _parse_conf(conf)
    if state_dir is not None and not state_dir.strip():
        raise click.BadParameter("an empty path (an unset shell variable?)", param_hint="--state-dir")
    _distinct_files(("TOPOLOGY_FILE", topology_file), ("-o", output), ("--dead-letter", dead_letter),
                    ("--metrics-file", metrics_file), ("--filter", filter_file))
    try:
        if topology_file.endswith((".yaml", ".yml")):
            from multilang.shellbolt import load_flux

            topology = load_flux(topology_file, filter_file, os.environ if env_filter else None, overrides=overrides)
        elif filter_file is not None or env_filter:
            raise TopologyError("--filter and -e/--env-filter apply to Flux YAML files (.yaml/.yml) only")
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
            if master == "yarn" and not (os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR")):
                raise TopologyError("--master yarn: set HADOOP_CONF_DIR or YARN_CONF_DIR to the directory of the "
                                    "cluster's configuration files (Spark finds the ResourceManager there)")
        else:
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
    metrics = _metrics_reporter(topology, engine, metrics_file, metrics_port, metrics_host)
    recorder = _recorder(record_dir, engine, topology)
    _stopped_before_start()
    with output_file(output, refused=EXIT_USAGE) as stream:
        if engine == "spark":
            raise SystemExit(_run_on_spark(topology, master=master or "local[*]", remote=remote, checkpoint=checkpoint,
                                           duration=duration, max_tuples=max_tuples, output=stream,
                                           progress=progress, dead_letter=dead_letter))
        _run_local(topology, stream, duration=duration, max_tuples=max_tuples, until_done=until_done,
                   progress=progress, progress_tasks=progress_tasks, metrics=metrics, recorder=recorder,
                   dead_letter=dead_letter)


def _run_local(topology: Any, output: IO[str], *, duration: float | None, max_tuples: int | None,
               until_done: bool | None, progress: bool, progress_tasks: bool, metrics: Any, recorder: Any,
               dead_letter: str | None) -> None:
    """``multilang run`` on the embedded engine; ends in SystemExit with the exit code."""
    if until_done is None:
        until_done = duration is None and max_tuples is None

    out = Output(output)

    def emit(record: dict[str, Any]) -> None:
        out.line(orjson.dumps(record))

    runtime, dead_file = _runtime(topology, out, dead_letter, on_output=emit)
    runtime.recorder = recorder
    start = time.monotonic()
    try:
        async def go(nursery: Any) -> Any:
            nursery.start_soon(flush_every, out)
            return await runtime.run(duration=duration, max_tuples=max_tuples, until_done=until_done,
                                     progress=_live_view(progress_tasks) if progress else None, metrics=metrics)

        result, signum = _run_trio(go, runtime)
        if result is None:  # stopped at once by a second signal: what it had
            result = runtime.result()
        signum = signum or _signals.first  # one that came as the run ended: it ends as interrupted too
    except KeyboardInterrupt:
        click.echo("interrupted; all component processes were stopped", err=True)
        raise SystemExit(EXIT_SIGINT) from None
    except (TopologyError, MultilangError) as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE if isinstance(exc, TopologyError) else EXIT_FAILED) from None
    finally:
        if dead_file is not None:
            dead_file.close()
        if recorder is not None:
            _recorded(recorder)
    for record in result.outputs:
        emit(record)
    out.flush()
    _summary(result, time.monotonic() - start, dead_letter)
    if signum is not None:
        _interrupted(signum, bool(topology.output.key))
    raise SystemExit(EXIT_OUTPUT_CLOSED if out.closed and signum is None else _exit_code(result, signum))


@main.command(short_help="Pipe stdin through one bolt: a tuple per line, a JSON line per emit.")
@click.option("--fields", default=None,
              help="Comma-separated input fields of the tuples the bolt gets. Default: one field, line; with "
                   "--json-input, as many values as each line's list has.")
@click.option("--output-fields", default=None, help="Comma-separated fields the bolt emits (default: any number of values).")
@click.option("--json-input", is_flag=True, help="Each input line is a JSON list of values instead of one string "
                                                  "(any other JSON value, such as an object, is one value).")
@click.option("--conf", "-c", multiple=True, metavar="KEY=VALUE",
              help="Conf override, e.g. -c topology.message.timeout.secs=5 (VALUE parsed as JSON if it can be; "
                   "docs/CONF.md lists the keys).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="warning", show_default=True,
              help="The host's own messages; what the bolt logs and writes to stderr shows unless error.")
@click.option("--dead-letter", "dead_letter", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write input lines given up on (after multilang.max.replays) here, as JSON lines.")
@click.argument("command", nargs=-1, required=True)
@_owning_signals
def pipe(fields: str | None, output_fields: str | None, json_input: bool, conf: tuple[str, ...], log_level: str,
         dead_letter: str | None, command: tuple[str, ...]) -> None:
    """Pipe stdin through one bolt: each line becomes a tuple, each emit a JSON line.

    Like Spark's RDD.pipe, but with a multilang bolt: multilang pipe -- ruby split_bolt.rb
    """
    from multilang.shellbolt import PythonSpout, ShellBolt, TopologyBuilder

    _setup_logging(log_level)
    if fields is None:
        fields = "*" if json_input else "line"  # "*": any number of values (a JSON list per line)
    in_fields = fields.split(",") if fields else []
    if not in_fields:
        raise click.UsageError("--fields names no field")
    if "" in in_fields:
        raise click.UsageError(f"--fields {fields!r} has an empty field name (two commas, or one at an end)")
    if len(in_fields) > 1 and not json_input:
        raise click.UsageError(f"--fields declares {len(in_fields)} fields, but without --json-input each line is "
                               "one value; add --json-input (a JSON list per line) or give one field")

    feed = StdinFeed(0 if in_fields == ["*"] else len(in_fields), json_input)
    builder = TopologyBuilder()
    builder.set_spout("stdin", PythonSpout(feed, fields=in_fields))
    # Without --output-fields the bolt may emit tuples of any length ("*").
    out_fields = output_fields.split(",") if output_fields else ["*"]
    builder.set_bolt("bolt", ShellBolt(list(command), fields=out_fields)).shuffle_grouping("stdin")
    overrides = _parse_conf(conf)
    from multilang.shellbolt import SCHEMA

    flux_only = [k for k in overrides if k in SCHEMA and SCHEMA[k].flux]
    if flux_only:  # pipe's output is every emit of its one bolt; it has no Java classes to place
        raise click.UsageError(f"{', '.join(flux_only)}: applies to Flux YAML files (multilang run) only and "
                               "would be ignored by multilang pipe")
    kept = [k for k in ("topology.state.provider", "topology.state.provider.config") if k in overrides]
    if kept:
        # stdin cannot be read again: a resumed pipe would skip the next input's first lines as "done"
        raise click.UsageError(f"{', '.join(kept)}: multilang pipe keeps no state between runs (its input is "
                               "stdin); a stateful bolt's state lives for one run. Use multilang run --state-dir "
                               "with a topology whose spout can replay its input.")
    try:
        topology = builder.create_topology(overrides, name="pipe")
        feed.max_line = int(topology.conf.get("multilang.max.frame.bytes") or feed.max_line)
    except TopologyError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from None

    _stopped_before_start()
    out = Output(sys.stdout)
    held = HeldOutputs(out.values)  # each input's outputs once its tree completes: exactly once per input
    runtime, dead_file = _runtime(topology, out, dead_letter, on_tracked_output=held.output, line_of=feed)
    held.roots = runtime.acker.roots
    feed.on_ack, feed.on_fail = held.acked, held.failed
    start = time.monotonic()
    try:
        (spout,) = [t for t in runtime.tasks.values() if t.name == "stdin"]

        async def go(nursery: Any) -> Any:
            nursery.start_soon(feed.pump, runtime, spout)
            nursery.start_soon(flush_every, out)
            return await runtime.run(until_done=True)

        result, signum = _run_trio(go, runtime)
        if result is None:  # stopped at once by a second signal: what it had
            result = runtime.result()
        signum = signum or _signals.first
    except KeyboardInterrupt:
        raise SystemExit(EXIT_SIGINT) from None
    except MultilangError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE if isinstance(exc, TopologyError) else EXIT_FAILED) from None
    finally:
        if dead_file is not None:
            dead_file.close()
    out.flush()
    code = EXIT_OUTPUT_CLOSED if out.closed and signum is None else _exit_code(result, signum)
    if code not in (EXIT_OK, EXIT_OUTPUT_CLOSED):
        _summary(result, time.monotonic() - start, dead_letter)
    if signum is not None:
        _interrupted(signum, False)
    raise SystemExit(code)


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


def _check_command(cmd: tuple[str, ...]) -> None:
    """Exit 2 naming why CMD cannot run (not on PATH, a directory, not
    executable, a missing script), before any vector starts."""
    from multilang.shellbolt import command_problem

    problem = command_problem(list(cmd), os.getcwd(), os.environ.get("PATH"))
    if problem is not None:
        click.echo(f"error: {problem}", err=True)
        raise SystemExit(EXIT_USAGE)


def _distinct_files(*named: tuple[str, str | None]) -> None:
    """Exit 2 if two of the files a run reads or writes are one file: -o over
    the topology file would replace it with the output."""
    seen: dict[str, str] = {}
    for flag, path in named:
        if path is None or path == "-":
            continue
        real = os.path.realpath(path)
        if real in seen:
            click.echo(f"error: {flag} {path}: the same file as {seen[real]}; name another", err=True)
            raise SystemExit(EXIT_USAGE)
        seen[real] = f"{flag} {path}" if flag != "TOPOLOGY_FILE" else f"the topology file {path}"


def _unreachable(remote: str, timeout: float = 5.0) -> str | None:
    """Why a Spark Connect server cannot be reached at ``remote``
    (sc://host[:port]...; port 15002 by default), or None: a TCP connection
    is tried first, because PySpark's client retries a refused connection
    for minutes before it gives up."""
    import socket
    from urllib.parse import urlparse

    try:
        url = urlparse(remote)
        host, port = url.hostname, url.port or 15002
    except ValueError as exc:
        return f"not a Spark Connect URL ({exc})"
    if not host:
        return "no host in the URL (sc://host[:port])"
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        return f"cannot reach a Spark Connect server at {host}:{port} ({why}); is it running?"
    return None


def _run_on_spark(topology: Any, *, master: str, remote: str | None, checkpoint: str | None,
                  duration: float | None, max_tuples: int | None, output: Any, progress: bool,
                  dead_letter: str | None) -> int:
    """``multilang run --engine spark``: a Structured Streaming query
    (docs/SPARK.md); a line per micro-batch and a summary on stderr, the
    output view as JSON lines on ``output``; returns the exit code."""
    from multilang.adapters.spark import run_topology, spark_error_text

    if remote is not None and not re.match(r"^(sc://\S+|local(\[([1-9]\d*|\*)\])?)$", remote):
        click.echo(f"error: --remote {remote!r}: a Spark Connect URL is sc://host[:port][/;params], or local[N] "
                   "for a local Connect server", err=True)
        return EXIT_USAGE
    if remote is not None and remote.startswith("sc://"):
        unreachable = _unreachable(remote)
        if unreachable:
            click.echo(f"error: --remote {remote}: {unreachable}", err=True)
            return EXIT_USAGE

    def emit(rec: dict[str, Any]) -> None:
        output.write(orjson.dumps(rec).decode() + "\n")

    def echo(line: str) -> None:
        click.echo(line, err=True)

    start = time.monotonic()
    stop: dict[str, Any] = {"signal": None, "running": False}

    def on_signal(signum: int, frame: Any) -> None:
        first = stop["signal"] is None
        stop["signal"] = signum
        if not first or not stop["running"]:
            raise KeyboardInterrupt  # a second signal, or no query to stop yet: at once

    def should_stop() -> bool:
        if not stop["running"]:  # the query runs: a signal now stops it between batches
            stop["running"] = True
            for s in old:  # again: PySpark's SparkContext put its own SIGINT handler in place
                signal.signal(s, on_signal)
        return stop["signal"] is not None

    view = None
    if progress and sys.stderr.isatty():  # the live view, from the committed micro-batches (docs/OBSERVE.md)
        from .live import LiveView

        view = LiveView(sys.stderr, tty=True)
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        result = run_topology(topology, master=master, remote=remote, checkpoint=checkpoint, duration=duration,
                              max_tuples=max_tuples, on_record=emit,
                              on_progress=echo if progress and view is None else None,
                              on_snapshot=view.show if view is not None else None, should_stop=should_stop)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return EXIT_SIGTERM if stop["signal"] == signal.SIGTERM else EXIT_SIGINT
    except TopologyError as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - Spark job failures arrive as Py4J/Python exceptions
        click.echo(f"error: the Spark job failed: {spark_error_text(exc)}", err=True)
        return EXIT_FAILED
    finally:
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
    if result.dead_letters:
        click.echo(f"[summary] {len(result.dead_letters)} input(s) given up on after their retries"
                   + (f", written to {dead_letter}" if dead_letter else "; --dead-letter FILE keeps them"), err=True)
        if dead_letter:
            with open(dead_letter, "wb") as f:
                for d in result.dead_letters:
                    f.write(orjson.dumps(d, default=repr) + b"\n")
    if checkpoint:
        click.echo(f"[summary] checkpoint {os.path.abspath(checkpoint)} (run the same command to continue)", err=True)
    if stop["signal"] is not None:
        return EXIT_SIGINT if stop["signal"] == signal.SIGINT else EXIT_SIGTERM
    return EXIT_OK if result.ok else EXIT_FAILED


@main.command(
    "conform",
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
)
@click.option("--role", type=click.Choice(["bolt", "spout"]), default=None,
              help="What the component is. Default: from a conformance component's ready line, else bolt.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "junit"]), default="text", show_default=True,
              help="Report format (written to stdout).")
@click.option("--vectors", "vectors_dir", type=click.Path(file_okay=False, path_type=pathlib.Path), default=None,
              help="Directory of vector files. Default: the vectors shipped with the package (spec/vectors).")
@click.option("--timeout", type=click.FloatRange(min=0.05, max=600), default=None,
              help="Seconds to wait for each expected frame; above 2 it also stretches every other wait "
                   "(handshake, ready line, exit, pid file) in proportion. Default: 2, and a check that failed "
                   "only because a frame came later runs again with 30 (Storm's message timeout).")
@click.option("--strict", is_flag=True, default=False,
              help="Failed recommended checks fail the run too (reported as FAIL, not WARN).")
@click.option("-k", "select", metavar="SUBSTRING", default=None, help="Run only vectors whose id contains SUBSTRING.")
@click.option("--verbose", "-v", is_flag=True, help="List the checks that do not apply to this component too.")
@click.option("--jobs", "-j", type=click.IntRange(min=1, max=64), default=None,
              help="Vectors run at once, each against its own process. Default: 4 (2 per core, at most 4); 1: one "
                   "after another (a component that cannot bear several of itself at once).")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def conform(role, fmt, vectors_dir, timeout, strict, select, verbose, jobs, cmd) -> None:  # fmt: skip
    """Check that a component speaks the multilang protocol.

    Plays the host against CMD (started once per vector, no shell) and runs
    the vectors of spec/vectors. Any component gets the protocol checks; a
    scripted conformance component (spec/CONFORMANCE.md) also gets the API
    checks of its mode.

        multilang conform -- python my_bolt.py

        multilang conform --role spout -- node my_spout.js

    Checks are required, recommended or extension (spec/CONFORMANCE.md): a
    failed recommended check is a warning (WARN) unless --strict.

    Exit status: 0 if no required or extension check failed (and, with
    --strict, no recommended one), 1 otherwise, 2 on usage errors.
    """
    from ..conform import ConformError, run_conformance

    _check_command(cmd)
    try:
        report = run_conformance(list(cmd), role, vectors_dir=vectors_dir, timeout=timeout, select=select,
                                 strict=strict, jobs=jobs)
    except ConformError as exc:  # vectors that cannot be read, a command that cannot start
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from None
    except KeyboardInterrupt:  # every component process was killed on the way out
        click.echo("conform: interrupted; no verdict", err=True)
        raise SystemExit(EXIT_SIGINT) from None
    if select and not report.results:
        raise click.UsageError(f"no vector id contains {select!r}")
    if fmt == "json":
        click.echo(json.dumps(report.to_json(), ensure_ascii=False, indent=2))
    elif fmt == "junit":
        click.echo(report.to_junit())
    else:
        click.echo(report.to_text(verbose))
    sys.exit(0 if report.ok else 1)


# --- multilang run --record, multilang replay (docs/OBSERVE.md "Record and replay") --------------------


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
    tasks = sorted(recorder.tasks)
    comps = [name for name, c in recorder.meta["components"].items() if set(c["tasks"]) & set(tasks)]
    click.echo(f"[record] frames of {len(tasks)} task(s) ({', '.join(comps) or 'none'}) recorded in "
               f"{recorder.path}; replay one with: multilang replay {recorder.path} --component C [--task N] -- CMD",
               err=True)


@main.command("lib", short_help="Print or copy the Ruby, Node or Python component library.")
@click.argument("lang", type=click.Choice(["ruby", "node", "python"]))
@click.option("--copy", "copy_to", metavar="DIR", type=click.Path(file_okay=False),
              help="Copy the library into DIR (made if missing), beside your components, and print the copy's path.")
def lib(lang: str, copy_to: str | None) -> None:
    """Print where the component library for LANG is (a file for ruby and
    node, the directory to put on PYTHONPATH for python), or copy it."""
    import shutil

    from .libs import USAGE, library_path

    try:
        path = library_path(lang)
    except FileNotFoundError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_FAILED) from None
    if copy_to is not None:
        if lang == "python":
            raise click.UsageError("--copy applies to ruby and node; the Python library is installed with pip")
        try:
            os.makedirs(copy_to, exist_ok=True)
            path = pathlib.Path(shutil.copy(path, copy_to)).resolve()
        except OSError as exc:
            click.echo(f"error: --copy {copy_to}: {exc.strerror or exc}", err=True)
            raise SystemExit(EXIT_USAGE) from None
        click.echo(f"copied; a component beside it loads it with: {USAGE[lang]}", err=True)
    click.echo(str(path))


@main.command("replay")
@click.argument("recording", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--component", required=True, metavar="C", help="The recorded component to replay.")
@click.option("--task", type=int, metavar="N", help="Its task (needed when it ran more than one).")
@click.option("--session", type=click.IntRange(min=1), metavar="K",
              help="The task's process session (1, 2, ... a restart starts a new one). Default: the last complete one.")
@click.option("--cwd", type=click.Path(file_okay=False, exists=True),
              help="Where CMD runs. Default: where the recorded process ran (the topology's resource directory).")
@click.option("--timeout", type=click.FloatRange(min=0.05, max=3600), default=10.0, show_default=True,
              help="Seconds CMD may send nothing while the replay waits for it (handshake, an ack, a sync): "
                   "longer is a hang (exit 1).")
@click.option("--partial", is_flag=True,
              help="Replay a recording with a truncated or damaged segment: what is whole before the damage. Without "
                   "it such a recording is an error (exit 1), naming the segment and what was lost.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="warning",
              show_default=True)
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def replay(recording: str, component: str, task: int | None, session: int | None, cwd: str | None, timeout: float,
           log_level: str, cmd: tuple[str, ...], partial: bool = False) -> None:
    """Feed a recorded task's input to CMD and compare its output.

    Plays the host against CMD (no shell) as the run played it for one task
    of COMPONENT recorded with multilang run --record DIR: the handshake,
    then every tuple, heartbeat and command in order, paced as recorded.
    Then compares CMD's emits, acks and fails with the recorded ones, per
    input tuple (docs/OBSERVE.md):

        multilang replay rec/ --component split --task 3 -- ruby ruby/split_bolt.rb

    Prints "no difference: ..." and exits 0, or the first difference (the
    input tuple, expected and got) and exits 1; 1 too if CMD crashes or
    hangs (--timeout); 2 on usage errors. CMD's stderr is shown.
    """
    import trio

    from multilang.shellbolt import (
        RecordingDamaged, ReplayUsageError, command_problem, replay as run_replay, replay_resolve_argv as resolve_argv,
        replay_select as select,
    )

    _setup_logging(log_level)
    # CMD's stderr, logged per line by the host (multilang.component.*): the user's debug output
    logging.getLogger("multilang.component").setLevel(min(logging.INFO, getattr(logging, log_level.upper())))
    if not cmd:
        raise click.UsageError("no command to replay into: give it after --, e.g. -- ruby ruby/split_bolt.rb")
    try:
        sel = select(recording, component, task, session, partial)
        workdir = cwd or (sel.session.start or {}).get("cwd") or os.getcwd()
        if not os.path.isdir(workdir):
            raise ReplayUsageError(f"the recorded process ran in {workdir}, which does not exist here: give --cwd")
        argv = resolve_argv(list(cmd))
        problem = command_problem(argv, workdir, os.environ.get("PATH"))
        if problem is not None:
            raise ReplayUsageError(f"{problem} (the command runs in {workdir})" if "commands run in" not in problem
                                   else problem)
        for note in sel.notes:
            click.echo(f"[replay] {note}", err=True)
        outcome = trio.run(run_replay, sel, argv, workdir, timeout)
    except ReplayUsageError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from None
    except RecordingDamaged as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_FAILED) from None
    for note in outcome.notes[len(sel.notes):]:
        click.echo(f"[replay] {note}", err=True)
    click.echo(outcome.text)
    raise SystemExit(outcome.code)
