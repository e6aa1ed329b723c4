"""Known-broken bolt for the diagnosis tests: completes the handshake and
answers heartbeats, then crashes (exit 1) on the first real tuple.
On _raw.py (stdlib only)."""

import sys

from _raw import frames, handshake, is_heartbeat, send

messages = frames()
handshake(messages)
for msg in messages:
    if is_heartbeat(msg):
        send({"command": "sync"})
    elif isinstance(msg, dict):
        sys.stderr.write("KeyError: 'word' (crashing on the first tuple)\n")
        sys.exit(1)
