"""`multilang pipe`'s input: stdin lines read in a worker thread, parsed
(one string per line, or a JSON list with --json-input) and handed to the
stdin spout; a line that cannot become a tuple is a dead letter naming it."""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

import orjson

from ..errors import MultilangError
from . import signals as _signals

__all__ = ["StdinFeed"]  # for `multilang pipe` (pipe.py)

#: A run of 19 or more digits: maybe an integer beyond 64 bits, which orjson
#: reads as a float; the standard library keeps it exact for the bolt.
_LONG_NUMBER = re.compile(rb"\d{19}")
#: the deepest nesting an input line may have: the host's frames hold it with orjson (255 levels, less
#: the frame's own), and deeper values would only fail in a bolt's library or the next frame
_MAX_DEPTH = 200


def _maybe_deep(raw: bytes) -> bool:
    """Whether a line could nest deeper than _MAX_DEPTH (its brackets say
    at most how deep; a short line cannot)."""
    return len(raw) > 2 * _MAX_DEPTH and raw.count(b"[") + raw.count(b"{") > _MAX_DEPTH


def _not_json(name: str) -> Any:
    """``json.loads``' hook for NaN, Infinity and -Infinity, which Python reads
    and JSON does not have: refused, rather than sent on as null (orjson's
    writing of a float NaN), which would change the line's meaning."""
    raise ValueError(f"{name} is not a JSON number")


