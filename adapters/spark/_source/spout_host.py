"""The spout process host of the multilang streaming source.

The spout runs on the runtime's own process host: one
:class:`~multilang.shellbolt._host.process.ShellProcess` at a time, restarted by the
same :class:`~multilang.shellbolt._host.supervisor.RestartPolicy`, configured by the
same :class:`~multilang.shellbolt._model.conf.ProcessConf` (spec/PROTOCOL.md §2.4,
§5.2, §8.2). :class:`SpoutHost` is the trio side; :class:`_SupervisedSpout` is
the blocking face Spark's reader calls, through the one sync/trio seam
(:class:`~multilang.adapters._sync.TrioHost`: one trio loop in a daemon
thread, which also keeps each process's stderr drained between calls, §8.3).
Every open source is reaped at interpreter exit (``_close_all`` and the
TrioHost's shutdown hooks).

Used by :mod:`multilang.adapters.spark._source.source` (docs/SPARK.md, "How it runs").
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import weakref
from typing import Any, Awaitable, Callable

import trio

from multilang.codec import dumps
from multilang.connection import Role, State
from multilang.errors import ComponentError, TopologyError
from multilang.messages import Ack, Activate, Batch, Deactivate, Emit, Fail, Message, TopologyContext
from multilang.shellbolt import (
    SCHEMA, GiveUp, ProcessConf, RestartPolicy, ShellProcess, Spawn, SpoutDriver, Supervision, command_problem,
    component_error, scratch_folder, spawn_child,
)

from ..._sync import TrioHost
from .._engine.ship import executor_name, unpacked, with_libraries
from .options import CONSUMER_COMPONENT, _Options

__all__ = ["SpoutHost", "spout_conf"]

log = logging.getLogger("multilang.spark.source")

#: The component name the spout's context gives its consumer, the Spark query.


#: The keys whose defaults the spout sees in its handshake conf (values from the schema).
_HANDSHAKE_DEFAULTS = (
    "topology.message.timeout.secs", "topology.max.spout.pending", "topology.subprocess.timeout.secs",
    "supervisor.worker.timeout.secs", "multilang.max.frame.bytes", "multilang.handshake.timeout.secs",
    "multilang.restart.budget", "multilang.restart.window.secs", "multilang.kill.grace.secs",
)

#: The source states open in this process (``_SourceState`` adds itself), closed at exit.
_live_states: "weakref.WeakSet[Any]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # Spark does not always call stop(); reap our children anyway
    for st in list(_live_states):
        try:
            st.close()
        except Exception:  # pragma: no cover
            pass


class _Lost(Exception):
    """The spout process is gone or unusable; ``err`` says why. (Its good
    frames before that were handed on as they came.)"""

    def __init__(self, err: ComponentError) -> None:
        super().__init__(str(err))
        self.err = err


def spout_conf(opts: _Options) -> dict[str, Any]:
    """The conf the spout gets in its handshake (and the host reads)."""
    user = opts.conf
    conf = {**{k: SCHEMA[k].default for k in _HANDSHAKE_DEFAULTS}, "topology.name": f"spark-{opts.component}",
            **user}
    if opts.max_pending is not None:
        conf["topology.max.spout.pending"] = opts.max_pending
    return {k: v for k, v in conf.items() if _jsonable(v)}


class SpoutHost:
    """The spout's process, restarted on crash within the restart budget (§8.2).

    Lives in a trio loop. ``on_events`` receives every frame other than
    ``sync``, in order, as it is read (the one spout driver,
    :class:`~multilang.shellbolt.SpoutDriver`), also after a command's sync
    (a spout may emit while idle, §4.4) and before a process dies.
    Each process's stderr is drained in ``nursery`` for as long as it lives.
    ``spawn`` starts the child (a test passes an in-memory one)."""

    def __init__(
        self, opts: _Options, fields: list[str], on_events: Callable[[list[Message]], None],
        nursery: trio.Nursery, *, spawn: Spawn = spawn_child,
    ) -> None:
        self.opts = opts
        self.fields = fields
        self.on_events = on_events
        self.nursery = nursery
        self.spawn = spawn
        argv = list(opts.argv)
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # a spout importing multilang runs with this installation
        self.argv = argv
        self.cwd, env = opts.cwd, opts.env
        if opts.archive:  # shipped with the job: the spout runs in its unpacked copy (ship.py)
            root = unpacked(opts.archive)
            self.cwd, env = os.path.join(root, opts.cwd or ""), with_libraries(root, env)
        self.env = {**os.environ, **env}
        if spawn is spawn_child:  # a missing script or interpreter: one clear error, not a crash loop
            problem = command_problem(argv, self.cwd or os.getcwd(), self.env.get("PATH"))
            if problem is not None:
                raise TopologyError(f"on {executor_name()} (the driver, where spouts run): spout "
                                    f"{opts.component!r}: {problem}")
        self.conf = spout_conf(opts)
        self.pconf = ProcessConf.from_conf(self.conf)
        self.supervision = Supervision(RestartPolicy.from_conf(self.pconf), component=opts.component, log=log)
        self.proc: ShellProcess | None = None
        self.driver: SpoutDriver | None = None  # the current process's
        #: §9.1: batch if the conf's multilang.extensions has it (the default), so
        #: that commands may be pipelined (§9.5); never state (a spout's is none)
        extensions = self.conf.get("multilang.extensions", SCHEMA["multilang.extensions"].default)
        self.offers = ("batch",) if isinstance(extensions, list) and "batch" in extensions else ()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def restarts(self) -> int:
        return self.supervision.restarts

    @property
    def pipelined(self) -> bool:
        """Whether the current process accepted batch: commands may go several to a write (§9.5)."""
        return self.proc is not None and self.proc.conn.batching

    def _context(self) -> dict[str, Any]:
        """§2.2: this process is task ``taskIndex`` of the component's
        ``parallelism`` tasks; the Spark query is the consumer ``spark``."""
        opts = self.opts
        tasks = {t: opts.component for t in opts.task_ids}
        tasks[opts.consumer_task] = CONSUMER_COMPONENT
        return TopologyContext(
            task_id=opts.task_id,
            component_id=opts.component,
            task_to_component=tasks,
            streams=[opts.stream],
            stream_to_output_fields={opts.stream: list(self.fields)},
            stream_to_target_to_grouping={opts.stream: {CONSUMER_COMPONENT: {"type": "SHUFFLE"}}},
        ).to_json()

    async def ensure_started(self) -> None:
        while self.driver is None:
            proc = ShellProcess(
                component=self.opts.component, task=self.opts.task_id, role=Role.SPOUT, argv=self.argv,
                cwd=self.cwd, env=self.env, pid_dir=scratch_folder("multilang-pids-"),
                conf=self.pconf, spawn=self.spawn,
            )
            self.supervision.started(trio.current_time())
            try:
                try:
                    early = await proc.start(self.nursery, self.conf, self._context(), offers=self.offers)
                    await self._handle(proc, early)
                except BaseException as exc:  # a failed spawn, no pid reply (§2.4), EOF
                    err = component_error(exc)
                    if err is None:
                        raise
                    raise _Lost(err) from None
                driver = SpoutDriver(proc, lambda events, proc=proc: self._handle(proc, events))
                self.proc, self.driver = proc, driver
                self.nursery.start_soon(self._serve, driver)
                await self._command(driver, Activate())  # §4.1: always first
            except _Lost as lost:
                await self._lost(proc, lost.err)

    async def command(self, *cmds: Message) -> None:
        """Run commands to their syncs: one, or several in one write to a
        process that accepted batch (:attr:`pipelined`; one at a time to one
        that did not). A crash restarts the process; a command not answered
        by then is *not* retried (the caller decides: an unacked id stays
        queued by the caller and goes to the new process), except an ack or
        a fail, whose fate must reach the replacement (§8.2)."""
        await self.ensure_started()
        if len(cmds) > 1 and not self.pipelined:
            for cmd in cmds:
                await self.command(cmd)
            return
        driver = self.driver
        assert driver is not None
        answered = 0

        def synced(n: int) -> None:
            nonlocal answered
            answered += n

        try:
            await self._command(driver, *cmds, on_sync=synced)
        except _Lost as lost:
            await self._lost(driver.proc, lost.err)
            await self.ensure_started()
            owed = [cmd for cmd in cmds[answered:] if type(cmd) in (Ack, Fail)]
            if owed:
                await self.command(*owed)

    async def _command(self, driver: SpoutDriver, *cmds: Message, on_sync: Callable[[int], None] | None = None) -> None:
        """Commands to their syncs (the driver's); the frames they bring go to
        ``on_events`` as they come. The subprocess timeout runs while one is
        outstanding (§5.2)."""
        try:
            await driver.command(*cmds, on_sync=on_sync)
        except ComponentError as err:
            raise _Lost(err) from None

    async def _serve(self, driver: SpoutDriver) -> None:
        """The process's reader and watchdog, next to its stderr drain, until
        the process is lost or closed: a command waiting then raises. So does
        an error of ``on_events`` (it reaches the caller of :meth:`command`,
        not the loop every source of this process shares)."""
        try:
            async with trio.open_nursery() as n:
                n.start_soon(driver.proc.watch, driver.due)
                await driver.serve()
        except BaseException as exc:  # maybe in a group with the cancellation of a closing source
            err = component_error(exc) or _an_error(exc)
            if err is None:
                raise  # a cancellation alone: it ends the task
            driver.lose(err)

    async def _handle(self, proc: ShellProcess, events: list[Message]) -> None:
        """Emits that want task ids are answered at once (§4.3); every frame
        goes to ``on_events``, in order, a batch's emits (§9.5) as emits."""
        replies = b"".join([proc.task_ids_reply([self.opts.consumer_task]) for ev in events
                            if type(ev) is Emit and ev.wants_task_ids])
        if replies:
            await proc.write(replies)
        if any(type(ev) is Batch for ev in events):
            flat: list[Message] = []
            for ev in events:
                if type(ev) is Batch:
                    flat.extend(Emit(values=values, stream=stream, id=msg_id, need_task_ids=False)
                                for values, msg_id, stream in ev.emits)
                else:
                    flat.append(ev)
            events = flat
        self.on_events(events)

    async def _lost(self, proc: ShellProcess, err: ComponentError) -> None:
        worked = self.driver is not None and self.driver.worked
        self.proc = self.driver = None
        await self._reap(proc)
        d = self.supervision.lost(err, now=trio.current_time(), worked=worked,
                                  where=f"multilang source: spout {self.opts.component}:{self.opts.task_id}")
        if isinstance(d, GiveUp):
            raise err
        await trio.sleep(d.delay)  # the backoff (§8.2 step 3)

    async def _reap(self, proc: ShellProcess) -> None:
        try:
            await proc.aclose()
        finally:
            shutil.rmtree(proc.pid_dir, ignore_errors=True)

    async def aclose(self) -> None:
        """§5.4: deactivate (within the kill grace), then close stdin, SIGTERM,
        SIGKILL; always reap. Idempotent."""
        driver, self.driver, self.proc = self.driver, None, None
        if driver is None:
            return
        proc = driver.proc
        try:
            if proc.open and proc.conn.state is State.IDLE:
                with trio.move_on_after(self.pconf.kill_grace):
                    try:
                        await driver.command(Deactivate())
                    except Exception:  # lost, or its reader stopped: reaped below
                        pass
        finally:
            with trio.CancelScope(shield=True):
                await self._reap(proc)


class _SupervisedSpout:
    """The blocking face of a :class:`SpoutHost`, run in this process's
    :class:`TrioHost` loop (one round trip per command).

    ``before_close`` (async, run in the loop) runs before the process is
    closed, on :meth:`close` and at the loop's shutdown alike: the source
    stops its background task there (docs/SPARK.md, "How it runs")."""

    def __init__(self, opts: _Options, fields: list[str], on_events: Callable[[list[Message]], None],
                 before_close: Callable[[], Awaitable[None]] | None = None) -> None:
        self._host = TrioHost.get()
        self._before_close = before_close
        self._spout: SpoutHost = self._host.run(self._open, opts, fields, on_events)

    async def _open(self, opts: _Options, fields: list[str], on_events: Any) -> SpoutHost:
        nursery = await self._host.nursery.start(_keeper)
        spout = SpoutHost(opts, fields, on_events, nursery)
        self._host.on_shutdown(self._aclose)  # reaped even if nobody calls close()
        return spout

    @property
    def pid(self) -> int | None:
        return self._spout.pid

    @property
    def restarts(self) -> int:
        return self._spout.restarts

    @property
    def host(self) -> SpoutHost:
        """The trio side, for code that runs in the loop."""
        return self._spout

    def run(self, afn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """``await afn(*args)`` in the loop; blocks until it returns."""
        return self._host.run(afn, *args)

    def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the loop's thread."""
        return self._host.run_sync(fn, *args)

    def start_soon(self, afn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Call from the loop: run ``afn`` in the background next to the
        spout's stderr drain, cancelled when the spout closes."""
        self._spout.nursery.start_soon(afn, *args)

    def ensure_started(self) -> None:
        self._host.run(self._spout.ensure_started)

    def command(self, *cmds: Message) -> None:
        self._host.run(self._spout.command, *cmds)

    async def _aclose(self) -> None:
        try:
            if self._before_close is not None:
                await self._before_close()
        finally:
            await self._spout.aclose()

    def close(self) -> None:
        if not self._host.alive:
            return  # the loop already ran its shutdown hooks, ours included
        try:
            self._host.run(self._aclose)
        finally:
            self._host.run_sync(self._forget)

    def _forget(self) -> None:  # in the loop: the hooks list and the nursery are the loop's
        self._host.off_shutdown(self._aclose)
        self._spout.nursery.cancel_scope.cancel()


async def _keeper(*, task_status: trio.TaskStatus[trio.Nursery] = trio.TASK_STATUS_IGNORED) -> None:
    """A nursery in the TrioHost's loop where a spout's stderr drains live
    between the blocking calls (§8.3); cancelled when the spout closes."""
    async with trio.open_nursery() as n:
        task_status.started(n)
        await trio.sleep_forever()


def _jsonable(v: Any) -> bool:
    try:
        dumps(v)
        return True
    except Exception:
        return False


def _an_error(exc: BaseException) -> Exception | None:
    """The first error (not a cancellation) in ``exc`` or the groups it nests."""
    if isinstance(exc, BaseExceptionGroup):
        return next((e for e in map(_an_error, exc.exceptions) if e is not None), None)
    return exc if isinstance(exc, Exception) else None
