"""Known-broken bolt for the diagnosis tests: a debug print() goes to stdout
(the protocol channel) before each ack, so the host reads non-JSON text.
The handshake and heartbeats are fine. On _raw.py (stdlib only)."""

import os

from _raw import run_bolt


def ack_after_a_print(tid):
    os.write(1, ("DEBUG got tuple %s\n" % tid).encode())
    return tid


run_bolt(ack_id=ack_after_a_print)
