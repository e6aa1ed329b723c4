"""The ``multilang`` command line (click). Thin: parsing, output, exit codes.

Exit codes of ``multilang run`` and ``multilang pipe``:

====  =========================================================
0     the run finished and every tuple tree completed
1     tuples failed for good (trees incomplete at the end) or a
      component gave up after its restart budget
2     usage error or invalid topology
130   interrupted (Ctrl-C / SIGINT)
143   terminated (SIGTERM)
====  =========================================================

Human output (progress, summary, logs) goes to stderr; data to stdout.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from typing import IO, Any

import click
import orjson

from .errors import MultilangError, TopologyError

__all__ = ["main", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_SIGINT", "EXIT_SIGTERM"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 2, 130, 143


@click.group()
@click.version_option(package_name="multilang-bridge")
def main() -> None:
    """Run Apache Storm multilang spouts and bolts, in any language."""


def _parse_conf(pairs: tuple[str, ...]) -> dict[str, Any]:
    conf: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--conf")
        try:
            conf[key] = json.loads(raw)
        except ValueError:
            conf[key] = raw  # a bare string
    return conf


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)-5s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


class _Progress:
    """Live per-component progress on stderr: emitted, acked, failed, rate, restarts."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        self.t = time.monotonic()

    def __call__(self, runtime: Any) -> None:
        now = time.monotonic()
        dt = max(now - self.t, 1e-9)
        parts = []
        for name, s in runtime.stats.items():
            rate = (s.emitted - self.last.get(name, 0)) / dt
            self.last[name] = s.emitted
            parts.append(f"{name}: emitted {s.emitted} ({rate:.0f}/s) acked {s.acked} failed {s.failed}"
                         + (f" restarts {s.restarts}" if s.restarts else ""))
        self.t = now
        click.echo("[progress] " + " | ".join(parts), err=True)


def _summary(result: Any, elapsed: float) -> None:
    click.echo(f"[summary] {elapsed:.1f}s; trees completed {result.completed}, failed {result.failed} "
               f"(timed out {result.timed_out}), incomplete {result.pending}", err=True)
    for name, s in result.stats.items():
        click.echo(f"[summary]   {name}: emitted {s.emitted}, executed {s.executed}, acked {s.acked}, "
                   f"failed {s.failed}, restarts {s.restarts}, errors {s.errors}", err=True)
    for err in result.gave_up:
        click.echo(f"[summary] gave up: {err}", err=True)


