"""Errors logged once per interval per kind, with a count: never once per tuple.

A poison tuple replayed over and over, or a bolt that reports the same
exception for every input, would otherwise print the same ERROR record
thousands of times a minute and bury everything else (issue 18). The first
record of a kind is logged in full at once; later ones of the same kind are
only counted, and the count is logged once the interval has passed
("...: 1234 more like this in the last 10s, the last: <its first line>").

A *kind* is the task plus the first line of the message with its numbers and
quoted values masked, so "failed on tuple -4217..." and "failed on tuple
8812..." are one kind. Pure: the clock is passed in.
"""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = ["RateLimitedLog", "LineBudget"]

# Numbers, and quoted values that start a word ("tuple 'abc'", not "bolt:1's").
# A quote left open (a value cut short, "...") is masked to the end of the line.
_VARYING = re.compile(r"(?<!\w)'[^'\n]*(?:'|$)|(?<!\w)\"[^\"\n]*(?:\"|$)|-?\d+(?:\.\d+)?", re.M)
_MAX_KINDS = 1000  # kinds remembered at once; past that the oldest are forgotten (memory stays bounded)


def kind_of(where: str, msg: str) -> str:
    # Masked before it is cut: the length of a number must not make a new kind.
    return f"{where}|{_VARYING.sub('#', msg.split(chr(10), 1)[0])[:200]}"


class RateLimitedLog:
    """``log(where, level, now, fmt, *args)``: logs the first record of a kind
    and counts the rest until ``interval`` seconds have passed."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self.logger = logger
        self.interval = interval
        # kind -> [window start, suppressed count, level, the last message's start]
        self._kinds: dict[str, list[Any]] = {}

    def log(self, where: str, level: int, now: float, fmt: str, *args: Any, kind: str | None = None) -> None:
        """``kind``: what makes lines the same kind (default: ``kind_of``
        of the message); the count's report quotes the last message."""
        msg = fmt % args if args else fmt
        kind = kind_of(where, msg) if kind is None else kind
        state = self._kinds.get(kind)
        if state is not None and now - state[0] < self.interval:
            state[1] += 1
            state[3] = msg[:400]  # the report quotes the last one (the first was logged in full)
            return
        if state is not None and state[1]:
            self._report(kind, state, now)
        if state is None and len(self._kinds) >= _MAX_KINDS:
            self.flush(now)
            self._kinds.pop(next(iter(self._kinds)))
        self._kinds[kind] = [now, 0, level, msg[:400]]
        self.logger.log(level, "%s", msg)

    def flush(self, now: float) -> None:
        """Log the counts still held (at the end of a run)."""
        for kind, state in self._kinds.items():
            if state[1]:
                self._report(kind, state, now)
                state[1] = 0

    def _report(self, kind: str, state: list[Any], now: float) -> None:
        where = kind.partition("|")[0]
        last = state[3].split("\n", 1)[0]
        sample = last if len(last) <= 160 else last[:160] + "..."
        self.logger.log(state[2], "%s: %d more like this in the last %.0fs, the last: %s",
                        where, state[1], max(now - state[0], 0.0), sample)


class LineBudget:
    """At most ``lines`` log lines of one process per ``interval`` seconds
    (its ``log`` frames and stderr lines): a component that logs per tuple
    shows its first lines and then a count, not a flood. Pure: the clock is
    passed in."""

    def __init__(self, lines: int = 100, interval: float = 10.0) -> None:
        self.lines, self.interval = lines, interval
        self._start: float | None = None
        self._used = 0
        self.dropped = 0  # lines not shown in the current window

    def take(self, now: float) -> int | None:
        """None: do not show this line. Else the number of lines not shown
        since the last window began, to report before this one (often 0)."""
        if self._start is None or now - self._start >= self.interval:
            dropped, self.dropped = self.dropped, 0
            self._start, self._used = now, 1
            return dropped
        if self._used < self.lines:
            self._used += 1
            return 0
        self.dropped += 1
        return None
