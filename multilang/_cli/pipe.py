"""``multilang pipe``: stdin lines through a bolt (a one-bolt topology), outputs on stdout."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from multilang.shellbolt import setup_logging

from ..errors import MultilangError, TopologyError
from . import signals as _signals
from .common import (
    EXIT_FAILED, EXIT_OK, EXIT_OUTPUT_CLOSED, EXIT_SIGINT, EXIT_USAGE, embedded_runtime, exit_code, interrupted,
    owning_signals, parse_conf, run_trio, stopped_before_start,
)
from .output import Output, flush_every
from .pipe_input import StdinFeed
from .pipe_output import HeldOutputs
from .summary import print_summary


@click.command(short_help="Pipe stdin through one bolt: a tuple per line, a JSON line per emit.")
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
@owning_signals
def pipe(fields: str | None, output_fields: str | None, json_input: bool, conf: tuple[str, ...], log_level: str,
         dead_letter: str | None, command: tuple[str, ...]) -> None:
    """Pipe stdin through one bolt: each line becomes a tuple, each emit a JSON line.

    Like Spark's RDD.pipe, but with a multilang bolt: multilang pipe -- ruby split_bolt.rb
    """
    from multilang.shellbolt import PythonSpout, ShellBolt, TopologyBuilder

    setup_logging(log_level)
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
    overrides = parse_conf(conf)
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

    stopped_before_start()
    out = Output(sys.stdout)
    held = HeldOutputs(out.values)  # each input's outputs once its tree completes: exactly once per input
    runtime, dead_file = embedded_runtime(topology, out, dead_letter, on_tracked_output=held.output, line_of=feed)
    held.roots = runtime.acker.roots
    feed.on_ack, feed.on_fail = held.acked, held.failed
    start = time.monotonic()
    try:
        (spout,) = [t for t in runtime.tasks.values() if t.name == "stdin"]

        async def go(nursery: Any) -> Any:
            nursery.start_soon(feed.pump, runtime, spout)
            nursery.start_soon(flush_every, out)
            return await runtime.run(until_done=True)

        result, signum = run_trio(go, runtime)
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
    code = EXIT_OUTPUT_CLOSED if out.closed and signum is None else exit_code(result, signum)
    if code not in (EXIT_OK, EXIT_OUTPUT_CLOSED):
        print_summary(result, time.monotonic() - start, dead_letter)
    if result.gave_up and feed.open:  # (each line up to it is output or a dead letter: Runtime._give_up_read_once)
        click.echo(f"[summary] stdin: the run gave up after line {feed.last_taken}; the lines after it were not "
                   "processed (neither output nor dead letters)", err=True)
    if signum is not None:
        interrupted(signum, False)
    raise SystemExit(code)
