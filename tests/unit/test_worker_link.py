"""A host worker's link to the other workers (shellbolt/_workers/link.py),
over real Unix sockets: what it keeps for a peer is bounded, also across
the peer's death."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from multilang.shellbolt import load_topology
from multilang.shellbolt._runtime.runtime import Runtime
from multilang.shellbolt._runtime.tasks import Delivery
from multilang.shellbolt._workers.link import _CAPACITY, Link, socket_path
from multilang.shellbolt._workers.worker import Placement, placement

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_a_batch_being_sent_when_its_peer_dies_frees_no_room_for_the_batch_after_it(tmp_path):
    """Worker 0 sends a full batch to worker 1, which reads nothing, so the
    send waits; worker 1 dies (peer_lost) and the send fails. A producer
    routes a full batch more for worker 1 meanwhile: it waits there while
    worker 1 is down, so the producers must wait for room. The failed send
    once counted its own batch off the new one's count, and worker 1 looked
    empty: producers routed to it without bound."""
    topo = load_topology(str(EXAMPLES / "wordcount.toml"))
    where = placement(topo, 2)
    task = next(t for t, w in where.items() if w == 1)
    directory = str(tmp_path)

    def batch() -> list[Delivery]:  # (its words fill the socket's buffers: the send waits)
        return [Delivery([f"{i:01000}"], "split", "default", 0, 0) for i in range(_CAPACITY)]

    async def main() -> None:
        link = Link(directory, 0, 2, where)
        link.runtime = Runtime(topo, placement=Placement(0, 2, where, link))
        peer = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await peer.bind(socket_path(directory, 1))
        peer.listen(1)  # worker 1: it accepts, and reads nothing
        async with trio.open_nursery() as nursery:
            await link.serve(nursery)
            link.put(task, batch())
            link.wake()
            await trio.testing.wait_all_tasks_blocked()
            assert link.full(1), "a full batch on its way: the producers wait"
            link.peer_lost(1, "killed")  # the send fails ...
            assert not link.full(1)
            link.put(task, batch())  # ... and a batch more is routed to worker 1 before the link sees it fail
            await trio.testing.wait_all_tasks_blocked()
            assert link.full(1), "the failed send made room for a batch that cannot go"
            nursery.cancel_scope.cancel()
        peer.close()

    trio.run(main)
