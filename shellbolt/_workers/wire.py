"""What crosses between host workers, and how it is framed: length-prefixed
pickles of whole batches over a Unix socket in the run's private directory
(mode 0700: only this user's processes connect; nothing from a component is
unpickled that our own workers did not pickle)."""

from __future__ import annotations

import pickle
import struct
from itertools import repeat
from operator import itemgetter
from typing import Any

from .._model.acker import TupleEdges
from .._runtime.tasks import Delivery

__all__ = ["encode", "Frames", "pack", "unpack"]

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


_head = itemgetter(1, 2, 3, 5)  # a Delivery's source, stream, source task, tick
_values = itemgetter(0)
_edges = itemgetter(4)
_new_tuple = tuple.__new__


def pack(runs: list[list[Any]], ds: list[Delivery]) -> None:
    """Add deliveries to one task's batch, kept by column: runs of
    ``[source, stream, source_task, tick, values..., tokens...]`` (a token as a
    root id, one-hop, or its ids per root). A producer's tuples to one task
    share their header, so a run is usually a whole flush's worth, and
    nothing is built per tuple but its token."""
    if len(ds) > 1 and len(set(map(_head, ds))) > 1:  # mixed headers (rare): a run for each header
        for d in ds:
            pack(runs, [d])
        return
    head = _head(ds[0])
    tokens = [e if type(e) is int else e.ids for e in map(_edges, ds)]
    if runs and tuple(runs[-1][:4]) == head:
        last = runs[-1]
        last[4].extend(map(_values, ds))
        last[5].extend(tokens)
    else:
        runs.append([*head, list(map(_values, ds)), tokens])


def unpack(runs: list[list[Any]]) -> list[Delivery]:
    """The deliveries of a batch :func:`pack` built, in order."""
    out: list[Delivery] = []
    for source, stream, source_task, tick, values, tokens in runs:
        edges = [e if type(e) is int else TupleEdges(e) for e in tokens]
        # (each Delivery built by map and zip, not in a comprehension's Python loop: about 14% less CPU)
        out += map(_new_tuple, repeat(Delivery),
                   zip(values, repeat(source), repeat(stream), repeat(source_task), edges, repeat(tick)))
    return out
