"""Known-broken bolt for the diagnosis tests: completes the handshake and
answers heartbeats, then crashes (exit 1) on the first real tuple.
With ``--slowly`` it closes its stdout there and exits (status 3) a moment
later instead, as a process whose cleanup takes a while does: the runner
sees the closed stdout first and must still name the exit status.
On _raw.py (stdlib only)."""

import os
import sys
import time

from _raw import frames, handshake, is_heartbeat, send

SLOWLY = "--slowly" in sys.argv[1:]

messages = frames()
handshake(messages)
for msg in messages:
    if is_heartbeat(msg):
        send({"command": "sync"})
    elif isinstance(msg, dict):
        if SLOWLY:
            sys.stderr.write("closing down (on the first tuple)\n")
            sys.stderr.flush()
            os.close(1)
            time.sleep(0.3)
            sys.exit(3)
        sys.stderr.write("KeyError: 'word' (crashing on the first tuple)\n")
        sys.exit(1)
