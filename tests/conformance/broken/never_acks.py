"""Known-broken bolt for the diagnosis tests: splits sentences and emits each
word unanchored, answers heartbeats, but never acks or fails a tuple (the
same fault as storm-starter's Ruby split bolt). Raw stdio, stdlib only."""

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
queued = []
while True:
    msg = queued.pop(0) if queued else read_frame()
    if not isinstance(msg, dict):
        continue
    if msg.get("stream") == "__heartbeat":
        send({"command": "sync"})
        continue
    for word in str((msg.get("tuple") or [""])[0]).split():
        send({"command": "emit", "anchors": [], "tuple": [word]})
        while True:  # wait for the task ids, queueing what comes first
            reply = read_frame()
            if isinstance(reply, list):
                break
            queued.append(reply)
