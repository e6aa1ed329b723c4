"""Supervision without processes or real time (DESIGN.md style rule 8).

The restart policy is pure and takes the time as an argument. The process
host's rules -- the handshake timeout (spec/PROTOCOL.md §2.4), the subprocess
timeout (§5.2) -- run against an in-memory component (``StreamTransport`` over
``trio.testing`` memory streams) under ``MockClock(autojump_threshold=0)``:
the clock jumps to the next deadline as soon as every task waits, so each
test asserts the exact virtual time a rule fired at and takes no wall time.
The real-process versions of these faults stay in tests/faults.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal

import orjson
import pytest
import trio
import trio.testing

from multilang.connection import Role
from multilang.errors import ComponentCrashed, HeartbeatTimeout
from multilang.framing import FrameReader
from multilang.messages import Activate, Emit, Next
from multilang.shellbolt._model.conf import SCHEMA, ProcessConf
from multilang.shellbolt._host.process import ShellProcess, StreamTransport
from multilang.shellbolt._host.supervisor import GiveUp, Restart, RestartPolicy

T = 8.0  # the subprocess timeout of these tests (§5.2)
HANDSHAKE = 3.0
GRACE = 1.0
PCONF = ProcessConf.from_conf({
    "topology.subprocess.timeout.secs": T,
    "multilang.handshake.timeout.secs": HANDSHAKE,
    "multilang.kill.grace.secs": GRACE,
})


def run(afn):
    return trio.run(afn, clock=trio.testing.MockClock(autojump_threshold=0))


@contextlib.contextmanager
def unwrapped():
    """A nursery's lone error as itself (trio wraps it in an ExceptionGroup)."""
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


# --- ProcessConf ---------------------------------------------------------------------------------


def test_process_conf_defaults_come_from_the_schema():
    pc = ProcessConf.from_conf({})
    assert pc.subprocess_timeout == SCHEMA["supervisor.worker.timeout.secs"].default
    assert pc.handshake_timeout == SCHEMA["multilang.handshake.timeout.secs"].default
    assert pc.kill_grace == SCHEMA["multilang.kill.grace.secs"].default
    assert pc.restart_budget == SCHEMA["multilang.restart.budget"].default
    assert pc.restart_window == SCHEMA["multilang.restart.window.secs"].default
    assert pc.max_frame_bytes == SCHEMA["multilang.max.frame.bytes"].default


def test_process_conf_subprocess_timeout_falls_back_to_the_supervisor_key_and_zero_grace_is_kept():
    pc = ProcessConf.from_conf({"supervisor.worker.timeout.secs": 7, "multilang.kill.grace.secs": 0})
    assert pc.subprocess_timeout == 7.0 and pc.kill_grace == 0.0
    pc = ProcessConf.from_conf({"topology.subprocess.timeout.secs": 2, "supervisor.worker.timeout.secs": 7})
    assert pc.subprocess_timeout == 2.0


# --- RestartPolicy (§8.2) ------------------------------------------------------------------------


def test_backoff_doubles_up_to_five_seconds_then_the_budget_gives_up():
    policy = RestartPolicy(8, 1000.0)
    delays = []
    now = 0.0
    for _ in range(8):
        d = policy.crashed(started=now, now=now + 1)
        assert isinstance(d, Restart)
        delays.append(d.delay)
        now += 1 + d.delay
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert d.count == 8 and d.budget == 8
    assert policy.crashed(started=now, now=now + 1) == GiveUp(count=8, budget=8, window=1000.0)


def test_a_long_life_resets_the_backoff_and_old_restarts_leave_the_window():
    policy = RestartPolicy(2, 60.0)
    assert policy.crashed(started=0, now=1).delay == 0.1
    assert policy.crashed(started=1.1, now=2).delay == 0.2
    assert isinstance(policy.crashed(started=2.2, now=3), GiveUp)  # 3 crashes within 60 s
    policy = RestartPolicy(2, 60.0)
    policy.crashed(started=0, now=1)
    policy.crashed(started=1.1, now=2)
    d = policy.crashed(started=50, now=70)  # lived 20 s; the first two left the window
    assert d == Restart(delay=0.1, count=1, budget=2, window=60.0)


def test_the_budget_is_shared_by_the_policies_of_one_component():
    times = RestartPolicy(1, 60.0).times
    a, b = RestartPolicy(1, 60.0, times=times), RestartPolicy(1, 60.0, times=times)
    assert isinstance(a.crashed(started=0, now=1), Restart)
    assert isinstance(b.crashed(started=0, now=2), GiveUp)  # task b's first crash, the component's second


