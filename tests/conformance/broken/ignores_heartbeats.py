"""Known-broken bolt for the diagnosis tests: acks every tuple but never
answers a heartbeat tuple with sync. On _raw.py (stdlib only)."""

from _raw import run_bolt

run_bolt(on_heartbeat=lambda msg: None)
