"""Supervision common to shell bolts and spouts (spec/PROTOCOL.md §8.2).

A shell task runs *sessions*: spawn + handshake, then reader, writer, stderr
drain, heartbeats and a watchdog in a nursery of their own. When a session
ends badly (crash, EOF, hang, protocol error) the task fails the tuples that
were in flight in that process, so their spouts replay them, and starts a new
session after a backoff, until the component's restart budget is spent.
Tuples still queued for the task are not lost: the next process gets them.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any, Callable

import trio

from multilang.connection import Role
from multilang.errors import ComponentReportedError
from multilang.messages import Error, Log, Metrics, Sync

from .._host.process import ShellProcess
from .._host.supervisor import GiveUp, RestartPolicy, Supervision
from .._model.conf import ProcessConf
from .._model.results import first_line
from .._model.topology import ComponentDef
from .tasks import PY_LEVEL, RuntimeSeam, Task, component_error, log


__all__ = ["ShellTask"]


class ShellTask(Task):
    """Supervision common to shell bolts and spouts (§8.2)."""

    role = Role.BOLT

    def __init__(self, runtime: RuntimeSeam, comp: ComponentDef, task_id: int) -> None:
        super().__init__(runtime, comp, task_id)
        self.proc: ShellProcess | None = None
        self.pconf = ProcessConf.from_conf(self.conf)
        self._blocked = False  # our reader waits on downstream space: not the child's fault
        self._starts = 0  # process starts of this task: each gets a fresh pid directory (§2.1)
        self._last_error: str | None = None  # the last `error` frame of the current process
        #: the current process did work (a bolt's settled a tuple, a spout's answered a next, ack or fail):
        #: RestartPolicy counts crashes in a row of processes that did none as a crash loop
        self._worked = False

    async def run(self) -> None:
        # The budget is per component, as documented (§8.2): every task of
        # the component counts its restarts in the same window (on host
        # workers, every task of it that this worker runs: docs/WORKERS.md).
        placement = self.runtime.placement
        sup = Supervision(RestartPolicy.from_conf(self.pconf, times=self.runtime.restart_times(self.name)),
                          component=self.name, log=log,
                          scope="" if placement is None else f" on host worker {placement.worker}")
        while True:
            sup.started(trio.current_time())
            self._worked = False
            try:
                await self._session()
                return
            except BaseException as exc:
                err = component_error(exc)
                if err is None or self.runtime.stopping:
                    if err is not None:
                        return
                    raise
            self.session_lost(f"{self.where()}'s process was lost: {first_line(str(err))}")
            self.stats.error(f"process lost: {first_line(str(err))}")
            d = sup.lost(err, now=trio.current_time(), worked=self._worked, where=self.where())
            if isinstance(d, GiveUp):
                self.runtime.give_up(err)
                return
            self.stats.restarts += 1
            await trio.sleep(d.delay)  # the backoff (§8.2 step 3)

    def offers(self, extensions: list[str]) -> list[str]:
        """The extensions offered to this task's processes (§9.1): a spout is never offered ``state`` (§9.7)."""
        return [e for e in extensions if e != "state"]

    def session_lost(self, cause: str) -> None:
        """The process died or hung (§8.2): what it had in flight is failed
        by the task kinds that hold tuples (bolts); a spout holds none."""

    async def _session(self) -> None:
        rt = self.runtime
        argv, cwd, env = rt.topology.resolve_command(self.comp)
        # §2.1: a fresh pid directory for every process start, inside the
        # run's private (0700) directory.
        self._starts += 1
        pid_dir = os.path.join(rt.pid_dir, f"{self.task_id}-{self._starts}")
        os.mkdir(pid_dir, 0o700)
        self._last_error = None
        rec = rt.recorder  # --record: this task's recording taps the process's pipes (record.py)
        proc = ShellProcess(
            component=self.name, task=self.task_id, role=self.role, argv=argv, cwd=cwd, env=env,
            pid_dir=pid_dir, conf=self.pconf,
            **({} if rec is None else {"spawn": rec.task(self.name, self.task_id, self.conf).spawn}),
        )
        self.proc = proc
        try:
            offered = self.conf.get("multilang.extensions")
            offers = self.offers(offered) if isinstance(offered, list) else []
            context = rt.topology.context_for(self.name, self.task_id).to_json()
            async with trio.open_nursery() as n:
                early = await proc.start(n, self.conf, context, offers)  # spawned, stderr drained, handshaken
                self.obs.extensions = proc.conn.extensions
                log.debug("%s started: pid %s", self.where(), proc.pid)
                await self._handle(proc, early)
                await self._serve(proc, n)
        finally:
            await proc.aclose(hurry=self.runtime.hurry)
            self.proc = None
            self.last_pid = proc.pid  # (the run's last snapshot names the process that ran: observe.py)
            shutil.rmtree(pid_dir, ignore_errors=True)

    async def _watchdog(self, proc: ShellProcess, expecting: Callable[[], float | None]) -> None:
        """Kill a process that sends nothing for the subprocess timeout (§5.2).

        ``expecting()`` returns since when a frame is due, or None when
        nothing is (an idle spout). Nothing is due either while our reader
        waits for downstream space; unblocking resets ``last_inbound``."""
        await proc.watch(lambda: None if self._blocked else expecting())

    def _common(self, ev: Any, proc: ShellProcess) -> None:
        """log / error / metrics / sync / unknown commands (§3.7)."""
        t = type(ev)
        if t is Log:
            level = PY_LEVEL.get(ev.level, logging.INFO)
            if level >= logging.WARNING:  # a component's own errors, maybe one per tuple: rate-limited
                self.runtime.errlog.log(self.where(), level, trio.current_time(), "[%s pid %s] %s",
                                        self.where(), proc.pid, ev.msg)
            else:  # shown by default, within the process's line budget (multilang.component.*)
                proc.component_log(level, ev.msg)
        elif t is Error:
            self.stats.errors += 1
            err = ComponentReportedError(ev.msg, component=self.name, task=self.task_id, pid=proc.pid)
            self.runtime.reported_errors.append(err)
            self._last_error = ev.msg
            self.stats.error(ev.msg)
            self.runtime.errlog.log(self.where(), logging.ERROR, trio.current_time(), "%s", err)
        elif t is Metrics:
            self.stats.metric(ev.name, ev.params)
        elif t is Sync:
            pass
        else:  # UnknownCommand on a bolt: Storm ignores it; so do we, loudly once
            log.warning("%s (pid %s) sent unknown command %r; ignored (§3.7)", self.where(), proc.pid, getattr(ev, "command", ev))

    async def _after_batch(self, touched: set["Task"]) -> None:
        """Settle the acker, then wait (once per chunk) for downstream space."""
        self.runtime.settle()
        self.runtime.nudge()  # what this task holds changed: the run may be done
        full = [t for t in touched if t.full()]
        if full:
            self._blocked = True
            try:
                for t in full:
                    await t.wait_for_space()
            finally:
                self._blocked = False
                if self.proc is not None:
                    self.proc.last_inbound = trio.current_time()

    async def _handle(self, proc: ShellProcess, events: list[Any]) -> None:
        raise NotImplementedError

    async def _serve(self, proc: ShellProcess, nursery: trio.Nursery) -> None:
        raise NotImplementedError
