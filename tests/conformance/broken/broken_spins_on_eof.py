"""Broken bolt: on stdin EOF it busy-loops instead of exiting (§5.4)."""

from _raw import run_bolt

run_bolt()
while True:
    pass
