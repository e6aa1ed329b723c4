"""``multilang conform``: the conformance vectors against a component."""

from __future__ import annotations

import json
import pathlib
import sys

import click

from .common import EXIT_SIGINT, EXIT_USAGE, FloatRange, IntRange, check_command


@click.command(
    "conform",
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
)
@click.option("--role", type=click.Choice(["bolt", "spout"]), default=None,
              help="What the component is. Default: from a conformance component's ready line, else bolt.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "junit"]), default="text", show_default=True,
              help="Report format (written to stdout).")
@click.option("--vectors", "vectors_dir", type=click.Path(file_okay=False, path_type=pathlib.Path), default=None,
              help="Directory of vector files. Default: the vectors shipped with the package (spec/vectors).")
@click.option("--timeout", type=FloatRange(min=0.05, max=600), default=None,
              help="Seconds to wait for each expected frame; above 2 it also stretches every other wait "
                   "(handshake, ready line, exit, pid file) in proportion. Default: 2, and a check that failed "
                   "only because a frame came later runs again with 30 (Storm's message timeout).")
@click.option("--strict", is_flag=True, default=False,
              help="Failed recommended checks fail the run too (reported as FAIL, not WARN).")
@click.option("-k", "select", metavar="SUBSTRING", default=None, help="Run only vectors whose id contains SUBSTRING.")
@click.option("--verbose", "-v", is_flag=True, help="List the checks that do not apply to this component too.")
@click.option("--jobs", "-j", type=IntRange(min=1, max=64), default=None,
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

    check_command(cmd)
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
