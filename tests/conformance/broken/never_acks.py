"""Known-broken bolt for the diagnosis tests: splits sentences and emits each
word unanchored, answers heartbeats, but never acks or fails a tuple (the
same fault as storm-starter's Ruby split bolt). On _raw.py (stdlib only)."""

from _raw import frames, handshake, is_heartbeat, send

messages = frames()
handshake(messages)
for msg in messages:
    if isinstance(msg, list):
        continue  # a task-id reply: storm.rb's emit waits for it, this one does not care
    if is_heartbeat(msg):
        send({"command": "sync"})
        continue
    for word in str((msg.get("tuple") or [""])[0]).split():
        send({"command": "emit", "anchors": [], "tuple": [word]})