def test_a_give_up_is_not_counted_as_a_restart_of_the_component():
    """Two tasks of a component with a budget of 2: a's third crash gives
    up; b's next crash gives up too, after the 2 restarts there were (it
    said 3: a's give-up was counted as one)."""
    times = RestartPolicy(2, 60.0).times
    a, b = RestartPolicy(2, 60.0, times=times), RestartPolicy(2, 60.0, times=times)
    assert isinstance(a.crashed(started=0, now=1), Restart)
    assert isinstance(b.crashed(started=0, now=1.1), Restart)
    assert a.crashed(started=1.2, now=2) == GiveUp(count=2, budget=2, window=60.0)
    assert b.crashed(started=1.3, now=2.1) == GiveUp(count=2, budget=2, window=60.0)


def test_processes_that_do_no_work_give_up_however_slowly_they_die():
    # 30 s each (a hang until the subprocess timeout): two fit in the 60 s
    # window, so the window alone would restart them for ever.
    policy = RestartPolicy(5, 60.0)
    now, delays = 0.0, []
    for _ in range(5):
        d = policy.crashed(started=now, now=now + 30, worked=False)
        assert isinstance(d, Restart) and d.count <= 2
        delays.append(d.delay)
        now += 30 + d.delay
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6]  # a long life that did nothing does not reset the backoff
    d = policy.crashed(started=now, now=now + 30, worked=False)
    assert d == GiveUp(count=5, budget=5, window=60.0, in_a_row=True)
    assert d.describe("split") == ("5 restarts in a row of processes that did no work (settled no tuple, "
                                   "answered no next, ack or fail) for component 'split'")


def test_a_process_that_did_work_ends_the_streak():
    policy = RestartPolicy(2, 60.0)
    now = 0.0
    for worked in [False, False, True, False, False, True, False, False]:
        d = policy.crashed(started=now, now=now + 30, worked=worked)
        assert isinstance(d, Restart), (worked, d)
        now += 31
    assert isinstance(policy.crashed(started=now, now=now + 30, worked=False), GiveUp)


def test_zero_budget_gives_up_at_the_first_crash():
    assert RestartPolicy(0, 60.0).crashed(started=0, now=1) == GiveUp(count=0, budget=0, window=60.0)


# --- an in-memory component --------------------------------------------------------------------


class FakeChild:
    """The far side of a StreamTransport: reads the host's frames, writes its own."""

    def __init__(self) -> None:
        stdin_send, self.stdin = trio.testing.memory_stream_one_way_pair()
        self.stdout, stdout_recv = trio.testing.memory_stream_one_way_pair()
        self.stderr, stderr_recv = trio.testing.memory_stream_one_way_pair()
        self.transport = StreamTransport(stdin_send, stdout_recv, stderr_recv)
        self._frames = FrameReader()
        self._pending: list[bytes] = []

    async def spawn(self, argv, cwd, env):
        return self.transport

    async def read(self) -> dict:
        while not self._pending:
            data = await self.stdin.receive_some(1 << 16)
            if not data:  # EOF on stdin: a component exits (§5.4)
                self.transport.exit(0)
                await trio.sleep_forever()
            self._pending.extend(self._frames.feed(data))
        return orjson.loads(self._pending.pop(0))

    async def send(self, obj: dict) -> None:
        await self.stdout.send_all(orjson.dumps(obj) + b"\nend\n")

    async def handshake(self, *, pid_file: bool = True) -> dict:
        hs = await self.read()
        if pid_file:  # §2.3: the file first, then the reply
            open(os.path.join(hs["pidDir"], str(self.transport.pid)), "w").close()
        await self.send({"pid": self.transport.pid})
        return hs

    async def crash(self, status: int, last_words: bytes = b"") -> None:
        if last_words:
            await self.stderr.send_all(last_words)
        await self.stdout.aclose()
        await self.stderr.aclose()
        self.transport.exit(status)


def shell_process(child: FakeChild, tmp_path, role: Role = Role.BOLT) -> ShellProcess:
    return ShellProcess(component="c", task=1, role=role, argv=["fake"], cwd=None, env={},
                        pid_dir=str(tmp_path), conf=PCONF, spawn=child.spawn)


CONTEXT = {"taskid": 1, "componentid": "c", "task->component": {"1": "c"}}


# --- handshake (§2.3, §2.4) ----------------------------------------------------------------------


