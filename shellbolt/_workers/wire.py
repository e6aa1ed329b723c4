"""What crosses between host workers, and how it is framed: length-prefixed
pickles of whole batches over a Unix socket in the run's private directory
(mode 0700: only this user's processes connect; nothing from a component is
unpickled that our own workers did not pickle)."""

from __future__ import annotations

import pickle
import struct
from typing import Any

from .._model.acker import TupleEdges

__all__ = ["encode", "Frames", "to_wire", "from_wire"]

_HEADER = struct.Struct("!I")
#: the largest frame a worker accepts (a batch is bounded by topology.producer.batch.size deliveries per task)
MAX_FRAME = 1 << 30


def encode(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=5)
    return _HEADER.pack(len(data)) + data


class Frames:
    """Bytes in, whole messages out."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        buf = self._buf
        buf += data
        out, i = [], 0
        while len(buf) - i >= 4:
            (n,) = _HEADER.unpack_from(buf, i)
            if n > MAX_FRAME:
                raise ValueError(f"a frame of {n} bytes between workers: more than {MAX_FRAME}")
            if len(buf) - i - 4 < n:
                break
            out.append(pickle.loads(bytes(buf[i + 4:i + 4 + n])))
            i += 4 + n
        del buf[:i]
        return out


def to_wire(d: Any) -> tuple[Any, ...]:
    """A Delivery as it travels: its token as a root id (one-hop) or its ids per root."""
    edges = d.edges
    return (d.values, d.source, d.stream, d.source_task, edges if type(edges) is int else edges.ids, d.tick)


def from_wire(row: tuple[Any, ...]) -> tuple[Any, ...]:
    values, source, stream, source_task, edges, tick = row
    return values, source, stream, source_task, edges if type(edges) is int else TupleEdges(edges), tick
