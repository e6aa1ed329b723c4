"""A bolt without any library: it parses frames with the standard library
(exact integers of any size), appends each tuple's values to the file named
by its first argument as JSON, and echoes them, anchored and acked."""

import json
import os
import sys


def read():
    lines = []
    for line in sys.stdin:
        if line.rstrip("\r\n") == "end":
            return json.loads("".join(lines))
        lines.append(line)
    sys.exit(0)


def write(obj):
    sys.stdout.write(json.dumps(obj) + "\nend\n")
    sys.stdout.flush()


setup = read()
open(os.path.join(setup["pidDir"], str(os.getpid())), "w").close()
write({"pid": os.getpid()})
with open(sys.argv[1], "a", encoding="utf-8") as log:
    while True:
        msg = read()
        if isinstance(msg, list):  # task ids
            continue
        if msg.get("stream") == "__heartbeat":
            write({"command": "sync"})
            continue
        log.write(json.dumps(msg["tuple"]) + "\n")
        log.flush()
        write({"command": "emit", "anchors": [msg["id"]], "tuple": msg["tuple"], "need_task_ids": False})
        write({"command": "ack", "id": msg["id"]})
