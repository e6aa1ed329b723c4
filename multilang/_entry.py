"""The ``multilang`` console script: signals are noted (``_signals``) before
the command line is even imported, so that no moment of a run is without a
handler."""

from __future__ import annotations


def main() -> None:
    from . import _signals

    _signals.install()
    from .cli import main as cli

    cli()
