"""Known-broken bolt for the diagnosis tests: acks every tuple, but only
3.5 s after it arrived (longer than the conformance runner's default 2 s
wait); heartbeats are answered at once. Raw stdio, stdlib only."""

import json
import os
import select
import sys
import time

DELAY = 3.5
buf = b""


def frames_in_buffer():
    global buf
    out = []
    while True:
        lines = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        if b"end" not in lines[:-1]:
            return out
        i = lines.index(b"end")
        body = b"\n".join(lines[:i])
        buf = b"\n".join(lines[i + 1:])
        if body.strip():
            out.append(json.loads(body))


def send(obj):
    os.write(1, (json.dumps(obj) + "\nend\n").encode())


pending = []  # (due, id)
shook = False
while True:
    wait = max(0.0, pending[0][0] - time.monotonic()) if pending else None
    if select.select([0], [], [], wait)[0]:
        data = os.read(0, 65536)
        if not data:
            sys.exit(0)
        buf += data
        for msg in frames_in_buffer():
            if not shook:
                open(os.path.join(msg["pidDir"], str(os.getpid())), "w").close()
                send({"pid": os.getpid()})
                shook = True
            elif isinstance(msg, dict) and msg.get("stream") == "__heartbeat":
                send({"command": "sync"})
            elif isinstance(msg, dict):
                pending.append((time.monotonic() + DELAY, msg["id"]))
    while pending and pending[0][0] <= time.monotonic():
        send({"command": "ack", "id": pending.pop(0)[1]})
