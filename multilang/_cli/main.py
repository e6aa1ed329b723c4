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
129   hung up (SIGHUP: the terminal closed): stopped as by SIGTERM,
      the output file and the last checkpoint written (ignored under
      ``nohup``)
141   the reader of the output went away (``| head``): stopped quietly
====  =========================================================

Human output (progress, summary, logs) goes to stderr; data to stdout.
"""

from __future__ import annotations

import click

from .._component import release_stdout
from . import signals as _signals
from .common import EXIT_FAILED, EXIT_OK, EXIT_OUTPUT_CLOSED, EXIT_SIGINT, EXIT_SIGTERM, EXIT_USAGE
from .conform import conform
from .libs import lib
from .pipe import pipe
from .replay import replay
from .run import run

release_stdout()  # a host: its stdout is its own

__all__ = ["main", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_SIGINT", "EXIT_SIGTERM", "EXIT_OUTPUT_CLOSED"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="multilang-bridge")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Run Apache Storm multilang spouts and bolts, in any language."""
    if ctx.invoked_subcommand not in ("run", "pipe"):
        _signals.default()  # only run and pipe finish their output after a signal


for _command in (run, pipe, conform, lib, replay):  # one module a command; --help lists them by name
    main.add_command(_command)
del _command
