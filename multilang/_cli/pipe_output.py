"""``multilang pipe``'s output: each input's outputs, printed once its tree completes.

A bolt that fails an input, crashes, hangs or never acks gets the input
again (a replay), and emits its outputs again: printed at once, they would
come out once per attempt, and those of an input finally given up on (a dead
letter) would stay printed. So an output anchored to an input is held until
that input's tree completes, and dropped when it fails: the output of ``pipe``
is exactly once per input that completes, and nothing of a dead letter. An
unanchored emit belongs to no input: it is printed at once (at least once).
Memory is bounded by the inputs in flight (``topology.max.spout.pending``).
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["HeldOutputs"]


class _Shared:
    """An output anchored to several inputs: printed when all completed."""

    __slots__ = ("values", "pending", "dead")

    def __init__(self, values: list[Any], pending: int) -> None:
        self.values = values
        self.pending = pending  # inputs whose trees have not completed yet
        self.dead = False  # one of its inputs failed: never printed


class HeldOutputs:
    """``output`` is the runtime's ``on_tracked_output``; ``acked`` and
    ``failed`` are the stdin spout's ``ack`` and ``fail`` (message ids)."""

    def __init__(self, write: Callable[[list[Any]], None]) -> None:
        self._write = write  # prints one output's values
        self._held: dict[Any, list[Any]] = {}  # message id -> its outputs (value lists, or _Shared)
        self.roots: dict[int, Any] = {}  # the acker's roots in flight (Acker.roots): root id -> its msg_id

    def output(self, component: str, stream: str, values: list[Any], roots: list[int]) -> None:
        if not roots:
            self._write(values)
            return
        live = self.roots
        if len(roots) == 1:
            root = live.get(roots[0])
            if root is not None:  # else its tree failed already: the replay outputs it again
                self._held.setdefault(root.msg_id, []).append(values)
            return
        ids = {live[r].msg_id for r in roots if r in live}
        if len(ids) < len(set(roots)):
            return  # one of its inputs failed already
        shared = _Shared(values, len(ids))
        for msg_id in ids:
            self._held.setdefault(msg_id, []).append(shared)

    def acked(self, msg_ids: list[Any]) -> None:
        pop, write = self._held.pop, self._write
        for msg_id in msg_ids:
            for v in pop(msg_id, ()):
                if type(v) is _Shared:
                    v.pending -= 1
                    if v.pending or v.dead:
                        continue
                    v = v.values
                write(v)

    def failed(self, msg_id: Any) -> None:
        for v in self._held.pop(msg_id, ()):
            if type(v) is _Shared:
                v.dead = True