def _leaves(eg: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for e in eg.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


def _run_trio(fn: Any) -> Any:
    """Run ``fn`` under trio. SIGINT (Ctrl-C) and SIGTERM cancel it, which
    stops and reaps every component; then KeyboardInterrupt (exit 130) or
    exit 143. Both are received as signals rather than left to trio's
    KeyboardInterrupt delivery, which could be lost while the run idled."""
    import trio

    terminated = interrupted = False

    async def wrapper() -> Any:
        async with trio.open_nursery() as nursery:
            async def watch() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        nonlocal terminated, interrupted
                        if signum == signal.SIGINT:
                            interrupted = True
                        else:
                            terminated = True
                        nursery.cancel_scope.cancel()
                        return

            nursery.start_soon(watch)
            result = await fn()
            nursery.cancel_scope.cancel()
            return result

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
    if interrupted:
        raise KeyboardInterrupt
    if terminated:
        raise SystemExit(EXIT_SIGTERM)
    return result


@main.command()
@click.argument("topology_file", type=click.Path(dir_okay=False))
@click.option("--engine", type=click.Choice(["local", "spark"]), default="local", show_default=True,
              help="local: the embedded trio runtime. spark: compile onto Spark.")
@click.option("--duration", type=float, help="Stop after this many seconds.")
@click.option("--max-tuples", type=int, help="Stop after the spouts emitted this many tuples (and their trees finished).")
@click.option("--until-done/--no-until-done", default=None,
              help="Stop when every spout is exhausted and all trees finished (the default without --duration).")
@click.option("--output", "-o", type=click.File("w"), default="-", show_default=True,
              help="Where output tuples go, as JSON lines.")
@click.option("--conf", "-c", multiple=True, metavar="KEY=VALUE", help="Conf override (VALUE parsed as JSON if it can be).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="warning", show_default=True)
@click.option("--progress/--no-progress", default=True, show_default=True, help="Live progress on stderr.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL (--engine spark).")
@click.option("--filter", "filter_file", type=click.Path(dir_okay=False), metavar="PROPERTIES_FILE",
              help="Flux YAML: substitute ${name} with the values of this .properties file (like flux --filter).")
@click.option("--env-filter", "-e", is_flag=True,
              help="Flux YAML: substitute ${ENV-NAME} with environment variables (like flux -e).")
def run(topology_file: str, engine: str, duration: float | None, max_tuples: int | None, until_done: bool | None,
        output: IO[str], conf: tuple[str, ...], log_level: str, progress: bool, master: str,
        filter_file: str | None, env_filter: bool) -> None:
    """Run the topology in TOPOLOGY_FILE (TOML, or Storm Flux YAML: .yaml/.yml)."""
    import os

    from .shellbolt.executor import Runtime
    from .shellbolt.topology import load_topology

    _setup_logging(log_level)
    try:
        if topology_file.endswith((".yaml", ".yml")):
            from .shellbolt.flux import load_flux

            topology = load_flux(topology_file, filter_file, os.environ if env_filter else None,
                                 overrides=_parse_conf(conf))
        elif filter_file is not None or env_filter:
            raise TopologyError("--filter and -e/--env-filter apply to Flux YAML files (.yaml/.yml) only")
        else:
            topology = load_topology(topology_file, _parse_conf(conf))
    except TopologyError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from None
    if engine == "spark":
        from .adapters.spark import run_cli

        raise SystemExit(run_cli(topology, master=master, output=output))
    if until_done is None:
        until_done = duration is None and max_tuples is None

    def emit(record: dict[str, Any]) -> None:
        output.write(orjson.dumps(record).decode() + "\n")

    try:
        runtime = Runtime(topology, on_output=emit)
    except TopologyError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from None
    start = time.monotonic()
    try:
        result = _run_trio(lambda: runtime.run(
            duration=duration, max_tuples=max_tuples, until_done=until_done,
            progress=_Progress() if progress else None,
        ))
    except KeyboardInterrupt:
        click.echo("interrupted; all component processes were stopped", err=True)
        raise SystemExit(EXIT_SIGINT) from None
    except (TopologyError, MultilangError) as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE if isinstance(exc, TopologyError) else EXIT_FAILED) from None
    for record in result.outputs:
        emit(record)
    output.flush()
    _summary(result, time.monotonic() - start)
    raise SystemExit(EXIT_OK if result.ok else EXIT_FAILED)


@main.command()
@click.option("--fields", default="line", show_default=True, help="Comma-separated input fields of the tuples the bolt gets.")
@click.option("--output-fields", default=None, help="Comma-separated fields the bolt emits (default: any number of values).")
@click.option("--json-input", is_flag=True, help="Each input line is a JSON list of values instead of one string.")
@click.option("--conf", "-c", multiple=True, metavar="KEY=VALUE")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="warning", show_default=True)
@click.argument("command", nargs=-1, required=True)
def pipe(fields: str, output_fields: str | None, json_input: bool, conf: tuple[str, ...], log_level: str,
         command: tuple[str, ...]) -> None:
    """Pipe stdin through one bolt: each line becomes a tuple, each emit a JSON line.

    Like Spark's RDD.pipe, but with a multilang bolt: multilang pipe -- ruby split_bolt.rb
    """
    from .shellbolt.executor import Runtime
    from .shellbolt.topology import PythonSpout, ShellBolt, TopologyBuilder

    _setup_logging(log_level)
    in_fields = [f for f in fields.split(",") if f]

    def lines() -> Any:
        for line in sys.stdin:
            line = line.rstrip("\n")
            if json_input:
                values = json.loads(line)
                yield values if isinstance(values, list) else [values]
            else:
                yield [line] + [None] * (len(in_fields) - 1)

    builder = TopologyBuilder()
    builder.set_spout("stdin", PythonSpout(lines, fields=in_fields))
    # Without --output-fields the bolt may emit tuples of any length ("*").
    out_fields = output_fields.split(",") if output_fields else ["*"]
    builder.set_bolt("bolt", ShellBolt(list(command), fields=out_fields)).shuffle_grouping("stdin")
    try:
        topology = builder.create_topology(_parse_conf(conf), name="pipe")
    except TopologyError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from None

    def emit(record: dict[str, Any]) -> None:
        values = record["values"] if out_fields == ["*"] else [record[f] for f in out_fields]
        sys.stdout.write(orjson.dumps(values).decode() + "\n")

    try:
        runtime = Runtime(topology, on_output=emit)
    except TopologyError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from None
    try:
        result = _run_trio(lambda: runtime.run(until_done=True))
    except KeyboardInterrupt:
        raise SystemExit(EXIT_SIGINT) from None
    except MultilangError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_FAILED) from None
    sys.stdout.flush()
    if not result.ok:
        _summary(result, 0)
    raise SystemExit(EXIT_OK if result.ok else EXIT_FAILED)

from .conform import conform_command
main.add_command(conform_command, "conform")
