"""What a component script prints before its ``run()``: held, then logged.

stdout is the protocol channel, and the pid reply must be the first thing on
it (§2.3): a ``print`` at import time, before :meth:`Component.run` guards
stdout, would break the handshake (Storm's host gives up on the worker). The
Ruby and Node libraries guard from load time; this module does the same for
Python, as far as a package shared by components and hosts can:

* :func:`hold` runs when ``multilang`` is imported. It holds ``sys.stdout``
  only in what looks like a component process: the import comes straight
  from the ``__main__`` script, stdin and stdout are both pipes, and stdout
  is still the interpreter's own.
* :meth:`Component.run` takes what was held (:func:`take`) and sends it as
  ``log`` frames right after the pid reply, as the Node library does.
* The host side (``multilang._cli``, ``multilang.shellbolt``,
  ``multilang.adapters``, ``multilang.testing``) calls :func:`release` when
  it is imported: a host's prints go to its stdout as usual. So does the
  end of the process, and a hold that grew past ``_LIMIT`` (not a component
  waiting for its handshake, then).

Prints that come before ``import multilang`` are not seen (as in Node, before
``require``).
"""

from __future__ import annotations

import atexit
import io
import os
import stat
import sys

_LIMIT = 1 << 16  # characters held at most


class _Held(io.TextIOBase):
    """``sys.stdout`` between the import of ``multilang`` and ``run()``."""

    def __init__(self, real: io.TextIOBase) -> None:
        self.real = real
        self.parts: list[str] = []
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.parts.append(s)
        self.size += len(s)
        if self.size > _LIMIT:
            release()
        return len(s)

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.real, "encoding", "utf-8")


def _from_main_script() -> bool:
    """The ``import multilang`` being run comes from the ``__main__`` script
    itself (a component script), not from a library, a tool or a worker."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        module = frame.f_globals.get("__name__") or ""
        if not (name.startswith("<frozen importlib") or module == "importlib" or module.startswith("importlib.")
                or os.path.abspath(name).startswith(here + os.sep)):
            return module == "__main__"
        frame = frame.f_back
    return False


def _pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def hold() -> None:
    if (isinstance(sys.stdout, _Held) or sys.stdout is None or sys.stdout is not sys.__stdout__
            or sys.flags.interactive or not getattr(sys.modules.get("__main__"), "__file__", None)
            or not (_pipe(0) and _pipe(1)) or not _from_main_script()):
        return
    sys.stdout = _Held(sys.stdout)
    atexit.register(release)


def take() -> str:
    """What was held, and stop holding (``run()`` guards stdout from now on)."""
    held = sys.stdout
    if not isinstance(held, _Held):
        return ""
    sys.stdout = held.real
    return "".join(held.parts)


def release() -> None:
    """Stop holding; what was held goes to stdout after all (a host's output)."""
    held = sys.stdout
    if isinstance(held, _Held):
        sys.stdout = held.real
        if held.parts:
            held.real.write("".join(held.parts))
            held.real.flush()
