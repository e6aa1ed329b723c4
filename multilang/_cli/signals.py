"""SIGINT, SIGTERM and SIGHUP for ``multilang run`` and ``multilang pipe``,
from the process's first moment to its last.

Python's own handling would turn a Ctrl-C during start-up into a
KeyboardInterrupt traceback (or click's "Aborted!", exit 1), and a SIGTERM
or SIGHUP before trio listens, or after it stopped listening, into a death
by the raw signal: no output, no summary. So the console script (``_entry``)
installs :func:`_note` before it imports anything else; while a run is under
way trio receives the signals itself (``cli._run_trio``), and before and after
it they are noted here: the run starts stopping at once, or the output and
summary are finished, and the exit code is 128 + the first signal. Commands
that take no such care (``conform``, ``replay``) get Python's defaults back.

SIGHUP (the terminal hung up: a closed window, a dropped ssh session) stops a
run as SIGTERM does, so that its output file and its last checkpoint are
written (exit 129); what would have gone to the lost terminal goes nowhere
(:func:`release_terminal`). Under ``nohup`` (SIGHUP ignored when the process
started) it stays ignored.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from typing import Any, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: the signals this process takes: SIGHUP not where it was ignored when the process started (nohup)
_handled: tuple[int, ...] | None = None

#: the first signal noted outside a run's own receiver, or None
first: int | None = None


def handled() -> tuple[int, ...]:
    """The signals that stop a run (decided once, before any handler of ours is in place)."""
    global _handled
    if _handled is None:
        _handled = tuple(s for s in SIGNALS if s != signal.SIGHUP or signal.getsignal(s) != signal.SIG_IGN)
    return _handled


def hung_up(exc: OSError) -> bool:
    """Whether ``exc``, from a write to stdout or stderr, says that the terminal hung up
    (then :func:`terminal_hung_up` has run, and the write may be dropped)."""
    if exc.errno != errno.EIO:
        return False
    terminal_hung_up()
    return True


def exit_status(signum: int) -> int:
    """A run stopped by ``signum`` exits 128 + it: 130 (SIGINT), 143 (SIGTERM), 129 (SIGHUP)."""
    return 128 + signum


def release_terminal(signum: int) -> None:
    """What a signal does first, wherever it is received: after a SIGHUP,
    :func:`terminal_hung_up`."""
    if signum == signal.SIGHUP:
        terminal_hung_up()


def terminal_hung_up() -> None:
    """Stdout and stderr, where they are a terminal that hung up (a write to
    it fails with EIO), are pointed at /dev/null, so that what the run still
    writes there (the live view, its summary, its output without ``-o``) goes
    nowhere instead of ending the run before it has stopped as SIGHUP stops
    it. Called on SIGHUP, and by a writer whose write failed with EIO (the
    terminal hangs up before the signal is handled)."""
    for fd in (1, 2):
        try:
            os.write(fd, b"")
        except OSError as exc:
            if exc.errno == errno.EIO:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, fd)
                os.close(null)


def _note(signum: int, frame: Any) -> None:
    global first
    release_terminal(signum)
    if first is None:
        first = signum


def install() -> None:
    for s in handled():
        signal.signal(s, _note)


@contextlib.contextmanager
def owned() -> Iterator[None]:
    """Signals noted, not raised, while the block runs; the handlers before
    it are back afterwards (in the console script: still these)."""
    old = {s: signal.signal(s, _note) for s in handled()}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def default() -> None:
    """Python's handlers back (Ctrl-C raises KeyboardInterrupt at once); a
    signal that came during start-up ends the command now."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in handled():
        if s != signal.SIGINT:
            signal.signal(s, signal.SIG_DFL)
    if first is not None:
        raise SystemExit(exit_status(first))
