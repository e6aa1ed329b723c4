"""Broken bolt: acks tuples with their id re-formatted (leading zeros
dropped, a space added): not the string it was sent (§3.6)."""

from _raw import run_bolt

run_bolt(ack_id=lambda tid: tid.lstrip("0") + " ")
