"""How runs end (issue 18): a timed stop drains, then calls what is left
"abandoned at stop" (not a failure); no ack owed to a spout is lost at the
stop; each process start has a fresh pid directory; the restart budget is
per component, as documented."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter

import pytest

import trio

from faults_support import ML, ROOT, build, faulty_bolt, numbered_spout, run_topology, task_ids, toml_str
from multilang.shellbolt import TopologyBuilder
from multilang.testing import assert_no_orphans, wait_until


def test_timed_stop_with_trees_in_flight_exits_0_and_calls_them_abandoned(tmp_path):
    spout = numbered_spout(100_000, events=False)
    topo = tmp_path / "slow.toml"
    topo.write_text(
        '[topology.conf]\n"multilang.shutdown.grace.secs" = 0.2\n"topology.max.spout.pending" = 50\n'
        f'[spouts.spout]\ncommand = {toml_str(spout.command)}\nfields = ["n"]\n'
        f'[bolts.bolt]\ncommand = {toml_str(faulty_bolt(sleep=0.05).command)}\nfields = ["n"]\n'
        'inputs = [{ source = "spout" }]\n'
    )
    proc = subprocess.run(ML + ["run", str(topo), "--duration", "4", "--no-progress", "-o", os.devnull],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("[summary]") and "trees completed" in x)
    abandoned = int(line.split("abandoned at stop ")[1])
    assert abandoned > 0, line


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_bolt_blocked_writing_when_the_run_stops_exits_without_waiting_out_its_grace(tmp_path, workers):
    """A bolt writes more than the host takes (each input emitted 2,000
    times, to a slow bolt: the host waits for room downstream and stops
    reading it, and its stdout pipe fills) when the run stops. Its stdin is
    closed and what it still writes is read and dropped, so it reads the EOF
    and exits. Before, it stayed blocked in its write for the whole kill
    grace (120 s here) before its SIGTERM: a trial's stop on host workers
    took the default 2 s more, 2 runs in 7."""
    spout = numbered_spout(100_000, events=False)
    topo = tmp_path / "burst.toml"
    topo.write_text(
        '[topology.conf]\n"multilang.shutdown.grace.secs" = 0\n"multilang.kill.grace.secs" = 120\n'
        '"topology.max.spout.pending" = 50\n'
        f'[spouts.spout]\ncommand = {toml_str(spout.command)}\nfields = ["n"]\n'
        f'[bolts.burst]\ncommand = {toml_str(faulty_bolt(copies=2000).command)}\nfields = ["n"]\n'
        'inputs = [{ source = "spout" }]\n'
        f'[bolts.slow]\ncommand = {toml_str(faulty_bolt(sleep=0.002).command)}\nfields = ["n"]\n'
        'inputs = [{ source = "burst" }]\n'
    )
    t0 = time.monotonic()
    proc = subprocess.run(ML + ["run", str(topo), "--duration", "2", "--no-progress", "--workers", workers, "-o",
                                os.devnull], capture_output=True, text=True, cwd=ROOT, timeout=300)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[summary]   slow: emitted" in proc.stderr, proc.stderr[-3000:]
    # Not a timed assert of speed: the kill grace alone would take 120 s.
    assert took < 60, f"the run took {took:.0f}s: the blocked bolt waited out its kill grace"


def test_a_timed_stop_delivers_every_ack_owed_to_the_spout():
    n = 100_000
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(n, per_next=20))
    b.set_bolt("bolt", faulty_bolt()).shuffle_grouping("spout")
    # A grace that a busy machine cannot run out of: what is checked is that every ack owed is delivered.
    topo = build(b, **{"topology.max.spout.pending": 500, "multilang.shutdown.grace.secs": 30})
    run = run_topology(topo, duration=2, limit=120)
    res = run.result
    assert res.ok and res.stopped_by == "duration"
    # Every tree that completed was acked to the spout, which said so on its
    # events stream before the processes were closed.
    assert res.completed > 0 and len(run.acked_ids()) == res.completed == res.stats["spout"].acked
    reliable = res.stats["spout"].emitted - len(run.events())  # the events stream is unreliable
    assert res.completed + res.pending == reliable


def test_a_stop_waits_for_the_next_a_spout_is_answering_and_delivers_its_emits(tmp_path):
    # The stop comes while the spout sleeps in a `next` (every tree before it
    # done): §5.4, the spout is deactivated (after that next's sync) and what
    # it emitted is delivered within the grace, not abandoned.
    marker = tmp_path / "slow.once"
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(1000, events=False, fault="slow_next:1", after=5, once=marker))
    b.set_bolt("bolt", faulty_bolt()).shuffle_grouping("spout")

    async def stop_during_next(rt):
        await wait_until(marker.exists, timeout=60)
        rt.request_stop("test")

    run = run_topology(build(b, **{"multilang.shutdown.grace.secs": 20, "topology.max.spout.pending": 1}),
                       during=stop_during_next, limit=120)
    res = run.result
    assert res.ok and res.pending == 0, f"abandoned at stop {res.pending}"
    assert res.stats["spout"].emitted == res.stats["spout"].acked == res.stats["bolt"].acked == 6, res.stats


def test_each_process_start_gets_a_fresh_private_pid_directory():
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(3000, per_next=10))
    b.set_bolt("bolt", faulty_bolt(sleep=0.0005)).shuffle_grouping("spout")
    topo = build(b)
    dirs = []

    async def kill_once(rt):
        (tid,) = task_ids(rt, "bolt")
        task = rt.tasks[tid]
        await wait_until(lambda: task.proc is not None and task.proc.pid is not None and rt.stats["bolt"].acked > 50)
        first = task.proc
        dirs.append((first.pid_dir, os.stat(first.pid_dir).st_mode & 0o777, os.listdir(first.pid_dir)))
        os.kill(first.proc.pid, signal.SIGKILL)
        await wait_until(lambda: task.proc is not None and task.proc is not first and task.proc.pid is not None)
        dirs.append((task.proc.pid_dir, os.stat(task.proc.pid_dir).st_mode & 0o777, os.listdir(task.proc.pid_dir)))
        dirs.append(os.path.exists(first.pid_dir))

    run = run_topology(topo, during=kill_once)
    (d1, mode1, files1), (d2, mode2, files2), first_still_there = dirs
    assert d1 != d2 and os.path.dirname(d1) == os.path.dirname(d2)
    assert mode1 == mode2 == 0o700
    assert files1 and files2 and files1 != files2, "each process wrote its own pid file there"
    assert not first_still_there, "the dead process's directory was removed after it was reaped"
    assert run.result.ok
    assert_no_orphans(run)


def test_the_restart_budget_is_counted_per_component_not_per_task():
    # Every process of a 3-task bolt dies on its first tuple. With a budget of
    # 2 per component, the third death (whichever task) gives up: exactly 2
    # restarts in all. Per task it would have allowed up to 6.
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(100_000, events=False))
    b.set_bolt("bolt", faulty_bolt(fault="exit:3"), parallelism=3).shuffle_grouping("spout")
    topo = build(b, **{"multilang.restart.budget": 2})
    run = run_topology(topo)
    res = run.result
    assert not res.ok and len(res.gave_up) == 1
    assert res.stats["bolt"].restarts == 2
    assert_no_orphans(run)


def test_max_tuples_still_replays_a_failed_tree_of_a_host_spout():
    from multilang.shellbolt import PythonBolt, PythonSpout

    seen: list[int] = []

    def flaky(values):
        seen.append(values[0])
        if values[0] == 3 and seen.count(3) == 1:
            raise ValueError("first try of 3 fails")
        return [values]

    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout([[i] for i in range(50)], fields=["n"]))
    b.set_bolt("bolt", PythonBolt(flaky, fields=["n"])).shuffle_grouping("spout")
    run = run_topology(build(b), max_tuples=10)
    res = run.result
    assert res.ok and res.pending == 0
    assert sorted(set(seen)) == list(range(10)) and seen.count(3) == 2, "3 was replayed past the limit"
    assert sorted(r["n"] for r in run.records("bolt")) == list(range(10))
