"""Raw multilang I/O for the fault-injection components (stdlib only).

Deliberately independent of the ``multilang`` library: these components must
be able to break every rule the library would refuse to break. Frames are
read as spec/PROTOCOL.md §1.2 says (a line that is exactly ``end``), written
compactly with ``\\nend\\n``; output is collected and written in one
``os.write`` loop per burst.

The "once" mechanism: a fault guarded by a marker file fires only if the file
does not exist yet, and creates it first, so the process that replaces a
faulty one behaves (spec/PROTOCOL.md §8.2 restarts the same command).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

_TERM = re.compile(rb"(?:\A|(?<=[\r\n]))end(?:\r\n|\n|\r)")


def frames(reads: list[int] | None = None):
    """Yield each frame from stdin, parsed; return at EOF. ``reads``, if
    given, gets a 0 appended at each read: a caller can count what came in
    one read (commands the host wrote together)."""
    buf = bytearray()
    while True:
        data = os.read(0, 1 << 16)
        if not data:
            return
        if reads is not None:
            reads.append(0)
        buf += data
        start = 0
        for m in _TERM.finditer(buf):
            body = bytes(buf[start : m.start()])
            start = m.end()
            if body.strip():
                yield json.loads(body)
        if start:
            del buf[:start]


def frame(obj) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\nend\n").encode()


def write(data: bytes, fd: int = 1) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def err(text: str) -> None:
    """A line on stderr (the host keeps a tail of it for error reports)."""
    write((text + "\n").encode(), 2)


def fire(marker: str | None) -> bool:
    """True if a fault should fire now: always without a marker; with one,
    only the first time (the marker file is created before the fault)."""
    if not marker:
        return True
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def handshake(messages, *, pid_file: bool = True, accept: tuple[str, ...] = ()):
    """Read the handshake, create the pid file, reply with the pid (§2.3),
    accepting those of ``accept`` that the handshake offers (§9.1, §9.2)."""
    msg = next(messages)
    pid = os.getpid()
    if pid_file:
        open(os.path.join(msg["pidDir"], str(pid)), "w").close()
    accepted = [e for e in accept if e in msg.get("extensions", ())]
    write(frame({"pid": pid, "extensions": accepted} if accepted else {"pid": pid}))
    return msg


def hang(seconds: float = 600) -> None:
    """Stop answering (but stay alive) until killed."""
    time.sleep(seconds)
    sys.exit(0)