def test_no_pid_reply_is_a_heartbeat_timeout_at_the_handshake_timeout_and_the_child_is_reaped(tmp_path):
    child = FakeChild()

    async def main():
        proc = shell_process(child, tmp_path)
        t0 = trio.current_time()
        with pytest.raises(HeartbeatTimeout, match=r"no pid reply within the 3s handshake timeout \(§2.4\)") as info, \
                unwrapped():
            async with trio.open_nursery() as n:
                try:
                    await proc.start(n, {}, CONTEXT)
                finally:
                    n.cancel_scope.cancel()
        assert trio.current_time() - t0 == HANDSHAKE
        await proc.aclose()  # stdin closed, grace, SIGTERM: the child ignored EOF
        assert child.transport.signals == [signal.SIGTERM]
        assert trio.current_time() - t0 == HANDSHAKE + GRACE
        return info.value

    err = run(main)
    assert err.component == "c" and err.task == 1


def test_handshake_returns_early_emits_and_warns_once_about_a_missing_pid_file(tmp_path, caplog):
    child = FakeChild()

    async def component():
        hs = await child.handshake(pid_file=False)
        assert hs["pidDir"] == str(tmp_path) and hs["context"] == CONTEXT
        await child.send({"command": "log", "msg": "opened"})

    async def main():
        proc = shell_process(child, tmp_path)
        async with trio.open_nursery() as n:
            n.start_soon(component)
            early = await proc.start(n, {}, CONTEXT)
            # the pid-file check waited its second (§2.3), in short polls
            assert 1.0 <= trio.current_time() < 1.1
            events = early or await proc.read_events()  # the log came with the pid, or just after
            assert [e.msg for e in events] == ["opened"]
            assert proc.pid == child.transport.pid
            await child.crash(0)

    with caplog.at_level(logging.WARNING, "multilang.shellbolt"):
        run(main)
    warnings = [r.getMessage() for r in caplog.records if "pid file" in r.getMessage()]
    assert len(warnings) == 1 and "§2.3" in warnings[0]


def test_a_crash_reports_exit_status_and_the_last_stderr_line_without_sleeping(tmp_path):
    child = FakeChild()

    async def main():
        proc = shell_process(child, tmp_path)
        async with trio.open_nursery() as n:
            n.start_soon(child.handshake)
            await proc.start(n, {}, CONTEXT)
            n.start_soon(child.crash, 3, b"Traceback\nValueError: boom")
            with pytest.raises(ComponentCrashed) as info:
                while True:
                    await proc.read_events()
        await proc.aclose()
        return info.value, trio.current_time()

    err, now = run(main)
    assert "closed its stdout" in str(err) and "(exit status 3)" in str(err)
    assert err.stderr_tail.endswith("ValueError: boom")
    assert now == 0.0  # settled on events (exit, stderr EOF), not on a timer


# --- the subprocess timeout (§5.2) -------------------------------------------------------------------


async def _started(proc: ShellProcess, child: FakeChild, n: trio.Nursery) -> float:
    n.start_soon(child.handshake)
    await proc.start(n, {}, CONTEXT)
    return trio.current_time()


def test_a_silent_bolt_is_killed_exactly_one_timeout_after_its_last_frame(tmp_path):
    child = FakeChild()

    async def main():
        proc = shell_process(child, tmp_path)
        async with trio.open_nursery() as n:
            t0 = await _started(proc, child, n)
            n.start_soon(lambda: reader(proc))

            async def chatter():
                await trio.sleep(0.75 * T)  # part of the scenario: a frame late in the window
                await child.send({"command": "log", "msg": "still here"})

            n.start_soon(chatter)
            with pytest.raises(HeartbeatTimeout, match=r"sent nothing for 8s \(subprocess timeout, §5.2\); killed"):
                await proc.watch(lambda: proc.last_inbound)
            n.cancel_scope.cancel()
        assert trio.current_time() - t0 == 0.75 * T + T  # the read moved the deadline
        assert child.transport.signals == [signal.SIGKILL]
        await proc.aclose()

    run(main)


async def reader(proc: ShellProcess) -> None:
    while True:
        await proc.read_events()


def test_a_reader_blocked_on_downstream_space_is_not_the_childs_fault(tmp_path):
    child = FakeChild()

    async def main():
        proc = shell_process(child, tmp_path)
        blocked = True
        async with trio.open_nursery() as n:
            t0 = await _started(proc, child, n)

            async def unblock():
                nonlocal blocked
                await trio.sleep(5 * T)  # part of the scenario: downstream stays full this long
                blocked = False
                proc.last_inbound = trio.current_time()  # as the shell task does on unblocking

            n.start_soon(unblock)
            with pytest.raises(HeartbeatTimeout):
                await proc.watch(lambda: None if blocked else proc.last_inbound)
            n.cancel_scope.cancel()
        assert trio.current_time() - t0 == 5 * T + T
        await proc.aclose()

    run(main)


