"""A worker's links: to the other workers (the tuples routed to their tasks,
the acks and fails of their trees) and to the main process (outputs,
status, stop). Tuples for another worker's task are kept by its
:class:`RemoteTask` and sent as one batch per peer per flush. A flush runs
once whatever queued something for it yields: a delivery to another
worker's task, an ack or fail of another worker's tree, an output, a
message for the main process, each wakes the flusher as a delivery to a
local inbox wakes its task. Every ``_TICK`` seconds it runs anyway, a
backstop that no flow of the tests needs: a trial's spout that waited for
each tree's ack got one tree per 50 ms tick on 2 workers (2 ms on one),
its emits queued for the peer with nothing to wake the flusher; the tick
is long now so that a wake left out shows. Backpressure: a peer that reads
slowly leaves its batches unsent, and the producers that route to it wait
for space, as they wait for a full inbox (Task.full / wait_for_space)."""

from __future__ import annotations

import os
from typing import Any

import trio

from .._model.topology import ComponentDef
from .._runtime.tasks import Delivery, Task
from .wire import Frames, encode, pack, unpack

__all__ = ["Link", "RemoteTask", "socket_path"]

_TICK = 0.25
#: deliveries kept for one peer before its producers wait
_CAPACITY = 4096


def socket_path(directory: str, worker: int | str) -> str:
    return os.path.join(directory, f"w{worker}")


class _Outbox:
    """A remote task's inbox as the runtime's routes see it: appends go to the link."""

    __slots__ = ("link", "task_id")

    def __init__(self, link: "Link", task_id: int) -> None:
        self.link, self.task_id = link, task_id

    def append(self, d: Delivery) -> None:
        self.link.put(self.task_id, [d])

    def extend(self, ds: list[Delivery]) -> None:
        self.link.put(self.task_id, list(ds))

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return False


class RemoteTask(Task):
    """A task that runs in another worker: what is delivered to it goes there."""

    remote = True

    def __init__(self, runtime: Any, comp: ComponentDef, task_id: int, link: "Link") -> None:
        super().__init__(runtime, comp, task_id)
        self.link = link
        self.peer = link.placement[task_id]
        self.inbox = _Outbox(link, task_id)  # type: ignore[assignment]

    def deliver(self, d: Delivery) -> None:
        self.link.put(self.task_id, [d])

    def deliver_many(self, ds: list[Delivery]) -> None:
        self.link.put(self.task_id, ds)

    def kick(self) -> None:
        self.link.wake()

    def full(self) -> bool:
        return self.link.full(self.peer)

    async def wait_for_space(self) -> None:
        await self.link.wait_for_space(self.peer)

    @property
    def busy(self) -> bool:
        return False  # the link counts what is on its way

    async def run(self) -> None:
        return None


