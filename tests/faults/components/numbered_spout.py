"""A reliable spout over the numbers 0..N-1 (stdlib only), like a durable source.

Usage: python numbered_spout.py N [--format TEMPLATE] [--per-next K]
                                  [--state FILE] [--no-events]
                                  [--fault MODE] [--after N] [--once MARKER]
                                  [--batch] [--nexts-per-read FILE]

Message id = the number i (a JSON integer); values = [TEMPLATE.format(i=i, pid=PID)]
or [i] without --format. Each ``next`` emits up to K new numbers (default 1),
replays first. A ``fail`` re-queues its id *whether or not this process
emitted it*: ids are offsets into a durable source, so the process that
replaces a dead spout can replay the trees the dead one started (spec §8.2
says a spout must tolerate ack/fail of ids it does not know).

``--state FILE`` is the durable offset: the next number to emit is stored
there after every burst of emits is written, and read at start. A process
killed between writing its emits and storing the offset re-emits those
numbers after the restart (at-least-once, like any source that commits
after sending).

Unless --no-events, it reports on stream "events" (unreliable emits, fields
["event", "msg_id"]): ["acked", i] and ["failed", i] from the ack and fail
commands.

``--batch`` accepts extension batch when offered (its emits stay standard
frames, which §9.5 allows), so the host may pipeline commands to it.
``--nexts-per-read FILE`` appends to FILE, at each read of stdin that
brought ``next`` commands, their number (one per line).

``--fault MODE`` (with --after N: fires once N numbers were emitted; with
--once MARKER: in the first process only):
  exit_on_ack      exit(1) on the first ack command, before its sync
  exit_on_fail     exit(1) on the first fail command, before its sync
  exit_after_fail  exit(1) just after the first fail's sync, before the next
                   `next` could replay it (the replay kept in memory only)
  undeclared       emit the next number on stream "nope" (not declared)
  exit:CODE        exit with CODE during a next
  slow_next:SECS   sleep SECS during a next, before its emits (the marker
                   is made as the sleep begins)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _raw import err, fire, frame, frames, handshake, write  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("n", type=int)
p.add_argument("--format")
p.add_argument("--per-next", type=int, default=1)
p.add_argument("--state")
p.add_argument("--no-events", action="store_true")
p.add_argument("--fault")
p.add_argument("--after", type=int, default=0)
p.add_argument("--once")
p.add_argument("--batch", action="store_true")
p.add_argument("--nexts-per-read")
ARGS = p.parse_args()
SYNC = frame({"command": "sync"})


def values(i: int) -> list:
    return [ARGS.format.format(i=i, pid=os.getpid())] if ARGS.format else [i]


def load_offset() -> int:
    if ARGS.state and os.path.exists(ARGS.state):
        with open(ARGS.state) as f:
            text = f.read().strip()
        return int(text or 0)
    return 0


def store_offset(offset: int) -> None:
    if ARGS.state:
        tmp = ARGS.state + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(offset))
        os.replace(tmp, ARGS.state)


def main() -> None:
    reads: list[int] = []
    messages = frames(reads)
    try:
        handshake(messages, accept=("batch",) if ARGS.batch else ())
    except StopIteration:
        return
    log_reads = open(ARGS.nexts_per_read, "a", buffering=1) if ARGS.nexts_per_read else None
    logged = 0
    err(f"numbered_spout pid {os.getpid()} ready")
    offset = load_offset()
    replay: deque[int] = deque()
    events = not ARGS.no_events
    fault = ARGS.fault
    for msg in messages:
        if isinstance(msg, list):
            continue  # task ids: never asked for
        cmd = msg.get("command")
        out = []
        if log_reads is not None and len(reads) > logged:  # the first command of a read: log the last read's
            if logged and reads[logged - 1]:
                log_reads.write(f"{reads[logged - 1]}\n")
            logged = len(reads)
        if cmd == "next":
            reads[-1] += 1
            batch = []
            while replay and len(batch) < ARGS.per_next:
                batch.append(replay.popleft())
            while offset < ARGS.n and len(batch) < ARGS.per_next:
                batch.append(offset)
                offset += 1
            for i in batch:
                em = {"command": "emit", "id": i, "tuple": values(i), "need_task_ids": False}
                if fault and i >= ARGS.after:
                    mode, _, arg = fault.partition(":")
                    if mode == "undeclared":
                        fault = None
                        if fire(ARGS.once):
                            err(f"numbered_spout: emitting {i} on an undeclared stream")
                            em["stream"] = "nope"
                    elif mode == "exit":
                        fault = None
                        if fire(ARGS.once):
                            err(f"numbered_spout pid {os.getpid()}: exiting with {arg} during next")
                            sys.exit(int(arg))
                    elif mode == "slow_next":
                        fault = None
                        if fire(ARGS.once):
                            time.sleep(float(arg))
                out.append(frame(em))
            out.append(SYNC)
            write(b"".join(out))
            store_offset(offset)
            continue
        if cmd in ("ack", "fail"):
            i = msg["id"]
            if fault in ("exit_on_ack", "exit_on_fail") and cmd == fault[len("exit_on_"):]:
                fault = None
                if fire(ARGS.once):
                    err(f"numbered_spout pid {os.getpid()}: exiting on {cmd} of {i}, before its sync")
                    sys.exit(1)
            if cmd == "fail":
                replay.append(i)
            if events:
                out.append(frame({"command": "emit", "stream": "events", "tuple": [cmd + "ed", i],
                                  "need_task_ids": False}))
        out.append(SYNC)  # activate, deactivate and anything else: just sync (§4.5)
        write(b"".join(out))
        if cmd == "fail" and fault == "exit_after_fail":
            fault = None
            if fire(ARGS.once):
                err(f"numbered_spout pid {os.getpid()}: exiting after the sync of fail {msg['id']}, not replayed")
                sys.exit(1)


if __name__ == "__main__":
    main()