def test_an_idle_spout_is_never_timed_out_and_a_command_arms_the_timeout(tmp_path):
    child = FakeChild()

    async def main():
        proc = shell_process(child, tmp_path, Role.SPOUT)
        command_since = None
        async with trio.open_nursery() as n:
            await _started(proc, child, n)

            async def driver():
                nonlocal command_since
                await trio.sleep(100 * T)  # idle for a long time: nothing is due (§5.2)
                command_since = trio.current_time()
                await proc.write(proc.conn.send(Activate()))  # §4.1: the first command

            n.start_soon(driver)
            with pytest.raises(HeartbeatTimeout):
                await proc.watch(lambda: command_since)
            n.cancel_scope.cancel()
        assert trio.current_time() - command_since == T
        await proc.aclose()

    run(main)


# --- the one spout driver (§4.2, §4.4) ------------------------------------------------------------------


def test_the_spout_driver_returns_at_the_sync_and_hands_on_what_comes_before_and_after_it(tmp_path):
    from multilang.shellbolt import SpoutDriver

    child = FakeChild()
    got: list = []

    async def spout(child: FakeChild) -> None:
        await child.read()  # activate
        await child.send({"command": "sync"})
        await child.read()  # next
        await child.send({"command": "emit", "tuple": ["a"], "id": 1})
        await child.send({"command": "sync"})
        await trio.sleep(T / 2)
        await child.send({"command": "emit", "tuple": ["idle"], "id": 2})  # between commands (§4.4)
        await child.read()  # next: dies without its sync
        await child.crash(1, b"gone\n")

    async def main():
        proc = shell_process(child, tmp_path, Role.SPOUT)
        async with trio.open_nursery() as n:
            await _started(proc, child, n)
            n.start_soon(spout, child)

            async def handle(events):
                got.append([(type(e).__name__, getattr(e, "values", None)) for e in events])

            driver = SpoutDriver(proc, handle)
            served = trio.Event()

            async def serve():
                with pytest.raises(ComponentCrashed):
                    await driver.serve()
                served.set()

            n.start_soon(serve)
            assert driver.due() is None
            await driver.command(Activate())
            assert got == [] and not driver.worked and driver.due() is None
            await driver.command(Next())
            assert [e for chunk in got for e in chunk] == [("Emit", ["a"])] and driver.worked
            await trio.sleep(T)  # idle: nothing is due, and the idle emit is handed on
            assert [e for chunk in got for e in chunk][-1] == ("Emit", ["idle"])
            with pytest.raises(ComponentCrashed, match="gone"):
                await driver.command(Next())
            await served.wait()
            with pytest.raises(ComponentCrashed):  # lost: every later command says so at once
                await driver.command(Next())
        await proc.aclose()

    run(main)


# --- restart, backoff and give-up (§8.2), through the Spark source's spout host ----------------------
#
# The source drives its spout through the same ShellProcess and RestartPolicy
# as the runtime; its host takes a Spawn, so a crash loop runs in virtual time.


class Spawner:
    """Each spawn is a new FakeChild running the next script in ``nursery``."""

    def __init__(self, nursery: trio.Nursery, *scripts) -> None:
        self.nursery = nursery
        self.scripts = list(scripts)
        self.times: list[float] = []
        self.children: list[FakeChild] = []

    async def __call__(self, argv, cwd, env):
        child = FakeChild()
        child.transport.pid = 100 + len(self.children)
        self.children.append(child)
        self.times.append(trio.current_time())
        self.nursery.start_soon(self.scripts.pop(0), child)
        return child.transport


async def crashes_on_activate(child: FakeChild) -> None:
    await child.handshake()
    assert (await child.read())["command"] == "activate"
    await child.crash(1, b"boom\n")


async def healthy(child: FakeChild) -> None:
    await child.handshake()
    while True:
        cmd = await child.read()
        if isinstance(cmd, list):  # the task ids of its emit (§4.3)
            continue
        if cmd["command"] == "next":
            await child.send({"command": "emit", "tuple": ["x"], "id": 1})
        await child.send({"command": "sync"})


async def hangs_on_next(child: FakeChild) -> None:
    await child.handshake()
    while (await child.read())["command"] != "next":
        await child.send({"command": "sync"})
    await trio.sleep_forever()