class StdinFeed:
    """``multilang pipe``'s input: an open-ended source for the stdin spout.

    stdin is read in a worker thread, in chunks of whatever is there, so a
    read never blocks the host: outputs stream while a slow producer (a
    ``tail -f``) keeps stdin open, and signals are handled at once. Lines
    wait here (at most ``CAPACITY``: the reader waits for room) until the
    spout takes them; ``open`` stays true until EOF (PythonSpoutTask). A
    line that is not UTF-8 cannot become a tuple: it is a dead letter at
    once, naming its line number, and so is a line that is not JSON with
    --json-input."""

    CAPACITY = 4096

    def __init__(self, n_fields: int, json_input: bool) -> None:
        from collections import deque

        self.items: Any = deque()
        self.numbers: Any = deque()  # the stdin line number of each item waiting in ``items``
        #: the line number of each item the spout took and has not finished
        #: with (its message id: items are numbered from 0 as they are taken)
        self._lines: dict[int, int] = {}
        self._taken = 0
        #: told the message ids whose trees completed, and a message id that failed (multilang pipe's output)
        self.on_ack: Any = None
        self.on_fail: Any = None
        self.open = True
        self.n_fields = n_fields  # values per line; 0: any number (--fields '*')
        self.json_input = json_input
        self._room: Any = None  # a trio.Event while the reader waits for room
        #: the longest line taken (multilang.max.frame.bytes): a longer one is
        #: a dead letter, and what is read of it is not kept (memory is bounded)
        self.max_line = 64 << 20
        self.last_taken = 0  # the stdin line number of the last input the spout took

    def __iter__(self) -> "StdinFeed":
        return self

    def __next__(self) -> list[Any]:
        got = self.take(1)
        if not got:
            raise StopIteration  # nothing now; pump() resumes the spout
        return got[0]

    def take(self, n: int) -> list[list[Any]]:
        """Up to ``n`` lines' values, in order; fewer: that is all for now
        (the spout's burst in one call, PythonSpoutTask)."""
        items, numbers, lines, seq = self.items, self.numbers, self._lines, self._taken
        got = [items.popleft() for _ in range(min(n, len(items)))]
        for _ in got:
            lines[seq] = numbers.popleft()
            seq += 1
        if got:
            self.last_taken = lines[seq - 1]
        self._taken = seq
        if self._room is not None and len(items) <= self.CAPACITY // 2:
            self._room.set()
        return got

    def ack(self, msg_ids: list[int]) -> None:
        """The trees of these inputs completed (PythonSpoutTask)."""
        pop = self._lines.pop
        for i in msg_ids:
            pop(i, None)
        if self.on_ack is not None:
            self.on_ack(msg_ids)

    def fail(self, msg_id: int) -> None:
        """The tree of this input failed: it is replayed, or a dead letter."""
        if self.on_fail is not None:
            self.on_fail(msg_id)

    def line_of(self, msg_id: Any) -> int | None:
        """The stdin line number of an input the spout has not finished with."""
        return self._lines.get(msg_id)

    def forget(self, msg_id: Any) -> None:
        """An input given up on (its dead letter is written)."""
        self._lines.pop(msg_id, None)

    async def pump(self, runtime: Any, spout: Any) -> None:
        import os

        import trio

        fd, buf, number = sys.stdin.fileno(), bytearray(), 0
        loads, append, numbered, arity = orjson.loads, self.items.append, self.numbers.append, self.n_fields
        skipping = False  # inside a line over max_line: its bytes are dropped up to its end
        while True:
            while len(self.items) >= self.CAPACITY:
                self._room = trio.Event()
                await self._room.wait()
                self._room = None
            try:
                chunk = await trio.to_thread.run_sync(os.read, fd, 1 << 16, abandon_on_cancel=True)
            except OSError as exc:  # a terminal that hung up: its input has ended (its SIGHUP stops the run)
                if not _signals.hung_up(exc):
                    raise
                chunk = b""
            lines: list[bytes] = []
            start = len(buf)  # a newline can only be in what was just read
            buf += chunk
            if skipping and (nl := buf.find(b"\n", start)) >= 0:
                del buf[: nl + 1]  # the end of the over-long line, reported already
                skipping, start = False, 0
            # Split only when a line ended: a long partial line is scanned once
            # per chunk for a newline, not split again and again.
            if not skipping and buf.find(b"\n", start) >= 0:
                lines = bytes(buf).split(b"\n")  # one copy per read, not one per line
                buf = bytearray(lines.pop())
            if not chunk and buf and not skipping:
                lines.append(bytes(buf))  # the last line, without its newline
            too_long = b""
            if chunk and not skipping and len(buf) > self.max_line:
                too_long, skipping = bytes(buf[:100]), True
            if skipping or not chunk:
                buf.clear()
            if self.json_input and lines and not _LONG_NUMBER.search(b"\n".join(lines)):
                # The common case in one loop: JSON lines orjson reads (a trailing \r is JSON
                # whitespace); _values decides about any other line.
                for raw in lines:
                    number += 1
                    try:
                        if len(raw) > 2 * _MAX_DEPTH and _maybe_deep(raw):  # the length test inline: per line
                            raise ValueError("maybe too deep")  # _values measures it
                        values = loads(raw)
                    except (ValueError, RecursionError):
                        values = self._values(raw[:-1] if raw.endswith(b"\r") else raw, number, runtime, spout)
                        if values is None:
                            continue
                    else:
                        if type(values) is not list:
                            values = [values]
                        if arity and len(values) != arity and self._arity(values, number, runtime, spout) is None:
                            continue
                    append(values)
                    numbered(number)
            else:
                for raw in lines:
                    number += 1
                    values = self._values(raw[:-1] if raw.endswith(b"\r") else raw, number, runtime, spout)
                    if values is not None:
                        append(values)
                        numbered(number)
            if too_long:
                number += 1
                runtime.dead_letter(spout, None, [too_long.decode("utf-8", "backslashreplace") + "..."],
                                    f"stdin line {number} is longer than multilang.max.frame.bytes "
                                    f"({self.max_line} bytes); it was not sent", 0, line=number)
            spout.resume()
            if not chunk:
                break
        self.open = False
        spout.resume()

    def _values(self, raw: bytes, number: int, runtime: Any, spout: Any) -> list[Any] | None:
        if self.json_input and not _LONG_NUMBER.search(raw) and not _maybe_deep(raw):
            try:
                values = orjson.loads(raw)  # checks the UTF-8 too
            except (ValueError, RecursionError):
                pass  # not UTF-8, not JSON, or beyond orjson (NaN, 1e400, a lone surrogate, deep): see below
            else:
                return self._arity(values if isinstance(values, list) else [values], number, runtime, spout)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            runtime.dead_letter(spout, None, [raw.decode("utf-8", "backslashreplace")],
                                f"stdin line {number} is not valid UTF-8 ({exc.reason} at byte {exc.start}; "
                                "shown with \\x escapes); it was not sent", 0, line=number)
            return None
        if not self.json_input:
            return [line] + [None] * (self.n_fields - 1)
        try:  # the standard library decides what orjson refused (NaN and Infinity are not JSON: refused too)
            values = json.loads(line, parse_constant=_not_json)
            why = _unsendable(values)
        except (ValueError, RecursionError) as exc:
            why = f"is not JSON (--json-input): {'nested too deeply' if isinstance(exc, RecursionError) else exc}"
        if why is not None:
            runtime.dead_letter(spout, None, [line], f"stdin line {number} {why}; it was not sent", 0, line=number)
            return None
        return self._arity(values if isinstance(values, list) else [values], number, runtime, spout)

    def _arity(self, values: list[Any], number: int, runtime: Any, spout: Any) -> list[Any] | None:
        """A JSON line's values, if --fields names as many (n_fields 0: any
        number); else a dead letter naming the line, not the spout's emit."""
        if self.n_fields and len(values) != self.n_fields:
            runtime.dead_letter(spout, None, values, f"stdin line {number} has {len(values)} value(s), but --fields "
                                f"names {self.n_fields}; it was not sent", 0, line=number)
            return None
        return values


def _unsendable(values: Any) -> str | None:
    """Why values the standard library read cannot go to a bolt as they are,
    or None: nesting deeper than _MAX_DEPTH, a number that overflows a float
    (1e400: it would go as null), a value no frame can carry (a lone
    surrogate: no UTF-8 for it)."""
    from ..codec import dumps

    stack = [(values, 1)]
    while stack:
        v, depth = stack.pop()
        if type(v) is float and not math.isfinite(v):
            return "has a number beyond a float's range (it would reach the bolt as null)"
        if isinstance(v, (list, dict)):
            if depth > _MAX_DEPTH:
                return f"is nested deeper than {_MAX_DEPTH} levels"
            stack.extend((x, depth + 1) for x in (v if isinstance(v, list) else v.values()))
    try:
        dumps(values)
    except (ValueError, TypeError, MultilangError) as exc:
        return f"has a value no frame can carry ({exc})"
    return None
