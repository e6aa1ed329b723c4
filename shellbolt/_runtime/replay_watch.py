"""A run to its end that only replays its poison (issue 18): a window of
``topology.message.timeout.secs x (1 + multilang.max.replays)`` in which
trees failed and none completed, while a shell spout still replays message
ids failed more than ``multilang.max.replays`` times. A shell spout decides
about replays, as in Storm; this one would replay them for ever, so the run
stops as at the end of ``--duration``, and fails (``stopped_by`` "replays").

Past ``--max-tuples`` the trees get the same window for their replays,
not for ever (:meth:`ReplayWatch.past_limit`).

One rule for both engines: the embedded one feeds it its acker's counts,
the main process of a run on host workers the sum of every worker's (each
counts the trees of its own spouts)."""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

from .._model.results import brief
from .._model.topology import Topology

__all__ = ["ReplayWatch", "Forever"]

log = logging.getLogger("multilang.shellbolt")

#: (spout, message id, times failed, last cause) of an id failed past multilang.max.replays
Forever = tuple[str, Any, int, "str | None"]


class ReplayWatch:
    """The watch over one run: a window starts at each completion, and at
    each look once one has passed (:meth:`check`); with ``--max-tuples``,
    one starts when the limit is reached (:meth:`past_limit`)."""

    def __init__(self, topology: Topology, message_timeout: float, now: float, completed: int, failed: int) -> None:
        self.topology = topology
        self.max_replays = int(topology.conf.get("multilang.max.replays", 3))
        self.window = message_timeout * (1 + self.max_replays)
        self.completed, self.failed, self.quiet_since = completed, failed, now
        self.give_up_at, self._failed_at_limit = math.inf, 0

    @property
    def due_at(self) -> float:
        """When the current window ends (the next look, at the latest)."""
        return min(self.give_up_at, self.quiet_since + self.window)

    def past_limit(self, now: float, emitted: int, max_tuples: int, failed: int, in_flight: int) -> bool:
        """``--max-tuples``: once the spouts have emitted ``max_tuples``, the
        trees get the window for their replays, not for ever (a bolt that
        never acks, a shell spout replaying a tuple that fails every time).
        True (and said) once it has passed: the run stops as at the end of
        ``--duration``, what is still in flight abandoned."""
        if self.give_up_at == math.inf:
            if emitted >= max_tuples:
                self.give_up_at, self._failed_at_limit = now + self.window, failed
            return False
        if now < self.give_up_at:
            return False
        log.warning("--max-tuples %d was reached %.0fs ago (topology.message.timeout.secs x (1 + multilang.max.replays)) "
                    "and the trees are not done: %d failed since (and were replayed), %d in flight; stopping as at the "
                    "end of --duration: what is still in flight is abandoned", max_tuples, self.window,
                    failed - self._failed_at_limit, in_flight)
        return True

    def check(self, now: float, completed: int, failed: int, forever: Callable[[], list[Forever]]) -> bool:
        """True (and the error logged): the run only replays its poison, and
        stops. ``forever``: the ids the spouts replay past max replays."""
        if completed != self.completed:
            self.completed, self.failed, self.quiet_since = completed, failed, now
            return False
        if now < self.quiet_since + self.window:
            return False
        ids = forever()
        if ids and failed > self.failed:
            self._say(ids)
            return True
        self.failed, self.quiet_since = failed, now  # watch the next window
        return False

    def _say(self, forever: list[Forever]) -> None:
        name, msg_id, times, cause = max(forever, key=lambda r: r[2])
        log.error("for %.0fs (topology.message.timeout.secs x (1 + multilang.max.replays)) trees failed and none "
                  "completed, while %d message id(s) failed more than multilang.max.replays (%d) times are still "
                  "replayed, e.g. message id %s of spout %r (failed %d times; last cause: %s). A shell spout decides "
                  "about replays, as in Storm, and this one would replay them for ever: the run stops as at the end "
                  "of --duration, and fails. Give up on such ids in the spout's fail(), or fix what fails them.%s",
                  self.window, len(forever), self.max_replays, brief(repr(msg_id), 100), name, times, cause,
                  self._cycle_note())

    def _cycle_note(self) -> str:
        cycle = self.topology.cycle()
        if cycle is None:
            return ""
        return (f" The topology has a cycle ({' -> '.join(cycle)}): a tuple that goes round it for ever keeps its "
                "tree from completing; emit the last round unanchored, or stop re-emitting.")