def spout_host(nursery, spawn, events, **conf):
    from types import SimpleNamespace

    from multilang.adapters.spark._source.spout_host import SpoutHost

    opts = SimpleNamespace(argv=["fake"], env={}, cwd=None, archive=None, component="s", stream="default",
                           max_pending=None, task_id=1, task_ids=[1], consumer_task=2,
                           conf={"topology.subprocess.timeout.secs": T, "multilang.kill.grace.secs": GRACE, **conf})
    return SpoutHost(opts, ["word"], events.extend, nursery, spawn=spawn)


def test_a_crashing_spout_is_restarted_after_a_doubling_backoff(caplog):
    async def main():
        events: list = []
        async with trio.open_nursery() as n:
            spawn = Spawner(n, crashes_on_activate, crashes_on_activate, healthy)
            host = spout_host(n, spawn, events)
            await host.command(Next())
            assert [type(e) for e in events] == [Emit] and host.restarts == 2
            await host.aclose()
            n.cancel_scope.cancel()
        # crash at 0, restart 0.1 s later, crash, restart 0.2 s after that;
        # each crash reaps at once (the child exited).
        assert spawn.times == [0.0, pytest.approx(0.1), pytest.approx(0.3)]

    with caplog.at_level(logging.ERROR, "multilang.spark.source"):
        run(main)
    msgs = [r.getMessage() for r in caplog.records if "restarting in" in r.getMessage()]
    assert len(msgs) == 2 and "restarting in 0.1s (restart 1 of 5" in msgs[0] and "restarting in 0.2s" in msgs[1]
    assert "boom" in msgs[0] and "(exit status 1)" in msgs[0]  # the stderr tail and status made it in


def test_an_error_of_the_sources_event_handler_reaches_the_command_not_the_loop():
    class Refusing(list):
        def extend(self, events):
            if any(type(e) is Emit for e in events):
                raise ValueError("the source could not take a row")
            super().extend(events)

    async def main():
        async with trio.open_nursery() as n:  # the loop: an error escaping into it would fail here, not below
            spawn = Spawner(n, healthy)
            host = spout_host(n, spawn, [])
            host.on_events = Refusing().extend
            with pytest.raises(ValueError, match="could not take a row"):
                await host.command(Next())
            await host.aclose()  # reaped all the same
            assert spawn.children[0].transport.returncode is not None
            n.cancel_scope.cancel()

    run(main)


def test_a_spout_that_keeps_crashing_is_given_up_after_its_budget():
    async def main():
        async with trio.open_nursery() as n:
            spawn = Spawner(n, *[crashes_on_activate] * 3)
            host = spout_host(n, spawn, [], **{"multilang.restart.budget": 2})
            with pytest.raises(ComponentCrashed, match="closed its stdout"):
                await host.ensure_started()
            n.cancel_scope.cancel()
        assert len(spawn.times) == 3 and spawn.times[-1] == pytest.approx(0.3)

    run(main)


def test_a_spout_silent_after_a_command_is_killed_at_the_subprocess_timeout_and_replaced(caplog):
    async def main():
        async with trio.open_nursery() as n:
            spawn = Spawner(n, hangs_on_next, healthy)
            host = spout_host(n, spawn, [])
            await host.ensure_started()
            t0 = trio.current_time()
            await trio.sleep(10 * T)  # idle between commands: no timeout runs (§5.2)
            assert host.restarts == 0
            await host.command(Next())  # hangs; killed after T; replaced; `next` is not resent
            assert host.restarts == 1
            assert spawn.children[0].transport.signals[0] == signal.SIGKILL
            assert spawn.times[1] - t0 == pytest.approx(10 * T + T + 0.1)  # the timeout, then the backoff
            await host.aclose()
            n.cancel_scope.cancel()

    with caplog.at_level(logging.ERROR, "multilang.spark.source"):
        run(main)
    (msg,) = [r.getMessage() for r in caplog.records if "restarting in" in r.getMessage()]
    assert "subprocess timeout, §5.2" in msg


def test_a_spout_without_a_pid_reply_is_replaced_after_the_handshake_timeout():
    async def silent(child: FakeChild) -> None:
        await trio.sleep_forever()

    async def main():
        async with trio.open_nursery() as n:
            spawn = Spawner(n, silent, healthy)
            host = spout_host(n, spawn, [], **{"multilang.handshake.timeout.secs": HANDSHAKE})
            await host.ensure_started()
            assert host.restarts == 1
            # §2.4 timeout, then stdin closed + grace, SIGTERM (the child ignores EOF), then the backoff
            assert spawn.times[1] == pytest.approx(HANDSHAKE + GRACE + 0.1)
            assert spawn.children[0].transport.signals == [signal.SIGTERM]
            await host.aclose()
            n.cancel_scope.cancel()

    run(main)
