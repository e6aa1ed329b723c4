"""Known-broken bolt for the diagnosis tests: completes the handshake and
answers heartbeats, then crashes (exit 1) on the first real tuple.
Raw stdio, stdlib only."""

import json
import os
import sys

buf = b""


def read_frame():
    global buf
    while True:
        lines = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        if b"end" in lines[:-1]:
            i = lines.index(b"end")
            body = b"\n".join(lines[:i])
            buf = b"\n".join(lines[i + 1:])
            if body.strip():
                return json.loads(body)
            continue
        data = os.read(0, 65536)
        if not data:
            sys.exit(0)
        buf += data


def send(obj):
    os.write(1, (json.dumps(obj) + "\nend\n").encode())


hello = read_frame()
open(os.path.join(hello["pidDir"], str(os.getpid())), "w").close()
send({"pid": os.getpid()})
while True:
    msg = read_frame()
    if isinstance(msg, dict) and msg.get("stream") == "__heartbeat":
        send({"command": "sync"})
    elif isinstance(msg, dict):
        sys.stderr.write("KeyError: 'word' (crashing on the first tuple)\n")
        sys.exit(1)