class Link:
    """One worker's connections. ``placement``: task id -> worker."""

    def __init__(self, directory: str, worker: int, workers: int, placement: dict[int, int]) -> None:
        self.directory, self.worker, self.workers, self.placement = directory, worker, workers, placement
        self.runtime: Any = None
        self._out: dict[int, dict[int, list[Any]]] = {w: {} for w in range(workers) if w != worker}
        self._count = dict.fromkeys(self._out, 0)
        #: peer -> how many times it was lost: a flush under way when it was counts its batch off no count
        self._lives = dict.fromkeys(self._out, 0)
        self._wake = trio.Event()
        self._flush_done = trio.Event()  # set as each flush ends
        self._space = trio.Event()
        self._conns: dict[int, trio.SocketStream] = {}
        #: peer -> deliveries and acker messages sent to it / received from it, since it (re)started
        self.sent = dict.fromkeys(self._out, 0)
        self.received = dict.fromkeys(self._out, 0)
        #: peers that died and are not back: what goes to them waits (bounded: producers wait for space)
        self.down: set[int] = set()
        self.outputs: list[dict[str, Any]] = []
        #: batches of outputs (and of a keyed view's changes) taken for the main process, and of them sent:
        #: a tree that completes while some are on their way waits for them (Runtime.held_completions)
        self._taken = self._sent_out = 0
        self._outputs_lock = trio.Lock()
        #: peer -> [(root, xor)] of its roots whose acks a stateful task here holds (WorkerCheckpointer)
        self._held: dict[int, list[tuple[int, int]]] = {}
        self._to_main: list[Any] = []
        self.main: trio.SocketStream | None = None
        self._main_lock = trio.Lock()
        self.stopping = False

    # -- what the runtime calls ------------------------------------------------------

    def put(self, task_id: int, ds: list[Delivery]) -> None:
        """Deliveries for another worker's task: sent by the flush that runs
        once the producer yields (as a local inbox wakes its consumer)."""
        peer = self.placement[task_id]
        pack(self._out[peer].setdefault(task_id, []), ds)
        self._count[peer] += len(ds)
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def full(self, peer: int) -> bool:
        return self._count[peer] >= _CAPACITY

    async def wait_for_space(self, peer: int) -> None:
        while self._count[peer] >= _CAPACITY:
            await self._space.wait()

    async def send_main(self, msg: Any) -> None:
        """A message to the main process (one sender at a time). If it is
        gone (killed), nothing: the worker's control reads the end of its
        connection and stops the worker."""
        assert self.main is not None
        async with self._main_lock:
            try:
                await self.main.send_all(encode(msg))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    def peer_lost(self, peer: int, cause: str) -> None:
        """Worker ``peer`` died (the main process says so): nothing more goes
        to it until it is back, the counts with it start again, and every
        tree this worker owns is failed at once, as any may have had a tuple
        there (its spout replays it: at least once), instead of timing out."""
        self.down.add(peer)
        self._out[peer] = {}
        self._count[peer] = 0
        self._lives[peer] += 1
        self.sent[peer] = self.received[peer] = 0
        conn = self._conns.pop(peer, None)
        if conn is not None:
            conn.socket.close()
        rt = self.runtime
        committed = rt.acker.committed
        for r in list(rt.acker.roots):
            if r in committed:
                rt.acker.complete_root(r)
            else:
                rt.acker.fail_root(r, cause)
        rt.settle()
        space, self._space = self._space, trio.Event()
        space.set()

    def peer_up(self, peer: int) -> None:
        self.down.discard(peer)
        self.wake()

    async def flushed(self) -> dict[int, int]:
        """What has been sent to each peer (counted as :attr:`received`
        counts it there), once a flush begun after this call has ended:
        everything queued for the peers before it is in it."""
        for _ in range(2):  # (the flush under way may have taken its messages before the last were queued)
            done = self._flush_done
            self.wake()
            await done.wait()
        return dict(self.sent)

    def held(self, owner: int, root: int, xor: int) -> None:
        self._held.setdefault(owner, []).append((root, xor))

    def to_main(self, msg: Any) -> None:
        """A message to the main process, sent by the next flush (from code that cannot wait)."""
        self._to_main.append(msg)
        self.wake()

    def outputs_unsent(self) -> int | None:
        """The batch of outputs that a tree completing now waits for: the
        next one taken where outputs wait to be taken, else the last one
        taken, if not yet sent; None where every output is with the main
        process."""
        if self.outputs or self.runtime.view_changes:  # (their coming woke the flusher: output, on_view_change)
            return self._taken + 1
        return self._taken if self._sent_out < self._taken else None

    def output(self, record: dict[str, Any]) -> None:
        """An output record of a topology without a keyed view: the main process writes it."""
        self.outputs.append(record)
        self.wake()

    # -- running -------------------------------------------------------------------------

    async def serve(self, nursery: trio.Nursery) -> None:
        """Listen for the other workers, and flush for ever."""
        path = socket_path(self.directory, self.worker)
        if os.path.exists(path):  # the socket of this worker's previous process
            os.unlink(path)
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(path)
        sock.listen(64)
        nursery.start_soon(trio.serve_listeners, self._reader, [trio.SocketListener(sock)])
        nursery.start_soon(self._flusher)

    async def _connect(self, peer: int) -> trio.SocketStream:
        conn = self._conns.get(peer)
        if conn is not None:
            return conn
        path = socket_path(self.directory, peer)
        while True:
            if peer in self.down:
                raise trio.ClosedResourceError(f"worker {peer} is down")
            try:
                conn = await trio.open_unix_socket(path)
                break
            except OSError:  # not listening yet (starting, or restarted)
                await trio.sleep(0.01)
        self._conns[peer] = conn
        return conn

    async def _flusher(self) -> None:
        rt = self.runtime
        while True:
            with trio.move_on_after(_TICK):
                await self._wake.wait()
            self._wake = trio.Event()
            if rt.checkpoints is not None:
                rt.checkpoints.tell()  # (held acks of other workers' roots, to their owners: checkpoints.py)
            remote = rt.acker.take_remote()
            failed_roots, rt.acker.failed_out = rt.acker.failed_out, []
            # The outputs first, every one emitted by now: the acks just taken may complete their trees at
            # their owners, and a worker killed between the two lost outputs whose trees completed (a trial).
            await self.flush_main()
            for peer in list(self._out):
                batch = self._out[peer]  # (now: a peer lost while an earlier one was sent to has a new one)
                acks, fails = remote.pop(peer, ({}, []))
                held = self._held.pop(peer, [])
                if not batch and not acks and not fails and not held and not failed_roots or peer in self.down:
                    continue
                self._out[peer] = {}
                n_rows = self._count[peer]  # (what put() counted into this batch)
                n = n_rows + len(acks) + len(fails) + len(held) + len(failed_roots)
                life = self._lives[peer]
                try:
                    conn = await self._connect(peer)
                    await conn.send_all(encode((self.worker, rt.acker.epoch, batch, acks, fails, held, failed_roots)))
                    sent = True
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    self._conns.pop(peer, None)  # it died: the main process will say so (peer_lost)
                    sent = False
                if self._lives[peer] == life:  # (lost while this was sent: its counts started again without it)
                    self._count[peer] -= n_rows
                    if sent:
                        self.sent[peer] += n
                space, self._space = self._space, trio.Event()
                space.set()
            done, self._flush_done = self._flush_done, trio.Event()
            done.set()

    async def flush_main(self) -> None:
        """Send the outputs and the messages waiting for the main process
        (each flush, and once more before the worker's result)."""
        if self.main is None:
            return
        rt = self.runtime
        if self.outputs or rt is not None and rt.view_changes:
            async with self._outputs_lock:  # (one batch at a time: each sent means every one before it is)
                self._taken += 1
                if self.outputs:
                    outs, self.outputs = self.outputs, []
                    await self.send_main(("out", outs))
                if rt is not None and rt.view_changes:  # (a keyed view without state: the main process keeps it)
                    changes, rt.view_changes = rt.view_changes, {}
                    await self.send_main(("view", changes))
                self._sent_out = self._taken
            if rt is not None:
                rt.release_completions(self._sent_out)
        while self._to_main:
            await self.send_main(self._to_main.pop(0))

    async def _reader(self, stream: trio.SocketStream) -> None:
        try:
            await self._read(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # a peer died: the main process says so (peer_lost)

    async def _read(self, stream: trio.SocketStream) -> None:
        rt = self.runtime
        frames = Frames()
        tasks = rt.tasks
        async with stream:
            async for data in stream:
                for sender, epoch, batch, acks, fails, held, failed_roots in frames.feed(data):
                    # Sent after a rollback that this worker has not heard of yet (each worker hears the main
                    # process's on its own connection): taken once it has. Before it, a new tree's tuple was
                    # dropped here as another worker's of an unknown epoch (and timed out), and an ack of an
                    # old tree whose emits the sender had dropped could complete it (its input then lost).
                    while rt.acker.epoch < epoch:
                        await rt.wait_for_change()
                    if sender in self.down:
                        continue  # from a process of it that died: its trees were failed
                    touched: set[Task] = set()
                    n = len(acks) + len(fails) + len(held) + len(failed_roots)
                    cp = rt.checkpoints
                    if held and cp is not None:
                        rh = cp.remote_held
                        for r, x in held:
                            x ^= rh.pop(r, 0)
                            if x:
                                rh[r] = x
                        rt.nudge()
                    for task_id, runs in batch.items():
                        t = tasks[task_id]
                        ds = unpack(runs)
                        t.deliver_many(ds)
                        touched.add(t)
                        n += len(ds)
                    if acks or fails:
                        rt.acker.apply_remote(acks, fails)
                        rt.settle()
                    if failed_roots:
                        rt.acker.failed_elsewhere(failed_roots)  # (their tuples here are stale from now on)
                        if cp is not None:
                            cp.failed_elsewhere(failed_roots, sender)
                    self.received[sender] += n
                    rt.nudge()  # (a prepare may wait for this peer's messages: WorkerCheckpointer.prepare)
                    for t in touched:
                        t.kick()
                    for t in touched:
                        if t.full():  # the peer's reads wait for this task's inbox: backpressure
                            await t.wait_for_space()
