"""The asyncio embedding (multilang.adapters.aio): trio as a guest of the asyncio loop, real processes."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from multilang.adapters.aio import (
    ComponentError,
    FeedSpout,
    ShellBolt,
    TopologyBuilder,
    TopologyError,
    load_flux,
    open_bolt,
    open_topology,
)
from multilang.shellbolt import OutputSpec
from multilang.testing import alive, child_pids

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RUBY_SPLIT = ["ruby", str(EXAMPLES / "ruby" / "split_bolt.rb")]
NODE_COUNT = ["node", str(EXAMPLES / "node" / "count_bolt.js")]

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.skipif(shutil.which("ruby") is None or shutil.which("node") is None, reason="needs ruby and node"),
]


def sentence(i: int) -> str:
    return f"Row{i} word{i % 13}, AND more!"


def expected_words(n: int) -> Counter:
    return Counter(w for i in range(n) for w in (f"row{i}", f"word{i % 13}", "and", "more"))


async def test_ten_thousand_tuples_through_a_ruby_bolt_exact_multiset():
    before = set(child_pids())
    got: Counter = Counter()
    async with open_bolt(RUBY_SPLIT, fields=["word"]) as bolt:
        async def feed():
            await bolt.send_many([sentence(i)] for i in range(10_000))
            bolt.close_input()

        sender = asyncio.create_task(feed())
        async for values in bolt:
            assert len(values) == 1
            got[values[0]] += 1
        await sender
    assert got == expected_words(10_000)
    assert bolt.result.ok and bolt.result.completed == 10_000 and bolt.result.failed == 0
    assert set(child_pids()) == before, "every child was reaped"


async def test_cancelling_midway_leaves_no_child_processes():
    before = set(child_pids())
    seen: set[int] = set()
    progressed = asyncio.Event()

    async def consumer():
        async with open_bolt(RUBY_SPLIT, fields=["word"], parallelism=3) as bolt:
            async def feed():
                await bolt.send_many([sentence(i)] for i in range(10_000_000))  # never finishes

            sender = asyncio.create_task(feed())
            try:
                n = 0
                async for _ in bolt:
                    n += 1
                    if n % 500 == 0:
                        seen.update(set(child_pids()) - before)
                    if n == 5000:
                        progressed.set()
            finally:
                sender.cancel()

    task = asyncio.create_task(consumer())
    await asyncio.wait_for(progressed.wait(), 20)
    assert len(seen) >= 3, f"three bolt processes ran: {seen}"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not [p for p in seen if alive(p)], "a bolt process survived the cancellation"
    assert set(child_pids()) == before


async def test_a_killed_bolt_is_replaced_and_the_multiset_stays_exact():
    """kill -9 one of two Ruby processes midway: its tuples are replayed (hold
    emits until ack, so none is counted twice), then a second session runs
    in the same loop (a fresh guest run)."""
    import signal

    before = set(child_pids())
    for _ in range(2):
        got: Counter = Counter()
        async with open_bolt(RUBY_SPLIT, fields=["word"], parallelism=2,
                             conf={"multilang.hold.emits.until.ack": True}) as bolt:
            async def feed():
                await bolt.send_many([sentence(i)] for i in range(3000))
                bolt.close_input()

            sender = asyncio.create_task(feed())
            killed = None
            async for values in bolt:
                got[values[0]] += 1
                if killed is None and sum(got.values()) >= 2000:
                    killed = min(set(child_pids()) - before)
                    os.kill(killed, signal.SIGKILL)
            await sender
        assert killed is not None
        assert got == expected_words(3000)
        assert bolt.result.stats["bolt"].restarts == 1 and bolt.result.ok
    assert set(child_pids()) == before


async def test_error_inside_the_block_kills_and_reaps():
    before = set(child_pids())
    with pytest.raises(ValueError, match="user code failed"):
        async with open_bolt(RUBY_SPLIT, fields=["word"]) as bolt:
            await bolt.send(["one two"])
            async for _ in bolt:
                raise ValueError("user code failed")
    assert set(child_pids()) == before


async def test_leaving_the_block_early_stops_gracefully():
    before = set(child_pids())
    async with open_bolt(RUBY_SPLIT, fields=["word"]) as bolt:
        await bolt.send_many([sentence(i)] for i in range(100))
        first = await bolt.__anext__()
    assert first[0] in expected_words(100)
    assert bolt.finished and bolt.result is not None
    assert set(child_pids()) == before


async def test_topology_with_a_feed_spout_ruby_split_node_count():
    builder = TopologyBuilder()
    builder.set_spout("input", FeedSpout(fields=["sentence"]))
    builder.set_bolt("split", ShellBolt(RUBY_SPLIT, fields=["word"]), 2).shuffle_grouping("input")
    builder.set_bolt("count", ShellBolt(NODE_COUNT, fields=["word", "count"]), 2).fields_grouping("split", ["word"])
    topology = builder.create_topology(output=OutputSpec("count", key=["word"]))
    async with open_topology(topology, max_buffered_outputs=16) as run:
        async def feed():
            for i in range(0, 2000, 100):
                await run.send_many([sentence(j)] for j in range(i, i + 100))
            run.close_input()

        sender = asyncio.create_task(feed())
        records = [r async for r in run.outputs()]
        await sender
    assert {r["word"]: r["count"] for r in records} == dict(expected_words(2000))
    assert run.result.ok


async def test_flux_topology_without_feeds_runs_to_the_end():
    topology = load_flux(EXAMPLES / "flux" / "simple_wordcount.yaml")
    async with open_topology(topology) as run:
        records = [r async for r in run.outputs()]
    assert sum(r["count"] for r in records) == 1000


async def test_two_bolts_share_one_guest_run():
    async def one(cmd, n):
        out = []
        async with open_bolt(cmd, fields=["word"]) as bolt:
            await bolt.send_many([sentence(i)] for i in range(n))
            bolt.close_input()
            async for values in bolt:
                out.append(values[0])
        return Counter(out)

    a, b = await asyncio.gather(one(RUBY_SPLIT, 300),
                                one(["node", str(EXAMPLES / "node" / "split_bolt.js")], 200))
    assert a == expected_words(300) and b == expected_words(200)


async def test_a_bolt_that_gives_up_raises_its_error():
    before = set(child_pids())
    crash = ["python", "-c", "import sys; sys.exit(3)"]
    with pytest.raises(ComponentError, match="exit status 3"):
        async with open_bolt(crash, conf={"multilang.restart.budget": 0}) as bolt:
            await bolt.send(["x"])
            bolt.close_input()
            async for _ in bolt:
                pass
    assert set(child_pids()) == before


async def test_missing_command_is_a_topology_error_at_open():
    with pytest.raises(TopologyError, match="no-such-program-xyz"):
        open_bolt(["no-such-program-xyz"])


async def test_send_rejects_a_bare_string():
    async with open_bolt(RUBY_SPLIT, fields=["word"]) as bolt:
        with pytest.raises(TypeError, match="list of values"):
            await bolt.send("not a list")


async def test_a_poison_input_is_given_up_on_and_counted_not_replayed_for_ever():
    # Issue 18: the asyncio feed is one of the host's own spouts.
    poison = ["python", str(ROOT / "tests" / "faults" / "components" / "poison_bolt.py"), "raise"]
    async with open_bolt(poison, fields=["out"], conf={"multilang.max.replays": 1}) as bolt:
        for line in ["a", "poison", "b"]:
            await bolt.send([line])
        bolt.close_input()
        got = sorted([v async for v in bolt])
    assert got == [["A"], ["B"]]
    res = bolt.result
    assert not res.ok and res.dead_letters == 1
    (letter,) = res.dead_letter_sample
    assert letter.input == ["poison"] and letter.attempts == 2 and "ValueError" in letter.cause
