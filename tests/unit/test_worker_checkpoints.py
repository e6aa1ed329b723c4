"""The main process's side of checkpoints across host workers
(shellbolt/_workers/coordinator.py: _Checkpoints), against a real state
store: the order of a checkpoint's commit and a worker's death."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from multilang.shellbolt import load_topology
from multilang.shellbolt._workers.coordinator import _Checkpoints, _futile, _lost, _Worker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ANSWER = {"changes": {}, "completed": [], "values": {}, "outputs": {}, "parallelism": {}}


async def _rollback(cause):
    raise AssertionError(f"not asked for here: {cause}")


async def _to_prepare(ck, broadcast):
    """Both workers quiet with something to checkpoint, then both at the cut: the prepare goes out."""
    ck.flags = {0: (True, True, 0, 0), 1: (True, True, 0, 0)}
    await ck.step(broadcast, 2, _rollback)
    ck.cuts = {0, 1}
    await ck.step(broadcast, 2, _rollback)


def _run(tmp_path, steps):
    """``steps(ck)`` against the main process's checkpoints of the README word count, on a real store."""
    topo = load_topology(str(EXAMPLES / "wordcount.toml"))
    topo.conf["topology.state.provider.config"] = {"dir": str(tmp_path / "state")}

    async def main():
        ck = _Checkpoints(topo, None)
        try:
            await steps(ck)
        finally:
            ck.close()

    trio.run(main)


def test_a_checkpoint_answered_by_a_worker_that_then_died_is_not_committed_after_its_death_is_told(tmp_path):
    """A worker answers the prepare and is killed; the main process sees
    the death before it reads the answer. The others are told of the death
    (each fails every tree it owns that no commit covered, and its spouts
    replay them): the checkpoint must not be written after that, or it
    covers trees being replayed, whose words are counted twice (seen once
    in a trial: about 200 sentences, one max spout pending's worth, too
    many). Nothing begins until the rollback that follows."""
    sent: list[tuple] = []

    async def broadcast(msg, but=None):
        sent.append(msg)
        return []

    async def steps(ck):
        await _to_prepare(ck, broadcast)
        assert [m[0] for m in sent] == ["cp_pause", "cp_prepare"]
        ck.prepared = {0: ANSWER, 1: ANSWER}  # both answers in, the second read after its worker's death was seen
        async with trio.open_nursery() as nursery:
            await ck.lock.acquire()  # (the death's handler holds it while it tells the others)
            nursery.start_soon(ck.step, broadcast, 2, _rollback)
            await trio.testing.wait_all_tasks_blocked()
            ck.abandon()
            ck.lock.release()
        assert ck.store.txid is None, "written after the others were told of the death"
        assert [m[0] for m in sent] == ["cp_pause", "cp_prepare"]
        await ck.step(broadcast, 2, _rollback)  # no new one before the rollback
        assert [m[0] for m in sent] == ["cp_pause", "cp_prepare"]
        ck.epoch += 1  # the rollback (run_workers' rollback(): a new epoch, every worker back to the last commit)
        ck.state = "idle"
        ck.flags = {0: (True, True, 0, 1), 1: (True, True, 0, 1)}
        await ck.step(broadcast, 2, _rollback)
        assert [m[0] for m in sent] == ["cp_pause", "cp_prepare", "cp_pause"]

    _run(tmp_path, steps)


def test_a_worker_killed_every_second_or_two_while_checkpoints_commit_is_not_a_crash_loop():
    """A trial killed a worker every 1 to 3 s on a loaded machine: 4 runs of
    8 gave up ("died 3 times in a row having got nothing done") although
    21 checkpoints committed across the three lives, each under 2 s."""
    assert not _futile(True, 1.2, committed=34, committed_at_hello=25)  # checkpoints committed while it ran
    assert _futile(True, 30.0, committed=34, committed_at_hello=34)  # they are taken, and none while it ran
    assert _futile(False, 0.0, committed=0, committed_at_hello=0)  # never said hello
    assert _futile(True, 0.5, committed=0, committed_at_hello=0)  # no checkpoints (yet): died soon after hello
    assert not _futile(True, 5.0, committed=0, committed_at_hello=0)  # ... and after a while: work done


def test_a_worker_dead_while_a_checkpoint_waits_to_be_written_has_its_trees_in_that_checkpoint_counted(tmp_path):
    """--max-tuples: a worker's next process may emit its share less the
    trees its predecessors completed. A CI run counted about ten sentences
    too many: the count was read when the death was seen, while a commit
    that covered some of those trees waited for the lock; the commit went
    out first, the next process's spout skipped those ids as committed, and
    emitted as many fresh sentences in their place."""
    sent: list[tuple] = []

    async def broadcast(msg, but=None):
        sent.append(msg)
        return []

    async def steps(ck):
        await _to_prepare(ck, broadcast)
        three = [("sentences", 0, str(i)) for i in range(3)]
        ck.prepared = {0: {**ANSWER, "completed": three}, 1: ANSWER}
        w = _Worker(0)
        w.completed = 1  # its last status (50 ms old: the acks of the other two were released since)
        async with trio.open_nursery() as nursery:
            await ck.lock.acquire()  # (held a moment: a rollback going out, say)
            nursery.start_soon(ck.step, broadcast, 2, _rollback)  # the commit waits for the lock ...
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(_lost, ck, w, "killed", broadcast)  # ... and then the death's handler
            await trio.testing.wait_all_tasks_blocked()
            ck.lock.release()
        assert ck.store.txid == 1 and ck.store.completed("sentences", 0, "2")  # the commit went out first
        assert [m[0] for m in sent] == ["cp_pause", "cp_prepare", "cp_commit", "peer_lost"]
        assert w.completed_before == 3, "the next process would emit the trees of that commit again"

    _run(tmp_path, steps)
