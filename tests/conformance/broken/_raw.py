"""Raw multilang I/O for the deliberately broken components (no library).

Just enough to talk to `multilang conform`: read frames (a line that is
exactly "end", after \\n, \\r\\n or \\r line endings), write frames, answer the
handshake. Each broken_*.py script breaks exactly one rule on top of this.
"""

import json
import os
import re

_TERM = re.compile(rb"(?:\A|(?<=[\r\n]))end(?:\r\n|\n|\r)")


def frames():
    """Yield each frame from stdin as parsed JSON; return at EOF."""
    buf = bytearray()
    while True:
        data = os.read(0, 1 << 16)
        if not data:
            return
        buf += data
        while True:
            m = _TERM.search(buf)
            if m is None:
                break
            body = bytes(buf[: m.start()])
            del buf[: m.end()]
            if body.strip():
                yield json.loads(body)


def send(obj):
    data = (json.dumps(obj) + "\nend\n").encode()
    while data:
        data = data[os.write(1, data) :]


def handshake(messages, pid_file=True):
    """Answer the handshake: create the pid file (unless told not to), reply with the pid."""
    msg = next(messages)
    pid = os.getpid()
    if pid_file:
        open(os.path.join(msg["pidDir"], str(pid)), "w").close()
    send({"pid": pid})
    return msg


def is_heartbeat(msg):
    return isinstance(msg, dict) and msg.get("stream") == "__heartbeat"


def run_bolt(ack_id=lambda tid: tid, on_heartbeat=lambda msg: send({"command": "sync"}), pid_file=True):
    """A bolt that acks every tuple (with ``ack_id(id)``) and answers heartbeats."""
    messages = frames()
    try:
        handshake(messages, pid_file=pid_file)
    except StopIteration:
        return
    for msg in messages:
        if isinstance(msg, list):
            continue  # task ids: never asked for
        if is_heartbeat(msg):
            on_heartbeat(msg)
        else:
            send({"command": "ack", "id": ack_id(msg["id"])})
