"""A reliable spout over the numbers 0..N-1 (stdlib only) that takes its
time in each ``next``, as a spout polling a remote source does, for
tests/faults/test_stateful_edges.py.

Usage: python stateful_spout.py N [--per-next K] [--delay SECONDS]

Each ``next`` sleeps SECONDS, then emits up to K numbers (replays of failed
ids first), message id = the number, values = [number], then syncs. It
declares (and never emits) a stream "quiet" for bolts that should get nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _raw import frame, frames, handshake, write  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("n", type=int)
p.add_argument("--per-next", type=int, default=1)
p.add_argument("--delay", type=float, default=0.0)
ARGS = p.parse_args()
SYNC = frame({"command": "sync"})


def main() -> None:
    messages = frames()
    try:
        handshake(messages)
    except StopIteration:
        return
    offset = 0
    replay: deque[int] = deque()
    for msg in messages:
        if isinstance(msg, list):
            continue
        cmd = msg.get("command")
        out = []
        if cmd == "next":
            if ARGS.delay and (replay or offset < ARGS.n):
                time.sleep(ARGS.delay)
            batch = []
            while replay and len(batch) < ARGS.per_next:
                batch.append(replay.popleft())
            while offset < ARGS.n and len(batch) < ARGS.per_next:
                batch.append(offset)
                offset += 1
            out = [frame({"command": "emit", "id": i, "tuple": [i], "need_task_ids": False}) for i in batch]
        elif cmd == "fail":
            replay.append(msg["id"])
        out.append(SYNC)
        write(b"".join(out))


if __name__ == "__main__":
    main()
