"""Edges of the host's checkpoint semantics for stateful bolts (spec/PROTOCOL.md
§9.7, docs/STATE.md, shellbolt/_runtime/checkpoint.py), checked as a user would check
them: real bolt processes, a reliable spout of numbered tuples, and at the
end the state in the store (and the output view) compared with a plain count
of the input: every spout tuple counted once, whatever failed on the way.

The stateful bolt is tests/faults/components/stateful_bolt.py (the library's
StatefulBolt): it maps spout value n to the word WORDS[n % 13] and counts
words; with several tasks the input is grouped by n, so a word's count is
spread over tasks and the per-task counts must *sum* to the plain count.
stateful_relay.py is a stateless relay after it that fails or holds one
tuple on request. The spout of most tests is the host's in-process spout,
gated where a test must act mid-run (``spout``, ``Gate``); the last three
tests use shell spouts whose emits land while a prepare is out, or a
rollback while a prepare is unanswered: host bugs found here and fixed in
19b4e89, kept as regression tests.

Every test synchronises on runtime counters (wait_until) or on a gated
input (``Gate``), never on sleeps.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import sqlite3
import subprocess
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio

from faults_support import (
    COMPONENTS,
    EXAMPLES,
    FAST_CONF,
    ML,
    ROOT,
    error_logs,
    faulty_bolt,
    numbered_spout,
    run_topology,
    task_ids,
    toml_str,
)
from multilang.shellbolt import PythonSpout, ShellBolt, ShellSpout, TopologyBuilder
from multilang.shellbolt._runtime.state_store import MemoryStore
from multilang.testing import current_pid
from multilang.shellbolt._model.topology import OutputSpec
from multilang.testing import wait_until

STATEFUL = COMPONENTS / "stateful_bolt.py"
RELAY = COMPONENTS / "stateful_relay.py"
SLOW_SPOUT = COMPONENTS / "stateful_spout.py"
WORDS = ["alice", "anna", "bob", "bill", "carol", "cat", "dave", "dog", "eve", "emma", "frank", "gus", "hatter"]
COUNT_FIELDS = ["key", "count", "letter"]


# --- building ------------------------------------------------------------------------------


def spout(n: int | None = None) -> PythonSpout:
    """A reliable spout of [0], [1], ... [n-1] (endless without n), message
    id = the number: the host's in-process spout, fast and deterministic. (A
    shell spout's `next` may still be out when a checkpoint starts; the last
    tests of this file are about that.)"""
    if n is None:
        return PythonSpout(lambda: ([i] for i in itertools.count()), fields=["n"])
    return PythonSpout([[i] for i in range(n)], fields=["n"])


class Gate:
    """The source of a :class:`PythonSpout` of [0] .. [n-1] that stops at a
    gate until the test opens it further (:meth:`open_to`): an open-ended
    source (``open``, ``resume``), so the run cannot end before the test has
    done its part, whatever the speed of the machine."""

    def __init__(self, n: int, first: int) -> None:
        self.n, self.limit, self.next = n, first, 0
        self.open = True

    def __iter__(self) -> "Gate":
        return self

    def __next__(self) -> list[int]:
        if self.next >= min(self.n, self.limit):
            self.open = self.next < self.n
            raise StopIteration
        self.next += 1
        return [self.next - 1]

    def open_to(self, rt, limit: int) -> None:
        self.limit = limit
        self.open = True
        for tid in task_ids(rt, "spout"):
            rt.tasks[tid].resume()


def gated_spout(n: int, first: int) -> tuple[PythonSpout, Gate]:
    gate = Gate(n, first)
    return PythonSpout(gate, fields=["n"]), gate


def stateful_bolt(*args: str, fields: list[str] = COUNT_FIELDS) -> ShellBolt:
    return ShellBolt(["python", str(STATEFUL), *args], fields=list(fields))


def relay(*args: str, fields: list[str] = COUNT_FIELDS) -> ShellBolt:
    return ShellBolt(["python", str(RELAY), *args], fields=list(fields))


def build(b: TopologyBuilder, tmp_path: Path, *, output: tuple[str, list[str]] | None = None, **conf: Any):
    """The topology with a sqlite store in tmp_path/state (kept after the run:
    the test reads it), checkpoints every 100 ms, at most 50 trees per spout
    task, and ``conf``."""
    full = {
        **FAST_CONF,
        "topology.state.checkpoint.interval.ms": 100,
        "topology.max.spout.pending": 50,
        "topology.state.provider.config": {"dir": str(tmp_path / "state")},
        **conf,
    }
    spec = OutputSpec(component=output[0], key=output[1]) if output else None
    return b.create_topology(full, resource_dir=EXAMPLES, output=spec)


def expected_counts(ids) -> dict[str, int]:
    return dict(Counter(WORDS[i % len(WORDS)] for i in ids))


# --- the store -------------------------------------------------------------------------------


def _db(tmp_path: Path) -> sqlite3.Connection:
    path = tmp_path / "state" / "topology.sqlite"
    assert path.exists(), f"no state store at {path}"
    return sqlite3.connect(path)


def stored_by_task(tmp_path: Path, component: str) -> dict[int, dict[str, Any]]:
    """The committed state of each task of ``component``, as the store holds it."""
    con = _db(tmp_path)
    try:
        out: dict[int, dict[str, Any]] = {}
        for task, key, value in con.execute("SELECT task, key, value FROM kv WHERE component = ?", (component,)):
            out.setdefault(task, {})[key] = json.loads(value)
        return out
    finally:
        con.close()


def stored_total(tmp_path: Path, component: str, skip: tuple[str, ...] = ()) -> dict[str, int]:
    """The committed state of ``component`` summed over its tasks."""
    total: Counter[str] = Counter()
    for state in stored_by_task(tmp_path, component).values():
        total.update({k: v for k, v in state.items() if k not in skip})
    return dict(total)


def stored_completed(tmp_path: Path, spout: str = "spout") -> list[Any]:
    """The spout message ids the store says its checkpoints cover."""
    con = _db(tmp_path)
    try:
        return sorted(json.loads(m) for (m,) in con.execute("SELECT msg_id FROM completed WHERE spout = ?", (spout,)))
    finally:
        con.close()


def stored_txid(tmp_path: Path) -> int | None:
    con = _db(tmp_path)
    try:
        row = con.execute("SELECT value FROM meta WHERE key = 'txid'").fetchone()
        return int(row[0]) if row else None
    finally:
        con.close()


# --- checks --------------------------------------------------------------------------------------


def assert_done_exactly(run, tmp_path: Path, n: int, *, component: str = "count", skip: tuple[str, ...] = ()) -> None:
    """The run ended by itself, every spout tuple's tree completed once, and
    the committed state counts every spout tuple once."""
    res = run.result
    assert res.ok and res.stopped_by == "done", res
    assert res.pending == 0, f"{res.pending} trees still pending"
    assert res.stats["spout"].acked == n, f"spout acks: {res.stats['spout'].acked} of {n}"
    assert stored_total(tmp_path, component, skip) == expected_counts(range(n))
    assert stored_completed(tmp_path) == list(range(n))
    assert stored_txid(tmp_path) == res.state_txid


def view(run) -> dict[str, Any]:
    return {r["key"]: r["count"] for r in run.result.outputs}


# --- kills ---------------------------------------------------------------------------------------


async def kill_task(rt, task_id: int, *, timeout: float = 10) -> int:
    """SIGKILL the process of one task, with tuples in flight there if that
    can be caught (freeze it, look, kill), else as it is. Returns the pid."""
    task = rt.tasks[task_id]
    with trio.fail_after(timeout):
        for _ in range(200):
            proc = task.proc
            if proc is not None and proc.proc is not None and proc.pid is not None and task.in_flight:
                pid = proc.proc.pid
                os.kill(pid, signal.SIGSTOP)
                await trio.sleep(0.02)
                if task.in_flight and task.proc is proc:
                    os.kill(pid, signal.SIGKILL)
                    return pid
                os.kill(pid, signal.SIGCONT)
            await trio.sleep(0.002)
        await wait_until(lambda: current_pid(rt, task_id) is not None)
        pid = current_pid(rt, task_id)
        os.kill(pid, signal.SIGKILL)
        return pid


# --- 1. the stateful bolt fails tuples --------------------------------------------------------------


def test_tuples_failed_by_the_stateful_bolt_itself_are_rolled_back_and_counted_once(tmp_path):
    # every 37th value is put into the state, then failed, the first time it is seen
    n = 300
    fails = tmp_path / "fails"
    fails.mkdir()
    b = TopologyBuilder()
    b.set_spout("spout", spout(n))
    b.set_bolt("count", stateful_bolt("--fail-dir", str(fails), "--fail-mod", "37"), parallelism=2) \
        .fields_grouping("spout", ["n"])
    run = run_topology(build(b, tmp_path), limit=120)
    res = run.result
    assert len(os.listdir(fails)) == len(range(0, n, 37)), "each marked value failed once"
    assert res.stats["count"].failed >= len(range(0, n, 37)) and res.rollbacks >= 1, res
    assert_done_exactly(run, tmp_path, n)


# --- 2. a downstream stateless bolt fails a tuple ------------------------------------------------------


def test_a_tuple_failed_downstream_rolls_the_state_back(tmp_path):
    n = 300
    b = TopologyBuilder()
    b.set_spout("spout", spout(n))
    b.set_bolt("count", stateful_bolt()).shuffle_grouping("spout")
    b.set_bolt("relay", relay("--fault", "fail", "--after", "120", "--once", str(tmp_path / "fail.once"))) \
        .shuffle_grouping("count")
    run = run_topology(build(b, tmp_path, output=("relay", ["key"])), limit=120)
    res = run.result
    assert (tmp_path / "fail.once").exists() and res.stats["relay"].failed == 1
    assert res.rollbacks >= 1, res
    assert_done_exactly(run, tmp_path, n)
    assert view(run) == expected_counts(range(n)), "the output view (last count per word)"


# --- 3. a tree times out ---------------------------------------------------------------------------------


def test_a_tree_that_times_out_downstream_rolls_the_state_back(tmp_path):
    n = 300
    b = TopologyBuilder()
    b.set_spout("spout", spout(n))
    b.set_bolt("count", stateful_bolt()).shuffle_grouping("spout")
    b.set_bolt("relay", relay("--fault", "hold", "--after", "120", "--once", str(tmp_path / "hold.once"))) \
        .shuffle_grouping("count")
    run = run_topology(build(b, tmp_path, output=("relay", ["key"]), **{"topology.message.timeout.secs": 2}),
                       limit=120)
    res = run.result
    assert (tmp_path / "hold.once").exists()
    assert res.timed_out >= 1 and res.rollbacks >= 1, res
    assert_done_exactly(run, tmp_path, n)
    assert view(run) == expected_counts(range(n))


# --- 4. ticks ---------------------------------------------------------------------------------------------


def test_ticks_to_a_stateful_bolt_do_not_keep_the_run_from_ending(tmp_path):
    # ticks change the state too (key "ticks": at most once, not compared)
    n = 600
    b = TopologyBuilder()
    source, gate = gated_spout(n, first=n // 2)
    b.set_spout("spout", source)
    b.set_bolt("count", stateful_bolt("--ticks"), parallelism=2,
               conf={"topology.tick.tuple.freq.secs": 0.05}).fields_grouping("spout", ["n"])
    topo = build(b, tmp_path)

    async def ticks_mid_run(rt):  # a few ticks reach the bolts with half the input in, then the rest comes
        await wait_until(lambda: rt.stats["count"].executed - rt.stats["spout"].emitted >= 6, timeout=100)
        gate.open_to(rt, n)

    run = run_topology(topo, during=ticks_mid_run, limit=120)
    assert run.result.stats["count"].executed - run.result.stats["spout"].emitted >= 6
    assert any(state.get("ticks") for state in stored_by_task(tmp_path, "count").values()), "ticks were checkpointed"
    assert_done_exactly(run, tmp_path, n, skip=("ticks",))


# --- 5. two stateful components in series ------------------------------------------------------------------


def test_two_stateful_components_in_series_with_a_killed_second_one(tmp_path):
    # count (2 tasks, by n) -> letters (2 tasks, by first letter): letters sums
    # the running counts it gets, so its state depends on every count emitted
    n = 600
    b = TopologyBuilder()
    source, gate = gated_spout(n, first=n // 2)
    b.set_spout("spout", source)
    b.set_bolt("count", stateful_bolt(), parallelism=2).fields_grouping("spout", ["n"])
    b.set_bolt("letters", stateful_bolt("--mode", "letters", fields=["key", "count"]), parallelism=2) \
        .fields_grouping("count", ["letter"])
    topo = build(b, tmp_path, output=("letters", ["key"]))
    killed: list[int] = []

    async def killer(rt):
        await wait_until(lambda: rt.checkpoints.committed >= 2 and rt.stats["spout"].acked >= n // 4, timeout=100)
        killed.append(await kill_task(rt, task_ids(rt, "letters")[0]))
        gate.open_to(rt, n)

    run = run_topology(topo, during=killer, limit=120)
    res = run.result
    assert killed and res.stats["letters"].restarts == 1 and res.rollbacks >= 1, res
    assert_done_exactly(run, tmp_path, n)
    # letters' state: per letter, the sum of 1..c over each (count task, word) with that letter
    want: Counter[str] = Counter()
    for state in stored_by_task(tmp_path, "count").values():
        for word, c in state.items():
            want[word[0]] += c * (c + 1) // 2
    assert stored_total(tmp_path, "letters") == dict(want)
    assert view(run) == dict(want), "the output view of the second stateful component"


# --- 6. hold mode on the stateful bolt -----------------------------------------------------------------------


def test_hold_emits_until_ack_on_the_stateful_bolt_with_a_kill(tmp_path):
    n = 600
    b = TopologyBuilder()
    source, gate = gated_spout(n, first=n // 2)
    b.set_spout("spout", source)
    b.set_bolt("count", stateful_bolt(), conf={"multilang.hold.emits.until.ack": True}).shuffle_grouping("spout")
    b.set_bolt("relay", relay()).shuffle_grouping("count")
    topo = build(b, tmp_path, output=("relay", ["key"]))
    killed: list[int] = []

    async def killer(rt):
        await wait_until(lambda: rt.checkpoints.committed >= 2 and rt.stats["spout"].acked >= n // 4, timeout=100)
        killed.append(await kill_task(rt, task_ids(rt, "count")[0]))
        gate.open_to(rt, n)

    run = run_topology(topo, during=killer, limit=120)
    res = run.result
    assert killed and res.stats["count"].restarts == 1 and res.rollbacks >= 1, res
    assert_done_exactly(run, tmp_path, n)
    assert view(run) == expected_counts(range(n))


# --- 7. three tasks, each killed in turn ---------------------------------------------------------------------


def test_each_of_three_stateful_tasks_killed_in_turn(tmp_path):
    n = 800
    b = TopologyBuilder()
    source, gate = gated_spout(n, first=n // 4)
    b.set_spout("spout", source)
    b.set_bolt("count", stateful_bolt(), parallelism=3).fields_grouping("spout", ["n"])
    topo = build(b, tmp_path)
    killed: dict[int, int] = {}

    async def killer(rt):
        for i, tid in enumerate(task_ids(rt, "count")):
            # a quarter of the input more, two commits since the last kill, then a kill
            done, commits = i * n // 4, rt.checkpoints.committed
            await wait_until(lambda: rt.checkpoints.committed >= commits + 2
                             and rt.stats["spout"].acked >= done + n // 8, timeout=20)
            killed[tid] = await kill_task(rt, tid)
            gate.open_to(rt, (i + 2) * n // 4)

    run = run_topology(topo, during=killer, limit=120)
    res = run.result
    assert len(killed) == 3 and res.stats["count"].restarts == 3 and res.rollbacks >= 3, res
    for tid, pid in killed.items():
        assert run.task_pids[tid][0] == pid and len(run.task_pids[tid]) == 2, run.task_pids
    assert_done_exactly(run, tmp_path, n)
    assert sorted(stored_by_task(tmp_path, "count")) == [0, 1, 2]


# --- 8. the memory provider ------------------------------------------------------------------------------------


def test_the_memory_provider_gives_a_killed_process_its_state_back(tmp_path):
    n = 600
    b = TopologyBuilder()
    source, gate = gated_spout(n, first=n // 2)
    b.set_spout("spout", source)
    b.set_bolt("count", stateful_bolt()).shuffle_grouping("spout")
    topo = build(b, tmp_path, output=("count", ["key"]), **{"topology.state.provider": "memory",
                                                             "topology.state.provider.config": None})
    killed: list[int] = []

    async def killer(rt):
        await wait_until(lambda: rt.checkpoints.committed >= 2 and rt.stats["spout"].acked >= n // 4, timeout=100)
        killed.append(await kill_task(rt, task_ids(rt, "count")[0]))
        gate.open_to(rt, n)

    run = run_topology(topo, during=killer, limit=120)
    res = run.result
    assert killed and res.stats["count"].restarts == 1 and res.rollbacks >= 1, res
    assert res.ok and res.stopped_by == "done" and res.pending == 0 and res.stats["spout"].acked == n, res
    assert res.state_path is None and not (tmp_path / "state").exists()
    assert run.runtime.checkpoints.store.load("count", 0) == expected_counts(range(n))
    assert view(run) == expected_counts(range(n))


# --- 9. runs stopped by max_tuples and by duration --------------------------------------------------------------


def test_a_run_stopped_by_max_tuples_commits_its_last_checkpoint(tmp_path):
    b = TopologyBuilder()
    b.set_spout("spout", spout())
    b.set_bolt("count", stateful_bolt(), parallelism=2).fields_grouping("spout", ["n"])
    # a long interval: the end of the input, not the timer, must bring the last checkpoint
    run = run_topology(build(b, tmp_path, **{"topology.state.checkpoint.interval.ms": 60_000}), max_tuples=150,
                       limit=120)
    res = run.result
    assert res.ok and res.stopped_by == "max_tuples" and res.pending == 0, res
    assert res.stats["spout"].acked == 150
    assert stored_completed(tmp_path) == list(range(150))
    assert stored_total(tmp_path, "count") == expected_counts(range(150))
    assert stored_txid(tmp_path) == res.state_txid >= 1


@pytest.mark.parametrize("kind", ["in-process spout", "shell spout, no max spout pending"])
def test_a_run_stopped_by_duration_commits_its_last_checkpoint_within_the_grace(tmp_path, kind):
    b = TopologyBuilder()
    if kind == "in-process spout":
        b.set_spout("spout", spout())
        conf = {}
    else:  # the defaults a user starts from: no max spout pending; the spout's last `next` may be out at the stop
        b.set_spout("spout", numbered_spout(1_000_000, events=False, per_next=5))
        conf = {"topology.max.spout.pending": None}
    b.set_bolt("count", stateful_bolt(), parallelism=2).fields_grouping("spout", ["n"])
    topo = build(b, tmp_path, **{"topology.state.checkpoint.interval.ms": 60_000, **conf})
    # the duration ends mid-stream (a long checkpoint interval: only the stop brings the commit)
    run = run_topology(topo, duration=3, limit=120)  # (the duration's clock starts before the processes do)
    res = run.result
    acked = res.stats["spout"].acked
    assert res.ok and res.stopped_by == "duration", res
    assert res.pending == 0, f"{res.pending} trees abandoned: the last checkpoint did not commit within the grace"
    assert acked > 0 and res.stats["spout"].emitted == acked
    assert stored_completed(tmp_path) == list(range(acked))
    assert stored_total(tmp_path, "count") == expected_counts(range(acked))


def test_a_stop_while_a_checkpoint_waits_for_its_prepare_takes_one_checkpoint_at_a_time(tmp_path):
    # The stop comes while the periodic checkpoint's prepare is out (the bolt
    # answers its first prepare 1 s late): the stop's final checkpoint waits
    # for that one instead of sending a second prepare beside it ("state
    # commit 3, but the last answered prepare is 4", issue 32).
    slow = tmp_path / "slow.once"
    b = TopologyBuilder()
    b.set_spout("spout", spout())
    b.set_bolt("count", stateful_bolt("--slow-prepare", str(slow), "--slow-secs", "1"), parallelism=2) \
        .fields_grouping("spout", ["n"])

    async def stop_during_prepare(rt):
        await wait_until(slow.exists, timeout=100)
        rt.request_stop("test")

    # Acking off: no tree keeps the drain waiting, so the final checkpoint
    # starts at once, while the periodic one still waits for its answers.
    topo = build(b, tmp_path, **{"topology.acker.executors": 0, "multilang.shutdown.grace.secs": 20})
    run = run_topology(topo, during=stop_during_prepare, limit=120)
    res = run.result
    assert res.ok and not res.gave_up, res
    emitted = res.stats["spout"].emitted
    assert emitted > 0 and res.stats["count"].executed == emitted
    assert stored_total(tmp_path, "count") == expected_counts(range(emitted)), "the stop's checkpoint has every count"


def test_a_cycle_that_never_lets_its_trees_complete_ends_a_run_to_the_end_and_is_named(tmp_path, caplog):
    # "loop" feeds itself (Storm allows cycles): every tuple goes round for
    # ever, so no tree completes; the shell spout replays them. The run to the
    # end stops after message timeout x (1 + max replays) with none
    # completing, names the cycle, and prints no count of a failed tree.
    # The stop waits for the trees in flight to fail (the drain ends when none
    # is pending): a replay the spout emitted just before the stop times out
    # within 2 s (timeout 1 s, checked every second), so the grace is an upper
    # bound that leaves it room. With the 1 s of FAST_CONF such a tree was
    # still going round when the run ended (about 1 run in 8), and the counts
    # of its tuples were printed as an uncommitted view.
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(3, events=False))
    b.set_bolt("loop", faulty_bolt()).shuffle_grouping("spout").shuffle_grouping("loop")
    b.set_bolt("count", stateful_bolt()).shuffle_grouping("loop")
    topo = build(b, tmp_path, output=("count", ["key"]),
                 **{"topology.message.timeout.secs": 1, "multilang.max.replays": 1,
                    "multilang.shutdown.grace.secs": 10})
    run = run_topology(topo, limit=120)
    res = run.result
    assert not res.ok and res.stopped_by == "replays", res
    assert res.completed == 0 and res.pending == 0, res  # every tree failed before the run ended
    assert res.outputs == [], "no tree completed, so nothing is counted"
    logs = " ".join(error_logs(caplog))
    assert "The topology has a cycle (loop -> loop)" in logs
    # (the first rollback comes before any commit: "to the start", never "to checkpoint None")
    assert "state rolled back to" in logs and "checkpoint None" not in logs


# --- 10. a bolt that never answers prepare -----------------------------------------------------------------------


def test_a_stateful_bolt_that_hangs_in_prepare_is_killed_and_the_run_recovers(tmp_path, caplog):
    n = 300
    marker = tmp_path / "hang.once"
    b = TopologyBuilder()
    b.set_spout("spout", spout(n))
    b.set_bolt("count", stateful_bolt("--hang-prepare", str(marker)), parallelism=2,
               conf={"topology.subprocess.timeout.secs": 1.5, "multilang.heartbeat.interval.secs": 0.3}) \
        .fields_grouping("spout", ["n"])
    run = run_topology(build(b, tmp_path), limit=120)
    res = run.result
    assert marker.exists()
    assert res.stats["count"].restarts == 1 and res.rollbacks >= 1, res
    assert any("sent nothing for 1.5s (subprocess timeout" in m for m in error_logs(caplog)), error_logs(caplog)
    assert_done_exactly(run, tmp_path, n)


# --- 11. held acks stay bounded ------------------------------------------------------------------------------------


def test_held_acks_stay_bounded_with_a_fast_spout_and_no_max_spout_pending(tmp_path):
    # An endless spout floods two count tasks (no max spout pending); the run
    # is stopped after 8 commits. Held acks are released at each commit, so
    # at any time they are at most the trees started since the last one (one
    # held ack per tree here): they do not pile up over the run.
    b = TopologyBuilder()
    b.set_spout("spout", spout())
    b.set_bolt("count", stateful_bolt(), parallelism=2).fields_grouping("spout", ["n"])
    topo = build(b, tmp_path, **{"topology.max.spout.pending": None, "topology.state.checkpoint.interval.ms": 50})
    windows: list[tuple[int, int]] = []  # per commit: (max held acks seen since the last, spout tuples since the last)

    async def sampler(rt):
        cp = rt.checkpoints
        last_commit, at_commit, max_held = cp.committed, rt.emitted_by_spouts, 0
        while True:
            max_held = max(max_held, len(cp.held))
            if cp.committed != last_commit:
                windows.append((max_held, rt.emitted_by_spouts - at_commit))
                last_commit, at_commit, max_held = cp.committed, rt.emitted_by_spouts, 0
                if len(windows) == 8:
                    rt.request_stop()
            await trio.sleep(0.001)

    run = run_topology(topo, during=sampler, limit=120)
    res = run.result
    acked = res.stats["spout"].acked
    print(f"\nper commit (max held acks, spout tuples since the previous commit): {windows}; "
          f"{res.checkpoints} checkpoints, {acked} trees in {run.elapsed:.2f}s")
    assert res.ok and res.stopped_by == "request" and res.pending == 0 and len(windows) >= 8, (res, windows)
    assert stored_completed(tmp_path) == list(range(acked))
    assert stored_total(tmp_path, "count") == expected_counts(range(acked))
    # A tree still in flight at a cut (untouched by a stateful task, or not done yet) is the next
    # checkpoint's: its held ack may wait a window or two more. So held acks are bounded by the trees of the
    # last three windows (+ spout bursts sampled late), never by the run's length (a CI run saw 2,816 held
    # against 1,856 trees of the last window).
    for i, (held, _) in enumerate(windows):
        assert held <= sum(e for _, e in windows[max(0, i - 2):i + 1]) + 256 or i == 0, (i, windows)
    assert len(run.runtime.checkpoints.held) == 0


# --- regressions: checkpoint races found by this file (fixed in 19b4e89) ---------------------------------------------
#
# Before the fix: a rollback while a task was slow to answer a prepare made the
# next checkpoint reuse the txid, its prepare was refused by the host's own
# ledger and swallowed, the stale answer was committed and the component
# crashed on the commit; a tree emitted by a spout `next` outstanding at the cut
# was committed as covered without its state (counts lost after a kill or a
# rollback); a checkpoint whose answers were in was dropped when such a tree was
# still running, and the answered changes never reached the store.


# --- a rollback while a stateful task is slow to answer prepare ----------------------------------------------------


def test_a_rollback_while_another_stateful_task_is_slow_to_answer_prepare(tmp_path):
    # "idle" is a stateful bolt that gets no tuples (it subscribes to a stream
    # never emitted); its first process takes 2 s to answer its first prepare.
    # While it sleeps, the count process is killed: the checkpoint is
    # abandoned, the state rolled back, and the run goes on. Nothing is wrong
    # with "idle": it must not be restarted, and the counts must be exact.
    n = 300
    slow = tmp_path / "slow.once"
    b = TopologyBuilder()
    source = numbered_spout(n, events=False, per_next=2)
    source.streams = {"events": ["event", "msg_id"]}  # declared, never emitted (--no-events)
    b.set_spout("spout", source)
    b.set_bolt("count", stateful_bolt()).shuffle_grouping("spout")
    b.set_bolt("idle", stateful_bolt("--slow-prepare", str(slow), "--slow-secs", "2")) \
        .shuffle_grouping("spout", "events")
    topo = build(b, tmp_path, **{"topology.state.checkpoint.interval.ms": 100})
    killed: list[int] = []

    async def killer(rt):
        await wait_until(slow.exists, timeout=100)  # idle is asleep in its first prepare
        killed.append(await kill_task(rt, task_ids(rt, "count")[0]))

    run = run_topology(topo, during=killer, limit=120)
    res = run.result
    assert killed and res.stats["count"].restarts == 1 and res.rollbacks >= 1, res
    assert res.stats["idle"].restarts == 0, "idle was restarted, though it did nothing wrong"
    assert_done_exactly(run, tmp_path, n)


# --- every commit is a cut through whole trees ------------------------------------------------------------------------


class CutCheckingStore(MemoryStore):
    """A state provider (docs/STATE.md "Writing a store") that checks, at
    each commit, what a resumed run would get from it: for a count bolt that
    adds 1 per spout tuple, the committed counts must add up to the number
    of spout message ids committed as covered. ``torn`` lists each commit
    where they do not: (txid, committed counts, committed message ids)."""

    def __init__(self, config, topology):
        MemoryStore.__init__(self)
        self.component, self.tasks, self.spout = config["component"], config["tasks"], config["spout"]
        self.ids: set[str] = set()
        self.torn: list[tuple[int, int, int]] = []

    def commit(self, cp, parallelism):
        super().commit(cp, parallelism)
        self.ids.update(key for spout, _, key in cp.completed if spout == self.spout)
        counted = sum(sum(self.load(self.component, i).values()) for i in range(self.tasks))
        if counted != len(self.ids):
            self.torn.append((cp.txid, counted, len(self.ids)))


def test_a_spout_emit_that_lands_during_prepare_is_not_committed_without_its_state(tmp_path):
    # A spout that takes 10 ms per `next` (a remote source) is usually in the
    # middle of one when a checkpoint pauses the spouts; its emits land while
    # the prepare is out. "slowprep" (a second stateful component, no input)
    # takes 50 ms to answer each prepare. A tree that reaches count after
    # count answered its prepare is not in that checkpoint's state, so the
    # checkpoint must not cover it (nor release its held ack). Checked at
    # every commit by the store, and by a kill of count after a few commits
    # (the new process starts from the committed counts; trees acked are not
    # replayed). Max spout pending 150 (more than the spout emits in an
    # interval) makes at least 4 checkpoints of the 600 trees, so the kill
    # after the third lands mid-run however late count starts (with count
    # 1.5 s late the spout had emitted all 600 by then: 2 commits, no kill).
    n = 600
    b = TopologyBuilder()
    b.set_spout("spout", ShellSpout(["python", str(SLOW_SPOUT), str(n), "--per-next", "10", "--delay", "0.01"],
                                    fields=["n"], streams={"quiet": ["n"]}))
    b.set_bolt("count", stateful_bolt()).shuffle_grouping("spout")
    b.set_bolt("slowprep", stateful_bolt("--prepare-secs", "0.05")).shuffle_grouping("spout", "quiet")
    topo = build(b, tmp_path, output=("count", ["key"]), **{
        "topology.max.spout.pending": 150, "topology.state.checkpoint.interval.ms": 100,
        "topology.state.provider": f"{__name__}:CutCheckingStore",
        "topology.state.provider.config": {"component": "count", "tasks": 1, "spout": "spout"}})
    killed: list[int] = []

    async def killer(rt):
        await wait_until(lambda: rt.checkpoints.committed >= 3, timeout=100)
        killed.append(await kill_task(rt, task_ids(rt, "count")[0]))

    run = run_topology(topo, during=killer, limit=120)
    res = run.result
    store = run.runtime.checkpoints.store
    assert killed and res.stats["count"].restarts == 1, res
    assert res.ok and res.pending == 0 and res.stats["spout"].acked == n, res
    final = store.load("count", 0)
    assert sum(final.values()) == n and final == expected_counts(range(n)), (
        f"{n - sum(final.values())} spout tuples acked but not counted; commits whose counts miss trees they "
        f"cover (txid, counted, covered): {store.torn}")
    assert not store.torn, f"commits whose counts miss trees they cover (txid, counted, covered): {store.torn}"
    assert view(run) == expected_counts(range(n))


def test_a_checkpoint_abandoned_because_a_tree_began_during_prepare_keeps_the_prepared_changes(tmp_path):
    # As above, but the tree that lands during the prepare is still going on
    # (a slow stateless bolt after count) when the last answer arrives: the
    # host abandons the checkpoint without a rollback. count already answered
    # `prepared` (its changes so far); those changes must still reach the
    # store. Each spout tuple sets its own key (n<i> = 1) and no key is set
    # twice, so a change the store never gets is visible at the end.
    n = 100
    b = TopologyBuilder()
    b.set_spout("spout", ShellSpout(["python", str(SLOW_SPOUT), str(n), "--per-next", "5", "--delay", "0.1"],
                                    fields=["n"], streams={"quiet": ["n"]}))
    b.set_bolt("count", stateful_bolt("--mode", "unique")).shuffle_grouping("spout")
    b.set_bolt("relay", faulty_bolt(sleep=0.005, fields=COUNT_FIELDS)).shuffle_grouping("count")
    b.set_bolt("slowprep", stateful_bolt("--prepare-secs", "0.08")).shuffle_grouping("spout", "quiet")
    run = run_topology(build(b, tmp_path, **{"topology.max.spout.pending": None,
                                             "topology.state.checkpoint.interval.ms": 100}), limit=120)
    res = run.result
    assert res.ok and res.stopped_by == "done" and res.pending == 0 and res.stats["spout"].acked == n, res
    assert stored_completed(tmp_path) == list(range(n))
    stored = stored_total(tmp_path, "count")
    missing = sorted(set(f"n{i}" for i in range(n)) - set(stored), key=lambda k: int(k[1:]))
    assert not missing, (f"{len(missing)} of {n} spout tuples acked and committed as covered, but not in the "
                         f"state: {missing[:15]}")
    assert stored == {f"n{i}": 1 for i in range(n)}


def test_a_slow_shell_spout_gets_one_checkpoint_per_interval_not_one_per_tuple(tmp_path):
    # A spout that takes 20 ms per `next` (a remote source) leaves every tree
    # waiting only for its held ack between two emits. That is no reason to
    # checkpoint early: the spout is still emitting. Storm's checkpoint spout
    # ticks once per interval; so do we, here one covering the whole run, then
    # (once the spout's `next` emits nothing) the last one, a tenth of the
    # interval later. Before: one checkpoint per tuple (30).
    n = 30
    b = TopologyBuilder()
    b.set_spout("spout", ShellSpout(["python", str(SLOW_SPOUT), str(n), "--delay", "0.02"], fields=["n"]))
    b.set_bolt("count", stateful_bolt()).shuffle_grouping("spout")
    topo = build(b, tmp_path, output=("count", ["key"]), **{"topology.state.checkpoint.interval.ms": 6000})
    run = run_topology(topo, limit=120)
    assert_done_exactly(run, tmp_path, n)
    assert 1 <= run.runtime.checkpoints.committed <= 2, run.runtime.checkpoints.committed
    assert view(run) == expected_counts(range(n))


@pytest.mark.parametrize("parallelism", [1, 2])
def test_a_killed_spout_process_that_starts_its_input_again_counts_each_input_once(tmp_path, parallelism):
    # The spout process is SIGKILLed after two checkpoints; its successor
    # reads its input from the start again (numbered_spout without --state,
    # as the README's sentence spout reads its file again). Emits whose
    # message ids a checkpoint committed are acked at once; ids whose trees
    # are still in flight from the dead process are folded into those trees.
    # Before: every word counted again after the restart (exit 0, no word).
    n = 3000
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(n, per_next=10, events=False))
    b.set_bolt("count", stateful_bolt(), parallelism).fields_grouping("spout", ["n"])
    topo = build(b, tmp_path, output=("count", ["key"]))
    killed: list[int] = []

    async def killer(rt):
        await wait_until(lambda: rt.checkpoints.committed >= 2, timeout=100)
        pid = current_pid(rt, task_ids(rt, "spout")[0])
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    run = run_topology(topo, during=killer, limit=120)
    res = run.result
    assert killed and res.stats["spout"].restarts == 1, res
    assert res.stats["spout"].skipped > 0, "the new process emitted committed ids again; they were skipped"
    assert stored_total(tmp_path, "count") == expected_counts(range(n))
    if parallelism == 1:  # else a word's count is spread over the tasks: the view holds one task's part
        assert view(run) == expected_counts(range(n))


def test_a_spout_that_numbers_its_inputs_afresh_after_a_restart_has_every_new_input_counted(tmp_path, caplog):
    # storm-starter's randomsentence.js numbers its sentences from 0 in each
    # process: after a restart, ids a checkpoint committed come back with other
    # values. They are new inputs: delivered and counted, not acked unseen
    # as "already committed" (issue 32: 13,904 words generated, 12,796 counted).
    b = TopologyBuilder()
    b.set_spout("spout", numbered_spout(100, fmt="{pid}-{i}", events=False, per_next=10))
    b.set_bolt("count", ShellBolt(["python", str(EXAMPLES / "python" / "count_bolt.py")], fields=["word", "count"])) \
        .shuffle_grouping("spout")
    pids: list[int] = []

    async def kill_once_the_first_hundred_are_committed(rt):
        (spout_task,) = task_ids(rt, "spout")
        await wait_until(lambda: rt.stats["spout"].acked >= 100, timeout=100)  # acks wait for their checkpoint
        pids.append(current_pid(rt, spout_task))
        os.kill(pids[0], signal.SIGKILL)

    run = run_topology(build(b, tmp_path), during=kill_once_the_first_hundred_are_committed, limit=120)
    res = run.result
    assert res.ok and res.stopped_by == "done", res
    assert res.stats["spout"].restarts == 1 and res.stats["spout"].skipped == 0, res.stats["spout"]
    counted = stored_total(tmp_path, "count")
    assert len(counted) == 200 and set(counted.values()) == {1}, "both processes' 100 inputs, each once"
    assert sum(1 for w in counted if w.startswith(f"{pids[0]}-")) == 100
    assert res.reused_ids == {"spout": 100}
    assert any("with other values than the input checkpoint" in m for m in error_logs(caplog)), error_logs(caplog)


def test_on_two_workers_a_resumed_spout_that_numbers_afresh_is_counted_and_named_in_the_summary(tmp_path):
    # As above, across runs and host workers: a second run over the same --state-dir whose spout numbers its
    # inputs afresh (ids 0-99 again, its pid in the values) has each counted as a new input, and the summary
    # names the reused ids, as the spout's worker saw them (they were not merged into the main's summary).
    spout = numbered_spout(100, fmt="{pid}-{i}", events=False, per_next=10)
    count = ["python", str(EXAMPLES / "python" / "count_bolt.py")]
    topo = tmp_path / "t.toml"
    topo.write_text('[topology]\nname = "topology"\n'
                    f'[spouts.spout]\ncommand = {toml_str(spout.command)}\nfields = ["n"]\n'
                    f'[bolts.count]\ncommand = {toml_str(count)}\nfields = ["word", "count"]\n'
                    'inputs = [{ source = "spout" }]\n')
    said = "[summary] spout 'spout' reused 100 message id(s) for inputs other than those a checkpoint holds"
    for first in (True, False):
        proc = subprocess.run(ML + ["run", str(topo), "--no-progress", "--workers", "2", "--state-dir", str(tmp_path / "state")],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (said in proc.stderr) is not first, proc.stderr[-3000:]
    counted = stored_total(tmp_path, "count")
    assert len(counted) == 200 and set(counted.values()) == {1}, "both runs' 100 inputs, each once"


def test_a_resume_of_a_complete_state_pipelines_next_to_a_spout_that_took_batch(tmp_path):
    # Issue 32: resuming a complete state cost 40% of a fresh run, because each
    # committed id came back through a `next` and went out through an `ack`,
    # a round trip each. To a spout that accepted batch the host pipelines
    # `next` while every emit is a committed one (§9.5), and the acks it owes;
    # a fresh run's too, while each `next` brings one input (issue 34), never
    # past topology.max.spout.pending (50 here).
    # Pass condition: what the spout was sent per read, and what was counted.
    n = 600

    def topo(reads: Path, where: Path = tmp_path, **conf: Any):
        b = TopologyBuilder()
        spout = numbered_spout(n, events=False)
        spout.command += ["--batch", "--nexts-per-read", str(reads)]
        b.set_spout("spout", spout)
        b.set_bolt("count", stateful_bolt()).fields_grouping("spout", ["n"])
        return build(b, where, output=("count", ["key"]), **conf)

    def nexts_per_read(path: Path) -> list[int]:
        return [int(line) for line in path.read_text().split()]

    fresh = run_topology(topo(tmp_path / "fresh.reads"), limit=120)
    assert_done_exactly(fresh, tmp_path, n)
    fresh_reads = nexts_per_read(tmp_path / "fresh.reads")
    assert 1 < max(fresh_reads) <= 50, f"pipelined within max spout pending: {fresh_reads}"
    one_at_a_time = tmp_path / "batch1"  # topology.producer.batch.size 1: Storm's one next per round trip
    assert_done_exactly(run_topology(topo(one_at_a_time / "reads", one_at_a_time, **{"topology.producer.batch.size": 1}),
                                     limit=120), one_at_a_time, n)
    assert max(nexts_per_read(one_at_a_time / "reads")) == 1

    resumed = run_topology(topo(tmp_path / "resumed.reads"), limit=120)
    res = resumed.result
    assert res.ok and res.stopped_by == "done", res
    assert res.stats["spout"].skipped == n and res.stats["spout"].emitted == 0, res.stats["spout"]
    assert stored_total(tmp_path, "count") == expected_counts(range(n)), "nothing counted twice"
    assert view(resumed) == expected_counts(range(n))
    reads = nexts_per_read(tmp_path / "resumed.reads")
    assert max(reads) >= 32 and len(reads) <= n // 8, f"{len(reads)} reads brought `next`: {reads}"


def test_a_spout_held_back_by_max_pending_beside_a_dry_shell_spout_gets_its_checkpoints_at_once(tmp_path, caplog):
    """Two shell spouts into a stateful count: "short" emits 50 tuples and
    then finds nothing to emit (a shell spout cannot say its input ended: it
    is dry for good), "long" is held back by max spout pending. A dry
    spout's tenth of the checkpoint interval counts from when it went dry,
    so once it has passed, each checkpoint is taken after the spouts' 2 ms
    of quiet. It counted from any spout's last emit: every checkpoint
    waited the tenth, and a trial's held-back spout ran at 950 trees/s at
    pending 100, against 10,000 alone. The counts stay exact."""
    caplog.set_level(logging.DEBUG, logger="multilang.shellbolt")
    b = TopologyBuilder()
    b.set_spout("long", numbered_spout(3000, events=False))
    b.set_spout("short", numbered_spout(50, events=False))
    b.set_bolt("count", stateful_bolt()).shuffle_grouping("long").shuffle_grouping("short")
    # (the interval's tenth: 0.1 s, 50 times the 2 ms; and short, so that however fast the machine, few of
    # the checkpoints fall in the tenth after "short" went dry)
    run = run_topology(build(b, tmp_path, output=("count", ["key"]),
                             **{"topology.state.checkpoint.interval.ms": 1000}))
    res = run.result
    assert res.ok and res.completed == 3050, res
    counts = {r["key"]: r["count"] for r in res.outputs}
    assert counts == expected_counts(list(range(3000)) + list(range(50)))
    whys = [r.getMessage() for r in caplog.records if r.getMessage().startswith("a checkpoint begins")]
    quick = [w for w in whys if "quiet 0.002 s" in w]
    # 3,050 trees at 50 per checkpoint: about 60, all but the first few after 2 ms
    assert len(quick) >= 40, whys[:10]


def test_on_two_workers_a_tuple_of_a_tree_that_failed_elsewhere_is_not_counted(tmp_path):
    # A trial's topology: each number goes to a bolt that fails the tens once (their spout replays them)
    # and to a slower one whose emits a stateful count counts. A ten's tree failed at its owner (the
    # spout's worker, 1) before its other branch reached the count, so no rollback was due; the other
    # worker still took that branch's tuples for live (another worker's tree, of this epoch) and counted
    # them, and the replay counted them again: 2 for several of the tens, in 3 runs of 12. The one
    # engine drops a failed tree's tuples; so must every worker, once the owner says it failed.
    comps = tmp_path / "comps.py"
    comps.write_text(
        "import sys, time\n"
        "from collections import deque\n"
        "from multilang import Bolt, BasicBolt, Spout, StatefulBolt\n\n"
        "class Nums(Spout):\n"
        "    def initialize(self, conf, context):\n"
        "        self.queue = deque(range(100))\n"
        "    def next_tuple(self):\n"
        "        if self.queue:\n"
        "            n = self.queue.popleft()\n"
        "            self.emit([n], msg_id=n)\n"
        "    def fail(self, msg_id):\n"
        "        self.queue.append(msg_id)\n\n"
        "class FailTensOnce(Bolt):\n"
        "    def initialize(self, conf, context):\n"
        "        self.seen = set()\n"
        "    def process(self, tup):\n"
        "        n = tup.values[0]\n"
        "        if n % 10 == 0 and n not in self.seen:\n"
        "            self.seen.add(n)\n"
        "            self.fail(tup)\n"
        "        else:\n"
        "            self.ack(tup)\n\n"
        "class SlowTag(BasicBolt):\n"
        "    def process(self, tup):\n"
        "        time.sleep(0.01)\n"
        "        self.emit([f'n{tup.values[0]}'])\n\n"
        "class Count(StatefulBolt):\n"
        "    def process(self, tup):\n"
        "        self.state.put(tup.values[0], self.state.get(tup.values[0], 0) + 1)\n"
        "        self.emit([tup.values[0], self.state.get(tup.values[0])])\n\n"
        "{'nums': Nums, 'fail': FailTensOnce, 'tag': SlowTag, 'count': Count}[sys.argv[1]]().run()\n")
    py = ["python", str(comps)]
    # Placed by task id, round-robin (docs/WORKERS.md): count 1, 2 on workers 0, 1; fail 3 on 0; nums 4 on 1;
    # tag 5 on 0. So the tens fail on worker 0, their trees are worker 1's, and half the keys count on 0.
    topo = tmp_path / "t.toml"
    topo.write_text('[topology]\nname = "tens"\n[topology.conf]\n"topology.max.spout.pending" = 50\n'
                    f'[spouts.nums]\ncommand = {toml_str(py + ["nums"])}\nfields = ["n"]\n'
                    f'[bolts.fail]\ncommand = {toml_str(py + ["fail"])}\nfields = ["n"]\n'
                    'inputs = [{ source = "nums" }]\n'
                    f'[bolts.tag]\ncommand = {toml_str(py + ["tag"])}\nfields = ["key"]\n'
                    'inputs = [{ source = "nums" }]\n'
                    f'[bolts.count]\ncommand = {toml_str(py + ["count"])}\nfields = ["key", "count"]\nparallelism = 2\n'
                    'inputs = [{ source = "tag", grouping = "fields", fields = ["key"] }]\n'
                    '[output]\ncomponent = "count"\nkey = ["key"]\n')
    proc = subprocess.run(ML + ["run", str(topo), "--no-progress", "--workers", "2"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = {json.loads(line)["key"]: json.loads(line)["count"] for line in proc.stdout.splitlines()}
    assert counts == {f"n{n}": 1 for n in range(100)}, proc.stderr[-3000:]


def test_a_batching_bolt_before_a_stateful_bolt_does_not_stall_the_checkpoints(tmp_path):
    """A bolt that holds its inputs until it has three (Storm's batching
    pattern) feeds a stateful bolt. A checkpoint pauses the spouts and used
    to wait until every tree in flight waited only for held acks: the trees
    held in the batching bolt never got there (no more input came), so each
    checkpoint waited for the message timeout, failed every tree, rolled back
    and replayed, for ever (a trial: a 30,000-number run killed after 120 s,
    its sum half of the right one). Trees that touched no stateful task are
    now left out of the cut after a short patience, and the run ends, exact."""
    n = 3000
    topo = tmp_path / "t.toml"
    topo.write_text(textwrap.dedent(f"""\
        [topology]
        name = "batched"
        [topology.conf]
        "topology.max.spout.pending" = 100
        [spouts.nums]
        command = {toml_str(list(numbered_spout(n, events=False).command))}
        fields = ["n"]
        [bolts.batch]
        command = {toml_str(["python", str(COMPONENTS / "batching_bolt.py")])}
        fields = ["s"]
        inputs = [{{ source = "nums", grouping = "shuffle" }}]
        [bolts.total]
        command = {toml_str(["python", str(COMPONENTS / "stateful_total.py")])}
        fields = ["k", "sum"]
        inputs = [{{ source = "batch", grouping = "global" }}]
        [output]
        component = "total"
        key = ["k"]
    """))
    proc = subprocess.run([*ML, "run", str(topo), "--no-progress"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [json.loads(x) for x in proc.stdout.splitlines()] == [{"k": "sum", "sum": n * (n - 1) // 2}]
    assert "(timed out 0)" in proc.stderr and "rolled back" not in proc.stderr.replace("0 rolled back", ""), \
        proc.stderr[-3000:]
