"""The ceiling: a minimal hand-written multilang bolt, ``echo`` or ``split``.

Handshake; then bulk ``os.read`` of 64 KiB, split on ``b"\\nend\\n"``,
``orjson.loads`` each frame, build the emit and ack dicts, ``orjson.dumps``,
and ONE ``os.write`` (looped only for partial writes) per burst of input
read. No validation beyond what the protocol work needs.

    python handwritten.py echo|split
"""

import os
import sys

import orjson

from _bench_common import run

TERM = b"\nend\n"
SYNC = b'{"command":"sync"}'


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main():
    split = sys.argv[1:] == ["split"]
    loads, dumps = orjson.loads, orjson.dumps
    buf = b""
    while TERM not in buf:
        data = os.read(0, 65536)
        if not data:
            return
        buf += data
    hs, _, buf = buf.partition(TERM)
    pid_dir = loads(hs)["pidDir"]
    pid = os.getpid()
    open(os.path.join(pid_dir, str(pid)), "w").close()
    _write_all(1, dumps({"pid": pid}) + TERM)
    while True:
        parts = buf.split(TERM)
        buf = parts.pop()
        out = []
        for body in parts:
            t = loads(body)
            tid = t["id"]
            if t["stream"] == "__heartbeat":
                out.append(SYNC)
                continue
            if split:
                for word in t["tuple"][0].split():
                    out.append(dumps({"command": "emit", "tuple": [word], "anchors": [tid], "need_task_ids": False}))
            else:
                out.append(dumps({"command": "emit", "tuple": t["tuple"], "anchors": [tid], "need_task_ids": False}))
            out.append(dumps({"command": "ack", "id": tid}))
        if out:
            out.append(b"")
            _write_all(1, TERM.join(out))
        data = os.read(0, 65536)
        if not data:
            return
        buf += data


if __name__ == "__main__":
    run(main)
