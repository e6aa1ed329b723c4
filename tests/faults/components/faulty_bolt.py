"""A relay bolt (stdlib only) that misbehaves on request.

Usage: python faulty_bolt.py [--fault MODE] [--after N] [--once MARKER]
                             [--startup MODE] [--sleep S] [--flood-line N]
                             [--gate FILE] [--copies N]

Normal behaviour: each input tuple is emitted again, unchanged, anchored to
itself on the default stream (``need_task_ids`` false), then acked; ticks
are acked; heartbeats are answered with ``sync``. Every process writes
``faulty_bolt pid P ready`` to stderr after its handshake.

``--fault MODE`` fires on the (N+1)-th tuple this process receives (after
``--after N`` tuples handled normally; default 0); with ``--once MARKER``
only in the first process that gets there (see _raw.fire). Modes:

  exit:CODE        exit with status CODE (writes a line to stderr first)
  hang             stop reading and writing (alive, until killed)
  garbage          write binary junk on stdout, then go on normally
  stray            write a stray text line on stdout (a print), then go on
  emit_then_garbage  emit wanting task ids (storm.py's default), then junk, in one write
  invalid_json     write a frame that is not valid JSON
  no_command       write a JSON object frame without "command"
  oversize         emit a tuple whose frame exceeds multilang.max.frame.bytes
  unterminated     write more than the limit without any line break, then wait
  fail             fail the tuple (a legitimate fail; emits nothing)
  ack_unknown      ack an id the host never sent
  fail_unknown     fail an id the host never sent
  ack_numeric      ack the tuple with its id as a JSON number (§3.6)
  double_ack       ack the tuple twice
  anchor_finished  ack the tuple, then emit anchored to it
  anchor_failed    fail the tuple, then emit anchored to it
  ack_heartbeat    ack the next heartbeat instead of answering sync
  undeclared       emit the tuple on stream "nope" (not declared), then ack
  wrong_arity      emit the tuple with one value too many, then ack
  direct:TASK      direct-emit the tuple to TASK (not a direct subscriber), then ack
  flood:BYTES      write BYTES to stderr (lines of --flood-line bytes), go on
  flood_exit:BYTES the same, then a last line "LAST-WORDS", then exit 3

``--startup MODE`` misbehaves during the handshake instead (with --once, the
first process only): ``exit:CODE`` after reading the handshake, ``hang``
(never reply), ``no_pid_file`` (reply without creating the pid file).
``--sleep S`` sleeps before handling each tuple (a slow bolt).
``--copies N`` emits each tuple N times before its ack (a split of a long
line: more output than a slow bolt downstream takes).
``--stubborn`` ignores SIGTERM, ignores EOF on stdin (keeps sleeping) and
starts a child process (``sleep 600``): only SIGKILL to its process group
ends both.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _raw import err, fire, frame, frames, handshake, hang, write  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--fault")
p.add_argument("--after", type=int, default=0)
p.add_argument("--once")
p.add_argument("--startup")
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--copies", type=int, default=1)
p.add_argument("--flood-line", type=int, default=1000)
p.add_argument("--stubborn", action="store_true")
p.add_argument("--gate")  # hold the first tuple until FILE exists (the test's event, not a time)
ARGS = p.parse_args()


def flood(total: int) -> None:
    line = (b"x" * max(ARGS.flood_line - 1, 0)) + b"\n"
    sent = 0
    while sent < total:
        write(line, 2)
        sent += len(line)


def main() -> None:
    if ARGS.stubborn:
        import signal
        import subprocess

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen(["sleep", "600"])
        err(f"faulty_bolt pid {os.getpid()}: stubborn, with child {child.pid}")
    messages = frames()
    if ARGS.startup and fire(ARGS.once):
        mode, _, arg = ARGS.startup.partition(":")
        if mode == "exit":
            next(messages, None)
            err(f"faulty_bolt pid {os.getpid()}: exiting during the handshake with status {arg}")
            sys.exit(int(arg))
        if mode == "hang":
            err(f"faulty_bolt pid {os.getpid()}: never answering the handshake")
            hang()
        if mode == "no_pid_file":
            try:
                hs = handshake(messages, pid_file=False)
            except StopIteration:
                return
            serve(messages, hs)
            return
    try:
        hs = handshake(messages)
    except StopIteration:
        hs = None
    if hs is not None:
        serve(messages, hs)
    if ARGS.stubborn:
        hang()


def serve(messages, hs) -> None:
    limit = int(hs["conf"].get("multilang.max.frame.bytes") or 64 << 20)
    err(f"faulty_bolt pid {os.getpid()} ready")
    seen = 0
    armed = bool(ARGS.fault)
    heartbeat_trap = False
    for msg in messages:
        if isinstance(msg, list):  # task ids: never asked for
            continue
        if msg.get("stream") == "__heartbeat":
            if heartbeat_trap:
                heartbeat_trap = False
                write(frame({"command": "ack", "id": msg["id"]}))
            else:
                write(frame({"command": "sync"}))
            continue
        tid = msg["id"]
        if msg.get("stream") == "__tick":
            write(frame({"command": "ack", "id": tid}))
            continue
        if ARGS.gate:
            while not os.path.exists(ARGS.gate):
                time.sleep(0.01)
        if ARGS.sleep:
            time.sleep(ARGS.sleep)
        seen += 1
        values = msg["tuple"]
        emit = {"command": "emit", "anchors": [tid], "tuple": values, "need_task_ids": False}
        ack = {"command": "ack", "id": tid}
        if armed and seen > ARGS.after:
            armed = False
            if fire(ARGS.once):
                out = misbehave(ARGS.fault, tid, values, emit, ack, limit)
                if out == "heartbeat":
                    heartbeat_trap = True
                    out = frame(emit) + frame(ack)
                write(out)
                continue
        write(frame(emit) * ARGS.copies + frame(ack))


def misbehave(fault: str, tid, values, emit, ack, limit: int) -> bytes:
    mode, _, arg = fault.partition(":")
    err(f"faulty_bolt pid {os.getpid()}: fault {mode} on tuple {tid}")
    if mode == "exit":
        sys.exit(int(arg))
    if mode == "hang":
        hang()
    if mode == "garbage":
        return b"\x00\x01GARBAGE\xff\xfe{not a frame\n" + frame(emit) + frame(ack)
    if mode == "emit_then_garbage":  # the host reads both at once: the task ids are owed to a broken connection
        return frame({k: v for k, v in emit.items() if k != "need_task_ids"}) + b"\x00\x01GARBAGE after an emit\n"
    if mode == "stray":
        return b"STRAY debug print: working on it\n" + frame(emit) + frame(ack)
    if mode == "invalid_json":
        return b'{"command":"emit","tuple":[INVALID\nend\n'
    if mode == "no_command":
        return b'{"tuple":["NO-COMMAND"],"anchors":[]}\nend\n'
    if mode == "oversize":
        return frame({"command": "emit", "anchors": [tid], "tuple": ["OVERSIZE" + "y" * limit]})
    if mode == "unterminated":
        write(b"UNTERMINATED" + b"z" * limit)
        hang()
    if mode == "fail":
        return frame({"command": "fail", "id": tid})
    if mode == "ack_unknown":
        return frame({"command": "ack", "id": "4242424242"})
    if mode == "fail_unknown":
        return frame({"command": "fail", "id": "4242424242"})
    if mode == "ack_numeric":
        return frame({"command": "ack", "id": int(tid)})
    if mode == "double_ack":
        return frame(emit) + frame(ack) + frame(ack)
    if mode == "anchor_finished":
        return frame(ack) + frame(emit)
    if mode == "anchor_failed":
        return frame({"command": "fail", "id": tid}) + frame(emit)
    if mode == "ack_heartbeat":
        return "heartbeat"  # type: ignore[return-value]
    if mode == "undeclared":
        return frame({**emit, "stream": "nope"}) + frame(ack)
    if mode == "wrong_arity":
        return frame({**emit, "tuple": values + ["EXTRA"]}) + frame(ack)
    if mode == "direct":
        return frame({**emit, "task": int(arg)}) + frame(ack)
    if mode == "flood":
        flood(int(arg))
        return frame(emit) + frame(ack)
    if mode == "flood_exit":
        flood(int(arg))
        err("LAST-WORDS before exit 3")
        sys.exit(3)
    raise SystemExit(f"unknown fault {fault!r}")


if __name__ == "__main__":
    main()
