"""Broken bolt: acks tuples with their id as a JSON number (§3.6 forbids it)."""

from _raw import run_bolt

run_bolt(ack_id=lambda tid: int(tid))
