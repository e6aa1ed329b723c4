"""When to restart a crashed process, and when to give up (spec/PROTOCOL.md §8.2).

    policy = RestartPolicy.from_conf(pconf, times=runtime.restart_times(name))
    decision = policy.crashed(started=t0, now=t1)
    if isinstance(decision, GiveUp): ...          # the budget is spent
    else: await trio.sleep(decision.delay)        # then start a new process

Pure: no trio, no clock, no I/O; the caller passes the times in. The runtime's
shell tasks and the Spark streaming source use the same policy, so they back
off and give up alike, and the policy is tested without waiting.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .conf import ProcessConf

__all__ = ["RestartPolicy", "Restart", "GiveUp"]


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
    """The budget is spent: ``count`` restarts were already used in the window."""

    count: int
    budget: int
    window: float


class RestartPolicy:
    """Restart budget per window, and exponential backoff per task (§8.2).

    ``times`` holds the recent crash times the budget counts; pass one deque
    to the policies of all tasks of a component, as the budget is per
    component (§8.2, "all its tasks together"). The backoff is this policy's
    own: ``first_backoff`` doubling up to ``max_backoff``, back to
    ``first_backoff`` after a process that lived ``reset_after`` seconds
    (a crash after a long healthy life is not a crash loop)."""

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

    @classmethod
    def from_conf(cls, conf: ProcessConf, *, times: deque[float] | None = None) -> "RestartPolicy":
        return cls(conf.restart_budget, conf.restart_window, times=times)

    def crashed(self, *, started: float, now: float) -> Restart | GiveUp:
        """A process started at ``started`` was lost at ``now``: restart or give up?"""
        if now - started > self.reset_after:
            self._backoff = self.first_backoff
        times = self.times
        times.append(now)
        while times and times[0] < now - self.window:
            times.popleft()
        if len(times) > self.budget:
            return GiveUp(count=len(times) - 1, budget=self.budget, window=self.window)
        delay = self._backoff
        self._backoff = min(delay * 2, self.max_backoff)
        return Restart(delay=delay, count=len(times), budget=self.budget, window=self.window)
