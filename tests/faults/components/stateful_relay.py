"""A stateless relay bolt (stdlib only) placed after a stateful bolt, for
tests/faults/test_stateful_edges.py: each input tuple is emitted again,
unchanged and anchored to itself, then acked; ticks are acked; heartbeats
are answered with sync.

Usage: python stateful_relay.py [--fault fail|hold] [--after N] [--once MARKER]

``--fault`` fires on the (N+1)-th tuple this process receives, and with
``--once MARKER`` only in the first process that gets there (see _raw.fire):

  fail   fail the tuple (emits nothing for it)
  hold   keep the tuple: never ack nor fail it (its tree times out)
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _raw import err, fire, frame, frames, handshake, write  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--fault", choices=["fail", "hold"])
p.add_argument("--after", type=int, default=0)
p.add_argument("--once")
ARGS = p.parse_args()


def main() -> None:
    messages = frames()
    try:
        handshake(messages)
    except StopIteration:
        return
    err(f"stateful_relay pid {os.getpid()} ready")
    seen = 0
    armed = bool(ARGS.fault)
    for msg in messages:
        if isinstance(msg, list):
            continue
        if msg.get("stream") == "__heartbeat":
            write(frame({"command": "sync"}))
            continue
        tid = msg["id"]
        if msg.get("stream") == "__tick":
            write(frame({"command": "ack", "id": tid}))
            continue
        seen += 1
        if armed and seen > ARGS.after:
            armed = False
            if fire(ARGS.once):
                err(f"stateful_relay pid {os.getpid()}: {ARGS.fault} on tuple {tid} {msg['tuple']}")
                if ARGS.fault == "fail":
                    write(frame({"command": "fail", "id": tid}))
                continue  # hold: never answered
        write(frame({"command": "emit", "anchors": [tid], "tuple": msg["tuple"], "need_task_ids": False})
              + frame({"command": "ack", "id": tid}))


if __name__ == "__main__":
    main()
