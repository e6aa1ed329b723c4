"""Framing (spec/PROTOCOL.md §1): JSON text, then a line that is exactly ``end``.

The reader is sans-IO: feed it bytes in any chunking, take whole frames out.
It accepts what Storm's host accepts from a peer: ``\\n``, ``\\r\\n`` and ``\\r``
line endings, blank lines and multi-line JSON. It never buffers more than
``max_frame_size`` bytes of one frame: past that it raises ``FrameTooLarge``
instead of growing without bound.
"""

from __future__ import annotations

import re

from .errors import FrameTooLarge, RemoteProtocolError

__all__ = ["FrameReader", "TERMINATOR", "DEFAULT_MAX_FRAME_SIZE"]

#: What our writer puts after each JSON text (§1.1).
TERMINATOR = b"\nend\n"

#: 64 MiB: larger than any sane tuple, small enough to stop a runaway peer.
DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024

# A terminator is a line that is exactly "end": at the start of the buffer or
# after a line ending, and followed by a line ending (\r\n, \n or a lone \r).
# JSON strings cannot hold raw line breaks, so such a line is never inside a
# frame. A lone \r at the very end of the buffer may be the first half of \r\n;
# the \n that follows is then whitespace at the start of the next frame.
_TERM = re.compile(rb"(?:\A|(?<=[\r\n]))end(?:\r\n|\n|\r)")
_BLANK = re.compile(rb"[ \t\r\n]*\Z")
# How far back to rescan after new data: "\nend\r" is 5 bytes.
_OVERLAP = 5


class FrameReader:
    """Split a byte stream into frame bodies (bytes, not yet decoded)."""

    __slots__ = ("_buf", "_scan", "max_frame_size", "closed")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._buf = bytearray()
        self._scan = 0  # bytes of _buf already searched for a terminator
        self.max_frame_size = max_frame_size
        self.closed = False

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return every frame body now complete, in order."""
        if not data:
            return []
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        start = 0
        pos = max(0, self._scan - _OVERLAP)
        for m in _TERM.finditer(buf, pos):
            frames.append(bytes(buf[start : m.start()]))
            start = m.end()
        if start:
            del buf[:start]
        self._scan = len(buf)
        if len(buf) > self.max_frame_size:
            # Blank lines between frames are not a frame; don't count them.
            raise FrameTooLarge(
                f"frame exceeds the {self.max_frame_size}-byte limit without an 'end' line",
                frame=bytes(buf[:200]),
            )
        for body in frames:
            if len(body) > self.max_frame_size:
                raise FrameTooLarge(f"frame of {len(body)} bytes exceeds the {self.max_frame_size}-byte limit", frame=body[:200])
        return frames

    def close(self) -> None:
        """The peer closed the stream. Raises if a frame was cut off."""
        self.closed = True
        if self._buf and not _BLANK.match(self._buf):
            rest = bytes(self._buf)
            self._buf.clear()
            raise RemoteProtocolError("stream ended in the middle of a frame", frame=rest)

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._buf)
