"""Broken spout: emits on next but never writes the sync that ends a command (§4.2)."""

from _raw import frames, handshake, send

messages = frames()
try:
    handshake(messages)
except StopIteration:
    raise SystemExit(0)
n = 0
for msg in messages:
    if isinstance(msg, dict) and msg.get("command") == "next":
        send({"command": "emit", "tuple": ["word", n], "need_task_ids": False})
        n += 1
    # ... and no {"command": "sync"}
