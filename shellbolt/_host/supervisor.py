"""When to restart a crashed process, and when to give up (spec/PROTOCOL.md §8.2).

    sup = Supervision(RestartPolicy.from_conf(pconf, times=...), component=name, log=log)
    sup.started(now)                              # a process starts
    decision = sup.lost(err, now=now, worked=did_work, where="bolt:3")   # logged
    if isinstance(decision, GiveUp): ...          # the budget is spent
    else: await trio.sleep(decision.delay)        # then start a new process

Pure: no trio, no clock, no I/O but the log; the caller passes the times in.
The runtime's shell tasks and the Spark streaming source take this one step
after every lost process, so they back off, give up and say so alike, and
the policy is tested without waiting.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from .._model.conf import ProcessConf

__all__ = ["RestartPolicy", "Restart", "GiveUp", "Supervision"]


@dataclass(frozen=True, kw_only=True)
class Restart:
    """Start a new process after ``delay`` seconds; ``count`` restarts (this one
    included) are in the window now, of ``budget`` allowed."""

    delay: float
    count: int
    budget: int
    window: float


@dataclass(frozen=True, kw_only=True)
class GiveUp:
    """The budget is spent: ``count`` restarts were already used in the
    window, or (``in_a_row``) by this task's processes one after the other,
    none of which did any work."""

    count: int
    budget: int
    window: float
    in_a_row: bool = False

    def describe(self, component: str, scope: str = "") -> str:
        """The log's words for it: 'giving up after ' + this (``scope``: where
        the budget is counted, after the component's name, as in
        :class:`Supervision`)."""
        if self.in_a_row:
            return (f"{self.count} restarts in a row of processes that did no work (settled no tuple, answered "
                    f"no next, ack or fail) for component {component!r}{scope}")
        return f"{self.count} restarts of component {component!r}{scope} in {self.window:g}s"


class RestartPolicy:
    """Restart budget per window, and exponential backoff per task (§8.2).

    ``times`` holds the recent crash times the budget counts; pass one deque
    to the policies of all tasks of a component, as the budget is per
    component (§8.2, "all its tasks together"). The backoff is this policy's
    own: ``first_backoff`` doubling up to ``max_backoff``, back to
    ``first_backoff`` after a process that did work and lived
    ``reset_after`` seconds (a crash after a long healthy life is not a
    crash loop), or when ``times`` holds no crash of the window (also when
    its owner cleared it: the Spark lane does for each partition).

    A process that did no work (the caller says: a bolt's settled no tuple,
    a spout's answered no ``next``, ``ack`` or ``fail``) is a crash loop however slowly it dies:
    one that hangs until the 30 s subprocess timeout, or never answers the
    handshake, fits two crashes in the default 60 s window and would never
    spend the budget. So the policy also counts this task's crashes in a row
    of such processes, and gives up when they exceed the budget."""

    def __init__(
        self,
        budget: int,
        window: float,
        *,
        times: deque[float] | None = None,
        first_backoff: float = 0.1,
        max_backoff: float = 5.0,
        reset_after: float = 10.0,
    ) -> None:
        self.budget = budget
        self.window = window
        self.times: deque[float] = deque() if times is None else times
        self.first_backoff = first_backoff
        self.max_backoff = max_backoff
        self.reset_after = reset_after
        self._backoff = first_backoff
        self._idle_streak = 0  # this task's crashes in a row of processes that did no work

    @classmethod
    def from_conf(cls, conf: ProcessConf, *, times: deque[float] | None = None) -> "RestartPolicy":
        return cls(conf.restart_budget, conf.restart_window, times=times)

    def crashed(self, *, started: float, now: float, worked: bool = True) -> Restart | GiveUp:
        """A process started at ``started`` was lost at ``now``, having done
        work or not (``worked``): restart or give up?"""
        times = self.times
        while times and times[0] < now - self.window:
            times.popleft()
        if not times or worked and now - started > self.reset_after:
            self._backoff = self.first_backoff  # (none of the component's crashes in the window: a fresh start)
        self._idle_streak = 0 if worked else self._idle_streak + 1
        times.append(now)
        if len(times) > self.budget or self._idle_streak > self.budget:
            times.pop()  # (a give-up is no restart: another task of the component counts the restarts only)
            if self._idle_streak > self.budget:
                return GiveUp(count=self._idle_streak - 1, budget=self.budget, window=self.window, in_a_row=True)
            return GiveUp(count=len(times), budget=self.budget, window=self.window)
        delay = self._backoff
        self._backoff = min(delay * 2, self.max_backoff)
        return Restart(delay=delay, count=len(times), budget=self.budget, window=self.window)


class Supervision:
    """The one supervision step after a lost process (§8.2), for one
    process slot (a task, a streaming source's spout): the policy decides,
    the decision is logged in one wording, restarts are counted. The caller
    says when each process started (:meth:`started`) and, when it is lost,
    whether it did work; then sleeps the backoff or stops."""

    def __init__(self, policy: RestartPolicy, *, component: str, log: logging.Logger, scope: str = "") -> None:
        self.policy = policy
        self.component = component
        #: where the budget is counted, said after the component's name: "" (the whole run), or
        #: " on host worker 1" (each worker counts the restarts of the tasks it runs)
        self.scope = scope
        self.log = log
        #: processes started again after a loss
        self.restarts = 0
        self._started = 0.0

    def started(self, now: float) -> None:
        """A process of this slot started at ``now``."""
        self._started = now

    def lost(self, err: Any, *, now: float, worked: bool, where: str) -> Restart | GiveUp:
        """The slot's process was lost at ``now`` (``err`` says how): restart
        after the decision's delay, or give up. ``where`` names the slot in
        the log line."""
        d = self.policy.crashed(started=self._started, now=now, worked=worked)
        if isinstance(d, GiveUp):
            self.log.error("%s: giving up after %s: %s", where, d.describe(self.component, self.scope), err)
            return d
        self.restarts += 1
        self.log.error("%s crashed; restarting in %.1fs (restart %d of %d allowed per %gs for component %r%s): %s",
                       where, d.delay, d.count, d.budget, d.window, self.component, self.scope, err)
        return d
