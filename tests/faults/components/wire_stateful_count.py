"""A stateful word-count bolt written against the wire (§9.7), no library:
the host's side of the state extension is tested without trusting ours."""
import json
import os
import sys

def read():
    lines = []
    while True:
        line = sys.stdin.readline()
        if not line:
            sys.exit(0)
        if line == "end\n":
            return json.loads("".join(lines))
        lines.append(line)

def send(obj):
    sys.stdout.write(json.dumps(obj) + "\nend\n")
    sys.stdout.flush()

hs = read()
offered = hs.get("extensions") or []
accept = ["state"] if "state" in offered else []
send({"pid": os.getpid(), "extensions": accept})
state, dirty, undo = {}, {}, {}
ABSENT = object()

def change(k, v):
    if k not in undo:
        undo[k] = state.get(k, ABSENT)
    state[k] = v
    dirty[k] = True

while True:
    m = read()
    if m.get("command") == "state":
        a = m["action"]
        if a == "init":
            state.update(m["state"]); dirty.clear(); undo.clear()
        elif a == "prepare":
            send({"command": "state", "action": "prepared", "txid": m["txid"],
                  "put": {k: state[k] for k in dirty if k in state}, "delete": [k for k in dirty if k not in state]})
            dirty.clear()
        elif a == "commit":
            undo.clear()
        elif a == "rollback":
            for k, v in undo.items():
                if v is ABSENT:
                    state.pop(k, None)
                else:
                    state[k] = v
            undo.clear(); dirty.clear()
        continue
    if m.get("stream") == "__heartbeat":
        send({"command": "sync"})
        continue
    if m.get("stream") == "__tick":
        send({"command": "ack", "id": m["id"]})
        continue
    word = m["tuple"][0]
    change(word, state.get(word, 0) + 1)
    send({"command": "emit", "anchors": [m["id"]], "tuple": [word, state[word]], "need_task_ids": False})
    send({"command": "ack", "id": m["id"]})
