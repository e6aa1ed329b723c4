"""A bolt that closes its stdout on the first real tuple and exits (status 3)
a moment later, as a process whose cleanup takes a while does: the runner
sees the closed stdout first and must still name the exit status.
On _raw.py (stdlib only)."""

import os
import sys
import time

from _raw import frames, handshake, is_heartbeat, send

messages = frames()
handshake(messages)
for msg in messages:
    if is_heartbeat(msg):
        send({"command": "sync"})
    elif isinstance(msg, dict):
        sys.stderr.write("closing down (on the first tuple)\n")
        sys.stderr.flush()
        os.close(1)
        time.sleep(0.3)
        sys.exit(3)
