"""The live view of ``multilang run`` (docs/OBSERVE.md, "Live view").

Reads :func:`multilang.shellbolt._observe.observe.snapshot` once per frame; no click,
no trio, no rich: a frame is a dozen short lines, and a small ANSI renderer
(cursor up, clear line) draws them in place.

* On a terminal: a header (elapsed, trees in flight / completed / failed,
  complete latency, ETA when it can be known), a row per component (a row
  per task too with ``tasks=True``), a loud STALLED line, redrawn every
  second. Log lines written meanwhile go above the rows (the view wraps the
  logging handlers' stream and ``sys.stderr`` while it draws).
* Elsewhere (a log file, CI): plain ``[progress]`` lines every 2 s, at most
  ~120 characters each: one summary line, one per component (per task too
  with ``tasks=True``), and a STALLED line when stalled.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

from . import signals as _signals

__all__ = ["LiveView", "fmt_ms", "fmt_count", "fmt_duration"]

PLAIN_WIDTH = 120  # a component line keeps its latency, capacity, in flight and queued
_CSI = "\x1b["
_LOUD = "\x1b[1;37;41m"  # bold white on red
_BOLD = "\x1b[1m"
_DIM = "\x1b[2m"
_RESET = "\x1b[0m"


def fmt_count(n: float | None) -> str:
    """1234 -> '1234', 12345 -> '12.3k', 1234567 -> '1.2M'; None (not known) -> '-'."""
    if n is None:
        return "-"
    n = round(n)
    if abs(n) < 10_000:
        return str(n)
    if abs(n) < 1_000_000:
        return f"{n / 1e3:.1f}k"
    return f"{n / 1e6:.1f}M"


def fmt_ms(ms: float | None) -> str:
    """A latency in milliseconds, in 3-4 characters; '-' for none."""
    if ms is None:
        return "-"
    if ms < 1:
        return f"{ms:.2f}"
    if ms < 10:
        return f"{ms:.1f}"
    if ms < 10_000:
        return f"{ms:.0f}"
    return f"{ms / 1e3:.0f}s"


def fmt_duration(s: float) -> str:
    if s < 60:
        return f"{s:.1f}s"
    m, s = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def _lat(row: dict[str, Any]) -> dict[str, Any]:
    """The latency a row shows: a spout's complete latency, a bolt's execute latency (as Storm UI's tables)."""
    return row["complete_latency_ms"] if row["kind"] == "spout" else row["execute_latency_ms"]


def _pair(lat: dict[str, Any]) -> str:
    if not lat["count"]:
        return "-"
    return f"{fmt_ms(lat['p50'])}/{fmt_ms(lat['p99'])}"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


class _Above:
    """A stream that clears the live rows before anything else is written,
    so log lines scroll above them; the next frame is drawn below."""

    def __init__(self, view: "LiveView", stream: TextIO) -> None:
        self._view = view
        self._stream = stream

    def write(self, text: str) -> int:
        self._view.clear()
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class LiveView:
    """A progress reporter for :meth:`Runtime.run` (``progress=``): called
    every :attr:`interval` seconds with the runtime, and :meth:`finish` once
    when the run ends (the final frame, on a terminal).

    ``stream``: where to draw (default ``sys.stderr``); ``tty``: draw in
    place (default: ``stream.isatty()``); ``tasks``: a row per task too;
    ``width`` / ``height``: the terminal's (default: asked each frame)."""

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None, tasks: bool = False,
                 width: int | None = None, height: int | None = None, interval: float | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if tty is None:
            isatty = getattr(self.stream, "isatty", None)
            tty = bool(isatty()) if callable(isatty) else False
        self.tty = tty
        self.tasks = tasks
        self._width, self._height = width, height
        self.interval = interval if interval is not None else (1.0 if tty else 2.0)
        self._drawn = 0  # lines of the last frame still on the screen
        self._last: dict[str, tuple[float, int]] = {}  # row key -> (elapsed, emitted) at the last frame
        self._wrapped: list[tuple[Any, Any]] = []  # (object, its original stream) while drawing in place

    # -- the reporter protocol ---------------------------------------------------------------------

    def __call__(self, runtime: Any) -> None:
        from multilang.shellbolt import snapshot

        self.show(snapshot(runtime))

    def finish(self, runtime: Any) -> None:
        """The run ended: on a terminal, draw the final frame and leave it;
        elsewhere nothing (the summary follows)."""
        try:
            if self.tty:
                self(runtime)
        finally:
            self.close()

    def close(self) -> None:
        """Done drawing: the last frame stays, logging writes as before."""
        self._unwrap()

    def show(self, snap: dict[str, Any]) -> None:
        """Draw one snapshot (a frame, or plain lines)."""
        if self.tty:
            self._wrap()
            try:
                self._draw(self.frame(snap))
            except OSError as exc:  # the terminal hung up (its SIGHUP stops the run): nothing more to draw on
                if not _signals.hung_up(exc):
                    raise
        else:
            self.stream.write("".join(line + "\n" for line in self.lines(snap)))
            self.stream.flush()

    # -- terminal -------------------------------------------------------------------------------------

    def size(self) -> tuple[int, int]:
        if self._width is not None:
            return self._width, self._height or 50
        try:
            cols, rows = os.get_terminal_size(self._raw().fileno())
        except (AttributeError, OSError, ValueError):
            cols = rows = 0
        for env, default in (("COLUMNS", 100), ("LINES", 50)):  # as shutil.get_terminal_size: the env first
            try:
                n = int(os.environ.get(env, ""))
            except ValueError:
                n = 0
            if env == "COLUMNS":
                cols = n if n > 0 else cols or default
            else:
                rows = n if n > 0 else rows or default
        return cols, rows

    def frame(self, snap: dict[str, Any]) -> list[str]:
        """The lines of a terminal frame (ANSI attributes included, each
        clipped to the terminal width)."""
        width, height = self.size()
        width = max(width - 1, 20)  # never the last column: a full line would wrap
        trees = snap["trees"]
        elapsed = snap["elapsed_s"]
        flight = "" if trees["in_flight"] is None else f"{fmt_count(trees['in_flight'])} in flight, "
        head = (f"{snap['topology']}  {fmt_duration(elapsed)}  trees: {flight}"
                f"{fmt_count(trees['completed'])} completed, {fmt_count(trees['failed'])} failed")
        if trees["complete_latency_ms"]["count"]:
            head += f"  complete {_pair(trees['complete_latency_ms'])} ms"
        if snap.get("eta_s") is not None:
            head += f"  ETA {fmt_duration(snap['eta_s'])}"
        lines = []
        if snap["stalled"]:
            lines.append(_LOUD + _clip(self._stall_text(snap, key=True), width) + _RESET)
        lines.append(_BOLD + _clip(head, width) + _RESET)
        rows = self._rows(snap)
        name_w = min(max([len(k) for k, _ in rows] + [9]), 24)
        header = (f"{'component':<{name_w}} {'rate/s':>7} {'flight':>6} {'queued':>6} {'acked':>7} {'failed':>6} "
                  f"{'lat p50/p99':>11} {'cap':>4} {'rst':>3}  last error")
        lines.append(_DIM + _clip(header, width) + _RESET)
        room = max(height - len(lines) - 2, 1)
        for i, (key, row) in enumerate(rows):
            if i == room and len(rows) > room + 1:
                lines.append(f"... {len(rows) - room} more rows (a taller terminal shows them)")
                break
            cap = row["capacity"]
            text = (f"{_clip(key, name_w):<{name_w}} {fmt_count(self._rate(key, elapsed, row['emitted'])):>7} "
                    f"{fmt_count(row['in_flight']):>6} {fmt_count(row['queued']):>6} {fmt_count(row['acked']):>7} "
                    f"{fmt_count(row['failed']):>6} {_pair(_lat(row)):>11} "
                    f"{'-' if cap is None else f'{cap:.2f}':>4} {row['restarts']:>3}")
            err = row["last_error"]
            if err:
                text += "  " + " ".join(err.split())
            lines.append(_clip(text, width))
        return lines

    def _draw(self, lines: list[str]) -> None:
        out = []
        if self._drawn:
            out.append(f"{_CSI}{self._drawn}F")  # to the first line of the last frame
        out.extend(f"{_CSI}2K{line}\n" for line in lines)
        out.append(f"{_CSI}J")  # what an older, longer frame left below
        stream = self._raw()
        stream.write("".join(out))
        stream.flush()
        self._drawn = len(lines)

    def clear(self) -> None:
        """Remove the rows from the screen (before someone else writes)."""
        if self._drawn:
            stream = self._raw()
            stream.write(f"{_CSI}{self._drawn}F{_CSI}J")
            stream.flush()
            self._drawn = 0

    def _raw(self) -> TextIO:
        s = self.stream
        return s._stream if isinstance(s, _Above) else s  # type: ignore[return-value]

    def _wrap(self) -> None:
        """While drawing in place: the logging handlers that write to our
        stream (and sys.stderr, if it is ours) clear the rows first."""
        if self._wrapped:
            return
        above = _Above(self, self.stream)
        for h in logging.getLogger().handlers:
            if isinstance(h, logging.StreamHandler) and h.stream is self.stream:
                self._wrapped.append((h, h.stream))
                h.stream = above  # type: ignore[assignment]
        if sys.stderr is self.stream:
            self._wrapped.append((sys, sys.stderr))
            sys.stderr = above  # type: ignore[assignment]
        if not self._wrapped:
            self._wrapped.append((None, None))  # nothing to wrap: do not look again

    def _unwrap(self) -> None:
        for obj, stream in self._wrapped:
            if obj is sys:
                sys.stderr = stream
            elif obj is not None:
                obj.stream = stream
        self._wrapped = []

    # -- plain lines ----------------------------------------------------------------------------------

    def lines(self, snap: dict[str, Any]) -> list[str]:
        """Plain ``[progress]`` lines (no ANSI), each at most ~120 characters."""
        el = f"[progress] {fmt_duration(snap['elapsed_s'])}"
        trees = snap["trees"]
        flight = "" if trees["in_flight"] is None else f"{trees['in_flight']} in flight, "
        head = f"{el} trees: {flight}{trees['completed']} completed, {trees['failed']} failed"
        if trees["complete_latency_ms"]["count"]:
            head += f", complete {_pair(trees['complete_latency_ms'])}ms"
        if snap.get("eta_s") is not None:
            head += f", ETA {fmt_duration(snap['eta_s'])}"
        out = [_clip(head, PLAIN_WIDTH)]
        if snap["stalled"]:
            out.append(_clip(f"{el} {self._stall_text(snap)}", PLAIN_WIDTH))
        for key, row in self._rows(snap):
            rate = self._rate(key, snap["elapsed_s"], row["emitted"])
            text = f"{el} {key}: emitted {row['emitted']} ({rate:.0f}/s) acked {row['acked']} failed {row['failed']}"
            # The figures a reader looks for first come first: a line is cut at PLAIN_WIDTH.
            lat = _lat(row)
            if lat["count"]:
                text += f" {'complete' if row['kind'] == 'spout' else 'exec'} {_pair(lat)}ms"
            if row["capacity"] is not None:
                text += f" cap {row['capacity']:.2f}"
            if row["in_flight"] is not None:
                text += f" in flight {row['in_flight']}"
            if row["queued"]:
                text += f" queued {row['queued']}"
            if row["restarts"]:
                text += f" restarts {row['restarts']}"
            if row["last_error"]:
                text += " error: " + " ".join(row["last_error"].split())
            out.append(_clip(text, PLAIN_WIDTH))
        return out

    # -- shared ------------------------------------------------------------------------------------------

    def _rows(self, snap: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        rows = []
        for name, comp in snap["components"].items():
            rows.append((name, comp))
            if self.tasks:
                rows.extend((f"  {name}:{t}" if self.tty else f"{name}:{t}", snap["tasks"][f"{name}:{t}"])
                            for t in comp["tasks"] if f"{name}:{t}" in snap["tasks"])
        return rows

    def _rate(self, key: str, elapsed: float, emitted: int) -> float:
        """Emits per second since the last frame (since the start on the first)."""
        t0, e0 = self._last.get(key, (0.0, 0))
        self._last[key] = (elapsed, emitted)
        dt = elapsed - t0
        return (emitted - e0) / dt if dt > 0 else 0.0

    @staticmethod
    def _stall_text(snap: dict[str, Any], key: bool = False) -> str:
        limit = f"multilang.progress.stall.secs = {snap['stall_secs']:g}" if key else f"over {snap['stall_secs']:g}s"
        return (f"STALLED: {snap['trees']['in_flight']} trees in flight, none completed for "
                f"{fmt_duration(snap['trees']['stalled_s'])} ({limit})")
