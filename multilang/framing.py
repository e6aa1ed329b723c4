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

__all__ = ["FrameReader", "LengthPrefixedReader", "FirstFrameCut", "TERMINATOR", "DEFAULT_MAX_FRAME_SIZE"]

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
_END_AT_EOF = re.compile(rb"(?:\A|(?<=[\r\n]))end\Z")
# How far back to rescan after new data: "\nend\r" is 5 bytes.
_OVERLAP = 5
# Partial frames larger than this are scanned incrementally, not re-split.
_FAST_LIMIT = 1 << 16


class FrameReader:
    """Split a byte stream into frame bodies (bytes, not yet decoded)."""

    __slots__ = ("_buf", "_scan", "max_frame_size", "closed", "_failed", "_cr")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._buf = bytearray()
        self._scan = 0  # bytes of _buf already searched for a terminator
        self.max_frame_size = max_frame_size
        self.closed = False
        self._failed = False  # after FrameTooLarge the stream cannot be resynchronised
        self._cr = False  # a \r was seen: this peer may use \r\n or \r line endings

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return every frame body now complete, in order.

        On ``FrameTooLarge`` the frames completed before the oversized one are
        on the exception as ``frames_before`` (so a caller can still deliver
        them); the reader then drops its buffer and refuses further data, so
        it never holds more than ``max_frame_size`` plus one chunk.
        """
        if not data:
            return []
        if self._failed:
            raise FrameTooLarge("the stream already broke the frame size limit; no further frames are read")
        if b"\r" in data:
            self._cr = True
        buf = self._buf
        if not self._cr and len(buf) < _FAST_LIMIT and not (buf or data).startswith(b"end"):
            # Fast path: a stream without \r (every writer we know) splits on
            # "\nend\n" in C. Only the frame at the very start of the buffer
            # could have a terminator without a \n before it; that case, large
            # partial frames and CR streams take the general path below.
            whole = bytes(buf) + data if buf else data
            size = len(whole)  # no frame is longer than what it was split from
            frames = whole.split(TERMINATOR)
            rest = frames.pop()
            self._buf = buf = bytearray(rest)
            self._scan = len(rest)
        else:
            buf += data
            size = len(buf)
            frames = []
            start = 0
            pos = max(0, self._scan - _OVERLAP)
            for m in _TERM.finditer(buf, pos):
                frames.append(bytes(buf[start : m.start()]))
                start = m.end()
            if start:
                del buf[:start]
            self._scan = len(buf)
        if size > self.max_frame_size and frames and max(map(len, frames)) > self.max_frame_size:  # one pass in C
            for i, body in enumerate(frames):
                if len(body) > self.max_frame_size:
                    self._fail(
                        FrameTooLarge(f"frame of {len(body)} bytes exceeds the {self.max_frame_size}-byte limit",
                                      frame=body[:200]),
                        frames[:i],
                    )
        if len(buf) > self.max_frame_size:
            self._fail(
                FrameTooLarge(
                    f"frame exceeds the {self.max_frame_size}-byte limit without an 'end' line",
                    frame=bytes(buf[:200]),
                ),
                frames,
            )
        return frames

    def _fail(self, exc: FrameTooLarge, frames_before: list[bytes]) -> None:
        exc.frames_before = frames_before  # type: ignore[attr-defined]
        self._failed = True
        self._buf.clear()
        self._scan = 0
        raise exc

    def close(self) -> list[bytes]:
        """The peer closed the stream: returns a last frame whose ``end`` line
        had no line break before EOF (Storm's ``readLine`` accepts one).
        Raises if a frame was cut off."""
        self.closed = True
        buf = self._buf
        if not buf or _BLANK.match(buf):
            return []
        m = _END_AT_EOF.search(buf)
        rest = bytes(buf)
        buf.clear()
        if m is not None:
            return [rest[: m.start()]]
        raise RemoteProtocolError("stream ended in the middle of a frame", frame=rest, rule="frame.truncated")

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._buf)


def first_frame_end(data: bytes | bytearray, searched: int = 0) -> int:
    """The offset just past the first terminator in ``data``, or -1.

    Used at the switch to a length-prefixed framing (§9.6): the last JSON
    frame (the pid reply) is cut off exactly where it ends, and the bytes
    after it go to the new reader untouched. ``searched``: how many bytes
    at the start were searched already (a buffer that grows by chunks is
    searched once, not again per chunk); a terminator that spans its end
    is still found."""
    m = _TERM.search(data, max(0, searched - 5))
    return -1 if m is None else m.end()


class FirstFrameCut:
    """The switch to a negotiated framing (§9.6), on one direction of a
    connection: the first frame (the handshake, or the pid reply) is JSON
    and goes to the reader in force; the bytes after it are held until the
    pid reply has been read and the framing of the rest chosen
    (:meth:`release`). The host's connection, ``multilang conform`` and
    ``multilang replay`` all switch through this one class.

    :meth:`feed` returns the bytes the reader in force should get now
    (``b""``: none yet). The first frame is cut off exactly where it ends
    (:func:`first_frame_end`). Memory stays bounded by the frame limit: a
    first frame with no end after ``max_frame_size`` bytes is handed over
    whole, for the reader to name it oversized, and nothing is held after
    that."""

    __slots__ = ("max_frame_size", "_held", "_cut", "_given_up")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._held = bytearray()
        self._cut = False  # the first frame was handed over; the rest is held
        self._given_up = False  # an oversized first frame was handed over: pass everything on

    @property
    def cut(self) -> bool:
        """True once the first frame was handed over."""
        return self._cut

    def feed(self, data: bytes) -> bytes:
        if self._given_up:
            return data
        if self._cut:
            self._held += data
            return b""
        searched = len(self._held)
        self._held += data
        end = first_frame_end(self._held, searched)
        if end < 0:
            if len(self._held) <= self.max_frame_size:
                return b""
            self._given_up = True
            out, self._held = bytes(self._held), bytearray()
            return out
        self._cut = True
        out = bytes(self._held[:end])
        del self._held[:end]
        return out

    def release(self) -> bytes:
        """What is held (the bytes after the first frame, or a first frame
        not yet ended), handed over once; the cut holds nothing after it."""
        out, self._held = bytes(self._held), bytearray()
        self._given_up = True
        return out


class LengthPrefixedReader:
    """Framing of extension ``msgpack`` (§9.6): a 4-byte big-endian length,
    then that many bytes of body. Same interface as :class:`FrameReader`.

    A length over ``max_frame_size`` raises ``FrameTooLarge`` as soon as the
    prefix is read; the body is never buffered."""

    __slots__ = ("_buf", "max_frame_size", "closed", "_failed")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._buf = bytearray()
        self.max_frame_size = max_frame_size
        self.closed = False
        self._failed = False

    def feed(self, data: bytes) -> list[bytes]:
        if not data:
            return []
        if self._failed:
            raise FrameTooLarge("the stream already broke the frame size limit; no further frames are read")
        buf = self._buf
        buf += data  # a bytearray: a large frame arriving in small reads is not copied again and again
        frames: list[bytes] = []
        pos, end = 0, len(buf)
        limit = self.max_frame_size
        while end - pos >= 4:
            n = int.from_bytes(buf[pos : pos + 4], "big")
            if n > limit or n == 0:
                head = bytes(buf[pos : pos + 200])
                buf.clear()
                if n == 0:
                    exc: RemoteProtocolError = RemoteProtocolError("a msgpack frame of length 0 (§9.6)", frame=head, rule="frame.msgpack")
                else:
                    self._failed = True
                    exc = FrameTooLarge(f"frame of {n} bytes exceeds the {limit}-byte limit", frame=head)
                exc.frames_before = frames  # type: ignore[attr-defined]
                raise exc
            if end - pos - 4 < n:
                break
            frames.append(bytes(buf[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        if pos:
            del buf[:pos]
        return frames

    def close(self) -> list[bytes]:
        """End of stream: fine at a frame boundary, an error inside a frame."""
        self.closed = True
        if self._buf:
            rest = bytes(self._buf[:200])
            self._buf.clear()
            raise RemoteProtocolError("stream ended in the middle of a frame", frame=rest, rule="frame.truncated")
        return []

    @property
    def buffered(self) -> int:
        return len(self._buf)
