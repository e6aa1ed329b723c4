"""Broken bolt: acks heartbeat tuples (then syncs); §3.2/§5.1 say never."""

from _raw import run_bolt, send


def on_heartbeat(msg):
    send({"command": "ack", "id": msg["id"]})
    send({"command": "sync"})


run_bolt(on_heartbeat=on_heartbeat)
