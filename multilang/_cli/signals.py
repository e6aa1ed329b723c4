"""SIGINT and SIGTERM for ``multilang run`` and ``multilang pipe``, from the
process's first moment to its last.

Python's own handling would turn a Ctrl-C during start-up into a
KeyboardInterrupt traceback (or click's "Aborted!", exit 1), and a SIGTERM
before trio listens, or after it stopped listening, into a death by the raw
signal: no output, no summary. So the console script (``_entry``) installs
:func:`_note` before it imports anything else; while a run is under way trio
receives the signals itself (``cli._run_trio``), and before and after it they
are noted here: the run starts stopping at once, or the output and summary
are finished, and the exit code is 128 + the first signal. Commands that
take no such care (``conform``, ``replay``) get Python's defaults back.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: the first signal noted outside a run's own receiver, or None
first: int | None = None


def _note(signum: int, frame: Any) -> None:
    global first
    if first is None:
        first = signum


def install() -> None:
    for s in SIGNALS:
        signal.signal(s, _note)


@contextlib.contextmanager
def owned() -> Iterator[None]:
    """Signals noted, not raised, while the block runs; the handlers before
    it are back afterwards (in the console script: still these)."""
    old = {s: signal.signal(s, _note) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def default() -> None:
    """Python's handlers back (Ctrl-C raises KeyboardInterrupt at once); a
    signal that came during start-up ends the command now."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if first is not None:
        raise SystemExit(128 + first)
